//! The WIT `git` interface for guests, on top of the host's git capability
//! ([`crate::capabilities::git`]). Every call checks the backend's grants,
//! then runs libgit2 on tokio's blocking pool so network waits never stall
//! the executor.

use super::bindings::wasmstate::backend::git as wit;
use super::chunks::{StateSink, StateSource};
use super::sandbox::Sandbox;
use crate::capabilities::git::{FileChange, GitAccess, GitError, RepoHandle};
use std::sync::Arc;
use wasmtime::component::Resource;

impl From<GitError> for wit::GitError {
    fn from(e: GitError) -> Self {
        match e {
            GitError::Denied(m) => wit::GitError::Denied(m),
            GitError::Unavailable(m) => wit::GitError::Unavailable(m),
            GitError::Rejected(m) => wit::GitError::Rejected(m),
            GitError::NotFound(m) => wit::GitError::NotFound(m),
            GitError::InvalidInput(m) => wit::GitError::InvalidInput(m),
            GitError::Internal(m) => wit::GitError::Internal(m),
        }
    }
}

impl Sandbox {
    /// Run `call` on repository `url` if this backend was granted it. The
    /// future owns what it needs (the store's data is not `Sync`).
    fn git<T: Send + 'static>(
        &self,
        url: String,
        call: impl FnOnce(&RepoHandle<'_>) -> Result<T, GitError> + Send + 'static,
    ) -> impl Future<Output = Result<T, wit::GitError>> + Send + 'static {
        let access = self.git.clone();
        let backend = self.backend.clone();
        let deadline = self.core.deadline();
        let slots = self.core.keep_slots();
        async move {
            let Some(access) = access else {
                tracing::warn!(backend = %backend, %url, "git call refused: the backend has no git grant");
                return Err(wit::GitError::Denied(format!(
                    "backend {backend:?} may not use git; the operator must add allow_git = [\"{url}\"] to it"
                )));
            };
            run(access, backend, url, deadline, slots, call).await
        }
    }
}

/// Run `call` on a blocking thread of the guest threads' pool, stopping at
/// the request's `deadline` (waiting for the repository and talking to the
/// remote), so host work done for a guest ends when the guest's time does.
async fn run<T: Send + 'static>(
    access: GitAccess,
    backend: Arc<str>,
    url: String,
    deadline: std::time::Instant,
    slots: super::turns::Slots,
    call: impl FnOnce(&RepoHandle<'_>) -> Result<T, GitError> + Send + 'static,
) -> Result<T, wit::GitError> {
    tokio::task::spawn_blocking(move || {
            // The call's instance slots stay taken until this ends, even
            // if the call is dropped first.
            let _slots = slots;
            let repo = access.host.repo(&access.grants, &url).inspect_err(|e| {
                if let GitError::Denied(_) = e {
                    tracing::warn!(backend = %backend, %url, "git call refused: repository not granted");
                }
            })?;
            call(&repo.until(deadline))
        })
        .await
        .map_err(|e| wit::GitError::Internal(format!("git task failed: {e}")))?
        .map_err(Into::into)
}

/// A handle the guest passed that is not in its table: a bug in the guest
/// or its bindings.
fn resource_error(e: wasmtime::component::ResourceTableError) -> wit::GitError {
    wit::GitError::Internal(format!("bad resource handle: {e}"))
}

impl wit::Host for Sandbox {
    async fn list_remote_refs(
        &mut self,
        url: String,
        prefix: String,
    ) -> Result<Vec<wit::RemoteRef>, wit::GitError> {
        let refs = self
            .git(url, move |repo| repo.list_remote_refs(&prefix))
            .await?;
        Ok(refs
            .into_iter()
            .map(|r| wit::RemoteRef {
                name: r.name,
                target: r.target,
            })
            .collect())
    }

    async fn fetch(
        &mut self,
        url: String,
        refs: Vec<String>,
    ) -> Result<Vec<Option<String>>, wit::GitError> {
        self.git(url, move |repo| repo.fetch(&refs)).await
    }

    async fn read_file(
        &mut self,
        url: String,
        commit: String,
        path: String,
    ) -> Result<Option<Vec<u8>>, wit::GitError> {
        self.git(url, move |repo| repo.read_file(&commit, &path))
            .await
    }

    async fn read_file_into(
        &mut self,
        url: String,
        commit: String,
        path: String,
        into: Resource<StateSink>,
    ) -> Result<Option<u64>, wit::GitError> {
        let Some(bytes) = self
            .git(url, move |repo| repo.read_file(&commit, &path))
            .await?
        else {
            return Ok(None);
        };
        self.charge_capability_sink(&into, bytes.len())
            .map_err(wit::GitError::Unavailable)?;
        let sink = self.table.get_mut(&into).map_err(resource_error)?;
        sink.write(&bytes);
        Ok(Some(bytes.len() as u64))
    }

    async fn stat_file(
        &mut self,
        url: String,
        commit: String,
        path: String,
    ) -> Result<Option<wit::FileStat>, wit::GitError> {
        let stat = self
            .git(url, move |repo| repo.stat_file(&commit, &path))
            .await?;
        Ok(stat.map(|s| wit::FileStat {
            blob: s.blob,
            size: s.size,
        }))
    }

    async fn list_files(
        &mut self,
        url: String,
        commit: String,
        dir: String,
    ) -> Result<Vec<String>, wit::GitError> {
        self.git(url, move |repo| repo.list_files(&commit, &dir))
            .await
    }

    async fn commit(
        &mut self,
        url: String,
        parent: Option<String>,
        changes: Vec<wit::FileChange>,
        message: String,
    ) -> Result<String, wit::GitError> {
        let changes: Vec<FileChange> = changes
            .into_iter()
            .map(|c| FileChange {
                path: c.path,
                content: c.content,
            })
            .collect();
        self.git(url, move |repo| {
            repo.commit(parent.as_deref(), &changes, &message)
        })
        .await
    }

    async fn commit_state(
        &mut self,
        url: String,
        parent: Option<String>,
        path: String,
        state: Resource<StateSource>,
        changes: Vec<wit::FileChange>,
        message: String,
    ) -> Result<String, wit::GitError> {
        // libgit2 writes a blob from one buffer: the host's copy of the
        // body, not the guest's (which never held it).
        let bytes = self
            .table
            .get(&state)
            .map_err(resource_error)?
            .bytes()
            .to_vec();
        let mut changes = changes;
        changes.push(wit::FileChange {
            path,
            content: Some(bytes),
        });
        wit::Host::commit(self, url, parent, changes, message).await
    }

    async fn push(
        &mut self,
        url: String,
        name: String,
        new: String,
        expected: Option<String>,
    ) -> Result<(), wit::GitError> {
        self.git(url, move |repo| repo.push(&name, &new, expected.as_deref()))
            .await
    }

    async fn file_history(
        &mut self,
        url: String,
        commit: String,
        path: String,
        limit: u32,
    ) -> Result<Vec<wit::FileVersion>, wit::GitError> {
        let versions = self
            .git(url, move |repo| repo.file_history(&commit, &path, limit))
            .await?;
        Ok(versions
            .into_iter()
            .map(|v| wit::FileVersion {
                commit: v.commit,
                time_unix_ms: v.time_unix_ms,
                size: v.size,
            })
            .collect())
    }

    async fn delete_ref(
        &mut self,
        url: String,
        name: String,
        expected: String,
    ) -> Result<(), wit::GitError> {
        self.git(url, move |repo| repo.delete_ref(&name, &expected))
            .await
    }
}
