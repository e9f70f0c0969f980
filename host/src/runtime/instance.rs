//! The store of one instance, and the instance each backend keeps ready
//! for its next call.
//!
//! Making an instance (a store with its WASI context, then instantiating
//! the guest) and dropping one (resetting its memory slot) were most of an
//! empty call's time (`docs/benchmarks.md`, "Where a request's time
//! goes"). So while a backend is in use (its calls come less than
//! [`READY_IDLE`] apart) and no other call of it is under way (under load
//! the cores are busy already: made ahead, an instance saves its call
//! nothing), the instance for its next call is made as a call ends, on a
//! thread of the lowest priority ([`super::ahead`]), where the used store
//! is dropped first (unless it grew big: that one gives its memory back
//! before its call answers); a call that finds one ready only hands it
//! its deadline and slots. Each instance serves one request: a ready
//! instance has run no call, and the one a call used is dropped when its
//! request ends (the request's later calls of the backend run in it,
//! [`KeptInstance`]), never used by another request.
//!
//! The bounds: a backend keeps at most one instance ready; the server at
//! most [`super::ready::ready_instances`] at once (its pool has that many slots more than
//! `max_instances`, so a ready instance never takes a running call's
//! slot); one nobody takes within [`READY_IDLE`] is dropped, so an idle
//! backend costs only its config again; and a guest that starts with more
//! than [`READY_MAX_MEMORY_BYTES`] of memory is never kept ready. A ready
//! instance's memory counts against its backend's and the server's
//! budgets like a running one's. A backend that is not in use has none (a
//! backend's load, with its config checked, is not a use).

use super::limits::{MemoryLimiter, Refusal};
use super::ready::Watch;
use super::sandbox::{
    STDERR_CAPACITY, Sandbox, http_ctx, limit_store, resource_table, wasi_builder,
};
use super::shared::{Prepared, Shared};
use super::turns::{Core, Slots, TurnHook};
use super::{GUEST_DATA_DIR, OUTER_GRACE, outbound};
use crate::backend::{StorageError, StorageResult};
use futures_util::FutureExt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};
use tokio::sync::OwnedSemaphorePermit;
use wasmtime::{Store, UpdateDeadline};
use wasmtime_wasi::FsPerms;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;

/// How long a ready instance waits for a call before it is dropped.
pub const READY_IDLE: Duration = Duration::from_secs(10);

/// The most linear memory an instance may start with and still be kept
/// ready (a Rust guest starts with about 1.1 MiB, the `local` guest with
/// 2 MiB: room for a request's heap, so its memory never grows): what
/// ready instances hold of the memory budgets stays small, whatever a
/// guest declares. A guest that starts bigger is made on each call's
/// path, as before.
pub const READY_MAX_MEMORY_BYTES: u64 = 5 << 20;

/// What a call leaves behind for the backend's next one.
#[derive(Clone, Copy)]
pub(super) enum Next {
    /// Make its instance now, if the backend is in use.
    MakeReady,
    /// Nothing (loading a backend is not using it).
    Nothing,
}

/// Where a call's instance comes from.
pub(super) enum Source {
    /// The instance the request's last call of this backend used, with
    /// the slots it held ([`KeptInstance`]); boxed, as the bindings are
    /// large beside the slots.
    Kept(Box<Prepared>),
    /// The backend's ready one, or one made now, holding these slots.
    Fresh(Slots),
}

/// The instance a call used, kept for the next call of the same request
/// ([`crate::request`]): one instance per request, so a write's
/// head and its conditional write cost one instance, not two. It keeps
/// its call's slots (a request holds at most one kept thing, and gives it
/// back before it waits for other slots, so no request holds one slot
/// while waiting for another). Only a call that ended cleanly and alone is
/// kept: it answered, within its deadline, refused nothing, left no trace
/// ([`Sandbox::left_a_trace`]: a later fault's report shows only its own
/// call's), stayed
/// small ([`READY_MAX_MEMORY_BYTES`]), and left no blocking work running
/// and no outgoing request waiting for its answer, even one the guest
/// sent and never awaited (what they set or hold must not reach the next
/// call; [`outbound::Requests`] counts a request from the moment it is
/// handed over; an answer's body still streaming goes on, within the same
/// request and grant, until the instance is dropped). Given back as the
/// request
/// ends (or before it waits on something slow,
/// [`crate::request::give_back`]), as any used instance is: dropped on
/// the lane, the next one made there.
pub(super) struct KeptInstance {
    shared: Arc<Shared>,
    prepared: Option<Prepared>,
}

impl KeptInstance {
    /// Keep `prepared`, which `shared`'s call just used, if it may serve
    /// the request's next call; else give it back.
    pub(super) fn keep_or_give_back(
        shared: &Arc<Shared>,
        prepared: Prepared,
        deadline: Instant,
        next: Next,
    ) {
        let sandbox = prepared.0.data();
        let clean = Instant::now() < deadline
            && sandbox.limiter.refused().is_none()
            && sandbox.limiter.charged() <= READY_MAX_MEMORY_BYTES
            && !sandbox.left_a_trace()
            && !sandbox.core.blocking_work_under_way()
            && sandbox.outbound.requests.none_under_way()
            && !shared.tasks.is_closed();
        let prepared = match clean {
            true => {
                let kept = KeptInstance {
                    shared: shared.clone(),
                    prepared: Some(prepared),
                };
                match crate::request::keep(kept) {
                    Ok(()) => return,
                    Err(mut kept) => kept.prepared.take(),
                }
            }
            false => Some(prepared),
        };
        if let Some((store, _)) = prepared {
            shared.after_call(store, next);
        }
    }

    /// What this request kept for `shared`'s next call. One kept for
    /// another backend is given back.
    pub(super) fn take_for(shared: &Arc<Shared>) -> Option<Prepared> {
        let mut kept = crate::request::take::<KeptInstance>()?;
        match Arc::ptr_eq(&kept.shared, shared) {
            true => kept.prepared.take(),
            false => None,
        }
    }
}

impl Drop for KeptInstance {
    fn drop(&mut self) {
        if let Some((store, _)) = self.prepared.take() {
            self.shared.after_call(store, Next::MakeReady);
        }
    }
}

/// Hand `prepared` to a call that runs until `deadline` holding `slots`,
/// with `memory_bytes` of linear memory at most.
pub(super) fn hand_to_call(
    prepared: Prepared,
    deadline: Instant,
    slots: Slots,
    memory_bytes: u64,
) -> Prepared {
    let (mut store, guest) = prepared;
    store.data().core.hand_to_call(deadline, slots);
    store.data_mut().limiter.set_limit(memory_bytes);
    store.set_epoch_deadline(1);
    (store, guest)
}

/// The ready slot an instance is made in: free, or still held by the
/// store of the call that ended.
enum Slot {
    Free(OwnedSemaphorePermit),
    HeldBy(Store<Sandbox>),
}

impl Slot {
    /// The slot, once the store holding it is dropped (`None` if something
    /// else still holds it: not blocking work the call started, which
    /// keeps the call's own slots, those `after_call` replaced).
    fn free(self) -> Option<OwnedSemaphorePermit> {
        match self {
            Slot::Free(permit) => Some(permit),
            Slot::HeldBy(store) => {
                let slots = store.data().core.keep_slots();
                drop(store);
                Arc::try_unwrap(slots).ok()?.pop()
            }
        }
    }
}

/// Drop `store`, letting its instance slots go only after its pool slot
/// is back, whatever order wasmtime drops a store's parts in (today the
/// call hook's and the epoch callback's clones of `Core` outlive the
/// instance; this does not rely on it): a call that took a slot freed
/// first could find the pool full.
fn drop_store(store: Store<Sandbox>) {
    let slots = store.data().core.keep_slots();
    drop(store);
    drop(slots);
}

impl Shared {
    /// A call is done with `used`: drop it and make the instance for the
    /// next call, off the request's path (or drop it here if no instance
    /// is to be made).
    pub(super) fn after_call(self: &Arc<Self>, used: Store<Sandbox>, next: Next) {
        let permit = match next {
            // A server that is stopping serves no next call; and while
            // other calls of the backend are under way, the cores are
            // busy with it already: made ahead, the instance would cost
            // as much and save its call nothing (measured: 10 % less
            // throughput under load), so the next call makes its own.
            Next::MakeReady => {
                let now_worth_it = !self.tasks.is_closed() && !self.others_under_way();
                self.ready.begin(Instant::now(), now_worth_it)
            }
            Next::Nothing => None,
        };
        let Some(permit) = permit else {
            return drop_store(used);
        };
        // A store that grew big (its memory, or what the host holds for
        // it: a state read through the host's copy) gives it back before
        // the call answers, so what the budgets and the server hold stays
        // bounded by what is under way. A small one is reset on the lane,
        // holding the ready slot in place of its call's slots (those go
        // now: a starved lane never holds up a call), and gives that slot
        // to the instance made next.
        let slot = match used.data().limiter.charged() > READY_MAX_MEMORY_BYTES {
            true => {
                drop_store(used);
                Slot::Free(permit)
            }
            false => {
                used.data()
                    .core
                    .hand_to_call(Instant::now(), Arc::new(vec![permit]));
                Slot::HeldBy(used)
            }
        };
        let shared = self.clone();
        // Made at the lowest priority, so it never takes a core from the
        // answer on its way to the client (`super::ahead`).
        super::ahead::spawn(async move {
            // Whatever happens here (the used store's drop panicking too),
            // `finish` is called: else the backend's ready one stays
            // `Preparing`, and none is made for it again.
            let made = std::panic::AssertUnwindSafe(async {
                // `None`: something still holds the slot (nothing started
                // since the call ended takes it, so this is not expected).
                let permit = slot.free()?;
                // A guest's start functions run as it is instantiated and
                // may wait in a host call no epoch reaches: cut off as a
                // call is.
                tokio::time::timeout(shared.limits.timeout + OUTER_GRACE, shared.prepare(permit))
                    .await
                    .ok()
                    .flatten()
            })
            .catch_unwind()
            .await
            .ok()
            .flatten();
            if shared.ready.finish(made) {
                shared.watch_ready();
            }
        });
    }

    /// Whether calls of this backend other than the one ending hold its
    /// instance slots.
    fn others_under_way(&self) -> bool {
        self.own_instances.available_permits() + 1 < self.instances_per_backend
    }

    /// Drop the ready instance when no call took it within
    /// [`READY_IDLE`]: one timer per backend, ending when none is ready.
    fn watch_ready(self: Arc<Self>) {
        // Hold no reference while waiting: a reload drops the backend and
        // its ready instance at once.
        let backend = Arc::downgrade(&self);
        drop(self);
        tokio::spawn(async move {
            loop {
                let Some(shared) = backend.upgrade() else {
                    return;
                };
                match shared.ready.watch(Instant::now()) {
                    Watch::Expired((store, _)) => return drop_store(store),
                    Watch::Done => return,
                    Watch::Until(at) => {
                        drop(shared);
                        tokio::time::sleep_until(at.into()).await;
                    }
                }
            }
        });
    }

    /// Make an instance holding the ready slot `permit`. `None` if it
    /// cannot be made: the next call makes its own and reports why.
    async fn prepare(&self, permit: OwnedSemaphorePermit) -> Option<Prepared> {
        let deadline = Instant::now() + self.limits.timeout;
        let mut store = self.new_store(deadline, Arc::new(vec![permit])).ok()?;
        store.data().core.make_ahead();
        // Held to the cap of a ready instance while it is made: a start
        // function cannot take more of the budgets than that while no
        // call is under way.
        store
            .data_mut()
            .limiter
            .set_limit(self.limits.memory_bytes.min(READY_MAX_MEMORY_BYTES));
        let started = Instant::now();
        let instantiated = self.pre.instantiate(&mut store).await;
        self.metrics.instantiated(&self.name, started.elapsed());
        let limiter = &store.data().limiter;
        if limiter.refused() == Some(Refusal::Instance) {
            // It starts bigger than a ready instance may be.
            self.ready.never_again();
            return None;
        }
        // A refusal by a budget (busy now) or a failure: the next call
        // makes its own and reports what goes wrong.
        let guest = instantiated.ok()?;
        if limiter.refused().is_some() {
            return None;
        }
        // A start function that did something a call would be blamed for
        // (wrote to stderr, logged, met the disk quota): this guest's
        // instances are made on each call's path, where that is the
        // call's own doing.
        if store.data().left_a_trace() {
            self.ready.never_again();
            return None;
        }
        Some((store, guest))
    }

    /// A store for one request: fresh WASI context granting only this
    /// backend's directory, memory limiter, epoch deadline, and a turn on
    /// the cores while it runs wasm.
    pub(super) fn new_store(
        &self,
        deadline: Instant,
        slots: Slots,
    ) -> StorageResult<Store<Sandbox>> {
        let core = Core::new(self.turns.clone(), deadline, slots);
        let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
        let mut wasi = wasi_builder();
        // File operations on a local disk are short; running them inline
        // (on the guest threads, never the HTTP ones) instead of on a
        // blocking pool halves a small read's latency.
        wasi.allow_blocking_current_thread(super::fs::FILE_IO_INLINE)
            .stderr(stderr.clone());
        if let Some(dir) = &self.dir {
            wasi.preopened_dir(dir, GUEST_DATA_DIR, FsPerms::ReadWrite)
                .map_err(|e| {
                    StorageError::Unavailable(format!(
                        "cannot open the backend's directory {}: {e}",
                        dir.display()
                    ))
                })?;
        }
        let sandbox = Sandbox {
            wasi: wasi.build(),
            table: resource_table(),
            http: http_ctx(),
            outbound: outbound::Outbound {
                policy: self.outbound.clone(),
                backend: self.name.clone(),
                aws: self.aws.clone(),
                azure: self.azure.clone(),
                gcp: self.gcp.clone(),
                max_body_bytes: self.max_lift_bytes,
                requests: outbound::Requests::new(),
                budgets: [self.memory.clone(), self.server_memory.clone()],
                work: self.host_work.clone(),
            },
            limiter: MemoryLimiter::new(
                self.limits.memory_bytes,
                self.memory.clone(),
                self.server_memory.clone(),
            ),
            quota: self.quota.clone(),
            quota_refused: Arc::new(AtomicBool::new(false)),
            open_files: super::quota::InstanceFiles::new(self.quota.clone()),
            stderr,
            backend: self.name.clone(),
            config: self.config.clone(),
            log_lines: 0,
            git: self.git.clone(),
            postgres: self.postgres.clone(),
            secrets: self.secrets.clone(),
            core: core.clone(),
        };
        let mut store = Store::new(&self.engine, sandbox);
        store.limiter(|s| &mut s.limiter);
        limit_store(&mut store, self.max_lift_bytes);
        // The guest holds a turn on the cores only while it runs wasm: the
        // call hook takes it on the way in and gives it back on every call
        // into the host, and every epoch tick passes it on (so a spinning
        // guest shares the cores with the rest of its backend, and other
        // backends always find one) until its wall-clock deadline, when it
        // is interrupted.
        store.call_hook_async(TurnHook(core.clone()));
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            Ok(if Instant::now() >= core.deadline() {
                UpdateDeadline::Interrupt
            } else {
                UpdateDeadline::YieldCustom(1, Box::pin(core.pass()))
            })
        });
        Ok(store)
    }
}
