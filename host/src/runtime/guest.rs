//! One backend served by a guest component: every request in a fresh
//! instance on the guest threads, within the backend's limits, with every
//! way it can end turned into a [`StorageResult`].

use super::OUTER_GRACE;
use super::chunks::StateSink;
use super::instance::{KeptInstance, Next, Source, hand_to_call};
use super::limits::{Budget, Refusal};
use super::quota::DirQuota;
use super::sandbox::Sandbox;
use super::shared::Shared;
use super::turns::Turns;
use super::versions::{Answer, Guest};
use crate::backend::{Diagnostic, LockInfo, Storage, StorageError, StorageResult};
use crate::metrics::Fault;
use futures_util::FutureExt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;
use wasmtime::{Store, Trap};

mod conditional;

/// Most bytes a guest may hand the host in one workspace list: far more
/// names than any backend has, far less than the memory a flood of huge
/// lists would cost.
const MAX_LIST_BYTES: usize = 16 << 20;

/// A future returned by one guest call, borrowing the instance and store.
pub type GuestCall<'a, T> = Pin<Box<dyn Future<Output = Answer<T>> + Send + 'a>>;

/// One backend served by a guest component. Cheap to share; every request
/// runs in a fresh instance (its calls of the backend in the same one).
#[derive(Clone)]
pub struct GuestBackend {
    pub(super) shared: Arc<Shared>,
    /// What the loader found out about it; limits' use is added when asked.
    pub(super) description: Arc<crate::backend::Description>,
}

impl GuestBackend {
    /// The most linear memory one instance used since this was last
    /// called (or since the backend loaded).
    pub fn take_memory_peak(&self) -> u64 {
        self.shared.memory_peak.swap(0, Ordering::Relaxed)
    }

    /// The backend's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// sha256 of the guest component serving this backend.
    pub fn sha256(&self) -> &str {
        &self.shared.sha256
    }

    /// Its share of the guest memory budget.
    pub fn memory_budget(&self) -> &Budget {
        &self.shared.memory
    }

    /// The contract version its guest was built for.
    pub fn contract(&self) -> crate::contract::ContractVersion {
        self.shared.contract
    }

    /// Set what the console shows of it (the loader knows its origin).
    pub fn described(mut self, description: crate::backend::Description) -> Self {
        self.description = Arc::new(description);
        self
    }

    /// Whether an instance is ready for its next call (for benchmarks).
    pub fn has_ready_instance(&self) -> bool {
        self.shared.ready.is_ready()
    }

    /// Its turns on the guest threads.
    pub fn turns(&self) -> &Turns {
        &self.shared.turns
    }

    /// Its directory's disk quota, if it has one.
    pub fn disk_quota(&self) -> Option<&Arc<DirQuota>> {
        self.shared.quota.as_ref()
    }

    /// Run one call in a fresh instance (or the one its request's last
    /// call used, [`KeptInstance`]), lifting at most `max_lift` bytes
    /// out of it; the answer comes by the deadline (plus a grace for a
    /// guest stuck in a host call) whatever the guest does.
    ///
    /// The call runs in the caller's task: no task of its own, so no
    /// thread wake-ups on the way in and out. That is safe because nothing
    /// here can hold a worker past the deadline: wasm is interrupted at an
    /// epoch tick, every host call the guest awaits (network, git, a turn,
    /// `sync` on the blocking pool) is dropped with this future, and the
    /// file calls it makes inline are short (only regular files and
    /// directories can be opened, see [`super::fs`]). The one exception:
    /// the server's only guest call flushes inline, on a runtime with
    /// another worker, and a disk slower than the deadline holds that
    /// worker until it answers (`fs::sync`). A change whose
    /// client hangs up still completes: the protocol runs every change as a
    /// task of its own ([`crate::protocol::App::change`]).
    async fn run<T: Send>(
        &self,
        max_lift: usize,
        call: impl for<'a> FnOnce(&'a Guest, &'a mut Store<Sandbox>) -> GuestCall<'a, T> + Send,
    ) -> StorageResult<T> {
        self.run_then(max_lift, Next::MakeReady, call).await
    }

    /// [`GuestBackend::run`], then prepare for the `next` call.
    async fn run_then<T: Send>(
        &self,
        max_lift: usize,
        next: Next,
        call: impl for<'a> FnOnce(&'a Guest, &'a mut Store<Sandbox>) -> GuestCall<'a, T> + Send,
    ) -> StorageResult<T> {
        let shared = &self.shared;
        let _under_way = crate::request::call_under_way();
        // The instance this request's last call used holds its slots;
        // else (one kept for another backend given back first) wait for
        // slots, which is not the guest's time.
        let source = match KeptInstance::take_for(shared) {
            Some(kept) => Source::Kept(Box::new(kept)),
            None => {
                let shutting_down = |_| StorageError::Unavailable("server is shutting down".into());
                let own = shared
                    .own_instances
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(shutting_down)?;
                let slot = shared
                    .instances
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(shutting_down)?;
                Source::Fresh(Arc::new(vec![own, slot]))
            }
        };
        // Tracked, so a server that stops waits for the calls under way.
        let called = std::panic::AssertUnwindSafe(shared.call(max_lift, call, source, next));
        let called = shared.tasks.track_future(called.catch_unwind());
        match tokio::time::timeout(shared.limits.timeout + OUTER_GRACE, called).await {
            Ok(Ok(result)) => result,
            Ok(Err(panic)) => {
                shared.metrics.fault(&shared.name, Fault::Trap);
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Err(StorageError::GuestTrapped {
                    reason: format!("the host's call into the guest failed: {what}"),
                    detail: None,
                })
            }
            Err(_elapsed) => {
                shared.metrics.fault(&shared.name, Fault::Timeout);
                Err(StorageError::GuestTimedOut(shared.limits.timeout))
            }
        }
    }

    /// Ask the guest to check its configuration (the emptiest call there
    /// is, which is why benchmarks time it).
    pub async fn validate_config(&self) -> StorageResult<Vec<Diagnostic>> {
        self.validate_then(Next::MakeReady).await
    }

    /// [`GuestBackend::validate_config`] as a backend loads: loading is
    /// not using it, so no instance is made ready for it.
    pub(super) async fn validate_on_load(&self) -> StorageResult<Vec<Diagnostic>> {
        self.validate_then(Next::Nothing).await
    }

    async fn validate_then(&self, next: Next) -> StorageResult<Vec<Diagnostic>> {
        let lift = self.shared.max_lift_bytes;
        self.run_then(lift, next, |g, s| {
            Box::pin(async move {
                let diagnostics = g.validate(s).await?;
                Ok(Ok(diagnostics.into_iter().map(Into::into).collect()))
            })
        })
        .await
    }
}

impl Shared {
    /// Take the request's kept instance, the ready one, or make one; take
    /// a turn on the cores, call, classify the outcome; then keep the
    /// instance for the request's next call, or make the next call's.
    async fn call<T>(
        self: &Arc<Self>,
        max_lift: usize,
        call: impl for<'a> FnOnce(&'a Guest, &'a mut Store<Sandbox>) -> GuestCall<'a, T>,
        source: Source,
        next: Next,
    ) -> StorageResult<T> {
        let deadline = Instant::now() + self.limits.timeout;
        let memory = self.limits.memory_bytes;
        let (mut store, instantiated) = match source {
            Source::Kept(kept) => {
                let slots = kept.0.data().core.keep_slots();
                let (store, guest) = hand_to_call(*kept, deadline, slots, memory);
                (store, Ok(guest))
            }
            Source::Fresh(slots) => match self.ready.take() {
                Some(ready) => {
                    self.metrics.called_on_ready(&self.name);
                    let (store, guest) = hand_to_call(ready, deadline, slots, memory);
                    (store, Ok(guest))
                }
                None => {
                    let mut store = self.new_store(deadline, slots)?;
                    let started = Instant::now();
                    let guest = self.pre.instantiate(&mut store).await;
                    self.metrics.instantiated(&self.name, started.elapsed());
                    (store, guest)
                }
            },
        };
        store.set_hostcall_fuel(max_lift);
        let (outcome, guest) = match instantiated {
            Ok(guest) => {
                let called = Instant::now();
                let result = call(&guest, &mut store).await;
                self.metrics.called(&self.name, called.elapsed());
                (result, Some(guest))
            }
            Err(error) => (Err(error), None),
        };
        let answered = matches!(outcome, Ok(Ok(_)));
        let answer = self.classify(outcome, &store, deadline, max_lift);
        match guest {
            Some(guest) if answered => {
                KeptInstance::keep_or_give_back(self, (store, guest), deadline, next)
            }
            _ => self.after_call(store, next),
        }
        answer
    }

    /// What a call's `outcome` means for its client.
    fn classify<T>(
        &self,
        outcome: Answer<T>,
        store: &Store<Sandbox>,
        deadline: Instant,
        max_lift: usize,
    ) -> StorageResult<T> {
        let sandbox = store.data();
        self.memory_peak
            .fetch_max(sandbox.limiter.used(), Ordering::Relaxed);
        match outcome {
            Ok(Ok(value)) => Ok(value),
            // Whatever went wrong once its time was up (a host call cut
            // short at the deadline, say), the guest ran out of time.
            Ok(Err(_)) | Err(_)
                if Instant::now() >= deadline && sandbox.limiter.refused().is_none() =>
            {
                self.metrics.fault(&self.name, Fault::Timeout);
                Err(StorageError::GuestTimedOut(self.limits.timeout))
            }
            // The guest's own error, but caused by a cap the host imposed.
            Ok(Err(_)) if sandbox.quota_refused.load(Ordering::Relaxed) => Err(self.no_space()),
            Ok(Err(e)) => match sandbox.limiter.refused() {
                Some(refusal @ (Refusal::Backend | Refusal::Server)) => {
                    Err(self.over_budget(refusal))
                }
                _ => Err(StorageError::from(e)),
            },
            Err(error) => Err(self.fault(error, sandbox, max_lift)),
        }
    }

    fn no_space(&self) -> StorageError {
        let limit = self.quota.as_ref().map_or(0, |q| q.limit());
        self.metrics.disk_quota_refused(&self.name);
        StorageError::NoSpace(format!(
            "its directory reached its disk quota of {} MiB (disk_quota_mib)",
            limit >> 20
        ))
    }

    fn over_budget(&self, refusal: Refusal) -> StorageError {
        self.metrics
            .memory_refused(&self.name, refusal == Refusal::Server);
        StorageError::Overloaded(match refusal {
            Refusal::Server => format!(
                "the server's guest memory budget of {} MiB (max_guest_memory_mib) is in use by other requests",
                self.server_memory.bytes() >> 20
            ),
            _ => format!(
                "this backend's share of guest memory, {} MiB (memory_budget_mib), is in use by its other requests",
                self.memory.bytes() >> 20
            ),
        })
    }

    /// Classify a failed call: a cap the host imposed, the deadline, a
    /// crash with the guest's own panic message when it left one.
    fn fault(&self, error: wasmtime::Error, sandbox: &Sandbox, max_lift: usize) -> StorageError {
        match sandbox.limiter.refused() {
            Some(Refusal::Instance) => {
                self.metrics.fault(&self.name, Fault::OutOfMemory);
                return StorageError::GuestOutOfMemory(self.limits.memory_bytes);
            }
            Some(refusal) => return self.over_budget(refusal),
            None => {}
        }
        if sandbox.quota_refused.load(Ordering::Relaxed) {
            return self.no_space();
        }
        if matches!(error.downcast_ref::<Trap>(), Some(Trap::Interrupt)) {
            self.metrics.fault(&self.name, Fault::Timeout);
            return StorageError::GuestTimedOut(self.limits.timeout);
        }
        self.metrics.fault(&self.name, Fault::Trap);
        // wasmtime refuses to lift more than the store's hostcall fuel and
        // says so only in its message.
        if error
            .chain()
            .any(|e| e.to_string().contains("too much data is being copied"))
        {
            return StorageError::Internal(format!(
                "the guest returned more than the {} MiB the host accepts from one call",
                max_lift >> 20
            ));
        }
        let (reason, detail) = super::crash::explain(&error, &sandbox.stderr.contents());
        tracing::warn!(
            backend = %self.name,
            guest_stderr = detail.as_deref().unwrap_or(""),
            "guest crashed: {reason}; trap: {error:#}"
        );
        StorageError::GuestTrapped { reason, detail }
    }
}

impl GuestBackend {
    /// Read the state (or version `id` of it) into `sink` in a fresh
    /// instance; `None` when there is none.
    async fn read_into(
        &self,
        workspace: &str,
        version: Option<&str>,
        sink: StateSink,
    ) -> StorageResult<Option<StateSink>> {
        let ws = workspace.to_owned();
        let id = version.map(str::to_owned);
        self.run(self.shared.max_lift_bytes, move |g, s| {
            Box::pin(async move {
                let lent = s.data_mut().table.push(sink)?;
                let found = match &id {
                    Some(id) => g.read_version(s, &ws, id, &lent).await?,
                    None => g.read(s, &ws, &lent).await?,
                };
                let sink = s.data_mut().table.delete(lent)?;
                // Whatever the guest answers (a state, or none): what the
                // host holds is partial.
                if sink.failed() && found.is_ok() {
                    return Ok(Err(super::body::copy_failed("read")));
                }
                Ok(found.map(|found| found.then_some(sink)))
            })
        })
        .await
    }

    /// Read everything into memory, refusing more than the host accepts.
    async fn read_whole(
        &self,
        workspace: &str,
        version: Option<&str>,
    ) -> StorageResult<Option<Vec<u8>>> {
        let limit = self.shared.max_lift_bytes;
        let Some(sink) = self
            .read_into(workspace, version, StateSink::collect(limit))
            .await?
        else {
            return Ok(None);
        };
        match sink.into_bytes() {
            (_, true) => Err(StorageError::Internal(format!(
                "the guest returned more than the {} MiB the host accepts from one call",
                limit >> 20
            ))),
            (bytes, false) => Ok(Some(bytes)),
        }
    }
}

impl Storage for GuestBackend {
    fn host_work(&self) -> crate::work::HostWork {
        self.shared.host_work.clone()
    }

    fn describe(&self) -> Option<crate::backend::Description> {
        let shared = &self.shared;
        let mib = |bytes: u64| format!("{} MiB", bytes >> 20);
        let mut description = (*self.description).clone();
        let busy = shared.instances_per_backend - shared.own_instances.available_permits();
        description.limits.extend([
            ("memory per request".into(), mib(shared.limits.memory_bytes)),
            (
                "time per request".into(),
                format!("{} ms", shared.limits.timeout.as_millis()),
            ),
            (
                "instances in use".into(),
                format!("{busy} of {}", shared.instances_per_backend),
            ),
            (
                "guest memory in use".into(),
                format!(
                    "{} of {}",
                    mib(shared.memory.used_bytes()),
                    mib(shared.memory.bytes())
                ),
            ),
        ]);
        if let Some(quota) = &shared.quota {
            description.limits.push((
                "disk in use".into(),
                format!("{} of {}", mib(quota.used()), mib(quota.limit())),
            ));
        }
        Some(description)
    }

    async fn read(&self, workspace: &str) -> StorageResult<Option<Vec<u8>>> {
        self.read_whole(workspace, None).await
    }

    async fn read_prefix(&self, workspace: &str, max: usize) -> StorageResult<Option<Vec<u8>>> {
        let sink = self
            .read_into(workspace, None, StateSink::prefix(max))
            .await?;
        Ok(sink.map(|s| s.into_bytes().0))
    }

    async fn holds(&self, workspace: &str, state: &bytes::Bytes) -> StorageResult<bool> {
        let sink = self
            .read_into(workspace, None, StateSink::compare(state.clone()))
            .await?;
        Ok(sink.is_some_and(|s| s.matched()))
    }

    fn conditional_writes(&self) -> bool {
        self.has_conditional_calls()
    }

    async fn head(&self, workspace: &str) -> StorageResult<Option<crate::backend::Head>> {
        if !self.has_conditional_calls() {
            // What the trait says of a storage without a head.
            return Err(StorageError::Internal(format!(
                "this backend's guest answers no head (built for contract {}, before 0.3.0)",
                self.shared.contract
            )));
        }
        self.head_in_guest(workspace).await
    }

    async fn write(
        &self,
        workspace: &str,
        state: bytes::Bytes,
        lock_id: Option<&str>,
    ) -> StorageResult<()> {
        let any = crate::backend::Expect::Any;
        match self.write_in_guest(workspace, state, lock_id, any).await? {
            true => Ok(()),
            false => Err(StorageError::Internal(
                "the guest refused an unconditional write (expect any) as not expected: a bug in                  the guest"
                    .into(),
            )),
        }
    }

    async fn write_if(
        &self,
        workspace: &str,
        state: bytes::Bytes,
        lock_id: Option<&str>,
        expect: crate::backend::Expect,
    ) -> StorageResult<bool> {
        self.write_in_guest(workspace, state, lock_id, expect).await
    }

    async fn read_metadata(
        &self,
        workspace: &str,
    ) -> StorageResult<Option<crate::backend::Metadata>> {
        self.read_metadata_in_guest(workspace).await
    }

    async fn write_metadata(
        &self,
        workspace: &str,
        content: Option<String>,
        expect: crate::backend::Expect,
    ) -> StorageResult<bool> {
        self.write_metadata_in_guest(workspace, content, expect)
            .await
    }

    async fn delete(&self, workspace: &str, lock_id: Option<&str>) -> StorageResult<()> {
        let ws = workspace.to_owned();
        let id = lock_id.map(str::to_owned);
        self.run(self.shared.max_lift_bytes, move |g, s| {
            Box::pin(async move { g.delete(s, &ws, id.as_deref()).await })
        })
        .await
    }

    async fn lock(&self, workspace: &str, info: LockInfo) -> StorageResult<()> {
        let ws = workspace.to_owned();
        let info = info.into();
        self.run(self.shared.max_lift_bytes, move |g, s| {
            Box::pin(async move { g.lock(s, &ws, &info).await })
        })
        .await
    }

    async fn unlock(&self, workspace: &str, id: &str) -> StorageResult<()> {
        let ws = workspace.to_owned();
        let id = id.to_owned();
        self.run(self.shared.max_lift_bytes, move |g, s| {
            Box::pin(async move { g.unlock(s, &ws, &id).await })
        })
        .await
    }

    async fn current_lock(&self, workspace: &str) -> StorageResult<Option<LockInfo>> {
        let ws = workspace.to_owned();
        let holder = self
            .run(self.shared.max_lift_bytes, move |g, s| {
                Box::pin(async move { g.current_lock(s, &ws).await })
            })
            .await?;
        Ok(holder.map(Into::into))
    }

    async fn force_unlock(&self, workspace: &str) -> StorageResult<Option<LockInfo>> {
        let ws = workspace.to_owned();
        let holder = self
            .run(self.shared.max_lift_bytes, move |g, s| {
                Box::pin(async move { g.force_unlock(s, &ws).await })
            })
            .await?;
        Ok(holder.map(Into::into))
    }

    async fn list_workspaces(&self) -> StorageResult<Vec<String>> {
        self.run(MAX_LIST_BYTES, |g, s| {
            Box::pin(async move { g.list_workspaces(s).await })
        })
        .await
    }

    async fn create_workspace(&self, name: &str) -> StorageResult<bool> {
        let name = name.to_owned();
        self.run(self.shared.max_lift_bytes, move |g, s| {
            Box::pin(async move { g.create_workspace(s, &name).await })
        })
        .await
    }

    async fn delete_workspace(&self, name: &str) -> StorageResult<()> {
        let name = name.to_owned();
        self.run(self.shared.max_lift_bytes, move |g, s| {
            Box::pin(async move { g.delete_workspace(s, &name).await })
        })
        .await
    }

    async fn list_versions(&self, workspace: &str) -> StorageResult<Vec<crate::backend::Version>> {
        let ws = workspace.to_owned();
        let versions = self
            .run(MAX_LIST_BYTES, move |g, s| {
                Box::pin(async move { g.list_versions(s, &ws).await })
            })
            .await?;
        versions.ok_or(StorageError::NoHistory)
    }

    async fn read_version(&self, workspace: &str, id: &str) -> StorageResult<Option<Vec<u8>>> {
        self.read_whole(workspace, Some(id)).await
    }
}
