//! Write a wasmstate storage guest: implement [`Backend`], call
//! [`register_backend!`], build with `cargo build --release --target wasm32-wasip2`.
//!
//! The host creates a fresh instance of the guest for every request, so
//! nothing survives in memory between requests; [`Backend::new`] runs for
//! every call with the operator's configuration. One request's calls may
//! share an instance (a write's head and its conditional write): answer
//! each call from storage, not from memory.
//!
//! ```no_run
//! use wasmstate_guest::{Backend, Config, Error, LockInfo};
//!
//! struct Memory;
//!
//! impl Backend for Memory {
//!     fn new(_config: &Config) -> Result<Self, Error> {
//!         Ok(Memory)
//!     }
//!     fn read(&self, _workspace: &str) -> Result<Option<Vec<u8>>, Error> {
//!         Ok(None)
//!     }
//!     fn write(&self, _ws: &str, _state: &[u8], _lock_id: Option<&str>) -> Result<(), Error> {
//!         Err(Error::Internal("read-only example".into()))
//!     }
//!     fn delete(&self, _ws: &str, _lock_id: Option<&str>) -> Result<(), Error> {
//!         Ok(())
//!     }
//!     fn lock(&self, _ws: &str, _info: &LockInfo) -> Result<(), Error> {
//!         Ok(())
//!     }
//!     fn unlock(&self, _ws: &str, _id: &str) -> Result<(), Error> {
//!         Ok(())
//!     }
//!     fn current_lock(&self, _ws: &str) -> Result<Option<LockInfo>, Error> {
//!         Ok(None)
//!     }
//!     fn force_unlock(&self, _ws: &str) -> Result<Option<LockInfo>, Error> {
//!         Ok(None)
//!     }
//!     fn list_workspaces(&self) -> Result<Vec<String>, Error> {
//!         Ok(vec!["default".into()])
//!     }
//!     fn create_workspace(&self, _name: &str) -> Result<bool, Error> {
//!         Ok(false)
//!     }
//!     fn delete_workspace(&self, _name: &str) -> Result<(), Error> {
//!         Err(Error::NotFound)
//!     }
//! }
//!
//! wasmstate_guest::register_backend!(Memory);
//! ```
#![deny(missing_docs)]

pub mod body;
pub mod clock;
mod config;
mod error;
mod export;
pub mod fs;
pub mod git;
pub mod http;
pub mod log;
pub mod postgres;
mod types;

pub use body::{StateReader, StateWriter};
pub use config::Config;
pub use error::Error;
pub use types::{Diagnostic, Expect, Head, LockInfo, Metadata, Version};
pub use wasmstate_types::state::{version_in_prefix, version_in_tail};

/// Check a workspace name by the host's rule: 1 to 90 characters of
/// `A-Z a-z 0-9 . _ -`, not starting with `.`. The host checks every name
/// before it reaches a guest; use this where a guest derives names itself
/// (for example when listing keys written by other tools).
pub fn validate_workspace_name(name: &str) -> Result<(), Error> {
    wasmstate_types::names::check_name("workspace", name).map_err(Error::InvalidInput)
}

/// A secret the operator provides to this backend (`secrets.NAME` in the
/// host's config), e.g. a password for the storage service. With a manifest,
/// only the secrets it lists under `capabilities.secrets` are visible.
pub fn secret(name: &str) -> Option<String> {
    export::wit::wasmstate::backend::host::get_secret(name)
}

/// The WIT package version this SDK implements; the host refuses guests
/// built for a version it does not know.
pub const WIT_VERSION: &str = "0.3.0";

/// A storage driver. One value is created per request by [`Backend::new`].
///
/// Every method must be safe to repeat: Terraform retries failed requests.
/// Workspace names are validated by the host before they reach you.
///
/// States come in two shapes; implement one of each pair. The simple one,
/// [`Backend::read`] and [`Backend::write`], holds a state whole in the
/// guest's memory: fine for small states. The streaming one,
/// [`Backend::read_into`] and [`Backend::write_from`], moves it in chunks
/// (`std::io::copy` between a file or an HTTP body and the host), so a
/// guest needs memory for a chunk, not a state. Each pair's default calls
/// the other.
pub trait Backend {
    /// Build the backend from the operator's configuration. Return
    /// [`Error::InvalidConfig`] for configuration problems.
    fn new(config: &Config) -> Result<Self, Error>
    where
        Self: Sized;

    /// Check the configuration without touching storage. The default builds
    /// the backend with [`Backend::new`] and reports its configuration error.
    fn validate(config: &Config) -> Vec<Diagnostic>
    where
        Self: Sized,
    {
        match Self::new(config) {
            Ok(_) => Vec::new(),
            Err(Error::InvalidConfig(diagnostics)) => diagnostics,
            Err(other) => vec![Diagnostic::general(other.to_string())],
        }
    }

    /// The latest state, or `None` when the workspace has none (the simple
    /// path; the default gathers what [`Backend::read_into`] writes).
    fn read(&self, workspace: &str) -> Result<Option<Vec<u8>>, Error> {
        let _guard = body_guard::enter("read", "read_into")?;
        let mut out = StateWriter::memory();
        Ok(self
            .read_into(workspace, &mut out)?
            .then(|| out.into_bytes()))
    }

    /// Replace the state atomically. When the workspace is locked and
    /// `lock_id` is not the holder's, return [`Error::Locked`]; when `lock_id`
    /// is given but nothing is locked, return `Error::LockMismatch(None)`.
    /// (The simple path; the default hands the bytes to
    /// [`Backend::write_from`].)
    fn write(&self, workspace: &str, state: &[u8], lock_id: Option<&str>) -> Result<(), Error> {
        let _guard = body_guard::enter("write", "write_from")?;
        self.write_from(workspace, &mut StateReader::from_slice(state), lock_id)
    }

    /// Write the latest state into `out`, in order; `false` when the
    /// workspace has none. A write to `out` fails once the host has all it
    /// needs: return then (any result; the SDK tells the host success).
    fn read_into(&self, workspace: &str, out: &mut StateWriter<'_>) -> Result<bool, Error> {
        let _guard = body_guard::enter("read_into", "read")?;
        match self.read(workspace)? {
            Some(state) => {
                std::io::Write::write_all(out, &state)
                    .map_err(|e| Error::io("handing the state to the host", e))?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Replace the state with what `state` yields, atomically (store it
    /// aside as it arrives, then switch); lock rules as [`Backend::write`].
    fn write_from(
        &self,
        workspace: &str,
        state: &mut StateReader<'_>,
        lock_id: Option<&str>,
    ) -> Result<(), Error> {
        let _guard = body_guard::enter("write_from", "write")?;
        self.write(workspace, &state.read_all(), lock_id)
    }

    /// The stored state's [`Head`], with its first bytes written into
    /// `prefix` (a write to it fails once the host has enough: stop then);
    /// `None` when the workspace has no state. Ask storage for the
    /// beginning only (one ranged request), never the whole state. The
    /// host keeps at most 64 KiB, and stops a head as soon as what it
    /// kept holds the state's lineage and serial: write a state of up to
    /// 64 KiB in one write, so it is kept whole and a write's judgement
    /// (is the stored state empty, is it the very body a retry sends)
    /// needs no second call.
    fn head(&self, workspace: &str, prefix: &mut StateWriter<'_>) -> Result<Option<Head>, Error> {
        let _ = (workspace, prefix);
        Err(Error::Internal(
            "this guest implements no Backend::head, which contract 0.3.0 needs; see the guest guide"
                .into(),
        ))
    }

    /// [`Backend::write_from`], only if the stored state is as `expect`
    /// says; `Ok(false)` when it is not, and nothing was written. Lock
    /// rules first, as [`Backend::write`]. The check and the switch must be
    /// one step of the storage (its compare-and-swap), so that of two
    /// writers expecting the same version, on any two hosts, exactly one
    /// succeeds. The default serves only [`Expect::Any`].
    fn write_if(
        &self,
        workspace: &str,
        state: &mut StateReader<'_>,
        lock_id: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, Error> {
        match expect {
            Expect::Any => self.write_from(workspace, state, lock_id).map(|()| true),
            _ => Err(Error::Internal(
                "this guest implements no Backend::write_if, which contract 0.3.0 needs; see the \
                 guest guide"
                    .into(),
            )),
        }
    }

    /// The workspace's [`Metadata`], kept beside its state where a native
    /// Terraform never looks; `None` when none is kept. The default says
    /// this storage keeps none (the host then keeps it per replica).
    fn read_metadata(&self, workspace: &str) -> Result<Option<Metadata>, Error> {
        let _ = workspace;
        Err(Error::InvalidInput(NO_METADATA.into()))
    }

    /// Set (`Some`) or remove (`None`) the workspace's metadata, only if it
    /// is as `expect` says (one step of the storage); `Ok(false)` when it
    /// is not. Removing metadata that is not there succeeds.
    fn write_metadata(
        &self,
        workspace: &str,
        content: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, Error> {
        let _ = (workspace, content, expect);
        Err(Error::InvalidInput(NO_METADATA.into()))
    }

    /// Delete the state; same lock rules as [`Backend::write`]. Deleting a
    /// missing state succeeds.
    fn delete(&self, workspace: &str, lock_id: Option<&str>) -> Result<(), Error>;

    /// Take the lock, or return [`Error::Locked`] with the holder. Locking
    /// again with the holder's own id succeeds.
    fn lock(&self, workspace: &str, info: &LockInfo) -> Result<(), Error>;

    /// Release the lock held under `id`; [`Error::LockMismatch`] with the
    /// holder when another id holds it. Unlocking an unlocked workspace
    /// succeeds.
    fn unlock(&self, workspace: &str, id: &str) -> Result<(), Error>;

    /// The current holder of the lock, if any.
    fn current_lock(&self, workspace: &str) -> Result<Option<LockInfo>, Error>;

    /// Release the lock whoever holds it; return the removed holder.
    fn force_unlock(&self, workspace: &str) -> Result<Option<LockInfo>, Error>;

    /// Every workspace, in any order.
    fn list_workspaces(&self) -> Result<Vec<String>, Error>;

    /// Create a workspace: `true` when created, `false` when it existed.
    fn create_workspace(&self, name: &str) -> Result<bool, Error>;

    /// Delete a workspace and its state; [`Error::Locked`] while locked,
    /// [`Error::NotFound`] when it does not exist.
    fn delete_workspace(&self, name: &str) -> Result<(), Error>;

    /// Previous versions of the workspace's state, newest first, when the
    /// storage keeps history itself (git commits, object versions). The
    /// default, `None`, lets the host keep versions instead.
    fn list_versions(&self, workspace: &str) -> Result<Option<Vec<Version>>, Error> {
        let _ = workspace;
        Ok(None)
    }

    /// One version listed by [`Backend::list_versions`]; `None` when there
    /// is no such version.
    fn read_version(&self, workspace: &str, id: &str) -> Result<Option<Vec<u8>>, Error> {
        let _ = (workspace, id);
        Ok(None)
    }

    /// [`Backend::read_version`], streamed into `out`; `false` when there is
    /// no such version. The default writes what `read_version` returns.
    fn read_version_into(
        &self,
        workspace: &str,
        id: &str,
        out: &mut StateWriter<'_>,
    ) -> Result<bool, Error> {
        match self.read_version(workspace, id)? {
            Some(state) => {
                std::io::Write::write_all(out, &state)
                    .map_err(|e| Error::io("handing the version to the host", e))?;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// What a guest that keeps no workspace metadata answers.
const NO_METADATA: &str = "this storage keeps no workspace metadata";

/// Each pair of [`Backend`] methods defaults to the other; a guest that
/// implements neither gets this one-line error instead of a stack overflow.
mod body_guard {
    use crate::Error;
    use std::cell::Cell;

    thread_local! {
        static INSIDE: Cell<u8> = const { Cell::new(0) };
    }

    /// Marks a default method as running until dropped.
    pub struct Entered(u8);

    impl Drop for Entered {
        fn drop(&mut self) {
            INSIDE.with(|inside| inside.set(inside.get() & !self.0));
        }
    }

    fn bit(method: &str) -> u8 {
        match method {
            "read" | "read_into" => 1,
            _ => 2,
        }
    }

    /// Enter the default `method`, which calls `other`; refused when the
    /// default of `other` is what called it.
    pub fn enter(method: &str, other: &str) -> Result<Entered, Error> {
        let bit = bit(method);
        INSIDE.with(|inside| {
            if inside.get() & bit != 0 {
                return Err(Error::Internal(format!(
                    "this guest implements neither Backend::{method} nor Backend::{other}; implement one of them"
                )));
            }
            inside.set(inside.get() | bit);
            Ok(Entered(bit))
        })
    }
}

/// `len` random bytes from the host (WASI's secure random source): for
/// names of temporary objects and tags that must not collide across hosts.
pub fn random_bytes(len: u64) -> Vec<u8> {
    wasip2::random::random::get_random_bytes(len)
}

/// The lock rule of [`Backend::write`] and [`Backend::delete`]: a change is
/// allowed when `lock_id` is the holder's, or when nothing is locked and no
/// id is presented; otherwise the right refusal, naming the holder.
pub fn check_lock(holder: Option<LockInfo>, lock_id: Option<&str>) -> Result<(), Error> {
    match (holder, lock_id) {
        (Some(holder), Some(id)) if holder.id == id => Ok(()),
        (Some(holder), _) => Err(Error::locked(holder)),
        (None, Some(_)) => Err(Error::lock_mismatch(None)),
        (None, None) => Ok(()),
    }
}

/// Times [`lock_by_creating`] tries again when the lock vanished between
/// a refused create and the read of its holder (the holder just unlocked).
const LOCK_RACE_RETRIES: usize = 20;

/// [`Backend::lock`] for storage that can create an object only where none
/// exists (S3's `If-None-Match: *`, GCS's `ifGenerationMatch=0`, etcd's
/// create revision 0): `create` makes the lock, `Ok(false)` when one is
/// already there; `holder` reads it. Locking again with the holder's own
/// id succeeds (a retried request); another holder is [`Error::Locked`].
pub fn lock_by_creating(
    workspace: &str,
    id: &str,
    mut create: impl FnMut() -> Result<bool, Error>,
    mut holder: impl FnMut() -> Result<Option<LockInfo>, Error>,
) -> Result<(), Error> {
    for _ in 0..LOCK_RACE_RETRIES {
        if create()? {
            return Ok(());
        }
        match holder()? {
            Some(holder) if holder.id == id => return Ok(()),
            Some(holder) => return Err(Error::locked(holder)),
            None => continue,
        }
    }
    Err(Error::Unavailable(format!(
        "the lock of {workspace:?} kept changing hands"
    )))
}

/// [`Backend::unlock`] for storage that can delete an object only while it
/// is still the version read (S3's `If-Match`, GCS's `ifGenerationMatch`):
/// `read` gives the lock's bytes and the version they were read at (`None`:
/// not locked); `delete` removes that version, `Ok(false)` when it changed
/// since; `holder` reads the lock again. A lock force-unlocked and taken by
/// someone else after the read is left alone; an unreadable lock is only
/// force-unlock's to remove.
pub fn unlock_if_unchanged<V>(
    id: &str,
    read: impl FnOnce() -> Result<Option<(Vec<u8>, V)>, Error>,
    delete: impl FnOnce(V) -> Result<bool, Error>,
    holder: impl FnOnce() -> Result<Option<LockInfo>, Error>,
) -> Result<(), Error> {
    let Some((bytes, version)) = read()? else {
        return Ok(());
    };
    match LockInfo::from_json(&bytes) {
        Ok(holder) if holder.id == id => {}
        Ok(holder) => return Err(Error::lock_mismatch(Some(holder))),
        Err(_) => return Err(Error::lock_mismatch(None)),
    }
    if delete(version)? {
        return Ok(());
    }
    match holder()? {
        None => Ok(()),
        holder => Err(Error::lock_mismatch(holder)),
    }
}

/// Register the type that implements [`Backend`] as this component's
/// storage driver. Call it exactly once, at the root of the guest crate.
#[macro_export]
macro_rules! register_backend {
    ($backend:ty) => {
        /// Entry point the SDK's exports call to reach this guest's backend.
        #[doc(hidden)]
        #[allow(unsafe_code)]
        #[unsafe(no_mangle)]
        pub fn __wasmstate_guest_entry() -> $crate::__private::Entry {
            $crate::__private::Entry {
                new: |config| {
                    <$backend as $crate::Backend>::new(config).map(|b| {
                        ::std::boxed::Box::new(b) as ::std::boxed::Box<dyn $crate::Backend>
                    })
                },
                validate: <$backend as $crate::Backend>::validate,
            }
        }
    };
}

/// Embed the guest's manifest (TOML) in the component, as the custom
/// section `wasmstate-manifest`, for operators' `wasmstate guest install`
/// and `guest inspect`. Usually `manifest!(include_str!("../guest.toml"))`.
///
/// ```toml
/// name = "etcd"
/// version = "0.1.0"
/// author = "Jane Doe <jane@example.com>"
/// description = "State and locks in etcd v3"
///
/// [capabilities]
/// http = ["http://*:2379"]    # origins it needs (`*` host: the operator picks)
/// directory = false           # a preopened directory at /data
/// git = false                 # the host's git capability
/// secrets = ["ETCD_PASSWORD"] # named values the operator must provide
/// memory_mib = 64             # memory it needs per request
/// timeout_ms = 5000           # time it needs per request
/// ```
///
/// The host gives an installed guest only what its manifest asks for and the
/// operator granted, and refuses to start it when a request is not granted.
#[macro_export]
macro_rules! manifest {
    ($toml:expr) => {
        const _: () = {
            const TEXT: &str = $toml;
            #[allow(unsafe_code)]
            #[unsafe(link_section = "wasmstate-manifest")]
            #[used]
            static MANIFEST: [u8; TEXT.len()] = $crate::__private::bytes(TEXT);
        };
    };
}

#[doc(hidden)]
pub mod __private {
    pub use crate::export::Entry;

    /// A string's bytes as an array, in a const context.
    pub const fn bytes<const N: usize>(text: &str) -> [u8; N] {
        let source = text.as_bytes();
        let mut out = [0u8; N];
        let mut i = 0;
        while i < N {
            out[i] = source[i];
            i += 1;
        }
        out
    }
}
