//! A guest's file streams: writes charged to the directory's quota and
//! made under its lock, and blocking reads and writes (which run inline)
//! holding the instance's turn.
//!
//! wasmtime-wasi's file output stream starts each write on a blocking pool
//! and lets it land later, so the size its charge was measured against
//! could change before the bytes landed (another instance truncating the
//! file between the two left a hole it was never charged for, credited
//! later when the file shrank). This one makes each write before `write`
//! returns, measured, charged and written under the quota's lock; at most
//! [`WRITE_CAPACITY`] at a time, so the lock is held briefly and nothing
//! waits in host memory. A non-blocking `write` runs without the
//! instance's turn, as wasmtime-wasi's did on its pool; the blocking one
//! holds it.

use super::super::quota::{DirQuota, Holder};
use super::super::turns::Core;
use super::ENOSPC;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use wasmtime_wasi::p2::{
    DynInputStream, InputStream, OutputStream, Pollable, StreamError, StreamResult,
};

/// Most bytes one `write` may hand over, as `check-write` says (what
/// wasmtime-wasi's file streams allow too). A larger one traps.
pub(super) const WRITE_CAPACITY: usize = 64 << 10;

/// A file's output stream (see the module's doc).
pub(super) struct GuestOutput {
    file: Arc<std::fs::File>,
    /// Where the next write lands; `None` for an appending stream.
    position: Option<u64>,
    quota: Option<Arc<DirQuota>>,
    /// This stream's place in the backend's register of open files: a
    /// stream keeps its file on disk as a descriptor does.
    holder: Option<Holder>,
    refused: Arc<AtomicBool>,
    core: Core,
    /// A write failed: the stream is closed.
    closed: bool,
}

impl GuestOutput {
    pub(super) fn new(
        file: Arc<std::fs::File>,
        position: Option<u64>,
        quota: Option<(Arc<DirQuota>, Holder)>,
        refused: Arc<AtomicBool>,
        core: Core,
    ) -> Self {
        let (quota, holder) = quota.unzip();
        GuestOutput {
            file,
            position,
            quota,
            holder,
            refused,
            core,
            closed: false,
        }
    }

    /// Write `bytes` where the stream is, charging what the file grows by
    /// first: measured, charged and written under the quota's lock.
    fn write_now(&mut self, bytes: &[u8]) -> StreamResult<()> {
        if self.closed {
            return Err(StreamError::Closed);
        }
        if bytes.len() > WRITE_CAPACITY {
            return Err(StreamError::trap(
                "write not permitted: more than check-write allowed",
            ));
        }
        if bytes.is_empty() {
            return Ok(());
        }
        self.write_locked(bytes).map_err(|e| {
            self.closed = true;
            StreamError::LastOperationFailed(e.into())
        })
    }

    fn write_locked(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let _changes = self.quota.as_ref().map(|q| q.changes());
        let len = bytes.len() as u64;
        let size = self.file.metadata()?.len();
        // An appending stream writes at the end: under the lock, nothing
        // else of this backend moves it before the bytes land.
        let at = self.position.unwrap_or(size);
        let growth = at.saturating_add(len).saturating_sub(size);
        if let Some(quota) = &self.quota {
            quota
                .charge(growth, &self.refused)
                .map_err(|_| std::io::Error::from_raw_os_error(ENOSPC))?;
        }
        let written = self.file.write_all_at(bytes, at);
        if let (Err(_), Some(quota)) = (&written, &self.quota) {
            // It failed part way: credit what it did not grow.
            let after = self.file.metadata().map_or(size + growth, |m| m.len());
            quota.credit(growth.saturating_sub(after.saturating_sub(size)));
        }
        written?;
        if let Some(position) = &mut self.position {
            *position += len;
        }
        Ok(())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for GuestOutput {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.write_now(&bytes)
    }

    fn flush(&mut self) -> StreamResult<()> {
        // Every write has landed when `write` returns.
        match self.closed {
            true => Err(StreamError::Closed),
            false => Ok(()),
        }
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        self.flush().map(|()| WRITE_CAPACITY)
    }

    async fn blocking_write_and_flush(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.core
            .hold()
            .await
            .map_err(|t| StreamError::Trap(t.into()))?;
        self.write_now(&bytes)
    }

    fn write_zeroes(&mut self, n: usize) -> StreamResult<()> {
        if n > WRITE_CAPACITY {
            return Err(StreamError::trap(
                "write-zeroes not permitted: more than check-write allowed",
            ));
        }
        self.write_now(&vec![0; n])
    }

    async fn cancel(&mut self) {}
}

#[wasmtime_wasi::async_trait]
impl Pollable for GuestOutput {
    async fn ready(&mut self) {}
}

impl Drop for GuestOutput {
    fn drop(&mut self) {
        release(self.quota.as_ref(), self.holder);
    }
}

/// A stream let go of its file: credit what that freed (a removed file's
/// bytes, once nothing holds it).
fn release(quota: Option<&Arc<DirQuota>>, holder: Option<Holder>) {
    if let (Some(quota), Some(holder)) = (quota, holder) {
        let freed = quota.changes().closed(holder);
        quota.credit(freed);
    }
}

/// A file's input stream whose blocking reads (which run inline) hold the
/// instance's turn.
pub(super) struct GuestInput {
    pub(super) inner: DynInputStream,
    pub(super) core: Core,
    /// This stream's place in the backend's register of open files.
    pub(super) held: Option<(Arc<DirQuota>, Holder)>,
}

impl Drop for GuestInput {
    fn drop(&mut self) {
        let (quota, holder) = self.held.take().unzip();
        release(quota.as_ref(), holder);
    }
}

#[wasmtime_wasi::async_trait]
impl InputStream for GuestInput {
    fn read(&mut self, size: usize) -> StreamResult<bytes::Bytes> {
        self.inner.read(size)
    }

    async fn blocking_read(&mut self, size: usize) -> StreamResult<bytes::Bytes> {
        self.core
            .hold()
            .await
            .map_err(|t| StreamError::Trap(t.into()))?;
        self.inner.blocking_read(size).await
    }

    fn skip(&mut self, n: usize) -> StreamResult<usize> {
        self.inner.skip(n)
    }

    async fn blocking_skip(&mut self, n: usize) -> StreamResult<usize> {
        self.core
            .hold()
            .await
            .map_err(|t| StreamError::Trap(t.into()))?;
        self.inner.blocking_skip(n).await
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for GuestInput {
    async fn ready(&mut self) {
        self.inner.ready().await
    }
}
