//! The error every [`crate::Backend`] method returns.

use crate::{Diagnostic, LockInfo};
use std::fmt;

/// Why a storage operation failed. The host turns each case into the right
/// HTTP status, so pick the case by meaning, not by wording.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The workspace does not exist.
    NotFound,
    /// Someone else holds the lock (boxed to keep `Result`s small; build it
    /// with [`Error::locked`]).
    Locked(Box<LockInfo>),
    /// The presented lock id is not the holder's (`None`: nothing is
    /// locked); build it with [`Error::lock_mismatch`].
    LockMismatch(Option<Box<LockInfo>>),
    /// The request cannot be served as asked.
    InvalidInput(String),
    /// The configuration is unusable.
    InvalidConfig(Vec<Diagnostic>),
    /// Storage is unreachable or busy; a retry may succeed.
    Unavailable(String),
    /// Anything else.
    Internal(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotFound => write!(f, "workspace not found"),
            Error::Locked(holder) => write!(f, "locked by {} (id {})", holder.who, holder.id),
            Error::LockMismatch(Some(holder)) => {
                write!(f, "lock id does not match the holder's ({})", holder.id)
            }
            Error::LockMismatch(None) => write!(f, "not locked"),
            Error::InvalidInput(m) => write!(f, "invalid input: {m}"),
            Error::InvalidConfig(d) => {
                let lines: Vec<String> = d.iter().map(|d| d.message.clone()).collect();
                write!(f, "invalid configuration: {}", lines.join("; "))
            }
            Error::Unavailable(m) => write!(f, "storage unavailable: {m}"),
            Error::Internal(m) => write!(f, "internal error: {m}"),
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    /// The workspace is locked by `holder`.
    pub fn locked(holder: LockInfo) -> Self {
        Error::Locked(Box::new(holder))
    }

    /// The lock id presented is not the holder's (`None`: nothing is locked).
    pub fn lock_mismatch(holder: Option<LockInfo>) -> Self {
        Error::LockMismatch(holder.map(Box::new))
    }

    /// An I/O failure with what was being done, e.g. `io("reading state", e)`.
    pub fn io(context: &str, err: std::io::Error) -> Self {
        use std::io::ErrorKind::*;
        let message = format!("{context}: {err}");
        match err.kind() {
            // Conditions that clear up on their own are worth a retry.
            TimedOut | Interrupted | WouldBlock | ResourceBusy | ConnectionRefused
            | ConnectionReset | ConnectionAborted => Error::Unavailable(message),
            _ => Error::Internal(message),
        }
    }
}
