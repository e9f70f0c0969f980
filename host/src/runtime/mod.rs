//! The guest runtime: one wasmtime engine, each backend's guest compiled once
//! and pre-linked, and a fresh, limited instance for every request.
//!
//! This module never parses HTTP; it implements [`Storage`] for the protocol
//! layer to call.

mod bindings;
mod cache;
mod engine;
mod git;
mod limits;
mod outbound;
mod sandbox;

pub use bindings::WIT_VERSION;
pub use cache::sha256_hex;

/// Refuse a component whose exports do not implement this host's WIT
/// version, naming both (see [`WIT_VERSION`]).
pub fn check_wit_version(exports: &[String]) -> anyhow::Result<()> {
    bindings::check_version(exports)
}

use crate::backend::{Diagnostic, LockInfo, Storage, StorageError, StorageResult};
use crate::config::{BackendConfig, Config, Limits};
use crate::metrics::{Fault, Metrics};
use crate::policy::OutboundPolicy;
use anyhow::Context;
use bindings::{Backend as GuestWorld, BackendPre as GuestWorldPre};
use limits::MemoryLimiter;
use sandbox::{STDERR_CAPACITY, Sandbox};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::Semaphore;
use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{Engine, Store, Trap, UpdateDeadline};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};
use wasmtime_wasi_http::WasiHttpCtx;

/// Where a granted directory appears inside the guest.
pub const GUEST_DATA_DIR: &str = "/data";

/// Extra time past the epoch deadline before the request is abandoned from
/// outside: covers a guest blocked in a host call, where epochs cannot fire.
const OUTER_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// The engine and everything shared by all backends.
pub struct Runtime {
    metrics: Arc<Metrics>,
    engine: Engine,
    linker: Linker<Sandbox>,
    instances: Arc<Semaphore>,
    max_instances: u32,
    cache_dir: PathBuf,
    git: Arc<crate::capabilities::git::GitHost>,
    _ticker: engine::EpochTicker,
}

impl Runtime {
    /// Build the engine for `config` (pool sized for its backends' limits)
    /// and start the epoch ticker.
    pub fn new(config: &Config, metrics: Arc<Metrics>) -> anyhow::Result<Runtime> {
        let max_memory = config
            .backends
            .iter()
            .map(|b| b.limits.memory_bytes)
            .max()
            .unwrap_or(Limits::default().memory_bytes);
        let engine = engine::build(config.max_instances, max_memory)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        GuestWorld::add_to_linker::<_, HasSelf<Sandbox>>(&mut linker, |s| s)?;
        Ok(Runtime {
            metrics,
            _ticker: engine::EpochTicker::start(engine.clone()),
            engine,
            linker,
            instances: Arc::new(Semaphore::new(config.max_instances as usize)),
            max_instances: config.max_instances,
            cache_dir: config.cache_dir(),
            git: Arc::new(crate::capabilities::git::GitHost::new(
                config.data_dir.join("git"),
            )),
        })
    }

    /// Compile (or load from cache), check and link `backend`'s guest, then
    /// have it validate its configuration. Every failure names the backend.
    pub async fn load_backend(
        &self,
        backend: &BackendConfig,
        wasm: &[u8],
        dir: Option<PathBuf>,
    ) -> anyhow::Result<GuestBackend> {
        let name = &backend.name;
        let context = || format!("backend {name:?} (guest {})", backend.guest);
        let sha256 = sha256_hex(wasm);
        let component =
            cache::compile(&self.engine, wasm, &sha256, &self.cache_dir).with_context(context)?;
        let exports: Vec<String> = component
            .component_type()
            .exports(&self.engine)
            .map(|(n, _)| n.to_string())
            .collect();
        bindings::check_version(&exports).with_context(context)?;
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("{}: cannot link the guest", context()))?;
        if let Some(dir) = &dir {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("{}: cannot create {}", context(), dir.display()))?;
        }
        let guest = GuestBackend {
            metrics: self.metrics.clone(),
            name: Arc::from(name.as_str()),
            pre: GuestWorldPre::new(pre)?,
            engine: self.engine.clone(),
            instances: self.instances.clone(),
            own_instances: Arc::new(Semaphore::new(
                backend
                    .max_instances
                    .unwrap_or((self.max_instances * 3).div_ceil(4))
                    .min(self.max_instances) as usize,
            )),
            limits: backend.limits,
            dir,
            config: backend.guest_config.clone().into(),
            outbound: Arc::new(OutboundPolicy::new(backend.allow_http.clone())),
            git: (!backend.allow_git.is_empty()).then(|| git::GitAccess {
                host: self.git.clone(),
                grants: backend.allow_git.clone().into(),
            }),
            secrets: backend.secrets.clone().into(),
            sha256,
        };
        let diagnostics = guest
            .validate_config()
            .await
            .map_err(|e| anyhow::anyhow!("{}: validating its configuration: {e}", context()))?;
        if !diagnostics.is_empty() {
            let lines: Vec<String> = diagnostics.iter().map(|d| format!("  {d}")).collect();
            anyhow::bail!(
                "{}: invalid configuration:\n{}",
                context(),
                lines.join("\n")
            );
        }
        Ok(guest)
    }
}

/// A future returned by one guest call, borrowing the instance and store.
type GuestCall<'a, T> = Pin<
    Box<
        dyn Future<Output = wasmtime::Result<Result<T, bindings::wasmstate::backend::types::Error>>>
            + Send
            + 'a,
    >,
>;

/// One backend served by a guest component. Cheap to share; every call runs
/// in a fresh instance.
pub struct GuestBackend {
    metrics: Arc<Metrics>,
    name: Arc<str>,
    pre: GuestWorldPre<Sandbox>,
    engine: Engine,
    instances: Arc<Semaphore>,
    /// This backend's own share of the slots: a flood of requests to one
    /// backend queues here, leaving slots for the others.
    own_instances: Arc<Semaphore>,
    limits: Limits,
    dir: Option<PathBuf>,
    config: Arc<[(String, String)]>,
    outbound: Arc<OutboundPolicy>,
    git: Option<git::GitAccess>,
    secrets: Arc<[(String, String)]>,
    sha256: String,
}

impl GuestBackend {
    /// The backend's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// sha256 of the guest component serving this backend.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// A store for one request: fresh WASI context granting only this
    /// backend's directory, memory limiter, epoch deadline.
    fn new_store(&self) -> StorageResult<Store<Sandbox>> {
        let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
        let mut wasi = WasiCtxBuilder::new();
        // File operations on a local disk are short; running them inline
        // instead of on tokio's blocking pool halves a small read's latency.
        wasi.allow_blocking_current_thread(true)
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
            table: ResourceTable::new(),
            http: WasiHttpCtx::new(),
            outbound: outbound::Outbound {
                policy: self.outbound.clone(),
                backend: self.name.clone(),
            },
            limiter: MemoryLimiter::new(self.limits.memory_bytes),
            stderr,
            backend: self.name.clone(),
            config: self.config.clone(),
            log_lines: 0,
            git: self.git.clone(),
            secrets: self.secrets.clone(),
        };
        let mut store = Store::new(&self.engine, sandbox);
        store.limiter(|s| &mut s.limiter);
        // Every epoch tick, a running guest yields to the executor (so a
        // spinning guest cannot starve the other requests sharing its worker
        // thread) until its wall-clock deadline, when it is interrupted.
        let deadline = Instant::now() + self.limits.timeout;
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            Ok(if Instant::now() >= deadline {
                UpdateDeadline::Interrupt
            } else {
                UpdateDeadline::Yield(1)
            })
        });
        Ok(store)
    }

    /// Run one call in a fresh instance, within the backend's limits, and
    /// turn every way it can end into a [`StorageResult`].
    async fn run<T: Send>(
        &self,
        call: impl for<'a> FnOnce(&'a GuestWorld, &'a mut Store<Sandbox>) -> GuestCall<'a, T> + Send,
    ) -> StorageResult<T> {
        // Waiting for a free instance slot is not the guest's time.
        let shutting_down = |_| StorageError::Unavailable("server is shutting down".into());
        let _own = self.own_instances.acquire().await.map_err(shutting_down)?;
        let _permit = self.instances.acquire().await.map_err(shutting_down)?;
        let mut store = self.new_store()?;
        let outer = self.limits.timeout + OUTER_GRACE;
        let outcome = tokio::time::timeout(outer, async {
            let started = Instant::now();
            let guest = self.pre.instantiate_async(&mut store).await?;
            self.metrics.instantiated(&self.name, started.elapsed());
            let called = Instant::now();
            let result = call(&guest, &mut store).await;
            self.metrics.called(&self.name, called.elapsed());
            result
        })
        .await;
        match outcome {
            Err(_elapsed) => {
                self.metrics.fault(&self.name, Fault::Timeout);
                Err(StorageError::GuestTimedOut(self.limits.timeout))
            }
            Ok(Ok(result)) => result.map_err(StorageError::from),
            Ok(Err(error)) => Err(self.fault(error, store.data())),
        }
    }

    /// Classify a trap: deadline, memory limit, or a crash with the guest's
    /// own panic message when it left one.
    fn fault(&self, error: wasmtime::Error, sandbox: &Sandbox) -> StorageError {
        if sandbox.limiter.refused() {
            self.metrics.fault(&self.name, Fault::OutOfMemory);
            return StorageError::GuestOutOfMemory(self.limits.memory_bytes);
        }
        if matches!(error.downcast_ref::<Trap>(), Some(Trap::Interrupt)) {
            self.metrics.fault(&self.name, Fault::Timeout);
            return StorageError::GuestTimedOut(self.limits.timeout);
        }
        self.metrics.fault(&self.name, Fault::Trap);
        // The client gets one short line (the panic message, or the trap's
        // kind); the wasm backtrace goes to the log only.
        let reason = match (sandbox.last_stderr_line(), error.downcast_ref::<Trap>()) {
            (Some(line), _) => line,
            (None, Some(trap)) => trap.to_string(),
            (None, None) => error
                .to_string()
                .lines()
                .next()
                .unwrap_or_default()
                .to_string(),
        };
        tracing::warn!(backend = %self.name, "guest trapped: {error:#}");
        StorageError::GuestTrapped(reason)
    }

    /// Ask the guest to check its configuration.
    pub async fn validate_config(&self) -> StorageResult<Vec<Diagnostic>> {
        self.run(|g, s| {
            Box::pin(async move {
                let diagnostics = g.wasmstate_backend_config().call_validate(s).await?;
                Ok(Ok(diagnostics.into_iter().map(Into::into).collect()))
            })
        })
        .await
    }
}

impl Storage for GuestBackend {
    async fn read(&self, workspace: &str) -> StorageResult<Option<Vec<u8>>> {
        let ws = workspace.to_owned();
        self.run(move |g, s| {
            Box::pin(async move { g.wasmstate_backend_storage().call_read(s, &ws).await })
        })
        .await
    }

    async fn write(
        &self,
        workspace: &str,
        state: Vec<u8>,
        lock_id: Option<&str>,
    ) -> StorageResult<()> {
        let ws = workspace.to_owned();
        let id = lock_id.map(str::to_owned);
        self.run(move |g, s| {
            Box::pin(async move {
                g.wasmstate_backend_storage()
                    .call_write(s, &ws, &state, id.as_deref())
                    .await
            })
        })
        .await
    }

    async fn delete(&self, workspace: &str, lock_id: Option<&str>) -> StorageResult<()> {
        let ws = workspace.to_owned();
        let id = lock_id.map(str::to_owned);
        self.run(move |g, s| {
            Box::pin(async move {
                g.wasmstate_backend_storage()
                    .call_delete(s, &ws, id.as_deref())
                    .await
            })
        })
        .await
    }

    async fn lock(&self, workspace: &str, info: LockInfo) -> StorageResult<()> {
        let ws = workspace.to_owned();
        let info = info.into();
        self.run(move |g, s| {
            Box::pin(async move { g.wasmstate_backend_storage().call_lock(s, &ws, &info).await })
        })
        .await
    }

    async fn unlock(&self, workspace: &str, id: &str) -> StorageResult<()> {
        let ws = workspace.to_owned();
        let id = id.to_owned();
        self.run(move |g, s| {
            Box::pin(async move { g.wasmstate_backend_storage().call_unlock(s, &ws, &id).await })
        })
        .await
    }

    async fn current_lock(&self, workspace: &str) -> StorageResult<Option<LockInfo>> {
        let ws = workspace.to_owned();
        let holder = self
            .run(move |g, s| {
                Box::pin(async move {
                    g.wasmstate_backend_storage()
                        .call_current_lock(s, &ws)
                        .await
                })
            })
            .await?;
        Ok(holder.map(Into::into))
    }

    async fn force_unlock(&self, workspace: &str) -> StorageResult<Option<LockInfo>> {
        let ws = workspace.to_owned();
        let holder = self
            .run(move |g, s| {
                Box::pin(async move {
                    g.wasmstate_backend_storage()
                        .call_force_unlock(s, &ws)
                        .await
                })
            })
            .await?;
        Ok(holder.map(Into::into))
    }

    async fn list_workspaces(&self) -> StorageResult<Vec<String>> {
        self.run(|g, s| {
            Box::pin(async move {
                g.wasmstate_backend_workspaces()
                    .call_list_workspaces(s)
                    .await
            })
        })
        .await
    }

    async fn create_workspace(&self, name: &str) -> StorageResult<bool> {
        let name = name.to_owned();
        self.run(move |g, s| {
            Box::pin(async move {
                g.wasmstate_backend_workspaces()
                    .call_create_workspace(s, &name)
                    .await
            })
        })
        .await
    }

    async fn delete_workspace(&self, name: &str) -> StorageResult<()> {
        let name = name.to_owned();
        self.run(move |g, s| {
            Box::pin(async move {
                g.wasmstate_backend_workspaces()
                    .call_delete_workspace(s, &name)
                    .await
            })
        })
        .await
    }

    async fn list_versions(&self, workspace: &str) -> StorageResult<Vec<crate::backend::Version>> {
        let ws = workspace.to_owned();
        let versions = self
            .run(move |g, s| {
                Box::pin(async move {
                    g.wasmstate_backend_history()
                        .call_list_versions(s, &ws)
                        .await
                })
            })
            .await?;
        let versions = versions.ok_or(StorageError::NoHistory)?;
        Ok(versions
            .into_iter()
            .map(|v| crate::backend::Version {
                id: v.id,
                serial: v.serial,
                created_unix_ms: v.created_unix_ms,
                bytes: v.bytes,
            })
            .collect())
    }

    async fn read_version(&self, workspace: &str, id: &str) -> StorageResult<Option<Vec<u8>>> {
        let ws = workspace.to_owned();
        let id = id.to_owned();
        self.run(move |g, s| {
            Box::pin(async move {
                g.wasmstate_backend_history()
                    .call_read_version(s, &ws, &id)
                    .await
            })
        })
        .await
    }
}
