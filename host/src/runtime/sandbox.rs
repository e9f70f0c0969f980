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

// What WASI allocates on the host for a guest, outside its memory limit
// (GHSA-852m-cvvp-9p4w), sized to this server rather than left at
// wasmtime's generic defaults: a guest of any backend holds at most
// MAX_HANDLES x MAX_FIELDS_BYTES (64 MiB) of header sets, asks at most
// MAX_RANDOM_BYTES at once, and hands the host at most what the host lifts
// from it anyway (`max_lift_bytes`) in one call.

/// Most resource handles (files, streams, requests, header sets) one
/// instance holds, in the host's table and the component's own: a storage
/// guest holds a few dozen at once (wasmtime: a million entries of host
/// memory, and 100,000 component handles).
pub const MAX_HANDLES: usize = 4096;
/// Largest random-byte request (`wasi:random`): a guest asks for a seed or
/// an ID, a few dozen bytes (wasmtime: 64 MiB, allocated on the host).
pub const MAX_RANDOM_BYTES: u64 = 1 << 20;
/// Largest in-memory size of one set of HTTP header fields: a storage
/// API's headers are a few KiB on the wire (wasmtime: 128 KiB per set).
pub const MAX_FIELDS_BYTES: usize = 16 << 10;

/// WASI for one instance, with its host allocations bounded as above.
pub fn wasi_builder() -> wasmtime_wasi::WasiCtxBuilder {
    let mut wasi = wasmtime_wasi::WasiCtxBuilder::new();
    wasi.max_random_size(MAX_RANDOM_BYTES);
    wasi
}

/// `wasi:http` for one instance, its header sets bounded as above.
pub fn http_ctx() -> WasiHttpCtx {
    let mut http = WasiHttpCtx::new();
    http.set_field_size_limit(MAX_FIELDS_BYTES);
    http
}

/// The host's table of an instance's resources, bounded as above.
pub fn resource_table() -> ResourceTable {
    let mut table = ResourceTable::new();
    table.set_max_capacity(MAX_HANDLES);
    table
}

/// Bound what the component model lets a guest of `store` allocate on the
/// host: live component handles, and the bytes it hands the host in one
/// call (`max_lift_bytes`, what the host takes back from a guest at most:
/// the largest state plus a margin; wasmtime's default of 128 MiB would
/// both allow more than that and refuse a server configured for larger
/// states).
pub fn limit_store<T>(store: &mut wasmtime::Store<T>, max_lift_bytes: usize) {
    store.set_hostcall_fuel(max_lift_bytes);
    store.set_max_component_handles(MAX_HANDLES);
}

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

impl Sandbox {
    /// Whether what ran in this instance left something a call is blamed
    /// for: a log line, stderr output, the disk quota met. Such an
    /// instance is handed to no other call (made ahead, or kept from its
    /// request's last call): the next call's report would show it.
    pub fn left_a_trace(&self) -> bool {
        self.log_lines > 0
            || !self.stderr.contents().is_empty()
            || self
                .quota_refused
                .load(std::sync::atomic::Ordering::Relaxed)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_wasi_allocates_for_a_guest_is_sized_to_this_server() {
        use wasmtime_wasi::p2::bindings::random::random::Host as _;
        let mut wasi = wasi_builder().build();
        let random = wasi.random();
        assert!(random.get_random_bytes(MAX_RANDOM_BYTES + 1).is_err());
        assert_eq!(random.get_random_bytes(64).unwrap().len(), 64);
        // wasmtime keeps the limit private; its Debug shows it.
        let http = format!("{:?}", http_ctx());
        assert!(
            http.contains(&format!("field_size_limit: {MAX_FIELDS_BYTES}")),
            "{http}"
        );
        assert_eq!(resource_table().max_capacity(), MAX_HANDLES);
        let engine = wasmtime::Engine::default();
        let mut store = wasmtime::Store::new(&engine, ());
        limit_store(&mut store, 65 << 20);
        assert_eq!(store.hostcall_fuel(), 65 << 20);
        assert_eq!(store.max_component_handles(), MAX_HANDLES);
    }
}
