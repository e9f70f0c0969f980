//! `sync` and `sync-data`: flushed on the blocking pool (inline for the
//! server's only guest call), holding no turn on the cores (an `fsync`
//! waits for the disk, not a core).

use super::{GuestFs, io_error};
use crate::runtime::turns::Core;
use std::sync::Arc;
use wasmtime::component::Resource;
use wasmtime_wasi::filesystem::Descriptor;
use wasmtime_wasi::p2::bindings::filesystem::types;
use wasmtime_wasi::p2::{FsError, FsResult};

/// A descriptor to flush to stable storage.
pub(super) enum SyncTarget {
    File(Arc<std::fs::File>),
    Dir(Arc<std::fs::File>),
}

/// How much of it: `sync` or `sync-data`.
#[derive(Clone, Copy)]
pub(super) enum Flush {
    All,
    Data,
}

/// Flush `target` on the blocking pool, holding no turn. An `fsync` waits
/// for the disk, not a core: inline under the turn it made every other
/// request of the backend wait for the disk too (and the disk serves
/// concurrent flushes in one journal commit). A backend still flushes at
/// most once per instance at a time, and the guest's deadline holds: the
/// call is awaited, so dropped with the request at its deadline; the
/// flush itself finishes on its thread, holding the instance's slots
/// until then.
///
/// The only guest call under way on the server flushes inline instead, as
/// a native backend would: no other guest call to hold up, and the two
/// thread hand-offs cost a lone POST 8–10 % (`cargo bench --bench
/// guest_vs_native -- socket-POST`, alternated runs). What that costs:
/// the worker is held until the disk answers, past the call's deadline if
/// the disk is that slow (nothing can cut a running `fsync` short), and
/// the requests that are not guest calls queued on that worker wait too.
/// So only where the runtime has another worker to serve them: on a
/// runtime of one worker (a one-CPU container; the thread making
/// instances ahead, [`crate::runtime::ahead`]) an inline `fsync` would
/// stop everything it runs for as long as the disk takes, for ever on a
/// disk that hangs.
pub(super) async fn sync_off_the_turn(target: SyncTarget, how: Flush, core: &Core) -> FsResult<()> {
    if core.alone_on_server() && tokio::runtime::Handle::current().metrics().num_workers() > 1 {
        return flush(target, how).map_err(io_error);
    }
    let slots = core.keep_slots();
    let flushed = tokio::task::spawn_blocking(move || {
        let _slots = slots;
        flush(target, how)
    })
    .await
    .map_err(|e| FsError::trap(wasmtime::Error::msg(format!("sync stopped: {e}"))))?;
    flushed.map_err(io_error)
}

/// Flush `target` to stable storage, here and now.
fn flush(target: SyncTarget, how: Flush) -> std::io::Result<()> {
    let file = match target {
        SyncTarget::File(file) => file,
        SyncTarget::Dir(dir) => {
            // A directory the guest opened is readable, and flushed
            // through its own descriptor (with std's calls, which retry
            // an interrupted flush): the open and close wasmtime-wasi
            // adds would cost every lock and write two system calls. The
            // granted one may be a path-only descriptor, which `fsync`
            // refuses (EBADF): flushed through a descriptor of its own.
            let flushed = match how {
                Flush::All => dir.sync_all(),
                Flush::Data => dir.sync_data(),
            };
            match flushed {
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::BADF.raw_os_error()) => {}
                other => return other,
            }
            use rustix::fs::{Mode, OFlags, openat};
            let own = openat(
                &*dir,
                ".",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            Arc::new(std::fs::File::from(own))
        }
    };
    match how {
        Flush::All => file.sync_all(),
        Flush::Data => file.sync_data(),
    }
}

impl GuestFs<'_> {
    /// What `sync` on `fd` flushes: the file, or the directory.
    pub(super) fn sync_target(&self, fd: &Resource<types::Descriptor>) -> FsResult<SyncTarget> {
        Ok(match self.fs.table.get(fd)? {
            Descriptor::File(f) => SyncTarget::File(f.file.clone()),
            Descriptor::Dir(d) => SyncTarget::Dir(d.dir.clone()),
        })
    }
}
