//! What one guest instance may touch: the data of its [`wasmtime::Store`],
//! and the host functions of the `host` interface.

use super::bindings::wasmstate::backend::{host, types};
use super::limits::MemoryLimiter;
use super::outbound::Outbound;
use super::quota::DirQuota;
use super::text::{escape_controls, truncate};
use super::turns::Core;
use crate::capabilities::git::GitAccess;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

/// Most log lines one request may write; more are dropped with a notice.
pub const MAX_LOG_LINES: usize = 64;
/// Longest log line kept; longer ones are cut.
pub const MAX_LOG_LINE: usize = 2048;
/// Bytes of guest stderr kept (panic messages); writing more traps the guest.
pub const STDERR_CAPACITY: usize = 16 * 1024;

/// The state of one sandboxed instance, for one request.
pub struct Sandbox {
    /// WASI context: no environment, no arguments, no network, and only the
    /// directory this backend was granted.
    pub wasi: WasiCtx,
    /// Resources (files, streams) the guest holds handles to.
    pub table: ResourceTable,
    /// `wasi:http` state.
    pub http: WasiHttpCtx,
    /// Outbound HTTP, filtered by the backend's grants.
    pub outbound: Outbound,
    /// Memory caps for this instance: its own, its backend's, the server's.
    pub limiter: MemoryLimiter,
    /// The quota of the backend's directory, if it has one.
    pub quota: Option<Arc<DirQuota>>,
    /// Set when the quota refused a growth during this request.
    pub quota_refused: Arc<AtomicBool>,
    /// The files this instance holds open (for the quota's credits).
    pub open_files: super::quota::InstanceFiles,
    /// Its place on the cores (file calls hold its turn), and when the
    /// call's guest time runs out (host work done for the guest, git and
    /// the database, stops then too): [`Core::deadline`].
    pub core: Core,
    /// Guest stderr, kept to report panic messages.
    pub stderr: MemoryOutputPipe,
    /// Backend name, tagged on every log line.
    pub backend: Arc<str>,
    /// The backend's configuration, handed out by `host.get-config`.
    pub config: Arc<[(String, String)]>,
    /// Log lines written so far in this request.
    pub log_lines: usize,
    /// Git repositories this backend may use, if any.
    pub git: Option<GitAccess>,
    /// The backend's database, if it has one.
    pub postgres: Option<Arc<crate::capabilities::postgres::PgStore>>,
    /// Secrets granted to this backend, by name.
    pub secrets: Arc<[(String, String)]>,
}

impl WasiView for Sandbox {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for Sandbox {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.outbound,
        }
    }
}

impl types::Host for Sandbox {}

impl host::Host for Sandbox {
    async fn log(&mut self, level: host::LogLevel, message: String) {
        self.log_lines += 1;
        if self.log_lines > MAX_LOG_LINES {
            if self.log_lines == MAX_LOG_LINES + 1 {
                tracing::warn!(backend = %self.backend, "guest log limit of {MAX_LOG_LINES} lines reached; dropping the rest of this request's lines");
            }
            return;
        }
        // One line per call, whatever the guest sends: control characters
        // are escaped, so a guest cannot forge lines of the host's own.
        let message = escape_controls(&truncate(&message, MAX_LOG_LINE));
        let backend = &*self.backend;
        match level {
            host::LogLevel::Trace => tracing::trace!(backend, guest = true, "{message}"),
            host::LogLevel::Debug => tracing::debug!(backend, guest = true, "{message}"),
            host::LogLevel::Info => tracing::info!(backend, guest = true, "{message}"),
            host::LogLevel::Warn => tracing::warn!(backend, guest = true, "{message}"),
            host::LogLevel::Error => tracing::error!(backend, guest = true, "{message}"),
        }
    }

    async fn get_config(&mut self) -> Vec<(String, String)> {
        self.config.to_vec()
    }

    async fn get_secret(&mut self, name: String) -> Option<String> {
        self.secrets
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    }
}
