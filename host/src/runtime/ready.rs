//! The one instance a backend keeps ready for its next call, as a small
//! state machine (empty, being made, ready) that knows nothing of wasm;
//! [`super::instance`] makes and hands out what it holds.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Instances the server keeps ready across all its backends with
/// `max_instances` running at most: an eighth of them, at least one.
pub fn ready_instances(max_instances: u32) -> u32 {
    (max_instances / 8).max(1)
}

/// The server's ready slots, shared by every backend's [`Ready`], and how
/// many instances are ready now (what the metrics read).
#[derive(Clone)]
pub struct ReadySlots {
    slots: Arc<Semaphore>,
    ready: Arc<AtomicUsize>,
    total: usize,
}

impl ReadySlots {
    /// `total` slots.
    pub fn new(total: usize) -> Self {
        ReadySlots {
            slots: Arc::new(Semaphore::new(total)),
            ready: Arc::default(),
            total,
        }
    }
}

impl crate::metrics::Usage for ReadySlots {
    /// Instances ready now (not those being made).
    fn used(&self) -> u64 {
        self.ready.load(Ordering::Relaxed) as u64
    }
    fn limit(&self) -> u64 {
        self.total as u64
    }
}

enum Slot<P> {
    Empty,
    /// Being made. A call that finds it so makes its own rather than wait:
    /// handing it over would cost two thread wake-ups, about what making
    /// one costs.
    Preparing,
    Ready {
        item: P,
        kept_at: Instant,
    },
}

struct State<P> {
    slot: Slot<P>,
    /// Whether a timer watches for a ready one nobody takes (one per
    /// backend, however many are made).
    watched: bool,
    /// Set when what it would keep is not worth keeping (too big).
    never: bool,
    /// When the backend's last call ended.
    last_call: Option<Instant>,
}

/// What the timer of a backend's ready one does next.
pub enum Watch<P> {
    /// Nobody took it in time: drop it (outside the lock).
    Expired(P),
    /// Look again then.
    Until(Instant),
    /// Nothing is ready: the timer ends (the next one kept starts one).
    Done,
}

/// What one backend keeps ready for its next call: at most one `P`.
pub(super) struct Ready<P> {
    state: Mutex<State<P>>,
    /// The server's ready slots, shared by every backend.
    server: ReadySlots,
    /// How long one waits for a call before it is dropped.
    idle: Duration,
}

impl<P> Ready<P> {
    /// Nothing ready yet; each one made takes one of `server`'s slots, and
    /// is dropped if no call takes it within `idle`.
    pub fn new(server: ReadySlots, idle: Duration) -> Self {
        Ready {
            state: Mutex::new(State {
                slot: Slot::Empty,
                watched: false,
                never: false,
                last_call: None,
            }),
            server,
            idle,
        }
    }

    /// The ready one, if there is one; `None`: make one.
    pub fn take(&self) -> Option<P> {
        let mut state = lock(&self.state);
        match std::mem::replace(&mut state.slot, Slot::Empty) {
            Slot::Ready { item, .. } => {
                self.server.ready.fetch_sub(1, Ordering::Relaxed);
                Some(item)
            }
            other => {
                state.slot = other;
                None
            }
        }
    }

    /// Whether one is ready now.
    pub fn is_ready(&self) -> bool {
        matches!(lock(&self.state).slot, Slot::Ready { .. })
    }

    /// A call ended `now`: start making the next one if `worth_it` (as
    /// the caller sees it) and the backend is in use (its call before
    /// this one ended less than `idle` ago), unless one is ready or being
    /// made, or the server has no ready slot free. The slot it holds
    /// until taken.
    pub fn begin(&self, now: Instant, worth_it: bool) -> Option<OwnedSemaphorePermit> {
        let mut state = lock(&self.state);
        let in_use = state
            .last_call
            .replace(now)
            .is_some_and(|before| now.saturating_duration_since(before) < self.idle);
        if !worth_it || !in_use || state.never || !matches!(state.slot, Slot::Empty) {
            return None;
        }
        let permit = self.server.slots.clone().try_acquire_owned().ok()?;
        state.slot = Slot::Preparing;
        Some(permit)
    }

    /// The one being made is `made` (`None`: it could not be): keep it.
    /// `true` when it was kept and no timer watches yet: the caller starts
    /// one ([`Ready::watch`]).
    pub fn finish(&self, made: Option<P>) -> bool {
        let mut state = lock(&self.state);
        debug_assert!(matches!(state.slot, Slot::Preparing));
        let Some(item) = made else {
            state.slot = Slot::Empty;
            return false;
        };
        state.slot = Slot::Ready {
            item,
            kept_at: Instant::now(),
        };
        self.server.ready.fetch_add(1, Ordering::Relaxed);
        !std::mem::replace(&mut state.watched, true)
    }

    /// Make none again: what would be kept is not worth keeping.
    pub fn never_again(&self) {
        lock(&self.state).never = true;
    }

    /// The timer's look at `now`: drop the ready one if it has waited
    /// its time, else say when to look again.
    pub fn watch(&self, now: Instant) -> Watch<P> {
        let mut state = lock(&self.state);
        match &state.slot {
            Slot::Ready { kept_at, .. } if now < *kept_at + self.idle => {
                Watch::Until(*kept_at + self.idle)
            }
            Slot::Ready { .. } => {
                state.watched = false;
                self.server.ready.fetch_sub(1, Ordering::Relaxed);
                match std::mem::replace(&mut state.slot, Slot::Empty) {
                    Slot::Ready { item, .. } => Watch::Expired(item),
                    _ => unreachable!("matched as ready"),
                }
            }
            Slot::Empty | Slot::Preparing => {
                state.watched = false;
                Watch::Done
            }
        }
    }
}

impl<P> Drop for Ready<P> {
    fn drop(&mut self) {
        // A backend dropped (a reload) with one ready: no longer counted.
        if matches!(lock(&self.state).slot, Slot::Ready { .. }) {
            self.server.ready.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Duration = Duration::from_secs(10);

    /// A backend in use: it has had a call.
    fn in_use(ready: Ready<u32>) -> Ready<u32> {
        assert!(
            ready.begin(Instant::now(), true).is_none(),
            "not on its first call"
        );
        ready
    }

    fn ready(server_slots: usize) -> Ready<u32> {
        in_use(Ready::new(ReadySlots::new(server_slots), IDLE))
    }

    fn begin(ready: &Ready<u32>) -> Option<OwnedSemaphorePermit> {
        ready.begin(Instant::now(), true)
    }

    #[test]
    fn a_backend_is_in_use_when_its_calls_come_less_than_idle_apart() {
        let ready = Ready::<u32>::new(ReadySlots::new(4), IDLE);
        let start = Instant::now();
        assert!(
            ready.begin(start, true).is_none(),
            "a first call (or a probe)"
        );
        assert!(
            ready.begin(start + IDLE * 2, true).is_none(),
            "long after it"
        );
        // Calls under load make none, but count as use.
        assert!(ready.begin(start + IDLE * 2 + IDLE / 4, false).is_none());
        assert!(
            ready.begin(start + IDLE * 2 + IDLE / 2, true).is_some(),
            "in use"
        );
    }

    #[test]
    fn one_is_made_at_a_time_and_taken_once() {
        let ready = ready(4);
        assert_eq!(ready.take(), None, "nothing before the first call");
        let slot = begin(&ready).expect("a server slot is free");
        assert!(begin(&ready).is_none(), "one being made already");
        assert!(ready.finish(Some(1)), "kept, and a timer is to watch it");
        assert!(begin(&ready).is_none(), "one ready already");
        assert_eq!(ready.take(), Some(1));
        assert_eq!(ready.take(), None, "taken once");
        drop(slot);
        assert!(begin(&ready).is_some());
    }

    #[test]
    fn a_call_that_finds_one_being_made_makes_its_own() {
        let ready = ready(4);
        let slot = begin(&ready).unwrap();
        assert_eq!(ready.take(), None);
        assert!(!ready.finish(None), "it could not be made");
        assert!(!ready.is_ready());
        drop(slot);
        assert!(begin(&ready).is_some(), "the next call's may be made");
    }

    #[test]
    fn none_is_made_once_what_would_be_kept_is_not_worth_it() {
        let ready = ready(4);
        let _slot = begin(&ready).unwrap();
        ready.never_again();
        assert!(!ready.finish(None));
        assert!(begin(&ready).is_none());
    }

    #[test]
    fn the_servers_ready_slots_bound_every_backend_together() {
        let server = ReadySlots::new(1);
        let a = in_use(Ready::new(server.clone(), IDLE));
        let b = in_use(Ready::new(server.clone(), IDLE));
        let held = begin(&a).expect("the one slot");
        assert!(begin(&b).is_none(), "no slot left for another backend");
        a.finish(Some(1));
        assert_eq!(
            server.ready.load(Ordering::Relaxed),
            1,
            "counted when ready"
        );
        assert_eq!(a.take(), Some(1));
        assert_eq!(server.ready.load(Ordering::Relaxed), 0);
        // The slot comes back when the call that took it lets it go.
        assert!(begin(&b).is_none());
        drop(held);
        assert!(begin(&b).is_some());
    }

    #[test]
    fn one_timer_per_backend_drops_what_nobody_took_in_time() {
        let ready = ready(4);
        let start = Instant::now();
        let _slot = begin(&ready).unwrap();
        assert!(ready.finish(Some(1)), "the first kept starts the timer");
        assert!(matches!(ready.watch(start), Watch::Until(_)));
        assert!(matches!(ready.watch(start + IDLE * 2), Watch::Expired(1)));
        assert!(matches!(ready.watch(start + IDLE * 2), Watch::Done));
        // Kept again, taken, kept again: still the one timer.
        let _slot = begin(&ready).unwrap();
        assert!(ready.finish(Some(2)), "no timer since the last one ended");
        assert_eq!(ready.take(), Some(2));
        let _slot = begin(&ready).unwrap();
        assert!(!ready.finish(Some(3)), "the timer still runs");
        match ready.watch(Instant::now()) {
            Watch::Until(at) => assert!(at > Instant::now()),
            _ => panic!("a fresh one waits its time"),
        }
    }
}
