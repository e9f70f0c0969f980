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
