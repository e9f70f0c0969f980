//! Plain Rust types an author works with, free of generated bindings.

pub use wasmstate_types::LockInfo;

/// One previous version of a state, kept by the guest's own storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// Opaque id the host passes back to [`crate::Backend::read_version`].
    pub id: String,
    /// The state's serial, when known.
    pub serial: Option<u64>,
    /// When it was written, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// Its size in bytes.
    pub bytes: u64,
}

/// One configuration problem, reported to the operator at startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The key at fault, when one key is.
    pub key: Option<String>,
    /// What is wrong and how to fix it, in one line.
    pub message: String,
}

impl Diagnostic {
    /// A problem with one key.
    pub fn key(key: impl Into<String>, message: impl Into<String>) -> Self {
        Diagnostic {
            key: Some(key.into()),
            message: message.into(),
        }
    }

    /// A problem with the configuration as a whole.
    pub fn general(message: impl Into<String>) -> Self {
        Diagnostic {
            key: None,
            message: message.into(),
        }
    }
}

/// What the host's stale-write guard needs of a stored state, without its
/// body (contract 0.3.0's `head`). Its first bytes go to the host through
/// the [`crate::StateWriter`] `head` is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The storage's own version of the stored bytes (an ETag, a GCS
    /// generation, a row version, a git blob id): it must change whenever
    /// they change; [`Expect::Version`] compares it.
    pub version: String,
    /// The state's size in bytes.
    pub size: u64,
    /// `<algorithm>:<lowercase hex>` of the stored bytes where the storage
    /// keeps one without reading them (`md5`, `sha256`, `git-blob`).
    pub digest: Option<String>,
}

/// Which stored state (or metadata) a conditional write may replace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Whatever is stored, or nothing.
    Any,
    /// Only when nothing is stored.
    Absent,
    /// Only while the stored version is still this one.
    Version(String),
}

/// A workspace's metadata (a small JSON document the host writes) and the
/// version [`Expect::Version`] compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    /// The document, at most 64 KiB.
    pub content: String,
    /// Opaque; must change whenever `content` is written.
    pub version: String,
}
