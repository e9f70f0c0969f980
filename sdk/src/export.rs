//! The generated WIT bindings and the glue that routes each exported
//! function to the author's [`Backend`]. Nothing here is public API: authors
//! never see wit-bindgen types.
#![allow(unsafe_code, missing_docs)]

use crate::{
    Backend, Config, Diagnostic, Error, Expect, Head, LockInfo, Metadata, StateReader, StateWriter,
};

pub(crate) mod wit {
    wit_bindgen::generate!({
        path: "../wit",
        world: "backend",
        // `wit/deps` (for the `guest` world other toolchains use) has WASI
        // items behind this gate; the parser must accept them to read the
        // folder, though `backend` uses none.
        features: ["clocks-timezone"],
        // `body.copy-to`/`copy-from` take the guest's WASI streams: the
        // `wasip2` crate's, so a file's or HTTP body's stream passes as is.
        with: {
            "wasi:io/error@0.2.12": wasip2::io::error,
            "wasi:io/poll@0.2.12": wasip2::io::poll,
            "wasi:io/streams@0.2.12": wasip2::io::streams,
        },
    });
}

use wit::exports::wasmstate::backend::{config, history, storage, workspaces};
use wit::wasmstate::backend::body::{StateSink, StateSource};
use wit::wasmstate::backend::types as t;

/// What `register_backend!` hands the SDK: how to build the author's backend.
pub struct Entry {
    /// Build a backend from configuration.
    pub new: fn(&Config) -> Result<Box<dyn Backend>, Error>,
    /// Check configuration without touching storage.
    pub validate: fn(&Config) -> Vec<Diagnostic>,
}

unsafe extern "Rust" {
    // Defined by `register_backend!` in the guest crate. A guest that forgets
    // the macro fails to link, naming this symbol.
    fn __wasmstate_guest_entry() -> Entry;
}

fn entry() -> Entry {
    // SAFETY: the symbol is defined by `register_backend!` with exactly this
    // signature; it has no preconditions.
    unsafe { __wasmstate_guest_entry() }
}

fn config() -> Config {
    Config::from_pairs(wit::wasmstate::backend::host::get_config())
}

fn with_backend<T>(f: impl FnOnce(&dyn Backend) -> Result<T, Error>) -> Result<T, t::Error> {
    let backend = (entry().new)(&config()).map_err(to_wit_error)?;
    f(backend.as_ref()).map_err(to_wit_error)
}

pub(crate) fn to_wit_lock(info: LockInfo) -> t::LockInfo {
    t::LockInfo {
        id: info.id,
        operation: info.operation,
        info: info.info,
        who: info.who,
        version: info.version,
        created: info.created,
        path: info.path,
    }
}

pub(crate) fn from_wit_lock(info: t::LockInfo) -> LockInfo {
    LockInfo {
        id: info.id,
        operation: info.operation,
        info: info.info,
        who: info.who,
        version: info.version,
        created: info.created,
        path: info.path,
    }
}

fn to_wit_diagnostic(d: Diagnostic) -> t::Diagnostic {
    t::Diagnostic {
        key: d.key,
        message: d.message,
    }
}

fn to_wit_error(e: Error) -> t::Error {
    match e {
        Error::NotFound => t::Error::NotFound,
        Error::Locked(holder) => t::Error::Locked(to_wit_lock(*holder)),
        Error::LockMismatch(holder) => t::Error::LockMismatch(holder.map(|h| to_wit_lock(*h))),
        Error::InvalidInput(m) => t::Error::InvalidInput(m),
        Error::InvalidConfig(d) => {
            t::Error::InvalidConfig(d.into_iter().map(to_wit_diagnostic).collect())
        }
        Error::Unavailable(m) => t::Error::Unavailable(m),
        Error::Internal(m) => t::Error::Internal(m),
    }
}

/// The one type that implements every exported interface.
struct Component;

/// Run a streaming read into `into`. When the host stopped it (it needed
/// only the beginning), the guest's own outcome does not matter: success.
fn read_to_host(
    into: &StateSink,
    read: impl FnOnce(&dyn Backend, &mut StateWriter<'_>) -> Result<bool, Error>,
) -> Result<bool, t::Error> {
    let mut out = StateWriter::host(into);
    let result = with_backend(|b| read(b, &mut out));
    if out.is_stopped() {
        return Ok(true);
    }
    result
}

impl storage::Guest for Component {
    fn read(workspace: String, into: &StateSink) -> Result<bool, t::Error> {
        read_to_host(into, |b, out| b.read_into(&workspace, out))
    }

    fn head(workspace: String, prefix: &StateSink) -> Result<Option<storage::StateHead>, t::Error> {
        let mut out = StateWriter::host(prefix);
        // Unlike `read`, a stopped prefix is normal here: the head itself
        // is the answer.
        let head = with_backend(|b| b.head(&workspace, &mut out))?;
        Ok(head.map(
            |Head {
                 version,
                 size,
                 digest,
             }| storage::StateHead {
                version,
                size,
                digest,
            },
        ))
    }

    fn write(
        workspace: String,
        state: &StateSource,
        lock_id: Option<String>,
        expect: t::Expect,
    ) -> Result<bool, t::Error> {
        let mut state = StateReader::host(state);
        let expect = from_wit_expect(expect);
        with_backend(|b| b.write_if(&workspace, &mut state, lock_id.as_deref(), &expect))
    }

    fn delete(workspace: String, lock_id: Option<String>) -> Result<(), t::Error> {
        with_backend(|b| b.delete(&workspace, lock_id.as_deref()))
    }

    fn lock(workspace: String, info: t::LockInfo) -> Result<(), t::Error> {
        let info = from_wit_lock(info);
        with_backend(|b| b.lock(&workspace, &info))
    }

    fn unlock(workspace: String, id: String) -> Result<(), t::Error> {
        with_backend(|b| b.unlock(&workspace, &id))
    }

    fn current_lock(workspace: String) -> Result<Option<t::LockInfo>, t::Error> {
        with_backend(|b| b.current_lock(&workspace)).map(|h| h.map(to_wit_lock))
    }

    fn force_unlock(workspace: String) -> Result<Option<t::LockInfo>, t::Error> {
        with_backend(|b| b.force_unlock(&workspace)).map(|h| h.map(to_wit_lock))
    }
}

impl workspaces::Guest for Component {
    fn list_workspaces() -> Result<Vec<String>, t::Error> {
        with_backend(|b| b.list_workspaces())
    }

    fn create_workspace(name: String) -> Result<bool, t::Error> {
        with_backend(|b| b.create_workspace(&name))
    }

    fn delete_workspace(name: String) -> Result<(), t::Error> {
        with_backend(|b| b.delete_workspace(&name))
    }

    fn read_metadata(name: String) -> Result<Option<t::Metadata>, t::Error> {
        let found = with_backend(|b| b.read_metadata(&name))?;
        Ok(found.map(|Metadata { content, version }| t::Metadata { content, version }))
    }

    fn write_metadata(
        name: String,
        content: Option<String>,
        expect: t::Expect,
    ) -> Result<bool, t::Error> {
        let expect = from_wit_expect(expect);
        with_backend(|b| b.write_metadata(&name, content.as_deref(), &expect))
    }
}

pub(crate) fn from_wit_expect(expect: t::Expect) -> Expect {
    match expect {
        t::Expect::Any => Expect::Any,
        t::Expect::Absent => Expect::Absent,
        t::Expect::Version(v) => Expect::Version(v),
    }
}

#[allow(dead_code)] // for the git and postgres wrappers
pub(crate) fn to_wit_expect(expect: &Expect) -> t::Expect {
    match expect {
        Expect::Any => t::Expect::Any,
        Expect::Absent => t::Expect::Absent,
        Expect::Version(v) => t::Expect::Version(v.clone()),
    }
}

impl history::Guest for Component {
    fn list_versions(workspace: String) -> Result<Option<Vec<history::Version>>, t::Error> {
        let versions = with_backend(|b| b.list_versions(&workspace))?;
        Ok(versions.map(|list| {
            list.into_iter()
                .map(|v| history::Version {
                    id: v.id,
                    serial: v.serial,
                    created_unix_ms: v.created_unix_ms,
                    bytes: v.bytes,
                })
                .collect()
        }))
    }

    fn read_version(workspace: String, id: String, into: &StateSink) -> Result<bool, t::Error> {
        read_to_host(into, |b, out| b.read_version_into(&workspace, &id, out))
    }
}

impl config::Guest for Component {
    fn validate() -> Vec<t::Diagnostic> {
        (entry().validate)(&config())
            .into_iter()
            .map(to_wit_diagnostic)
            .collect()
    }
}

wit::export!(Component with_types_in wit);
