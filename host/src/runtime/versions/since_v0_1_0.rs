//! Guests built for `wasmstate:backend@0.1.0` (frozen in
//! `wit/since_v0.1.0`), which pass states whole. This module only adapts:
//! a read's bytes go into the sink, a write's source is handed over whole,
//! and the `host` and `git` imports of 0.1.0 call the latest ones. The
//! `types` interface did not change, so it is shared.

use super::super::bindings::wasmstate::backend::{git as latest_git, host as latest_host, types};
use super::super::chunks::{StateSink, StateSource};
use super::super::sandbox::Sandbox;
use crate::backend::Version;
use wasmtime::Store;
use wasmtime::component::Resource;

wasmtime::component::bindgen!({
    path: "../wit/since_v0.1.0",
    world: "backend",
    imports: { default: async },
    exports: { default: async },
    with: { "wasmstate:backend/types@0.1.0": super::super::bindings::wasmstate::backend::types },
});

use self::wasmstate::backend::{git, host};

/// What a 0.1.0 call returns: a trap, or the guest's answer.
type Answer<T> = wasmtime::Result<Result<T, types::Error>>;

/// `read`: the whole state, written into `sink`.
pub async fn read(
    guest: &Backend,
    store: &mut Store<Sandbox>,
    workspace: &str,
    sink: &Resource<StateSink>,
) -> Answer<bool> {
    let state = guest
        .wasmstate_backend_storage()
        .call_read(&mut *store, workspace)
        .await?;
    fill(store, sink, state)
}

/// `write`: the source handed over whole.
pub async fn write(
    guest: &Backend,
    store: &mut Store<Sandbox>,
    workspace: &str,
    source: &Resource<StateSource>,
    lock_id: Option<&str>,
) -> Answer<()> {
    let state = store.data().table.get(source)?.bytes().clone();
    guest
        .wasmstate_backend_storage()
        .call_write(store, workspace, &state, lock_id)
        .await
}

/// `read-version`: the whole version, written into `sink`.
pub async fn read_version(
    guest: &Backend,
    store: &mut Store<Sandbox>,
    workspace: &str,
    id: &str,
    sink: &Resource<StateSink>,
) -> Answer<bool> {
    let state = guest
        .wasmstate_backend_history()
        .call_read_version(&mut *store, workspace, id)
        .await?;
    fill(store, sink, state)
}

/// `list-versions`, in the host's terms.
pub async fn list_versions(
    guest: &Backend,
    store: &mut Store<Sandbox>,
    workspace: &str,
) -> Answer<Option<Vec<Version>>> {
    let listed = guest
        .wasmstate_backend_history()
        .call_list_versions(store, workspace)
        .await?;
    Ok(host_versions!(listed))
}

fn fill(
    store: &mut Store<Sandbox>,
    sink: &Resource<StateSink>,
    state: Result<Option<Vec<u8>>, types::Error>,
) -> Answer<bool> {
    Ok(match state {
        Ok(Some(bytes)) => {
            store.data_mut().table.get_mut(sink)?.write(&bytes);
            Ok(true)
        }
        Ok(None) => Ok(false),
        Err(e) => Err(e),
    })
}

impl host::Host for Sandbox {
    async fn log(&mut self, level: host::LogLevel, message: String) {
        use latest_host::LogLevel as L;
        let level = match level {
            host::LogLevel::Trace => L::Trace,
            host::LogLevel::Debug => L::Debug,
            host::LogLevel::Info => L::Info,
            host::LogLevel::Warn => L::Warn,
            host::LogLevel::Error => L::Error,
        };
        latest_host::Host::log(self, level, message).await
    }

    async fn get_config(&mut self) -> Vec<(String, String)> {
        latest_host::Host::get_config(self).await
    }

    async fn get_secret(&mut self, name: String) -> Option<String> {
        latest_host::Host::get_secret(self, name).await
    }
}

impl From<latest_git::GitError> for git::GitError {
    fn from(e: latest_git::GitError) -> Self {
        use latest_git::GitError as E;
        match e {
            E::Denied(m) => git::GitError::Denied(m),
            E::Unavailable(m) => git::GitError::Unavailable(m),
            E::Rejected(m) => git::GitError::Rejected(m),
            E::NotFound(m) => git::GitError::NotFound(m),
            E::InvalidInput(m) => git::GitError::InvalidInput(m),
            E::Internal(m) => git::GitError::Internal(m),
        }
    }
}

impl git::Host for Sandbox {
    async fn list_remote_refs(
        &mut self,
        url: String,
        prefix: String,
    ) -> Result<Vec<git::RemoteRef>, git::GitError> {
        let refs = latest_git::Host::list_remote_refs(self, url, prefix).await?;
        Ok(refs
            .into_iter()
            .map(|r| git::RemoteRef {
                name: r.name,
                target: r.target,
            })
            .collect())
    }

    async fn fetch(
        &mut self,
        url: String,
        refs: Vec<String>,
    ) -> Result<Vec<Option<String>>, git::GitError> {
        Ok(latest_git::Host::fetch(self, url, refs).await?)
    }

    async fn read_file(
        &mut self,
        url: String,
        commit: String,
        path: String,
    ) -> Result<Option<Vec<u8>>, git::GitError> {
        Ok(latest_git::Host::read_file(self, url, commit, path).await?)
    }

    async fn list_files(
        &mut self,
        url: String,
        commit: String,
        dir: String,
    ) -> Result<Vec<String>, git::GitError> {
        Ok(latest_git::Host::list_files(self, url, commit, dir).await?)
    }

    async fn commit(
        &mut self,
        url: String,
        parent: Option<String>,
        changes: Vec<git::FileChange>,
        message: String,
    ) -> Result<String, git::GitError> {
        let changes = changes
            .into_iter()
            .map(|c| latest_git::FileChange {
                path: c.path,
                content: c.content,
            })
            .collect();
        Ok(latest_git::Host::commit(self, url, parent, changes, message).await?)
    }

    async fn push(
        &mut self,
        url: String,
        name: String,
        new: String,
        expected: Option<String>,
    ) -> Result<(), git::GitError> {
        Ok(latest_git::Host::push(self, url, name, new, expected).await?)
    }

    async fn file_history(
        &mut self,
        url: String,
        commit: String,
        path: String,
        limit: u32,
    ) -> Result<Vec<git::FileVersion>, git::GitError> {
        let versions = latest_git::Host::file_history(self, url, commit, path, limit).await?;
        Ok(versions
            .into_iter()
            .map(|v| git::FileVersion {
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
    ) -> Result<(), git::GitError> {
        Ok(latest_git::Host::delete_ref(self, url, name, expected).await?)
    }
}
