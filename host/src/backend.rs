//! The seam between the HTTP protocol and the guest runtime: what a storage
//! backend can do, in plain Rust types. The protocol layer calls [`Storage`];
//! the runtime implements it with wasmtime; the benchmark implements it
//! natively. Neither side sees the other's types.

use bytes::Bytes;
use std::future::Future;
use std::time::Duration;

mod conditional;
mod described;
mod held;

pub use crate::work::HostWork;
use crate::work::WorkError;
pub use conditional::{Expect, Head, MAX_METADATA_BYTES, Metadata};
pub use described::{Description, HistorySource, Version};
pub use held::{HeldLock, age_text, lock_age, own_lock};

pub use wasmstate_types::LockInfo;

/// One problem in a backend's configuration, reported by its guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The key at fault, when one key is.
    pub key: Option<String>,
    /// What is wrong, in one line.
    pub message: String,
}

impl std::fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.key {
            Some(key) => write!(f, "config.{key}: {}", self.message),
            None => write!(f, "{}", self.message),
        }
    }
}

/// Why a storage operation failed: the guest's own typed errors, plus the
/// ways the sandbox can stop a guest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    /// The workspace does not exist.
    #[error("workspace not found")]
    NotFound,
    /// Someone else holds the lock.
    #[error("workspace is locked by {} (lock id {})", .0.who, .0.id)]
    Locked(LockInfo),
    /// The presented lock id is not the holder's; `None`: nothing is locked.
    #[error("lock id does not match")]
    LockMismatch(Option<LockInfo>),
    /// The guest cannot serve the request as asked.
    #[error("{0}")]
    InvalidInput(String),
    /// The guest's configuration is unusable.
    #[error("invalid configuration: {}", join(.0))]
    InvalidConfig(Vec<Diagnostic>),
    /// Storage is unreachable or busy; a retry may succeed.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// The guest reported an internal error.
    #[error("storage error: {0}")]
    Internal(String),
    /// The guest trapped (crashed); its instance was discarded.
    #[error("guest crashed: {reason}")]
    GuestTrapped {
        /// One line: the exception or panic message, or the trap's kind.
        reason: String,
        /// What the guest wrote to stderr before it crashed (a traceback,
        /// a stack): for the log and the conformance kit, never a client.
        detail: Option<String>,
    },
    /// The guest ran past its deadline and was stopped.
    #[error("guest exceeded its time limit of {} ms", .0.as_millis())]
    GuestTimedOut(Duration),
    /// The guest tried to grow past its memory limit and was stopped.
    #[error("guest exceeded its memory limit of {} MiB", .0 / (1024 * 1024))]
    GuestOutOfMemory(u64),
    /// A server-wide resource the request needs is in use by others (the
    /// guest memory budget); the same request may succeed shortly.
    #[error("{0}; try again shortly")]
    Overloaded(String),
    /// The state is larger than this server can store and read back
    /// (sealed, it grows by a third); nothing was stored.
    #[error("{0}; nothing was written")]
    TooLarge(String),
    /// The backend's directory is at its disk quota; nothing was stored.
    #[error("{0}; nothing was stored")]
    NoSpace(String),
    /// The host could not seal or open a state (wrong or missing key).
    #[error("encryption: {0}")]
    Encryption(String),
    /// A key service (KMS) could not be reached or refused the host's
    /// credentials: nothing was sealed or opened; a retry may succeed.
    #[error("encryption key unavailable: {0}")]
    KeyUnavailable(String),
    /// Neither the host nor the guest keeps versions for this backend.
    #[error(
        "this backend keeps no version history; set history = N (versions per workspace) on it"
    )]
    NoHistory,
    /// The storage keeps no workspace metadata (a guest built for a
    /// contract before 0.3.0, or one whose storage cannot).
    #[error("this backend's storage keeps no workspace metadata: {0}")]
    NoMetadata(String),
}

impl From<WorkError> for StorageError {
    fn from(e: WorkError) -> Self {
        match e {
            WorkError::Busy(_) => StorageError::Overloaded(e.to_string()),
            WorkError::Failed(_) => StorageError::Internal(e.to_string()),
        }
    }
}

fn join(diagnostics: &[Diagnostic]) -> String {
    let lines: Vec<String> = diagnostics.iter().map(ToString::to_string).collect();
    lines.join("; ")
}

/// Result of a storage operation.
pub type StorageResult<T> = Result<T, StorageError>;

/// One backend's storage: the operations of the WIT `storage` and
/// `workspaces` interfaces. Workspace names are validated before they get
/// here. Every method must be safe to retry.
pub trait Storage: Send + Sync + 'static {
    /// What the operator sees of this backend, when it is served by a guest.
    fn describe(&self) -> Option<Description> {
        None
    }
    /// Whether any part of a state costs reading and opening all of it
    /// (host-side encryption puts `serial` after the ciphertext): pages
    /// that list many workspaces then skip the states themselves.
    fn opens_whole(&self) -> bool {
        false
    }
    /// Who keeps this backend's versions, as far as the last listing told.
    fn history_source(&self) -> HistorySource {
        HistorySource::Unknown
    }
    /// Where heavy host work for this backend runs (sealing, opening and
    /// parsing its big states): its own slots, so its big states slow
    /// only itself.
    fn host_work(&self) -> HostWork {
        HostWork::default()
    }
    /// The latest state, `None` when there is none.
    fn read(&self, workspace: &str) -> impl Future<Output = StorageResult<Option<Vec<u8>>>> + Send;
    /// The first `max` bytes of the latest state (all of it when shorter),
    /// `None` when there is none: what the stale-write guard reads, without
    /// moving a whole state.
    fn read_prefix(
        &self,
        workspace: &str,
        max: usize,
    ) -> impl Future<Output = StorageResult<Option<Vec<u8>>>> + Send {
        async move {
            let mut state = self.read(workspace).await?;
            if let Some(bytes) = &mut state {
                bytes.truncate(max);
            }
            Ok(state)
        }
    }
    /// Whether the latest state is exactly `state`: compared as it is
    /// read, without holding a second copy.
    fn holds(
        &self,
        workspace: &str,
        state: &Bytes,
    ) -> impl Future<Output = StorageResult<bool>> + Send {
        async move { Ok(self.read(workspace).await?.as_deref() == Some(&state[..])) }
    }
    /// Replace the state atomically, honouring the lock. `state` is shared,
    /// not copied, on its way to storage and the history.
    fn write(
        &self,
        workspace: &str,
        state: Bytes,
        lock_id: Option<&str>,
    ) -> impl Future<Output = StorageResult<()>> + Send;
    /// Whether [`Storage::head`] and [`Storage::write_if`] are the
    /// storage's own (a 0.3.0 guest): then two writers expecting the same
    /// version cannot both succeed, on any replicas, and an unlocked write
    /// needs no lock taken by the host.
    fn conditional_writes(&self) -> bool {
        false
    }
    /// The stored state's head, `None` when there is none.
    fn head(&self, workspace: &str) -> impl Future<Output = StorageResult<Option<Head>>> + Send {
        let _ = workspace;
        async {
            Err(StorageError::Internal(
                "this backend's storage answers no head (a guest built before contract 0.3.0)"
                    .into(),
            ))
        }
    }
    /// Like [`Storage::write`], only if the stored state is as `expect`
    /// says, in one step of the storage; `Ok(false)`: it is not, and
    /// nothing was written.
    fn write_if(
        &self,
        workspace: &str,
        state: Bytes,
        lock_id: Option<&str>,
        expect: Expect,
    ) -> impl Future<Output = StorageResult<bool>> + Send {
        async move {
            match expect {
                Expect::Any => self.write(workspace, state, lock_id).await.map(|()| true),
                _ => Err(StorageError::Internal(
                    "this backend's storage has no conditional write (a guest built before \
                     contract 0.3.0)"
                        .into(),
                )),
            }
        }
    }
    /// The workspace's metadata, `None` when none is kept.
    fn read_metadata(
        &self,
        workspace: &str,
    ) -> impl Future<Output = StorageResult<Option<Metadata>>> + Send {
        let _ = workspace;
        async {
            Err(StorageError::NoMetadata(
                "its guest was built for a contract before 0.3.0".into(),
            ))
        }
    }
    /// Set (`Some`) or remove (`None`) the workspace's metadata if it is as
    /// `expect` says; `Ok(false)`: it is not, and nothing changed.
    fn write_metadata(
        &self,
        workspace: &str,
        content: Option<String>,
        expect: Expect,
    ) -> impl Future<Output = StorageResult<bool>> + Send {
        let _ = (workspace, content, expect);
        async {
            Err(StorageError::NoMetadata(
                "its guest was built for a contract before 0.3.0".into(),
            ))
        }
    }
    /// Delete the state, honouring the lock.
    fn delete(
        &self,
        workspace: &str,
        lock_id: Option<&str>,
    ) -> impl Future<Output = StorageResult<()>> + Send;
    /// Take the lock.
    fn lock(
        &self,
        workspace: &str,
        info: LockInfo,
    ) -> impl Future<Output = StorageResult<()>> + Send;
    /// Release the lock held under `id`.
    fn unlock(&self, workspace: &str, id: &str) -> impl Future<Output = StorageResult<()>> + Send;
    /// The current holder, if any.
    fn current_lock(
        &self,
        workspace: &str,
    ) -> impl Future<Output = StorageResult<Option<LockInfo>>> + Send;
    /// Release the lock whoever holds it; the removed holder.
    fn force_unlock(
        &self,
        workspace: &str,
    ) -> impl Future<Output = StorageResult<Option<LockInfo>>> + Send;
    /// Every workspace.
    fn list_workspaces(&self) -> impl Future<Output = StorageResult<Vec<String>>> + Send;
    /// Create a workspace; `true` when it is new.
    fn create_workspace(&self, name: &str) -> impl Future<Output = StorageResult<bool>> + Send;
    /// Delete a workspace and its state.
    fn delete_workspace(&self, name: &str) -> impl Future<Output = StorageResult<()>> + Send;
    /// Previous versions of a state, newest first, when this storage keeps
    /// them.
    fn list_versions(
        &self,
        workspace: &str,
    ) -> impl Future<Output = StorageResult<Vec<Version>>> + Send {
        let _ = workspace;
        async { Err(StorageError::NoHistory) }
    }
    /// Seal the state and kept versions of `workspace` again under the
    /// sealing key (`wasmstate state reseal`); storage without host-side
    /// encryption has nothing to re-seal.
    fn reseal(
        &self,
        workspace: &str,
        request: &crate::resealing::ResealRequest,
    ) -> impl Future<Output = StorageResult<crate::resealing::ResealReport>> + Send {
        let _ = (workspace, request);
        async {
            Err(StorageError::InvalidInput(
                "this backend has no host-side encryption: nothing to re-seal".into(),
            ))
        }
    }
    /// One previous version; `None` when there is no such version.
    fn read_version(
        &self,
        workspace: &str,
        id: &str,
    ) -> impl Future<Output = StorageResult<Option<Vec<u8>>>> + Send {
        let _ = (workspace, id);
        async { Err(StorageError::NoHistory) }
    }
}

/// The `lineage` and `serial` of the stored state of `workspace`, read from
/// its first [`crate::statefile::PREFIX_BYTES`] (Terraform and OpenTofu
/// write them first), or from the whole state when they come later.
/// `None` when there is no state or it has not both. Storage is asked every
/// time, never a remembered value, so a second host writing the same
/// storage is seen.
pub async fn stored_version<S: Storage>(
    storage: &S,
    workspace: &str,
) -> StorageResult<Option<(String, u64)>> {
    use crate::statefile;
    let Some(prefix) = storage
        .read_prefix(workspace, statefile::PREFIX_BYTES)
        .await?
    else {
        return Ok(None);
    };
    if let Some(version) = statefile::version_in_prefix(&prefix) {
        return Ok(Some(version));
    }
    if prefix.len() < statefile::PREFIX_BYTES {
        return Ok(None);
    }
    let Some(stored) = storage.read(workspace).await? else {
        return Ok(None);
    };
    // Parsing a big state whole is the backend's host work, off the workers.
    let header = storage
        .host_work()
        .run_over(stored, |stored| statefile::read(stored).ok())
        .await?;
    Ok(header.and_then(|h| h.version().map(|(l, s)| (l.to_string(), s))))
}

/// A shared backend is a backend.
impl<S: Storage> Storage for std::sync::Arc<S> {
    fn conditional_writes(&self) -> bool {
        (**self).conditional_writes()
    }
    fn head(&self, workspace: &str) -> impl Future<Output = StorageResult<Option<Head>>> + Send {
        (**self).head(workspace)
    }
    fn write_if(
        &self,
        workspace: &str,
        state: Bytes,
        lock_id: Option<&str>,
        expect: Expect,
    ) -> impl Future<Output = StorageResult<bool>> + Send {
        (**self).write_if(workspace, state, lock_id, expect)
    }
    fn read_metadata(
        &self,
        workspace: &str,
    ) -> impl Future<Output = StorageResult<Option<Metadata>>> + Send {
        (**self).read_metadata(workspace)
    }
    fn write_metadata(
        &self,
        workspace: &str,
        content: Option<String>,
        expect: Expect,
    ) -> impl Future<Output = StorageResult<bool>> + Send {
        (**self).write_metadata(workspace, content, expect)
    }
    fn describe(&self) -> Option<Description> {
        (**self).describe()
    }
    fn opens_whole(&self) -> bool {
        (**self).opens_whole()
    }
    fn history_source(&self) -> HistorySource {
        (**self).history_source()
    }
    fn host_work(&self) -> HostWork {
        (**self).host_work()
    }
    fn read(&self, workspace: &str) -> impl Future<Output = StorageResult<Option<Vec<u8>>>> + Send {
        (**self).read(workspace)
    }
    fn read_prefix(
        &self,
        workspace: &str,
        max: usize,
    ) -> impl Future<Output = StorageResult<Option<Vec<u8>>>> + Send {
        (**self).read_prefix(workspace, max)
    }
    fn holds(
        &self,
        workspace: &str,
        state: &Bytes,
    ) -> impl Future<Output = StorageResult<bool>> + Send {
        (**self).holds(workspace, state)
    }
    fn write(
        &self,
        workspace: &str,
        state: Bytes,
        lock_id: Option<&str>,
    ) -> impl Future<Output = StorageResult<()>> + Send {
        (**self).write(workspace, state, lock_id)
    }
    fn delete(
        &self,
        workspace: &str,
        lock_id: Option<&str>,
    ) -> impl Future<Output = StorageResult<()>> + Send {
        (**self).delete(workspace, lock_id)
    }
    fn lock(
        &self,
        workspace: &str,
        info: LockInfo,
    ) -> impl Future<Output = StorageResult<()>> + Send {
        (**self).lock(workspace, info)
    }
    fn unlock(&self, workspace: &str, id: &str) -> impl Future<Output = StorageResult<()>> + Send {
        (**self).unlock(workspace, id)
    }
    fn current_lock(
        &self,
        workspace: &str,
    ) -> impl Future<Output = StorageResult<Option<LockInfo>>> + Send {
        (**self).current_lock(workspace)
    }
    fn force_unlock(
        &self,
        workspace: &str,
    ) -> impl Future<Output = StorageResult<Option<LockInfo>>> + Send {
        (**self).force_unlock(workspace)
    }
    fn list_workspaces(&self) -> impl Future<Output = StorageResult<Vec<String>>> + Send {
        (**self).list_workspaces()
    }
    fn create_workspace(&self, name: &str) -> impl Future<Output = StorageResult<bool>> + Send {
        (**self).create_workspace(name)
    }
    fn delete_workspace(&self, name: &str) -> impl Future<Output = StorageResult<()>> + Send {
        (**self).delete_workspace(name)
    }
    fn list_versions(
        &self,
        workspace: &str,
    ) -> impl Future<Output = StorageResult<Vec<Version>>> + Send {
        (**self).list_versions(workspace)
    }
    fn reseal(
        &self,
        workspace: &str,
        request: &crate::resealing::ResealRequest,
    ) -> impl Future<Output = StorageResult<crate::resealing::ResealReport>> + Send {
        (**self).reseal(workspace, request)
    }
    fn read_version(
        &self,
        workspace: &str,
        id: &str,
    ) -> impl Future<Output = StorageResult<Option<Vec<u8>>>> + Send {
        (**self).read_version(workspace, id)
    }
}
