//! What the host adds around a guest's storage, whatever the guest:
//! encryption at rest ([`envelope`]) and a version history ([`history`]).
//!
//! [`Store`] wraps any [`Storage`] and is itself a [`Storage`], so the
//! protocol layer serves it like a bare guest. Order matters: states are
//! sealed before the guest and the history see them, so both hold only
//! ciphertext when encryption is on.

pub mod envelope;
pub mod history;

use crate::backend::{LockInfo, Storage, StorageError, StorageResult, Version};
use envelope::{EncryptionKey, Sealer, StateHeader};
use history::History;

/// A backend's storage with the host's encryption and history around it.
pub struct Store<S> {
    inner: S,
    keys: Vec<EncryptionKey>,
    sealer: Option<Sealer>,
    history: Option<History>,
}

impl<S: Storage> Store<S> {
    /// Wrap `inner`. With `keys`, states are sealed with the first; with a
    /// `history`, every write is kept there too.
    pub fn new(inner: S, keys: Vec<EncryptionKey>, history: Option<History>) -> Self {
        Store {
            sealer: Sealer::new(keys.clone()),
            keys,
            inner,
            history,
        }
    }

    /// The wrapped storage.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn open(&self, workspace: &str, stored: Vec<u8>) -> StorageResult<Vec<u8>> {
        envelope::open_with(&self.keys, stored)
            .map_err(|e| StorageError::Encryption(format!("state of {workspace:?}: {e}")))
    }
}

impl<S: Storage> Storage for Store<S> {
    async fn read(&self, workspace: &str) -> StorageResult<Option<Vec<u8>>> {
        match self.inner.read(workspace).await? {
            Some(stored) => self.open(workspace, stored).map(Some),
            None => Ok(None),
        }
    }

    async fn write(
        &self,
        workspace: &str,
        state: Vec<u8>,
        lock_id: Option<&str>,
    ) -> StorageResult<()> {
        // Read the clear fields once, for the envelope and the history both.
        let header = if self.sealer.is_some() || self.history.is_some() {
            StateHeader::of(&state)
        } else {
            StateHeader::default()
        };
        let stored = match &self.sealer {
            Some(sealer) => sealer
                .seal(&state, &header)
                .map_err(StorageError::Encryption)?,
            None => state,
        };
        let kept = self.history.as_ref().map(|_| stored.clone());
        self.inner.write(workspace, stored, lock_id).await?;
        if let (Some(history), Some(kept)) = (&self.history, kept)
            && let Err(e) = history.record(workspace, kept, header.serial).await
        {
            // The state itself is saved; failing the write now would only
            // make Terraform retry a write that already happened.
            tracing::error!(workspace, error = %e, "state saved, but keeping its version in the history failed");
        }
        Ok(())
    }

    async fn delete(&self, workspace: &str, lock_id: Option<&str>) -> StorageResult<()> {
        self.inner.delete(workspace, lock_id).await
    }

    async fn lock(&self, workspace: &str, info: LockInfo) -> StorageResult<()> {
        self.inner.lock(workspace, info).await
    }

    async fn unlock(&self, workspace: &str, id: &str) -> StorageResult<()> {
        self.inner.unlock(workspace, id).await
    }

    async fn current_lock(&self, workspace: &str) -> StorageResult<Option<LockInfo>> {
        self.inner.current_lock(workspace).await
    }

    async fn force_unlock(&self, workspace: &str) -> StorageResult<Option<LockInfo>> {
        self.inner.force_unlock(workspace).await
    }

    async fn list_workspaces(&self) -> StorageResult<Vec<String>> {
        self.inner.list_workspaces().await
    }

    async fn create_workspace(&self, name: &str) -> StorageResult<bool> {
        self.inner.create_workspace(name).await
    }

    async fn delete_workspace(&self, name: &str) -> StorageResult<()> {
        self.inner.delete_workspace(name).await
    }

    /// The guest's own history when its storage keeps one (git commits…),
    /// else the host's.
    async fn list_versions(&self, workspace: &str) -> StorageResult<Vec<Version>> {
        match (self.inner.list_versions(workspace).await, &self.history) {
            (Err(StorageError::NoHistory), Some(history)) => {
                history.list(workspace).await.map_err(history_error)
            }
            (listed, _) => listed,
        }
    }

    async fn read_version(&self, workspace: &str, id: &str) -> StorageResult<Option<Vec<u8>>> {
        let stored = match (self.inner.read_version(workspace, id).await, &self.history) {
            (Ok(None) | Err(StorageError::NoHistory), Some(history)) => {
                history.read(workspace, id).await.map_err(history_error)?
            }
            (read, _) => read?,
        };
        stored.map(|s| self.open(workspace, s)).transpose()
    }
}

fn history_error(e: std::io::Error) -> StorageError {
    StorageError::Internal(format!("version history: {e}"))
}
