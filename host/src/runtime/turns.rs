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

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
    /// The server's guest calls, when known.
    server: Option<ServerCalls>,
}

/// The server's slots for guest calls (`max_instances`), to tell a call
/// that is the only one under way.
#[derive(Debug, Clone)]
pub struct ServerCalls {
    slots: Arc<Semaphore>,
    total: usize,
}

impl ServerCalls {
    /// The server's `total` call slots, `slots`.
    pub fn new(slots: Arc<Semaphore>, total: usize) -> Self {
        ServerCalls { slots, total }
    }

    /// Whether at most one call (the asker's) holds a slot now.
    pub fn alone(&self) -> bool {
        self.slots.available_permits() + 1 >= self.total
    }
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
            server: None,
        }
    }

    /// These turns on a server whose calls are `server`.
    pub fn on_server(mut self, server: ServerCalls) -> Self {
        self.server = Some(server);
        self
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
        // A take spends the task's cooperative budget, as a wait on the
        // semaphore does: a guest making file calls back to back still
        // lets the other tasks of its worker run every so often (tokio's
        // budget), not only at its epoch ticks.
        tokio::task::coop::consume_budget().await;
        if self.try_acquire(turn) {
            return Ok(());
        }
        let permit = tokio::time::timeout_at(deadline.into(), self.slots.clone().acquire_owned())
            .await
            .map_err(|_| Trap::Interrupt)?
            .map_err(|_| Trap::Interrupt)?;
        *lock(turn) = Some(permit);
        self.note_peak();
        Ok(())
    }

    /// Take a turn for `turn` now if one is free (or it holds one already);
    /// `false` if it would have to wait. Never ahead of a waiter: a turn
    /// given back goes to the first in the queue, not to the semaphore.
    fn try_acquire(&self, turn: &Turn) -> bool {
        let mut held = lock(turn);
        if held.is_some() {
            return true;
        }
        match self.slots.clone().try_acquire_owned() {
            Ok(permit) => {
                *held = Some(permit);
                drop(held);
                self.note_peak();
                true
            }
            Err(_) => false,
        }
    }

    fn note_peak(&self) {
        let held = self.total - self.slots.available_permits();
        self.peak.fetch_max(held, Ordering::Relaxed);
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
/// server's (or, while an instance is made ready ahead of its call, or a
/// used one waits to be dropped where the next is made, a ready slot). Every piece of blocking host work the call starts keeps a
/// clone, so a call dropped early (its client hung up, its deadline
/// passed) counts against them until that work has ended too: a backend
/// never has more blocking work running than it has instances.
pub type Slots = Arc<Vec<OwnedSemaphorePermit>>;

/// One instance's place on the cores: its backend's turns, its own turn,
/// when its time is up, and the instance slots it holds. The deadline and
/// the slots are the call's: an instance made ready ahead of its call
/// gets them when a call takes it ([`Core::hand_to_call`]).
#[derive(Debug, Clone)]
pub struct Core {
    turns: Turns,
    turn: Turn,
    /// The deadline, as nanoseconds after [`EPOCH`]: read at every entry
    /// into wasm, so an atomic rather than a lock.
    deadline: Arc<AtomicU64>,
    slots: Arc<Mutex<Slots>>,
    /// Set while the instance is made ahead, on its thread of its own
    /// ([`super::ahead`]): it takes none of the backend's turns until a
    /// call takes it, so a lane the kernel has set aside never holds one.
    made_ahead: Arc<AtomicBool>,
}

/// What deadlines are counted from.
static EPOCH: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

fn nanos_after_epoch(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(*EPOCH).as_nanos()).unwrap_or(u64::MAX)
}

impl Core {
    /// An instance of a backend with `turns`, until `deadline`, holding
    /// `slots`; it holds no turn yet.
    pub fn new(turns: Turns, deadline: Instant, slots: Slots) -> Self {
        Core {
            turns,
            turn: Turn::default(),
            deadline: Arc::new(AtomicU64::new(nanos_after_epoch(deadline))),
            slots: Arc::new(Mutex::new(slots)),
            made_ahead: Arc::new(AtomicBool::new(false)),
        }
    }

    /// This instance is being made ahead, off the guest threads: it takes
    /// no turn until [`Core::hand_to_call`].
    pub fn make_ahead(&self) {
        self.made_ahead.store(true, Ordering::Relaxed);
    }

    /// A call takes this instance: from now on it runs until `deadline`
    /// and holds `slots`; the slots it held before are let go (unless
    /// blocking work still keeps them).
    pub fn hand_to_call(&self, deadline: Instant, slots: Slots) {
        self.deadline
            .store(nanos_after_epoch(deadline), Ordering::Relaxed);
        let before = std::mem::replace(&mut *lock(&self.slots), slots);
        drop(before);
        self.made_ahead.store(false, Ordering::Relaxed);
    }

    /// Whether blocking work the call started (a flush, a stream's
    /// write) still runs: it keeps a clone of the slots
    /// ([`Core::keep_slots`]).
    pub fn blocking_work_under_way(&self) -> bool {
        Arc::strong_count(&lock(&self.slots)) > 1
    }

    /// When this instance's time is up.
    pub fn deadline(&self) -> Instant {
        *EPOCH + std::time::Duration::from_nanos(self.deadline.load(Ordering::Relaxed))
    }

    /// Keep this instance's slots taken while the returned value lives:
    /// moved into blocking work that may outlive the call.
    pub fn keep_slots(&self) -> Slots {
        lock(&self.slots).clone()
    }

    /// Hold the turn (waiting for it, until the deadline): for running
    /// wasm, and for host work that occupies a core like wasm does.
    pub async fn hold(&self) -> Result<(), Trap> {
        if self.made_ahead.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.turns.acquire(&self.turn, self.deadline()).await
    }

    /// Take the turn if it is free now (or held already); `false` if it
    /// would have to wait. For host work that cannot wait (a synchronous
    /// call) yet occupies a core like wasm does.
    pub fn try_hold(&self) -> bool {
        self.made_ahead.load(Ordering::Relaxed) || self.turns.try_acquire(&self.turn)
    }

    /// Whether this is the only guest call under way on the server (not
    /// known: no).
    pub fn alone_on_server(&self) -> bool {
        self.turns.server.as_ref().is_some_and(ServerCalls::alone)
    }

    /// Give the turn back (on a call into the host).
    pub fn release(&self) {
        Turns::release(&self.turn);
    }

    /// At an epoch tick: pass the turn on and queue for it again.
    pub fn pass(&self) -> impl Future<Output = ()> + Send + 'static {
        let made_ahead = self.made_ahead.load(Ordering::Relaxed);
        let passed = self.turns.pass(&self.turn, self.deadline());
        async move {
            match made_ahead {
                // Holding no turn: only let the lane's other work run.
                true => tokio::task::yield_now().await,
                false => passed.await,
            }
        }
    }
}

/// The call hook of one instance: its turn follows it in and out of wasm.
///
/// Async, so a guest that finds every turn taken waits on its way back
/// into wasm rather than running on to its next epoch check: a
/// synchronous hook cannot wait, and a function caches its epoch
/// deadline, so a guest let through without a turn could run a whole
/// tick (10 ms) in a loop, and a backend's instances could all do so at
/// once. The common case (a turn free) takes it without a timer
/// (`Turns::try_acquire`).
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

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
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
        let slots = Arc::new(vec![
            own.clone().acquire_owned().await.unwrap(),
            server.clone().acquire_owned().await.unwrap(),
        ]);
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
    async fn a_call_is_alone_only_while_no_other_holds_a_server_slot() {
        let server = Arc::new(Semaphore::new(3));
        let turns = Turns::new(1).on_server(ServerCalls::new(server.clone(), 3));
        let later = Instant::now() + Duration::from_secs(30);
        let mine = Arc::new(vec![server.clone().acquire_owned().await.unwrap()]);
        let core = Core::new(turns, later, mine);
        assert!(core.alone_on_server());
        let other = server.clone().acquire_owned().await.unwrap();
        assert!(!core.alone_on_server(), "another call holds a slot");
        drop(other);
        assert!(core.alone_on_server());
        let unknown = Core::new(Turns::new(1), later, Arc::new(Vec::new()));
        assert!(!unknown.alone_on_server(), "no server known: never alone");
    }

    #[tokio::test]
    async fn an_instance_made_ahead_takes_no_turn_until_a_call_takes_it() {
        let turns = Turns::new(1);
        let later = Instant::now() + Duration::from_secs(30);
        let other = turn();
        turns.acquire(&other, later).await.unwrap();
        let core = Core::new(turns.clone(), later, Arc::new(Vec::new()));
        core.make_ahead();
        // Every turn is held elsewhere, yet it runs.
        core.hold().await.unwrap();
        core.pass().await;
        assert!(lock(&core.turn).is_none(), "it holds none");
        core.hand_to_call(later, Arc::new(Vec::new()));
        let waiting = tokio::spawn({
            let core = core.clone();
            async move { core.hold().await }
        });
        tokio::task::yield_now().await;
        assert!(
            !waiting.is_finished(),
            "taken by a call, it waits for a turn"
        );
        Turns::release(&other);
        waiting.await.unwrap().unwrap();
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

    #[tokio::test]
    async fn a_call_that_takes_a_ready_instance_gives_its_own_deadline_and_slots() {
        let ready = Arc::new(Semaphore::new(1));
        let made_ready = Arc::new(vec![ready.clone().acquire_owned().await.unwrap()]);
        // Made long ago: its own deadline has passed.
        let turns = Turns::new(1);
        let core = Core::new(turns.clone(), Instant::now(), made_ready);
        let own = Arc::new(Semaphore::new(1));
        let later = Instant::now() + Duration::from_secs(30);
        core.hand_to_call(
            later,
            Arc::new(vec![own.clone().acquire_owned().await.unwrap()]),
        );
        assert_eq!(ready.available_permits(), 1, "the ready slot is let go");
        assert_eq!(own.available_permits(), 0, "the call's slot is held");
        assert!(core.deadline() + Duration::from_micros(1) >= later);
        assert!(core.deadline() <= later);
        // Waiting for its turn lasts until the call's deadline, not the
        // passed one it was made with (that would fail at once).
        let other = turn();
        turns.acquire(&other, later).await.unwrap();
        let waiting = tokio::spawn({
            let core = core.clone();
            async move { core.hold().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "it waits for the turn");
        Turns::release(&other);
        waiting.await.unwrap().unwrap();
        drop(core);
        assert_eq!(own.available_permits(), 1);
    }
}
