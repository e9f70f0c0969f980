//! Host-side bindings of the WIT world (the current contract, `wit/`), and
//! conversions to the runtime-neutral types of [`crate::backend`].

use crate::backend::{Diagnostic, Expect, LockInfo, StorageError};

wasmtime::component::bindgen!({
    path: "../wit",
    world: "backend",
    // Async imports: the git capability does network I/O on a blocking
    // thread and must not stall the executor; log/get-config are trivial.
    // The body's chunk calls only touch the request's own buffers: plain
    // calls, trapping on a handle the guest made up. Its copies wait on a
    // WASI stream (a file, an HTTP body): async.
    imports: {
        "wasmstate:backend/body.[method]state-source.copy-to": async | trappable,
        "wasmstate:backend/body.[method]state-sink.copy-from": async | trappable,
        "wasmstate:backend/body": trappable,
        default: async,
    },
    exports: { default: async },
    with: {
        // The guest's WASI streams are wasmtime-wasi's, in the same table.
        "wasi:io": wasmtime_wasi::p2::bindings::io,
        "wasmstate:backend/body.state-source": super::chunks::StateSource,
        "wasmstate:backend/body.state-sink": super::chunks::StateSink,
    },
});

use self::wasmstate::backend::types as t;

impl From<t::LockInfo> for LockInfo {
    fn from(l: t::LockInfo) -> Self {
        LockInfo {
            id: bounded(l.id),
            operation: bounded(l.operation),
            info: bounded(l.info),
            who: bounded(l.who),
            version: bounded(l.version),
            created: bounded(l.created),
            path: bounded(l.path),
        }
    }
}

impl From<LockInfo> for t::LockInfo {
    fn from(l: LockInfo) -> Self {
        t::LockInfo {
            id: l.id,
            operation: l.operation,
            info: l.info,
            who: l.who,
            version: l.version,
            created: l.created,
            path: l.path,
        }
    }
}

impl From<Expect> for t::Expect {
    fn from(e: Expect) -> Self {
        match e {
            Expect::Any => t::Expect::Any,
            Expect::Absent => t::Expect::Absent,
            Expect::Version(v) => t::Expect::Version(v),
        }
    }
}

impl From<t::Expect> for Expect {
    fn from(e: t::Expect) -> Self {
        match e {
            t::Expect::Any => Expect::Any,
            t::Expect::Absent => Expect::Absent,
            t::Expect::Version(v) => Expect::Version(v),
        }
    }
}

/// Longest text a guest may put in an error (or a lock holder's field):
/// whatever a guest returns ends up in an HTTP answer and the log, so a
/// hostile one must not be able to make either huge.
pub const MAX_GUEST_TEXT: usize = 4096;

fn bounded(text: String) -> String {
    if text.len() <= MAX_GUEST_TEXT {
        text
    } else {
        super::text::truncate(&text, MAX_GUEST_TEXT)
    }
}

impl From<t::Diagnostic> for Diagnostic {
    fn from(d: t::Diagnostic) -> Self {
        Diagnostic {
            key: d.key.map(bounded),
            message: bounded(d.message),
        }
    }
}

impl From<t::Error> for StorageError {
    fn from(e: t::Error) -> Self {
        match e {
            t::Error::NotFound => StorageError::NotFound,
            t::Error::Locked(holder) => StorageError::Locked(holder.into()),
            t::Error::LockMismatch(holder) => StorageError::LockMismatch(holder.map(Into::into)),
            t::Error::InvalidInput(m) => StorageError::InvalidInput(bounded(m)),
            t::Error::InvalidConfig(d) => {
                StorageError::InvalidConfig(d.into_iter().take(64).map(Into::into).collect())
            }
            t::Error::Unavailable(m) => StorageError::Unavailable(bounded(m)),
            t::Error::Internal(m) => StorageError::Internal(bounded(m)),
        }
    }
}
