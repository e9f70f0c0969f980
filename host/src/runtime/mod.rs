//! The guest runtime: one wasmtime engine, each backend's guest compiled once
//! and pre-linked, and a fresh, limited instance for every request.
//!
//! What one backend's guests may take from the server as a whole is bounded
//! here too: a share of the server-wide guest memory budget
//! ([`limits`]), a disk quota on its directory ([`quota`]), a share of the
//! cores ([`turns`]), and the bytes the host lifts out of one call.
//!
//! This module never parses HTTP; it implements [`crate::backend::Storage`]
//! for the protocol layer to call.

mod ahead;
mod bindings;
mod body;
mod cache;
mod chunks;
mod compiler;
mod crash;
mod engine;
mod fs;
mod git;
mod guest;
mod instance;
pub mod limits;
mod outbound;
mod pinned;
mod postgres;
pub mod quota;
mod ready;
mod sandbox;
mod shared;
pub mod system;
mod text;
pub mod turns;
mod versions;

pub use compiler::child_main_if_asked;
pub use guest::GuestBackend;

use crate::capabilities::aws::AwsSigner;
use crate::config::{BackendConfig, Config, Limits};
use crate::metrics::Metrics;
use crate::policy::OutboundPolicy;
use anyhow::Context;
use limits::Budget;
use sandbox::Sandbox;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::Semaphore;
use wasmtime::Engine;
use wasmtime::component::Linker;

/// Where a granted directory appears inside the guest.
pub const GUEST_DATA_DIR: &str = "/data";

/// Extra time past the epoch deadline before the request is abandoned from
/// outside: covers a guest blocked in a host call, where epochs cannot fire.
const OUTER_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Most bytes the host lifts out of a guest in one call beyond the largest
/// accepted body: room for the envelope around a state.
const LIFT_MARGIN_BYTES: usize = 1 << 20;

/// The engine and everything shared by all backends.
pub struct Runtime {
    metrics: Arc<Metrics>,
    engine: Engine,
    /// What `engine` was built from: a compiler child builds its own alike.
    engine_settings: engine::EngineSettings,
    linker: Linker<Sandbox>,
    instances: Arc<Semaphore>,
    max_instances: u32,
    /// The server's slots for instances made ready ahead of their calls.
    ready: ready::ReadySlots,
    cores: usize,
    /// How many backends the config serves (fixed until a restart).
    backends: usize,
    memory: Budget,
    max_lift_bytes: usize,
    cache_dir: PathBuf,
    cache_key: cache::CacheKey,
    git: Arc<crate::capabilities::git::GitHost>,
    /// The client of the host's own AWS calls (STS, ECS, instance metadata).
    aws_http: aws_smithy_runtime_api::client::http::SharedHttpClient,
    /// The client of the host's own Google token calls.
    gcp_http: reqwest::Client,
    tasks: tokio_util::task::TaskTracker,
    /// The longest `timeout_ms` of any backend: what draining waits for.
    longest_call: std::time::Duration,
    /// One quota per directory, across reloads.
    quotas: quota::DirQuotas,
    /// One database store (and lock session) per backend, across reloads.
    databases: crate::capabilities::postgres::PgStores,
    /// Each distinct guest compiled and linked once, by its sha256: the
    /// backends of one guest share its machine code and memory image, so a
    /// backend costs its settings, not a copy of its guest. Kept for the
    /// server's life: a reload that pins a new guest adds one, and a guest
    /// no backend runs any more stays compiled until a restart (bounded by
    /// the guests the operator ever pinned; pruning on reload is to do).
    compiled: std::sync::Mutex<std::collections::HashMap<String, Linked>>,
    _ticker: engine::EpochTicker,
}

impl Runtime {
    /// Build the engine for `config` (pool sized for its backends' limits)
    /// and the memory budget, and start the epoch ticker.
    pub fn new(config: &Config, metrics: Arc<Metrics>) -> anyhow::Result<Runtime> {
        let max_memory = config
            .backends
            .iter()
            .map(|b| b.limits.memory_bytes)
            .max()
            .unwrap_or(Limits::default().memory_bytes);
        let swap = system::swap_possible();
        if swap {
            tracing::warn!(
                "swap is possible for this server's memory: guest memory slots are reset with a memset \
                 (slower) rather than PAGEMAP_SCAN, whose reset skips swapped-out pages in wasmtime 48"
            );
        }
        let ready = ready::ready_instances(config.max_instances);
        let engine_settings = engine::EngineSettings {
            max_instances: config.max_instances + ready,
            max_memory_bytes: max_memory,
            swap_possible: swap,
        };
        let engine = engine_settings.build()?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        fs::add_to_linker(&mut linker)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        versions::add_to_linker(&mut linker)?;
        let cores = system::cores();
        let memory = Budget::new(guest_memory_budget(config)?);
        metrics.set_memory_budget(memory.clone());
        let ready_slots = ready::ReadySlots::new(ready as usize);
        metrics.set_ready_slots(ready_slots.clone());
        Ok(Runtime {
            _ticker: engine::EpochTicker::start(engine.clone()),
            metrics,
            engine,
            engine_settings,
            linker,
            instances: Arc::new(Semaphore::new(config.max_instances as usize)),
            max_instances: config.max_instances,
            ready: ready_slots,
            cores,
            backends: config.backends.len(),
            memory,
            max_lift_bytes: config.max_stored_bytes() + LIFT_MARGIN_BYTES,
            cache_dir: config.cache_dir(),
            cache_key: cache::CacheKey::load_or_create(&config.data_dir.join("cache.key"))?,
            tasks: tokio_util::task::TaskTracker::new(),
            quotas: quota::DirQuotas::default(),
            databases: Default::default(),
            compiled: Default::default(),
            longest_call: config
                .backends
                .iter()
                .map(|b| b.limits.timeout)
                .max()
                .unwrap_or_default()
                + OUTER_GRACE,
            aws_http: crate::capabilities::aws::http_client(),
            gcp_http: crate::capabilities::gcp::http_client(),
            git: Arc::new(
                crate::capabilities::git::GitHost::new(config.data_dir.join("git"))
                    .with_limits(config.git_clone_max_bytes, config.max_stored_bytes() as u64),
            ),
        })
    }

    /// Wait for the guest calls under way (each ends by its deadline) and
    /// start no more: for a server that is stopping.
    pub async fn drain(&self) {
        self.tasks.close();
        if !self.tasks.is_empty() {
            tracing::info!(
                calls = self.tasks.len(),
                "waiting for guest calls under way to finish"
            );
        }
        let _ = tokio::time::timeout(self.longest_call, self.tasks.wait()).await;
    }

    /// The most bytes a guest may hand back as one state: what the host
    /// may store ([`Config::max_stored_bytes`] when the server started).
    /// Writes beyond it are refused, so every stored state reads back.
    pub fn max_stored_bytes(&self) -> usize {
        self.max_lift_bytes - LIFT_MARGIN_BYTES
    }

    /// The longest a guest call may take (the longest `timeout_ms` of any
    /// backend, and the grace after it).
    pub fn longest_call(&self) -> std::time::Duration {
        self.longest_call
    }

    /// The server-wide guest memory budget.
    pub fn memory_budget(&self) -> &Budget {
        &self.memory
    }

    /// Compile (or load from cache), check and link `backend`'s guest
    /// `wasm` (whose digest is `sha256`), then
    /// have it validate its configuration. Every failure names the backend.
    pub async fn load_backend(
        &self,
        backend: &BackendConfig,
        wasm: &[u8],
        sha256: &str,
        dir: Option<PathBuf>,
    ) -> anyhow::Result<GuestBackend> {
        let name = &backend.name;
        let context = || format!("backend {name:?} (guest {})", backend.guest);
        let (version, pre) = self.linked(wasm, sha256).with_context(context)?;
        let quota = match &dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("{}: cannot create {}", context(), dir.display()))?;
                backend
                    .disk_quota_bytes
                    .map(|limit| self.quotas.of(dir, limit))
                    .transpose()
                    .with_context(|| format!("{}: cannot measure {}", context(), dir.display()))?
            }
            None => None,
        };
        let share = backend
            .memory_budget_bytes
            .unwrap_or(self.memory.bytes() / 4 * 3);
        let own_instances = backend
            .max_instances
            .unwrap_or((self.max_instances * 3).div_ceil(4))
            .min(self.max_instances) as usize;
        // Its guests' wasm and its heavy host work each take at most this
        // many cores, so its requests leave the others a worker. A server
        // of one backend has no others to leave one for (adding a backend
        // takes a restart): it gets every core.
        let cores = backend.max_cores.map_or(
            if self.backends > 1 {
                self.cores.saturating_sub(1)
            } else {
                self.cores
            },
            |n| n as usize,
        );
        let guest = GuestBackend {
            description: Arc::default(),
            shared: Arc::new(shared::Shared {
                contract: version,
                metrics: self.metrics.clone(),
                name: Arc::from(name.as_str()),
                pre: versions::GuestPre::new(version, pre)
                    .map_err(anyhow::Error::from)
                    .with_context(context)?,
                ready: ready::Ready::new(self.ready.clone(), instance::READY_IDLE),
                engine: self.engine.clone(),
                tasks: self.tasks.clone(),
                instances: self.instances.clone(),
                own_instances: Arc::new(Semaphore::new(own_instances)),
                instances_per_backend: own_instances,
                turns: turns::Turns::new(cores).on_server(turns::ServerCalls::new(
                    self.instances.clone(),
                    self.max_instances as usize,
                )),
                host_work: crate::work::HostWork::new(cores, backend.limits.timeout),
                limits: backend.limits,
                memory: Budget::new(share.min(self.memory.bytes())),
                server_memory: self.memory.clone(),
                quota,
                max_lift_bytes: self.max_lift_bytes,
                memory_peak: std::sync::atomic::AtomicU64::new(0),
                dir,
                config: backend.guest_config.clone().into(),
                aws: match &backend.aws {
                    Some(grant) => Some(Arc::new(
                        AwsSigner::new(name, grant, self.aws_http.clone()).await,
                    )),
                    None => None,
                },
                azure: backend
                    .azure
                    .as_ref()
                    .map(|grant| Arc::new(crate::capabilities::azure::AzureSigner::new(grant))),
                gcp: backend.gcp.as_ref().map(|grant| {
                    Arc::new(crate::capabilities::gcp::GcpAuth::new(
                        name,
                        grant,
                        self.gcp_http.clone(),
                    ))
                }),
                postgres: backend
                    .postgres
                    .as_ref()
                    .map(|grant| self.databases.of(name, grant, backend.history)),
                outbound: Arc::new(OutboundPolicy::new(
                    backend.allow_http.clone(),
                    backend.allow_http_addresses.clone(),
                )),
                git: (!backend.allow_git.is_empty()).then(|| crate::capabilities::git::GitAccess {
                    host: self.git.clone(),
                    grants: backend.allow_git.clone().into(),
                }),
                secrets: backend.secrets.clone().into(),
                sha256: sha256.to_owned(),
            }),
        };
        let diagnostics = guest
            .validate_on_load()
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
        self.metrics.set_backend_limits(
            name,
            guest.memory_budget().clone(),
            guest
                .disk_quota()
                .map(|q| q.clone() as Arc<dyn crate::metrics::Usage>),
            guest.turns().clone(),
            crate::backend::Storage::host_work(&guest),
        );
        Ok(guest)
    }
}

/// A guest compiled, its contract checked, and linked.
type Linked = (
    crate::contract::ContractVersion,
    wasmtime::component::InstancePre<Sandbox>,
);

impl Runtime {
    /// Whether the guest with digest `sha256` is compiled and linked: its
    /// bytes are not needed again to load another backend of it.
    pub fn has_linked(&self, sha256: &str) -> bool {
        self.compiled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(sha256)
    }

    /// The guest `wasm` (whose digest is `sha256`) compiled (or loaded
    /// from the cache), its contract checked and linked: once per distinct
    /// guest, shared by every backend that runs it.
    fn linked(&self, wasm: &[u8], sha256: &str) -> anyhow::Result<Linked> {
        let known =
            |compiled: &std::collections::HashMap<String, Linked>| compiled.get(sha256).cloned();
        if let Some(linked) = known(&self.compiled.lock().unwrap_or_else(|e| e.into_inner())) {
            return Ok(linked);
        }
        let component = compiler::compile(
            &self.engine,
            &self.engine_settings,
            wasm,
            sha256,
            &self.cache_dir,
            &self.cache_key,
        )?;
        let exports: Vec<String> = component
            .component_type()
            .exports(&self.engine)
            .map(|(n, _)| n.to_string())
            .collect();
        let version = crate::contract::check_version(&exports)?;
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(anyhow::Error::from)
            .context("cannot link the guest")?;
        let linked = (version, pre);
        self.compiled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(sha256.to_string(), linked.clone());
        Ok(linked)
    }
}

/// The server's guest memory budget: `max_guest_memory_mib`, or half of
/// the memory the server may use (physical memory, or its cgroup's limit
/// when that is lower). The pool's slots keep some memory resident between
/// requests; that is set aside first, so the budget holds for what is
/// resident, not only for what live instances use.
fn guest_memory_budget(config: &Config) -> anyhow::Result<u64> {
    let configured = match config.max_guest_memory_bytes {
        Some(bytes) => bytes,
        None => {
            let (limit, source) = system::memory_limit().context(
                "cannot tell how much memory this machine has; set max_guest_memory_mib",
            )?;
            let budget = (limit as f64 * system::DEFAULT_GUEST_MEMORY_FRACTION) as u64;
            tracing::info!(
                budget_mib = budget >> 20,
                "guest memory budget: half of the {} MiB of {}",
                limit >> 20,
                match source {
                    system::MemorySource::Physical => "physical memory",
                    system::MemorySource::Cgroup => "this server's cgroup limit",
                }
            );
            budget
        }
    };
    let resident = engine::pool_resident_bytes(
        config.max_instances + ready::ready_instances(config.max_instances),
    );
    anyhow::ensure!(
        configured > resident,
        "max_guest_memory_mib = {}: the guest instance pool alone keeps up to {} MiB resident \
         (max_instances = {}, and {} made ready ahead); raise the budget or lower max_instances",
        configured >> 20,
        resident >> 20,
        config.max_instances,
        ready::ready_instances(config.max_instances)
    );
    Ok(configured - resident)
}
