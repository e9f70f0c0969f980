//! How the cores are shared between backends.
//!
//! Each guest call runs in its request's task on the server's tokio
//! runtime (no task of its own: two thread wake-ups per call, measured at
//! half of an empty call's time); a guest's file I/O runs inline on the
//! worker thread (half a small read's latency, measured). Each backend has
//! at most `max_cores` instances occupying a worker at once ([`Turns`]):
//! running wasm, or in a file call other than `sync` ([`super::fs`]). A
//! guest gives its turn back whenever it calls into the host for anything
//! else (network, git, clocks; a call hook) and at every
//! epoch tick (10 ms), and queues for it again, FIFO, before running more
//! wasm. So a backend whose guests spin until their deadlines, in wasm or
//! in file I/O, keeps at most its share of the workers busy, the other
//! backends' requests always find a free one, and no guest waits for a
//! turn held by a guest that is itself waiting on the network (which, with
//! a remote serving one request at a time, would never finish).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime::{CallHook, CallHookHandler, StoreContextMut, Trap};

/// One backend's turns on the guest cores.
#[derive(Debug, Clone)]
pub struct Turns {
    slots: Arc<Semaphore>,
    total: usize,
    /// The most turns ever held at once.
    peak: Arc<AtomicUsize>,
}

/// The turn one instance holds while it runs wasm (empty while it is in
/// the host or waiting).
pub type Turn = Arc<Mutex<Option<OwnedSemaphorePermit>>>;

impl Turns {
    /// At most `cores` instances of the backend running wasm at once.
    pub fn new(cores: usize) -> Self {
        Turns {
            slots: Arc::new(Semaphore::new(cores.max(1))),
            total: cores.max(1),
            peak: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Give `turn` back, if it is held.
    pub fn release(turn: &Turn) {
        drop(lock(turn).take());
    }

    /// Wait (until `deadline`) for a turn; `Err` when the deadline passes.
    pub async fn acquire(&self, turn: &Turn, deadline: Instant) -> Result<(), Trap> {
        if lock(turn).is_some() {
            return Ok(());
        }
        let permit = tokio::time::timeout_at(deadline.into(), self.slots.clone().acquire_owned())
            .await
            .map_err(|_| Trap::Interrupt)?
            .map_err(|_| Trap::Interrupt)?;
        *lock(turn) = Some(permit);
        let held = self.total - self.slots.available_permits();
        self.peak.fetch_max(held, Ordering::Relaxed);
        Ok(())
    }

    /// At an epoch tick: give `turn` back, let the executor run others, and
    /// queue for it again. The returned future completes when the guest may
    /// continue (or at `deadline`, when the next tick interrupts it).
    pub fn pass(
        &self,
        turn: &Turn,
        deadline: Instant,
    ) -> impl Future<Output = ()> + Send + 'static {
        Turns::release(turn);
        let (turns, turn) = (self.clone(), turn.clone());
        async move {
            tokio::task::yield_now().await;
            let _ = turns.acquire(&turn, deadline).await;
        }
    }
}

impl crate::metrics::Usage for Turns {
    fn used(&self) -> u64 {
        self.peak.load(Ordering::Relaxed) as u64
    }
    fn limit(&self) -> u64 {
        self.total as u64
    }
}

/// The instance slots one call holds: its backend's share and the
/// server's. Every piece of blocking host work the call starts keeps a
/// clone, so a call dropped early (its client hung up, its deadline
/// passed) counts against both until that work has ended too: a backend
/// never has more blocking work running than it has instances.
pub type Slots = Arc<(OwnedSemaphorePermit, OwnedSemaphorePermit)>;

/// One instance's place on the cores: its backend's turns, its own turn,
/// when its time is up, and the instance slots it holds.
#[derive(Debug, Clone)]
pub struct Core {
    turns: Turns,
    turn: Turn,
    deadline: Instant,
    slots: Slots,
}

impl Core {
    /// An instance of a backend with `turns`, until `deadline`, holding
    /// `slots`; it holds no turn yet.
    pub fn new(turns: Turns, deadline: Instant, slots: Slots) -> Self {
        Core {
            turns,
            turn: Turn::default(),
            deadline,
            slots,
        }
    }

    /// Keep this instance's slots taken while the returned value lives:
    /// moved into blocking work that may outlive the call.
    pub fn keep_slots(&self) -> Slots {
        self.slots.clone()
    }

    /// Hold the turn (waiting for it, until the deadline): for running
    /// wasm, and for host work that occupies a core like wasm does.
    pub async fn hold(&self) -> Result<(), Trap> {
        self.turns.acquire(&self.turn, self.deadline).await
    }

    /// Give the turn back (on a call into the host).
    pub fn release(&self) {
        Turns::release(&self.turn);
    }

    /// At an epoch tick: pass the turn on and queue for it again.
    pub fn pass(&self) -> impl Future<Output = ()> + Send + 'static {
        self.turns.pass(&self.turn, self.deadline)
    }
}

/// The call hook of one instance: its turn follows it in and out of wasm.
pub struct TurnHook(pub Core);

#[wasmtime_wasi::async_trait]
impl<T: Send> CallHookHandler<T> for TurnHook {
    async fn handle_call_event(
        &self,
        _store: StoreContextMut<'_, T>,
        hook: CallHook,
    ) -> wasmtime::Result<()> {
        if hook.entering_host() {
            self.0.release();
        } else {
            self.0.hold().await?;
        }
        Ok(())
    }
}

fn lock(turn: &Turn) -> std::sync::MutexGuard<'_, Option<OwnedSemaphorePermit>> {
    turn.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn turn() -> Turn {
        Arc::new(Mutex::new(None))
    }

    #[tokio::test]
    async fn a_backend_runs_at_most_its_cores_and_takes_turns() {
        let turns = Turns::new(1);
        let later = Instant::now() + Duration::from_secs(30);
        let (first, second) = (turn(), turn());
        turns.acquire(&first, later).await.unwrap();
        // A second instance of the backend waits for the first one's turn.
        let waiting = tokio::spawn({
            let (turns, second) = (turns.clone(), second.clone());
            async move { turns.acquire(&second, later).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        // The first passes at its tick: the second runs; the first gets
        // its turn back only when the second gives it up (here: it calls
        // into the host).
        let back = tokio::spawn(turns.pass(&first, later));
        waiting.await.unwrap().unwrap();
        tokio::task::yield_now().await;
        assert!(!back.is_finished());
        Turns::release(&second);
        back.await.unwrap();
        assert!(lock(&first).is_some());
    }

    #[tokio::test]
    async fn blocking_work_keeps_the_instance_slots_after_the_call_is_gone() {
        let (own, server) = (Arc::new(Semaphore::new(1)), Arc::new(Semaphore::new(1)));
        let slots = Arc::new((
            own.clone().acquire_owned().await.unwrap(),
            server.clone().acquire_owned().await.unwrap(),
        ));
        let later = Instant::now() + Duration::from_secs(30);
        let core = Core::new(Turns::new(1), later, slots);
        let sync_under_way = core.keep_slots();
        // The call is dropped (its client hung up): the work it started
        // still counts against both.
        drop(core);
        assert_eq!(
            (own.available_permits(), server.available_permits()),
            (0, 0)
        );
        drop(sync_under_way);
        assert_eq!(
            (own.available_permits(), server.available_permits()),
            (1, 1)
        );
    }

    #[tokio::test]
    async fn waiting_for_a_turn_ends_at_the_deadline() {
        let turns = Turns::new(1);
        let (holder, late) = (turn(), turn());
        turns
            .acquire(&holder, Instant::now() + Duration::from_secs(30))
            .await
            .unwrap();
        let result = turns
            .acquire(&late, Instant::now() + Duration::from_millis(50))
            .await;
        assert_eq!(result, Err(Trap::Interrupt));
    }
}
