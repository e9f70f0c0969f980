//! Guests built for `wasmstate:backend@0.2.1` (frozen in
//! `wit/since_v0.2.1`), and for 0.2.0, whose names the component model
//! links to these by semver. This module only adapts: its `host`, `body`,
//! `git` and `postgres` imports call the latest implementations, and an
//! unconditional write is the old `write` (0.2.x has no `expect`, `head`
//! or metadata: the host asks such a guest for none of them, see
//! `GuestBackend::conditional_writes`). The `types` did not change, so
//! they are shared with the latest bindings, and the `body` resources are
//! the same host resources ([`StateSource`], [`StateSink`]).

use super::super::bindings::wasmstate::backend::{
    body as latest_body, git as latest_git, host as latest_host, postgres as latest_postgres, types,
};
use super::super::chunks::{StateSink, StateSource};
use super::super::sandbox::Sandbox;
use wasmtime::component::{HasSelf, Linker, Resource};
use wasmtime_wasi::p2::{DynInputStream, DynOutputStream};

wasmtime::component::bindgen!({
    path: "../wit/since_v0.2.1",
    world: "backend",
    // As the latest bindings: the chunk calls are plain and trappable, the
    // copies and the capabilities async.
    imports: {
        "wasmstate:backend/body.[method]state-source.copy-to": async | trappable,
        "wasmstate:backend/body.[method]state-sink.copy-from": async | trappable,
        "wasmstate:backend/body": trappable,
        default: async,
    },
    exports: { default: async },
    with: {
        "wasi:io": wasmtime_wasi::p2::bindings::io,
        "wasmstate:backend/types@0.2.1": super::super::bindings::wasmstate::backend::types,
        "wasmstate:backend/body.state-source": super::super::chunks::StateSource,
        "wasmstate:backend/body.state-sink": super::super::chunks::StateSink,
    },
});

use self::wasmstate::backend::{body, git, host, postgres};

/// Add the 0.2.1 imports to `linker`, interface by interface (`wasi:io`
/// and `types` are the latest bindings' already).
pub fn add_to_linker(linker: &mut Linker<Sandbox>) -> wasmtime::Result<()> {
    host::add_to_linker::<_, HasSelf<Sandbox>>(linker, |s| s)?;
    body::add_to_linker::<_, HasSelf<Sandbox>>(linker, |s| s)?;
    git::add_to_linker::<_, HasSelf<Sandbox>>(linker, |s| s)?;
    postgres::add_to_linker::<_, HasSelf<Sandbox>>(linker, |s| s)?;
    Ok(())
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

impl body::Host for Sandbox {}

impl body::HostStateSource for Sandbox {
    fn size(&mut self, source: Resource<StateSource>) -> wasmtime::Result<u64> {
        latest_body::HostStateSource::size(self, source)
    }

    fn serial(&mut self, source: Resource<StateSource>) -> wasmtime::Result<Option<u64>> {
        latest_body::HostStateSource::serial(self, source)
    }

    fn read(&mut self, source: Resource<StateSource>, max: u32) -> wasmtime::Result<Vec<u8>> {
        latest_body::HostStateSource::read(self, source, max)
    }

    async fn copy_to(
        &mut self,
        source: Resource<StateSource>,
        dest: Resource<DynOutputStream>,
    ) -> wasmtime::Result<Result<u64, String>> {
        latest_body::HostStateSource::copy_to(self, source, dest).await
    }

    fn drop(&mut self, source: Resource<StateSource>) -> wasmtime::Result<()> {
        latest_body::HostStateSource::drop(self, source)
    }
}

impl body::HostStateSink for Sandbox {
    fn write(&mut self, sink: Resource<StateSink>, bytes: Vec<u8>) -> wasmtime::Result<bool> {
        latest_body::HostStateSink::write(self, sink, bytes)
    }

    async fn copy_from(
        &mut self,
        sink: Resource<StateSink>,
        src: Resource<DynInputStream>,
    ) -> wasmtime::Result<Result<u64, String>> {
        latest_body::HostStateSink::copy_from(self, sink, src).await
    }

    fn drop(&mut self, sink: Resource<StateSink>) -> wasmtime::Result<()> {
        latest_body::HostStateSink::drop(self, sink)
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

fn latest_changes(changes: Vec<git::FileChange>) -> Vec<latest_git::FileChange> {
    changes
        .into_iter()
        .map(|c| latest_git::FileChange {
            path: c.path,
            content: c.content,
        })
        .collect()
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

    async fn read_file_into(
        &mut self,
        url: String,
        commit: String,
        path: String,
        into: Resource<StateSink>,
    ) -> Result<Option<u64>, git::GitError> {
        Ok(latest_git::Host::read_file_into(self, url, commit, path, into).await?)
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
        let changes = latest_changes(changes);
        Ok(latest_git::Host::commit(self, url, parent, changes, message).await?)
    }

    async fn commit_state(
        &mut self,
        url: String,
        parent: Option<String>,
        path: String,
        state: Resource<StateSource>,
        changes: Vec<git::FileChange>,
        message: String,
    ) -> Result<String, git::GitError> {
        let changes = latest_changes(changes);
        Ok(
            latest_git::Host::commit_state(self, url, parent, path, state, changes, message)
                .await?,
        )
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

impl From<latest_postgres::PgError> for postgres::PgError {
    fn from(e: latest_postgres::PgError) -> Self {
        use latest_postgres::PgError as E;
        match e {
            E::Denied(m) => postgres::PgError::Denied(m),
            E::Unavailable(m) => postgres::PgError::Unavailable(m),
            E::InvalidInput(m) => postgres::PgError::InvalidInput(m),
            E::Internal(m) => postgres::PgError::Internal(m),
        }
    }
}

impl From<latest_postgres::Holder> for postgres::Holder {
    fn from(h: latest_postgres::Holder) -> Self {
        match h {
            latest_postgres::Holder::Wasmstate(info) => postgres::Holder::Wasmstate(info),
            latest_postgres::Holder::Native(what) => postgres::Holder::Native(what),
        }
    }
}

/// A refusal as 0.2.1 knows them. `changed` answers only a write that
/// expected a version, which a 0.2.x guest cannot ask for: the host's bug.
fn refused(
    r: Option<latest_postgres::Refused>,
) -> Result<Option<postgres::Refused>, postgres::PgError> {
    use latest_postgres::Refused as R;
    Ok(match r {
        None => None,
        Some(R::Held(holder)) => Some(postgres::Refused::Held(holder.into())),
        Some(R::NotLocked) => Some(postgres::Refused::NotLocked),
        Some(R::Changed) => {
            return Err(postgres::PgError::Internal(
                "the database refused an unconditional write as changed".into(),
            ));
        }
    })
}

impl postgres::Host for Sandbox {
    async fn list_names(&mut self) -> Result<Vec<String>, postgres::PgError> {
        Ok(latest_postgres::Host::list_names(self).await?)
    }

    async fn read_into(
        &mut self,
        name: String,
        into: Resource<StateSink>,
    ) -> Result<Option<u64>, postgres::PgError> {
        Ok(latest_postgres::Host::read_into(self, name, into).await?)
    }

    async fn write(
        &mut self,
        name: String,
        state: Resource<StateSource>,
        lock_id: Option<String>,
    ) -> Result<Option<postgres::Refused>, postgres::PgError> {
        let any = types::Expect::Any;
        refused(latest_postgres::Host::write(self, name, state, lock_id, any).await?)
    }

    async fn delete(
        &mut self,
        name: String,
        lock_id: Option<String>,
    ) -> Result<Option<postgres::Refused>, postgres::PgError> {
        refused(latest_postgres::Host::delete(self, name, lock_id).await?)
    }

    async fn create(&mut self, name: String, data: String) -> Result<bool, postgres::PgError> {
        Ok(latest_postgres::Host::create(self, name, data).await?)
    }

    async fn lock(
        &mut self,
        name: String,
        info: types::LockInfo,
    ) -> Result<Option<postgres::Holder>, postgres::PgError> {
        let holder = latest_postgres::Host::lock(self, name, info).await?;
        Ok(holder.map(Into::into))
    }

    async fn lock_holder(
        &mut self,
        name: String,
    ) -> Result<Option<postgres::Holder>, postgres::PgError> {
        let holder = latest_postgres::Host::lock_holder(self, name).await?;
        Ok(holder.map(Into::into))
    }

    async fn unlock(
        &mut self,
        name: String,
        id: String,
        force: bool,
    ) -> Result<Option<postgres::Holder>, postgres::PgError> {
        let holder = latest_postgres::Host::unlock(self, name, id, force).await?;
        Ok(holder.map(Into::into))
    }

    async fn list_versions(
        &mut self,
        name: String,
    ) -> Result<Option<Vec<postgres::KeptVersion>>, postgres::PgError> {
        let listed = latest_postgres::Host::list_versions(self, name).await?;
        Ok(listed.map(|kept| {
            kept.into_iter()
                .map(|v| postgres::KeptVersion {
                    id: v.id,
                    serial: v.serial,
                    created_unix_ms: v.created_unix_ms,
                    bytes: v.bytes,
                })
                .collect()
        }))
    }

    async fn read_version(
        &mut self,
        name: String,
        id: String,
        into: Resource<StateSink>,
    ) -> Result<bool, postgres::PgError> {
        Ok(latest_postgres::Host::read_version(self, name, id, into).await?)
    }
}
