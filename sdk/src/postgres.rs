//! PostgreSQL through the host, in the layout of Terraform's `pg` backend:
//! rows of `<schema>.states (name, data)` and the advisory locks native
//! `terraform` clients take, which only the host can hold (they belong to
//! a database session that outlives a request). The guest names rows; the
//! host runs its own statements, holds the connection string and the
//! locks, and honours native clients' locks.
//!
//! ```no_run
//! use wasmstate_guest::postgres::{self, Refused};
//! use wasmstate_guest::Expect;
//! # fn demo(state: &wasmstate_guest::StateReader<'_>, out: &mut wasmstate_guest::StateWriter<'_>) -> Result<(), wasmstate_guest::postgres::PgError> {
//! // The row's version, size and digest, its first bytes into `out`.
//! let head = postgres::head("default", out)?;
//! let expect = head.map_or(Expect::Absent, |h| Expect::Version(h.version));
//! match postgres::write_if("default", state, None, &expect)? {
//!     None => {}                              // written
//!     Some(Refused::Held(holder)) => {}       // someone holds the lock
//!     Some(Refused::NotLocked) => {}          // a lock id, but no lock
//!     Some(Refused::Changed) => {}            // written by someone else since
//! }
//! # Ok(()) }
//! ```
//!
//! The host also keeps each workspace's metadata in
//! `<schema>.wasmstate_workspace_metadata` ([`read_metadata`],
//! [`write_metadata`]), which Terraform's pg backend never reads.

use crate::export::wit::wasmstate::backend::postgres as wit;
use crate::{Error, Expect, LockInfo, Metadata};
use std::fmt;

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PgError {
    /// The backend has no database (no `conn_str`).
    Denied(String),
    /// The database could not be reached, or the call timed out.
    Unavailable(String),
    /// A malformed argument.
    InvalidInput(String),
    /// Anything else.
    Internal(String),
}

impl fmt::Display for PgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PgError::Denied(m) => write!(f, "database denied: {m}"),
            PgError::Unavailable(m) => write!(f, "database unavailable: {m}"),
            PgError::InvalidInput(m) => write!(f, "invalid database argument: {m}"),
            PgError::Internal(m) => write!(f, "database error: {m}"),
        }
    }
}

impl std::error::Error for PgError {}

impl From<wit::PgError> for PgError {
    fn from(err: wit::PgError) -> Self {
        match err {
            wit::PgError::Denied(m) => PgError::Denied(m),
            wit::PgError::Unavailable(m) => PgError::Unavailable(m),
            wit::PgError::InvalidInput(m) => PgError::InvalidInput(m),
            wit::PgError::Internal(m) => PgError::Internal(m),
        }
    }
}

impl From<PgError> for Error {
    /// An unreachable database is worth a retry (a 503 Terraform retries);
    /// a missing grant is the operator's configuration.
    fn from(err: PgError) -> Self {
        match err {
            PgError::Unavailable(_) => Error::Unavailable(err.to_string()),
            PgError::Denied(_) => Error::InvalidConfig(vec![crate::Diagnostic {
                key: Some("conn_str".into()),
                message: err.to_string(),
            }]),
            PgError::InvalidInput(m) => Error::InvalidInput(m),
            PgError::Internal(_) => Error::Internal(err.to_string()),
        }
    }
}

/// Who holds a workspace's lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// A wasmstate client.
    Wasmstate(LockInfo),
    /// A native `terraform` client (its pg backend keeps nothing about its
    /// lock in the database): what is known of it.
    Native(String),
}

impl Holder {
    /// The holder as lock info: a native client's is what is known of it.
    pub fn into_lock_info(self) -> LockInfo {
        match self {
            Holder::Wasmstate(info) => info,
            Holder::Native(what) => LockInfo {
                id: String::new(),
                operation: String::new(),
                info: what,
                who: "a terraform client using backend \"pg\"".into(),
                version: String::new(),
                created: String::new(),
                path: String::new(),
            },
        }
    }
}

impl From<wit::Holder> for Holder {
    fn from(h: wit::Holder) -> Self {
        match h {
            wit::Holder::Wasmstate(info) => Holder::Wasmstate(crate::export::from_wit_lock(info)),
            wit::Holder::Native(what) => Holder::Native(what),
        }
    }
}

/// Why a write or delete did not happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Someone else holds the lock.
    Held(Holder),
    /// A lock id was given, but nobody holds the lock.
    NotLocked,
    /// The row is not at the version the write expected.
    Changed,
}

impl From<wit::Refused> for Refused {
    fn from(r: wit::Refused) -> Self {
        match r {
            wit::Refused::Held(h) => Refused::Held(h.into()),
            wit::Refused::NotLocked => Refused::NotLocked,
            wit::Refused::Changed => Refused::Changed,
        }
    }
}

/// The names of the rows, sorted.
pub fn list_names() -> Result<Vec<String>, PgError> {
    Ok(wit::list_names()?)
}

/// Row `name`'s data, written into `out` by the host; its size, `None`
/// without a row.
pub fn read_into(name: &str, out: &mut crate::StateWriter<'_>) -> Result<Option<u64>, PgError> {
    match out.host_sink() {
        Some(sink) => Ok(wit::read_into(name, sink)?),
        None => Err(PgError::Internal(
            "postgres reads go to the host's state sink (implement read_into)".into(),
        )),
    }
}

/// What [`head`] knows of a row without its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowHead {
    /// The row's version: it changes with every write of the row,
    /// Terraform's own included; [`Expect::Version`] compares it.
    pub version: String,
    /// The state's size in bytes, as [`read_into`] writes it.
    pub size: u64,
    /// `md5:<hex>` of those bytes, computed by the database.
    pub digest: String,
}

/// Row `name`'s head, with the state's first bytes written into `prefix`
/// by the host (as many as it takes); `None` when there is no row or it
/// holds no state (what [`Expect::Absent`] matches). The data never leaves
/// the database: its size and digest are computed there.
pub fn head(name: &str, prefix: &mut crate::StateWriter<'_>) -> Result<Option<RowHead>, PgError> {
    match prefix.host_sink() {
        Some(sink) => Ok(wit::head(name, sink)?.map(|h| RowHead {
            version: h.version,
            size: h.size,
            digest: h.digest,
        })),
        None => Err(PgError::Internal(
            "postgres heads go to the host's state sink (implement Backend::head)".into(),
        )),
    }
}

/// Set row `name` to the state the host lent, only while its lock is held
/// with `lock_id` (`None`: while nobody holds it). `None` when written.
pub fn write(
    name: &str,
    state: &crate::StateReader<'_>,
    lock_id: Option<&str>,
) -> Result<Option<Refused>, PgError> {
    write_if(name, state, lock_id, &Expect::Any)
}

/// [`write`], only if the row is as `expect` says ([`Expect::Absent`]: no
/// row or no state in it; [`Expect::Version`]: a [`RowHead::version`]),
/// checked in the write's own transaction: of two writers expecting the
/// same version, on any replicas, exactly one writes and the other gets
/// [`Refused::Changed`]. The lock rule is checked first.
pub fn write_if(
    name: &str,
    state: &crate::StateReader<'_>,
    lock_id: Option<&str>,
    expect: &Expect,
) -> Result<Option<Refused>, PgError> {
    match state.host_source() {
        Some(source) => {
            let expect = crate::export::to_wit_expect(expect);
            Ok(wit::write(name, source, lock_id, &expect)?.map(Into::into))
        }
        None => Err(PgError::Internal(
            "postgres writes take the host's state (implement write_from)".into(),
        )),
    }
}

/// Workspace `name`'s metadata, `None` when none is kept.
/// [`PgError::InvalidInput`] saying why when this database role may
/// neither make nor use the metadata table.
pub fn read_metadata(name: &str) -> Result<Option<Metadata>, PgError> {
    Ok(wit::read_metadata(name)?.map(|m| Metadata {
        content: m.content,
        version: m.version,
    }))
}

/// Set (`Some`) or remove (`None`) workspace `name`'s metadata if it is as
/// `expect` says, in one statement; `false` when it is not (nothing
/// changed). Removing metadata that is not there succeeds. Deleting the
/// row (`delete`) removes its metadata in the same transaction.
pub fn write_metadata(name: &str, content: Option<&str>, expect: &Expect) -> Result<bool, PgError> {
    let expect = crate::export::to_wit_expect(expect);
    Ok(wit::write_metadata(name, content, &expect)?)
}

/// Delete row `name` (and its workspace's metadata), under the rule of
/// [`write`].
pub fn delete(name: &str, lock_id: Option<&str>) -> Result<Option<Refused>, PgError> {
    Ok(wit::delete(name, lock_id)?.map(Into::into))
}

/// Insert row `name` with `data` unless one exists; whether inserted.
pub fn create(name: &str, data: &str) -> Result<bool, PgError> {
    Ok(wit::create(name, data)?)
}

/// Lock `name` for `info`: `None` when taken, else who holds it.
pub fn lock(name: &str, info: &LockInfo) -> Result<Option<Holder>, PgError> {
    let info = crate::export::to_wit_lock(info.clone());
    Ok(wit::lock(name, &info)?.map(Into::into))
}

/// Who holds `name`'s lock.
pub fn lock_holder(name: &str) -> Result<Option<Holder>, PgError> {
    Ok(wit::lock_holder(name)?.map(Into::into))
}

/// Release `name`'s lock if held with `id` (any wasmstate lock when
/// `force`): `None` when released or not held, else who holds it.
pub fn unlock(name: &str, id: &str, force: bool) -> Result<Option<Holder>, PgError> {
    Ok(wit::unlock(name, id, force)?.map(Into::into))
}

/// The versions of row `name` the host keeps in the database (written
/// with each change, in its transaction), newest first; `None` when it
/// keeps none there (the backend's `history = 0`).
pub fn list_versions(name: &str) -> Result<Option<Vec<crate::Version>>, PgError> {
    Ok(wit::list_versions(name)?.map(|kept| {
        kept.into_iter()
            .map(|v| crate::Version {
                id: v.id,
                serial: v.serial,
                created_unix_ms: v.created_unix_ms,
                bytes: v.bytes,
            })
            .collect()
    }))
}

/// Version `id` of row `name`, written into `out` by the host; `false`
/// when there is no such version.
pub fn read_version_into(
    name: &str,
    id: &str,
    out: &mut crate::StateWriter<'_>,
) -> Result<bool, PgError> {
    match out.host_sink() {
        Some(sink) => Ok(wit::read_version(name, id, sink)?),
        None => Err(PgError::Internal(
            "postgres reads go to the host's state sink (implement read_version_into)".into(),
        )),
    }
}
