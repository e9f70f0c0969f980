//! Heavy host work done on a backend's behalf: sealing and opening its
//! states, parsing a state whole, hashing a body the host signs for it.
//!
//! On a state of hundreds of MiB such work takes a core for a second or
//! more. Run on the async workers, a few such requests of one backend
//! would hold every worker and stall everyone else's; run unbounded on
//! blocking threads, one backend could still take every core. So work
//! over [`INLINE_BYTES`] runs on a blocking thread, at most `slots` at
//! once per backend (its `max_cores`, as for its guests' wasm), queued
//! FIFO and given up after the backend's call timeout. Small work runs in
//! place: a thread hand-off would cost more than it saves.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Semaphore;

/// Work on fewer bytes than this runs in place (about 0.1 ms of sealing).
pub const INLINE_BYTES: usize = 256 << 10;

/// One backend's slots for heavy host work.
#[derive(Debug, Clone)]
pub struct HostWork {
    slots: Arc<Semaphore>,
    total: usize,
    /// The most pieces of work ever run at once.
    peak: Arc<AtomicUsize>,
    /// How long work may wait for a slot.
    wait: Duration,
}

/// Why heavy work did not run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WorkError {
    /// Every slot stayed taken by the backend's other requests.
    #[error(
        "the backend's host work (sealing, parsing or signing big states) stayed busy for {0:?}"
    )]
    Busy(Duration),
    /// The work panicked (a bug in the host).
    #[error("host work failed: {0}")]
    Failed(String),
}

impl HostWork {
    /// At most `slots` pieces of work at once, each waiting at most `wait`.
    pub fn new(slots: usize, wait: Duration) -> Self {
        HostWork {
            slots: Arc::new(Semaphore::new(slots.max(1))),
            total: slots.max(1),
            peak: Arc::new(AtomicUsize::new(0)),
            wait,
        }
    }

    /// Run `work` over `bytes` bytes: in place when small, else on a
    /// blocking thread once one of the slots is free.
    pub async fn run<R: Send + 'static>(
        &self,
        bytes: usize,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, WorkError> {
        if bytes < INLINE_BYTES {
            return Ok(work());
        }
        let slot = match self.slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                // Queued behind other requests' work: what this request
                // kept for its next storage call is not held meanwhile.
                crate::request::give_back();
                tokio::time::timeout(self.wait, self.slots.clone().acquire_owned())
                    .await
                    .map_err(|_| WorkError::Busy(self.wait))?
                    .map_err(|_| WorkError::Busy(self.wait))?
            }
        };
        let running = self.total - self.slots.available_permits();
        self.peak.fetch_max(running, Ordering::Relaxed);
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            work()
        })
        .await
        .map_err(|e| WorkError::Failed(e.to_string()))
    }

    /// [`Self::run`] over `data` (its length decides where it runs).
    pub async fn run_over<T, R>(
        &self,
        data: T,
        work: impl FnOnce(&[u8]) -> R + Send + 'static,
    ) -> Result<R, WorkError>
    where
        T: AsRef<[u8]> + Send + 'static,
        R: Send + 'static,
    {
        let bytes = data.as_ref().len();
        self.run(bytes, move || work(data.as_ref())).await
    }

    /// How many pieces of work may run now.
    pub fn available(&self) -> usize {
        self.slots.available_permits()
    }
}

impl crate::metrics::Usage for HostWork {
    fn used(&self) -> u64 {
        self.peak.load(Ordering::Relaxed) as u64
    }
    fn limit(&self) -> u64 {
        self.total as u64
    }
}

impl Default for HostWork {
    /// One slot, waiting a minute, shared by every storage that is not a
    /// guest's (and by stopped backends): made once, so asking for it
    /// again never hands out a fresh, unbounded set of slots.
    fn default() -> Self {
        static SHARED: std::sync::OnceLock<HostWork> = std::sync::OnceLock::new();
        SHARED
            .get_or_init(|| HostWork::new(1, Duration::from_secs(60)))
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Usage;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn big_work_runs_off_the_workers_at_most_slots_at_once() {
        let work = HostWork::new(2, Duration::from_secs(30));
        let (running, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let tasks: Vec<_> = (0..6)
            .map(|_| {
                let (work, running, peak) = (work.clone(), running.clone(), peak.clone());
                tokio::spawn(async move {
                    work.run(INLINE_BYTES, move || {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(20));
                        running.fetch_sub(1, Ordering::SeqCst);
                    })
                    .await
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        assert_eq!(peak.load(Ordering::SeqCst), 2);
        assert_eq!((work.used(), work.limit()), (2, 2));
        assert_eq!(work.available(), 2);
    }

    #[tokio::test]
    async fn work_waiting_past_its_time_is_refused() {
        let work = HostWork::new(1, Duration::from_millis(50));
        let held = work.slots.clone().acquire_owned().await.unwrap();
        let refused = work.run(INLINE_BYTES, || ()).await;
        assert_eq!(refused, Err(WorkError::Busy(Duration::from_millis(50))));
        // Small work never waits.
        assert_eq!(work.run(10, || 7).await, Ok(7));
        drop(held);
        assert_eq!(work.run(INLINE_BYTES, || 8).await, Ok(8));
    }

    /// A storage that has no slots of its own (a stopped backend) shares
    /// one set: asking twice does not double them.
    #[test]
    fn the_default_slots_are_one_set() {
        let (a, b) = (HostWork::default(), HostWork::default());
        assert!(Arc::ptr_eq(&a.slots, &b.slots));
    }
}
