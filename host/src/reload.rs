//! Replacing backends while serving: on SIGHUP the server re-reads its
//! config file and rebuilds every backend (a changed pin picks up a newly
//! installed guest, changed grants or guest settings apply), then swaps each
//! in. Requests already running keep the instance they started on and
//! finish there; new requests get the new one. A backend that fails to load
//! keeps serving its old guest, and the error is logged.
//!
//! Adding or removing backends, and changes to listen, TLS or users, need a
//! restart; a reload says so in the log.

use crate::backend::{LockInfo, Storage, StorageResult, Version};
use crate::config::{Config, Overrides};
use crate::runtime::Runtime;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

/// A storage that can be replaced while requests run on it.
pub struct Swappable<S> {
    current: RwLock<Arc<S>>,
}

impl<S> Swappable<S> {
    /// Serve `storage` until replaced.
    pub fn new(storage: S) -> Self {
        Swappable {
            current: RwLock::new(Arc::new(storage)),
        }
    }

    /// New requests use `storage` from now on.
    pub fn replace(&self, storage: S) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(storage);
    }

    /// The storage a request starting now uses (held for its whole call).
    pub fn current(&self) -> Arc<S> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl<S: Storage> Storage for Swappable<S> {
    async fn read(&self, workspace: &str) -> StorageResult<Option<Vec<u8>>> {
        self.current().read(workspace).await
    }
    async fn write(
        &self,
        workspace: &str,
        state: Vec<u8>,
        lock_id: Option<&str>,
    ) -> StorageResult<()> {
        self.current().write(workspace, state, lock_id).await
    }
    async fn delete(&self, workspace: &str, lock_id: Option<&str>) -> StorageResult<()> {
        self.current().delete(workspace, lock_id).await
    }
    async fn lock(&self, workspace: &str, info: LockInfo) -> StorageResult<()> {
        self.current().lock(workspace, info).await
    }
    async fn unlock(&self, workspace: &str, id: &str) -> StorageResult<()> {
        self.current().unlock(workspace, id).await
    }
    async fn current_lock(&self, workspace: &str) -> StorageResult<Option<LockInfo>> {
        self.current().current_lock(workspace).await
    }
    async fn force_unlock(&self, workspace: &str) -> StorageResult<Option<LockInfo>> {
        self.current().force_unlock(workspace).await
    }
    async fn list_workspaces(&self) -> StorageResult<Vec<String>> {
        self.current().list_workspaces().await
    }
    async fn create_workspace(&self, name: &str) -> StorageResult<bool> {
        self.current().create_workspace(name).await
    }
    async fn delete_workspace(&self, name: &str) -> StorageResult<()> {
        self.current().delete_workspace(name).await
    }
    async fn list_versions(&self, workspace: &str) -> StorageResult<Vec<Version>> {
        self.current().list_versions(workspace).await
    }
    async fn read_version(&self, workspace: &str, id: &str) -> StorageResult<Option<Vec<u8>>> {
        self.current().read_version(workspace, id).await
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

/// Re-read the config and swap in every backend that loads; returns how
/// many were replaced.
pub async fn reload<S: Storage>(
    source: &ConfigSource,
    runtime: &Runtime,
    served: &BTreeMap<String, Arc<Swappable<S>>>,
    build: impl Fn(&Config, &str, crate::runtime::GuestBackend) -> S,
) -> anyhow::Result<usize> {
    let config = Config::load(Some(&source.path), source.overrides.clone())?;
    let mut replaced = 0;
    for backend in &config.backends {
        let Some(slot) = served.get(&backend.name) else {
            tracing::warn!(backend = %backend.name, "new backend in the config: restart the server to serve it");
            continue;
        };
        match crate::server::load_backend(&config, backend, runtime).await {
            Ok(guest) => {
                tracing::info!(backend = %backend.name, guest = %backend.guest, sha256 = guest.sha256(), "backend reloaded");
                slot.replace(build(&config, &backend.name, guest));
                replaced += 1;
            }
            Err(e) => {
                tracing::error!(backend = %backend.name, "reload failed, still serving the previous guest: {e:#}")
            }
        }
    }
    for name in served.keys() {
        if !config.backends.iter().any(|b| &b.name == name) {
            tracing::warn!(backend = %name, "backend removed from the config: still served until the server restarts");
        }
    }
    Ok(replaced)
}
