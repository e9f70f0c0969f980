//! The current contract's exports, found and type-checked once per
//! component ([`LatestPre::new`]), not once per instance: `bindgen!`'s
//! `BackendPre` type-checks all sixteen exports for every instance it
//! makes, though a request calls one or two (about a tenth of making an
//! instance). The calls keep bindgen's names and shapes, so the call sites
//! read as they did.

use super::super::bindings::exports::wasmstate::backend::history::Version;
use super::super::bindings::exports::wasmstate::backend::storage::StateHead;
use super::super::bindings::wasmstate::backend::types::{
    Diagnostic, Error, Expect, LockInfo, Metadata,
};
use super::super::chunks::{StateSink, StateSource};
use super::super::sandbox::Sandbox;
use super::Answer;
use std::marker::PhantomData;
use std::sync::Arc;
use wasmtime::Store;
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{
    ComponentExportIndex, ComponentNamedList, Instance, InstancePre, Lift, Lower, Resource,
    TypedFunc,
};

/// An exported function checked to be `P -> R` against the
/// `InstancePre` of its [`LatestPre`]; made only by [`Export::checked`],
/// so a call cannot pair an index with another signature.
struct Export<P, R> {
    index: ComponentExportIndex,
    signature: PhantomData<fn() -> (P, R)>,
}

impl<P: ComponentNamedList + Lower, R: ComponentNamedList + Lift> Export<P, R> {
    fn checked(
        pre: &InstancePre<Sandbox>,
        (interface, interface_name): (ComponentExportIndex, &str),
        name: &str,
    ) -> wasmtime::Result<Self> {
        let component = pre.component();
        let (item, index) = component
            .get_export(Some(&interface), name)
            .ok_or_else(|| {
                wasmtime::format_err!("instance export `{interface_name}` has no export `{name}`")
            })?;
        match item {
            // The check `Instance::get_typed_func` makes for each instance,
            // against the types the instance will have (the imported
            // resources are the linker's, in the same order).
            ComponentItem::ComponentFunc(func) => {
                func.typecheck::<P, R>(&pre.instance_type()).map_err(|e| {
                    e.context(format!("type-checking export `{interface_name}#{name}`"))
                })?
            }
            _ => wasmtime::bail!("export `{interface_name}#{name}` is not a function"),
        }
        Ok(Export {
            index,
            signature: PhantomData,
        })
    }
}

/// Any lifetime at the call: `Export` is covariant in its signature, and
/// a type check ignores lifetimes.
type Str = &'static str;
/// What every storage call answers.
type Answered<T> = (Result<T, Error>,);
/// `storage.write`'s arguments.
type WriteArgs = (Str, Resource<StateSource>, Option<Str>, &'static Expect);

/// Every export of the current contract, with bindgen's signature for it
/// (`signatures_are_bindgens` holds them to it).
struct Exports {
    head: Export<(Str, Resource<StateSink>), Answered<Option<StateHead>>>,
    read: Export<(Str, Resource<StateSink>), Answered<bool>>,
    write: Export<WriteArgs, Answered<bool>>,
    delete: Export<(Str, Option<Str>), Answered<()>>,
    lock: Export<(Str, &'static LockInfo), Answered<()>>,
    unlock: Export<(Str, Str), Answered<()>>,
    current_lock: Export<(Str,), Answered<Option<LockInfo>>>,
    force_unlock: Export<(Str,), Answered<Option<LockInfo>>>,
    list_workspaces: Export<(), Answered<Vec<String>>>,
    create_workspace: Export<(Str,), Answered<bool>>,
    delete_workspace: Export<(Str,), Answered<()>>,
    read_metadata: Export<(Str,), Answered<Option<Metadata>>>,
    write_metadata: Export<(Str, Option<Str>, &'static Expect), Answered<bool>>,
    list_versions: Export<(Str,), Answered<Option<Vec<Version>>>>,
    read_version: Export<(Str, Str, Resource<StateSink>), Answered<bool>>,
    validate: Export<(), (Vec<Diagnostic>,)>,
}

impl Exports {
    fn new(pre: &InstancePre<Sandbox>) -> wasmtime::Result<Self> {
        let interface = |name: &'static str| {
            let index = pre
                .component()
                .get_export_index(None, name)
                .ok_or_else(|| wasmtime::format_err!("no exported instance named `{name}`"))?;
            Ok::<_, wasmtime::Error>((index, name))
        };
        let storage = interface("wasmstate:backend/storage@0.3.0")?;
        let workspaces = interface("wasmstate:backend/workspaces@0.3.0")?;
        let history = interface("wasmstate:backend/history@0.3.0")?;
        let config = interface("wasmstate:backend/config@0.3.0")?;
        // Each field's type fixes the signature checked.
        macro_rules! checked {
            ($interface:expr, $name:literal) => {
                Export::checked(pre, $interface, $name)?
            };
        }
        Ok(Exports {
            head: checked!(storage, "head"),
            read: checked!(storage, "read"),
            write: checked!(storage, "write"),
            delete: checked!(storage, "delete"),
            lock: checked!(storage, "lock"),
            unlock: checked!(storage, "unlock"),
            current_lock: checked!(storage, "current-lock"),
            force_unlock: checked!(storage, "force-unlock"),
            list_workspaces: checked!(workspaces, "list-workspaces"),
            create_workspace: checked!(workspaces, "create-workspace"),
            delete_workspace: checked!(workspaces, "delete-workspace"),
            read_metadata: checked!(workspaces, "read-metadata"),
            write_metadata: checked!(workspaces, "write-metadata"),
            list_versions: checked!(history, "list-versions"),
            read_version: checked!(history, "read-version"),
            validate: checked!(config, "validate"),
        })
    }
}

/// A guest built for the current contract, linked, its exports checked.
pub struct LatestPre {
    pre: InstancePre<Sandbox>,
    exports: Arc<Exports>,
}

impl LatestPre {
    /// Find and type-check the exports of `pre`'s component.
    pub fn new(pre: InstancePre<Sandbox>) -> wasmtime::Result<Self> {
        let exports = Arc::new(Exports::new(&pre)?);
        Ok(LatestPre { pre, exports })
    }

    /// A fresh instance in `store`.
    pub async fn instantiate_async(&self, store: &mut Store<Sandbox>) -> wasmtime::Result<Latest> {
        let instance = self.pre.instantiate_async(&mut *store).await?;
        Ok(Latest {
            instance,
            exports: self.exports.clone(),
        })
    }
}

/// One instance of a current-contract guest. Made only by
/// [`LatestPre::instantiate_async`], so its exports were checked against
/// the `InstancePre` it came from.
pub struct Latest {
    instance: Instance,
    exports: Arc<Exports>,
}

/// Call sites name the interface, as with bindgen's `Backend`.
macro_rules! interfaces {
    ($($name:ident),*) => {$(
        /// This instance (its calls of that interface).
        pub fn $name(&self) -> &Self {
            self
        }
    )*};
}

/// A call with bindgen's name and arguments.
macro_rules! calls {
    ($($name:ident: $export:ident ($($arg:ident: $ty:ty),*) -> $answer:ty;)*) => {$(
        /// The guest's export of that name.
        pub async fn $name(&self, store: &mut Store<Sandbox>, $($arg: $ty),*) -> $answer {
            Ok(self.call(store, &self.exports.$export, ($($arg,)*)).await?.0)
        }
    )*};
}

impl Latest {
    interfaces!(
        wasmstate_backend_storage,
        wasmstate_backend_workspaces,
        wasmstate_backend_history,
        wasmstate_backend_config
    );

    #[allow(unsafe_code)]
    async fn call<P, R>(
        &self,
        store: &mut Store<Sandbox>,
        export: &Export<P, R>,
        params: P,
    ) -> wasmtime::Result<R>
    where
        P: ComponentNamedList + Lower + Send + Sync,
        R: ComponentNamedList + Lift + Send + Sync + 'static,
    {
        let func = self
            .instance
            .get_func(&mut *store, export.index)
            .ok_or_else(|| wasmtime::format_err!("an export is missing from its own instance"))?;
        // SAFETY: an `Export<P, R>` exists only after
        // `ComponentFunc::typecheck::<P, R>` passed for this index against
        // the `InstancePre` this instance was made from (`Latest` is made
        // only there); the check ignores lifetimes. This is what bindgen's
        // calls do after their per-instance check.
        let typed = unsafe { TypedFunc::<P, R>::new_unchecked(func) };
        // Post-return runs inside the call in wasmtime 48.
        typed.call_async(&mut *store, params).await
    }

    calls! {
        call_head: head(workspace: &str, prefix: Resource<StateSink>) -> Answer<Option<StateHead>>;
        call_read: read(workspace: &str, into: Resource<StateSink>) -> Answer<bool>;
        call_write: write(
            workspace: &str,
            state: Resource<StateSource>,
            lock_id: Option<&str>,
            expect: &Expect
        ) -> Answer<bool>;
        call_delete: delete(workspace: &str, lock_id: Option<&str>) -> Answer<()>;
        call_lock: lock(workspace: &str, info: &LockInfo) -> Answer<()>;
        call_unlock: unlock(workspace: &str, id: &str) -> Answer<()>;
        call_current_lock: current_lock(workspace: &str) -> Answer<Option<LockInfo>>;
        call_force_unlock: force_unlock(workspace: &str) -> Answer<Option<LockInfo>>;
        call_list_workspaces: list_workspaces() -> Answer<Vec<String>>;
        call_create_workspace: create_workspace(name: &str) -> Answer<bool>;
        call_delete_workspace: delete_workspace(name: &str) -> Answer<()>;
        call_read_metadata: read_metadata(name: &str) -> Answer<Option<Metadata>>;
        call_write_metadata: write_metadata(
            name: &str,
            content: Option<&str>,
            expect: &Expect
        ) -> Answer<bool>;
        call_list_versions: list_versions(workspace: &str) -> Answer<Option<Vec<Version>>>;
        call_read_version: read_version(
            workspace: &str,
            id: &str,
            into: Resource<StateSink>
        ) -> Answer<bool>;
    }

    /// `config.validate`: a list, not an answer.
    pub async fn call_validate(
        &self,
        store: &mut Store<Sandbox>,
    ) -> wasmtime::Result<Vec<Diagnostic>> {
        Ok(self.call(store, &self.exports.validate, ()).await?.0)
    }
}

/// Never run: does not compile if a signature above differs from the one
/// bindgen generates for the same export (lifetimes aside).
#[cfg(test)]
#[allow(dead_code)]
fn signatures_are_bindgens(ours: &Exports, bindgen: &super::super::bindings::Backend) {
    fn same<P, R>(_: TypedFunc<P, R>, _: &Export<P, R>) {}
    let storage = bindgen.wasmstate_backend_storage();
    same(storage.func_head(), &ours.head);
    same(storage.func_read(), &ours.read);
    same(storage.func_write(), &ours.write);
    same(storage.func_delete(), &ours.delete);
    same(storage.func_lock(), &ours.lock);
    same(storage.func_unlock(), &ours.unlock);
    same(storage.func_current_lock(), &ours.current_lock);
    same(storage.func_force_unlock(), &ours.force_unlock);
    let workspaces = bindgen.wasmstate_backend_workspaces();
    same(workspaces.func_list_workspaces(), &ours.list_workspaces);
    same(workspaces.func_create_workspace(), &ours.create_workspace);
    same(workspaces.func_delete_workspace(), &ours.delete_workspace);
    same(workspaces.func_read_metadata(), &ours.read_metadata);
    same(workspaces.func_write_metadata(), &ours.write_metadata);
    let history = bindgen.wasmstate_backend_history();
    same(history.func_list_versions(), &ours.list_versions);
    same(history.func_read_version(), &ours.read_version);
    same(
        bindgen.wasmstate_backend_config().func_validate(),
        &ours.validate,
    );
}
