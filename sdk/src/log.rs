//! Log lines that reach the host's log, tagged with the backend's name.
//!
//! The host caps how many lines (and bytes) one request may log, so a noisy
//! guest cannot flood the operator's logs.

use crate::export::wit::wasmstate::backend::host::{self, LogLevel};

fn emit(level: LogLevel, message: &str) {
    host::log(level, message);
}

/// Log at debug level.
pub fn debug(message: &str) {
    emit(LogLevel::Debug, message);
}

/// Log at info level.
pub fn info(message: &str) {
    emit(LogLevel::Info, message);
}

/// Log at warn level.
pub fn warn(message: &str) {
    emit(LogLevel::Warn, message);
}

/// Log at error level.
pub fn error(message: &str) {
    emit(LogLevel::Error, message);
}
