//! Replacing backends while serving: on SIGHUP the server re-reads its
//! config file and rebuilds every backend (a changed pin picks up a newly
//! installed guest, changed grants or guest settings apply), then swaps each
//! in. Requests already running keep the instance they started on and
//! finish there; new requests get the new one.
//!
//! A reload fails closed: a backend whose new configuration does not load
//! (a narrowed grant its guest still asks for, a trusted key removed, an
//! altered blob) is stopped, not left running with its old grants, and so
//! is a backend removed from the config. A stopped backend answers 503
//! naming why, until a reload that loads it. The log and the metrics
//! (`wasmstate_backend_up`, `wasmstate_reloads_total`) say so.
//!
//! Adding backends, and changes to listen, TLS or users, need a restart; a
//! reload says so in the log.

use crate::backend::{LockInfo, Storage, StorageError, StorageResult, Version};
use crate::config::{Config, Overrides};
use crate::runtime::Runtime;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

/// What a swappable backend serves: a storage, or nothing, and why.
enum Serving<S> {
    Up(S),
    Stopped(String),
}

/// A storage that can be replaced (or stopped) while requests run on it.
pub struct Swappable<S> {
    current: RwLock<Arc<Serving<S>>>,
}

impl<S> Swappable<S> {
    /// Serve `storage` until replaced.
    pub fn new(storage: S) -> Self {
        Swappable {
            current: RwLock::new(Arc::new(Serving::Up(storage))),
        }
    }

    /// New requests use `storage` from now on.
    pub fn replace(&self, storage: S) {
        self.set(Serving::Up(storage));
    }

    /// New requests are refused (503) with `reason` from now on.
    pub fn stop(&self, reason: String) {
        self.set(Serving::Stopped(reason));
    }

    fn set(&self, serving: Serving<S>) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(serving);
    }

    /// Whether it serves a storage now.
    pub fn is_up(&self) -> bool {
        matches!(*self.snapshot(), Serving::Up(_))
    }

    fn snapshot(&self) -> Arc<Serving<S>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The storage a request starting now uses (held for its whole call),
    /// or why there is none.
    fn current(&self) -> StorageResult<Current<S>> {
        let serving = self.snapshot();
        match &*serving {
            Serving::Up(_) => Ok(Current(serving)),
            Serving::Stopped(reason) => Err(StorageError::Unavailable(format!(
                "this backend is stopped: {reason}; fix the config and reload (SIGHUP)"
            ))),
        }
    }
}

impl<S: Storage> Swappable<crate::store::Store<S>> {
    /// Ask the storage served now who keeps its versions, and log it.
    pub async fn probe_history(&self) {
        if let Ok(store) = self.current() {
            store.probe_history().await;
        }
    }
}

/// A storage being served, held for one call.
struct Current<S>(Arc<Serving<S>>);

impl<S> std::ops::Deref for Current<S> {
    type Target = S;
    fn deref(&self) -> &S {
        match &*self.0 {
            Serving::Up(storage) => storage,
            Serving::Stopped(_) => unreachable!("checked by Swappable::current"),
        }
    }
}

impl<S: Storage> Storage for Swappable<S> {
    fn describe(&self) -> Option<crate::backend::Description> {
        self.current().ok()?.describe()
    }
    fn opens_whole(&self) -> bool {
        // A stopped backend reads nothing; a page then shows its error.
        self.current().is_ok_and(|s| s.opens_whole())
    }
    fn history_source(&self) -> crate::backend::HistorySource {
        self.current()
            .map(|s| s.history_source())
            .unwrap_or_default()
    }
    fn host_work(&self) -> crate::work::HostWork {
        self.current().map(|s| s.host_work()).unwrap_or_default()
    }
    async fn read(&self, workspace: &str) -> StorageResult<Option<Vec<u8>>> {
        self.current()?.read(workspace).await
    }
    async fn read_prefix(&self, workspace: &str, max: usize) -> StorageResult<Option<Vec<u8>>> {
        self.current()?.read_prefix(workspace, max).await
    }
    async fn holds(&self, workspace: &str, state: &bytes::Bytes) -> StorageResult<bool> {
        self.current()?.holds(workspace, state).await
    }
    async fn write(
        &self,
        workspace: &str,
        state: bytes::Bytes,
        lock_id: Option<&str>,
    ) -> StorageResult<()> {
        self.current()?.write(workspace, state, lock_id).await
    }
    fn conditional_writes(&self) -> bool {
        // A stopped backend writes nothing either way.
        self.current().is_ok_and(|s| s.conditional_writes())
    }
    async fn head(&self, workspace: &str) -> StorageResult<Option<crate::backend::Head>> {
        self.current()?.head(workspace).await
    }
    async fn write_if(
        &self,
        workspace: &str,
        state: bytes::Bytes,
        lock_id: Option<&str>,
        expect: crate::backend::Expect,
    ) -> StorageResult<bool> {
        self.current()?
            .write_if(workspace, state, lock_id, expect)
            .await
    }
    async fn read_metadata(
        &self,
        workspace: &str,
    ) -> StorageResult<Option<crate::backend::Metadata>> {
        self.current()?.read_metadata(workspace).await
    }
    async fn write_metadata(
        &self,
        workspace: &str,
        content: Option<String>,
        expect: crate::backend::Expect,
    ) -> StorageResult<bool> {
        self.current()?
            .write_metadata(workspace, content, expect)
            .await
    }
    async fn delete(&self, workspace: &str, lock_id: Option<&str>) -> StorageResult<()> {
        self.current()?.delete(workspace, lock_id).await
    }
    async fn lock(&self, workspace: &str, info: LockInfo) -> StorageResult<()> {
        self.current()?.lock(workspace, info).await
    }
    async fn unlock(&self, workspace: &str, id: &str) -> StorageResult<()> {
        self.current()?.unlock(workspace, id).await
    }
    async fn current_lock(&self, workspace: &str) -> StorageResult<Option<LockInfo>> {
        self.current()?.current_lock(workspace).await
    }
    async fn force_unlock(&self, workspace: &str) -> StorageResult<Option<LockInfo>> {
        self.current()?.force_unlock(workspace).await
    }
    async fn list_workspaces(&self) -> StorageResult<Vec<String>> {
        self.current()?.list_workspaces().await
    }
    async fn create_workspace(&self, name: &str) -> StorageResult<bool> {
        self.current()?.create_workspace(name).await
    }
    async fn delete_workspace(&self, name: &str) -> StorageResult<()> {
        self.current()?.delete_workspace(name).await
    }
    async fn list_versions(&self, workspace: &str) -> StorageResult<Vec<Version>> {
        self.current()?.list_versions(workspace).await
    }
    async fn read_version(&self, workspace: &str, id: &str) -> StorageResult<Option<Vec<u8>>> {
        self.current()?.read_version(workspace, id).await
    }
    async fn reseal(
        &self,
        workspace: &str,
        request: &crate::resealing::ResealRequest,
    ) -> StorageResult<crate::resealing::ResealReport> {
        self.current()?.reseal(workspace, request).await
    }
}

/// Where the running configuration came from, to read it again.
#[derive(Debug, Clone)]
pub struct ConfigSource {
    /// The config file.
    pub path: PathBuf,
    /// Command-line values that win over it.
    pub overrides: Overrides,
}

/// What a reload did.
#[derive(Debug)]
pub struct Reloaded {
    /// The configuration it read.
    pub config: Config,
    /// Backends now serving their new configuration.
    pub replaced: Vec<String>,
    /// Backends stopped, with why.
    pub stopped: Vec<(String, String)>,
}

/// Re-read the config; swap in every backend that loads and stop every one
/// that does not, or that is gone from the config. A config file that does
/// not parse changes nothing (every backend keeps serving as it was).
pub async fn reload<S: Storage>(
    source: &ConfigSource,
    runtime: &Runtime,
    served: &BTreeMap<String, Arc<Swappable<S>>>,
    build: impl Fn(&Config, &crate::config::BackendConfig, crate::runtime::GuestBackend) -> S,
) -> anyhow::Result<Reloaded> {
    let config = Config::load(Some(&source.path), source.overrides.clone())?;
    let mut outcome = Reloaded {
        config: config.clone(),
        replaced: Vec::new(),
        stopped: Vec::new(),
    };
    let mut pass = crate::loader::Pass::default();
    for backend in &config.backends {
        let Some(slot) = served.get(&backend.name) else {
            tracing::warn!(backend = %backend.name, "new backend in the config: restart the server to serve it");
            continue;
        };
        let ungranted = crate::loader::Ungranted::Refuse;
        match crate::loader::load_in(&mut pass, &config, backend, runtime, ungranted).await {
            Ok(guest) => {
                tracing::info!(backend = %backend.name, guest = %backend.guest, sha256 = guest.sha256(), "backend reloaded");
                slot.replace(build(&config, backend, guest));
                outcome.replaced.push(backend.name.clone());
            }
            Err(e) => {
                let reason = format!("its reload failed: {e:#}");
                tracing::error!(backend = %backend.name, "backend stopped: {reason}");
                slot.stop(reason.replace('\n', " "));
                outcome.stopped.push((backend.name.clone(), reason));
            }
        }
    }
    for (name, slot) in served {
        if !config.backends.iter().any(|b| &b.name == name) {
            tracing::warn!(backend = %name, "backend removed from the config: stopped");
            slot.stop("it was removed from the config".into());
            outcome
                .stopped
                .push((name.clone(), "removed from the config".into()));
        }
    }
    Ok(outcome)
}
