//! Every contract version this host runs, behind one type. The latest
//! (`wit/`) holds all the logic and is called directly; each older version
//! has one module that adapts its calls to the latest's shapes, as Zed does
//! for its extension API. A new version moves the current bindings into a
//! `since_vX` module and adds an arm here.

/// The host's [`Version`]s from what a guest's `list-versions` returned,
/// whichever version's record type it is (they match field for field).
macro_rules! host_versions {
    ($listed:expr) => {
        $listed.map(|versions| {
            versions.map(|list| {
                list.into_iter()
                    .map(|v| crate::backend::Version {
                        id: v.id,
                        serial: v.serial,
                        created_unix_ms: v.created_unix_ms,
                        bytes: v.bytes,
                        written_by: None,
                    })
                    .collect()
            })
        })
    };
}

mod latest;
pub mod since_v0_1_0;
pub mod since_v0_2_1;

use self::latest::{Latest, LatestPre};
use super::bindings::exports::wasmstate::backend::storage::StateHead;
use super::bindings::wasmstate::backend::types::{Diagnostic, Error, Expect, LockInfo, Metadata};
use super::chunks::{StateSink, StateSource};
use super::sandbox::Sandbox;
use crate::backend::Version;
use crate::contract::ContractVersion;
use wasmtime::Store;
use wasmtime::component::{HasSelf, InstancePre, Linker, Resource};

/// What a guest call returns: a trap, or the guest's answer.
pub type Answer<T> = wasmtime::Result<Result<T, Error>>;

/// Add the imports of every supported version to `linker`.
pub fn add_to_linker(linker: &mut Linker<Sandbox>) -> wasmtime::Result<()> {
    // Interface by interface: the world's imports include `wasi:io`
    // (the body's copies take WASI streams), which wasmtime-wasi adds.
    use super::bindings::wasmstate::backend::{body, git, host, postgres, types};
    types::add_to_linker::<_, HasSelf<Sandbox>>(linker, |s| s)?;
    host::add_to_linker::<_, HasSelf<Sandbox>>(linker, |s| s)?;
    body::add_to_linker::<_, HasSelf<Sandbox>>(linker, |s| s)?;
    git::add_to_linker::<_, HasSelf<Sandbox>>(linker, |s| s)?;
    postgres::add_to_linker::<_, HasSelf<Sandbox>>(linker, |s| s)?;
    since_v0_2_1::add_to_linker(linker)?;
    since_v0_1_0::Backend::add_to_linker::<_, HasSelf<Sandbox>>(linker, |s| s)?;
    Ok(())
}

/// A linked guest of one contract version, ready to instantiate.
pub enum GuestPre {
    /// Built against the current `wit/`.
    Latest(LatestPre),
    /// Built against 0.2.1 or 0.2.0.
    V0_2_1(since_v0_2_1::BackendPre<Sandbox>),
    /// Built against 0.1.0.
    V0_1_0(since_v0_1_0::BackendPre<Sandbox>),
}

/// One instance of a guest.
pub enum Guest {
    /// Built against the current `wit/`.
    Latest(Latest),
    /// Built against 0.2.1 or 0.2.0.
    V0_2_1(since_v0_2_1::Backend),
    /// Built against 0.1.0.
    V0_1_0(since_v0_1_0::Backend),
}

impl GuestPre {
    /// Typed exports of `pre` for `version`.
    pub fn new(version: ContractVersion, pre: InstancePre<Sandbox>) -> wasmtime::Result<Self> {
        Ok(match version {
            ContractVersion::V0_3_0 => GuestPre::Latest(LatestPre::new(pre)?),
            // 0.2.0 is a subset of 0.2.1: the same bindings (its names
            // resolve to 0.2.1's by semver) serve it.
            ContractVersion::V0_2_1 | ContractVersion::V0_2_0 => {
                GuestPre::V0_2_1(since_v0_2_1::BackendPre::new(pre)?)
            }
            ContractVersion::V0_1_0 => GuestPre::V0_1_0(since_v0_1_0::BackendPre::new(pre)?),
        })
    }

    /// A fresh instance in `store`.
    pub async fn instantiate(&self, store: &mut Store<Sandbox>) -> wasmtime::Result<Guest> {
        Ok(match self {
            GuestPre::Latest(pre) => Guest::Latest(pre.instantiate_async(store).await?),
            GuestPre::V0_2_1(pre) => Guest::V0_2_1(pre.instantiate_async(store).await?),
            GuestPre::V0_1_0(pre) => Guest::V0_1_0(pre.instantiate_async(store).await?),
        })
    }
}

/// Every arm calls the same function of the same interface, whose
/// signature did not change between versions.
macro_rules! same_in_every_version {
    ($guest:expr, $interface:ident . $call:ident ( $store:expr $(, $arg:expr)* )) => {
        match $guest {
            Guest::Latest(g) => g.$interface().$call($store $(, $arg)*).await,
            Guest::V0_2_1(g) => g.$interface().$call($store $(, $arg)*).await,
            Guest::V0_1_0(g) => g.$interface().$call($store $(, $arg)*).await,
        }
    };
}

/// What an older guest answers to a call its contract lacks (the host
/// asks only 0.3.0 guests, see `GuestBackend::conditional_writes`).
fn not_in_contract<T>(call: &str) -> Answer<T> {
    Ok(Err(Error::Internal(format!(
        "{call} is not in the contract this guest was built for (before 0.3.0)"
    ))))
}

impl Guest {
    /// `storage.head`, its first bytes into `prefix`; `None` when there is
    /// no state.
    pub async fn head(
        &self,
        store: &mut Store<Sandbox>,
        workspace: &str,
        prefix: &Resource<StateSink>,
    ) -> Answer<Option<StateHead>> {
        match self {
            Guest::Latest(g) => {
                let lent = Resource::new_borrow(prefix.rep());
                g.wasmstate_backend_storage()
                    .call_head(store, workspace, lent)
                    .await
            }
            Guest::V0_2_1(_) | Guest::V0_1_0(_) => not_in_contract("storage.head"),
        }
    }

    /// `storage.read` into `sink`; `false` when there is no state.
    pub async fn read(
        &self,
        store: &mut Store<Sandbox>,
        workspace: &str,
        sink: &Resource<StateSink>,
    ) -> Answer<bool> {
        let lent = || Resource::new_borrow(sink.rep());
        match self {
            Guest::Latest(g) => {
                g.wasmstate_backend_storage()
                    .call_read(store, workspace, lent())
                    .await
            }
            Guest::V0_2_1(g) => {
                g.wasmstate_backend_storage()
                    .call_read(store, workspace, lent())
                    .await
            }
            Guest::V0_1_0(g) => since_v0_1_0::read(g, store, workspace, sink).await,
        }
    }

    /// `storage.write` from `source`, if the stored state is as `expect`
    /// says; `false` when it is not. Guests before 0.3.0 take only
    /// [`Expect::Any`].
    pub async fn write(
        &self,
        store: &mut Store<Sandbox>,
        workspace: &str,
        source: &Resource<StateSource>,
        lock_id: Option<&str>,
        expect: &Expect,
    ) -> Answer<bool> {
        let lent = || Resource::new_borrow(source.rep());
        let unconditional = matches!(expect, Expect::Any);
        match self {
            Guest::Latest(g) => {
                g.wasmstate_backend_storage()
                    .call_write(store, workspace, lent(), lock_id, expect)
                    .await
            }
            Guest::V0_2_1(_) | Guest::V0_1_0(_) if !unconditional => {
                not_in_contract("a conditional storage.write")
            }
            Guest::V0_2_1(g) => Ok(g
                .wasmstate_backend_storage()
                .call_write(store, workspace, lent(), lock_id)
                .await?
                .map(|()| true)),
            Guest::V0_1_0(g) => Ok(since_v0_1_0::write(g, store, workspace, source, lock_id)
                .await?
                .map(|()| true)),
        }
    }

    /// `history.read-version` into `sink`; `false` when there is no such
    /// version.
    pub async fn read_version(
        &self,
        store: &mut Store<Sandbox>,
        workspace: &str,
        id: &str,
        sink: &Resource<StateSink>,
    ) -> Answer<bool> {
        let lent = || Resource::new_borrow(sink.rep());
        match self {
            Guest::Latest(g) => {
                g.wasmstate_backend_history()
                    .call_read_version(store, workspace, id, lent())
                    .await
            }
            Guest::V0_2_1(g) => {
                g.wasmstate_backend_history()
                    .call_read_version(store, workspace, id, lent())
                    .await
            }
            Guest::V0_1_0(g) => since_v0_1_0::read_version(g, store, workspace, id, sink).await,
        }
    }

    /// `history.list-versions`, in the host's terms.
    pub async fn list_versions(
        &self,
        store: &mut Store<Sandbox>,
        workspace: &str,
    ) -> Answer<Option<Vec<Version>>> {
        match self {
            Guest::Latest(g) => {
                let listed = g
                    .wasmstate_backend_history()
                    .call_list_versions(store, workspace)
                    .await?;
                Ok(host_versions!(listed))
            }
            Guest::V0_2_1(g) => {
                let listed = g
                    .wasmstate_backend_history()
                    .call_list_versions(store, workspace)
                    .await?;
                Ok(host_versions!(listed))
            }
            Guest::V0_1_0(g) => since_v0_1_0::list_versions(g, store, workspace).await,
        }
    }

    /// `workspaces.read-metadata`.
    pub async fn read_metadata(
        &self,
        store: &mut Store<Sandbox>,
        name: &str,
    ) -> Answer<Option<Metadata>> {
        match self {
            Guest::Latest(g) => {
                g.wasmstate_backend_workspaces()
                    .call_read_metadata(store, name)
                    .await
            }
            Guest::V0_2_1(_) | Guest::V0_1_0(_) => not_in_contract("workspaces.read-metadata"),
        }
    }

    /// `workspaces.write-metadata`.
    pub async fn write_metadata(
        &self,
        store: &mut Store<Sandbox>,
        name: &str,
        content: Option<&str>,
        expect: &Expect,
    ) -> Answer<bool> {
        match self {
            Guest::Latest(g) => {
                g.wasmstate_backend_workspaces()
                    .call_write_metadata(store, name, content, expect)
                    .await
            }
            Guest::V0_2_1(_) | Guest::V0_1_0(_) => not_in_contract("workspaces.write-metadata"),
        }
    }
    /// `storage.delete`.
    pub async fn delete(
        &self,
        store: &mut Store<Sandbox>,
        workspace: &str,
        lock_id: Option<&str>,
    ) -> Answer<()> {
        same_in_every_version!(
            self,
            wasmstate_backend_storage.call_delete(store, workspace, lock_id)
        )
    }

    /// `storage.lock`.
    pub async fn lock(
        &self,
        store: &mut Store<Sandbox>,
        workspace: &str,
        info: &LockInfo,
    ) -> Answer<()> {
        same_in_every_version!(
            self,
            wasmstate_backend_storage.call_lock(store, workspace, info)
        )
    }

    /// `storage.unlock`.
    pub async fn unlock(
        &self,
        store: &mut Store<Sandbox>,
        workspace: &str,
        id: &str,
    ) -> Answer<()> {
        same_in_every_version!(
            self,
            wasmstate_backend_storage.call_unlock(store, workspace, id)
        )
    }

    /// `storage.current-lock`.
    pub async fn current_lock(
        &self,
        store: &mut Store<Sandbox>,
        workspace: &str,
    ) -> Answer<Option<LockInfo>> {
        same_in_every_version!(
            self,
            wasmstate_backend_storage.call_current_lock(store, workspace)
        )
    }

    /// `storage.force-unlock`.
    pub async fn force_unlock(
        &self,
        store: &mut Store<Sandbox>,
        workspace: &str,
    ) -> Answer<Option<LockInfo>> {
        same_in_every_version!(
            self,
            wasmstate_backend_storage.call_force_unlock(store, workspace)
        )
    }

    /// `workspaces.list-workspaces`.
    pub async fn list_workspaces(&self, store: &mut Store<Sandbox>) -> Answer<Vec<String>> {
        same_in_every_version!(
            self,
            wasmstate_backend_workspaces.call_list_workspaces(store)
        )
    }

    /// `workspaces.create-workspace`.
    pub async fn create_workspace(&self, store: &mut Store<Sandbox>, name: &str) -> Answer<bool> {
        same_in_every_version!(
            self,
            wasmstate_backend_workspaces.call_create_workspace(store, name)
        )
    }

    /// `workspaces.delete-workspace`.
    pub async fn delete_workspace(&self, store: &mut Store<Sandbox>, name: &str) -> Answer<()> {
        same_in_every_version!(
            self,
            wasmstate_backend_workspaces.call_delete_workspace(store, name)
        )
    }

    /// `config.validate`.
    pub async fn validate(&self, store: &mut Store<Sandbox>) -> wasmtime::Result<Vec<Diagnostic>> {
        same_in_every_version!(self, wasmstate_backend_config.call_validate(store))
    }
}
