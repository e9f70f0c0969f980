//! A guest's file output streams: writes charged to the directory's quota
//! and made under its lock, and blocking writes (which run inline) holding
//! the instance's turn. Input streams: [`super::input`].
//!
//! wasmtime-wasi's file output stream measured nothing: the size a charge
//! was measured against could change before its bytes landed (another
//! instance truncating the file between the two left a hole it was never
//! charged for, credited later when the file shrank). This one measures,
//! charges and writes in one step under the quota's lock. Like
//! wasmtime-wasi's, a non-blocking `write` (at most [`WRITE_CAPACITY`])
//! runs on the blocking pool, so waiting for the lock there holds no guest
//! thread; `check-write` allows nothing more until the guest has waited
//! for it. A blocking write runs inline, holding the instance's turn. A
//! write still running when the stream is dropped finishes (its bytes
//! are not lost), and the file is let go after it.

use super::super::quota::{DirQuota, Holder};
use super::super::turns::Core;
use super::ENOSPC;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

/// Most bytes one `write` may hand over, as `check-write` says (what
/// wasmtime-wasi's file streams allow too). A larger one traps.
pub(super) const WRITE_CAPACITY: usize = 64 << 10;

/// The file a stream writes, and what a write owes the quota. Shared
/// with a write running on the blocking pool; the file is let go (in the
/// register of open files) when the last of them is dropped.
pub(super) struct Target {
    pub(super) file: Arc<std::fs::File>,
    pub(super) quota: Option<Arc<DirQuota>>,
    /// The stream's place in the register of open files (a stream keeps
    /// its file on disk as a descriptor does).
    pub(super) holder: Option<Holder>,
    pub(super) refused: Arc<AtomicBool>,
}

impl Target {
    /// Write `bytes` at `at` (at the end for `None`), charging what the
    /// file grows by first: measured, charged and written under the
    /// quota's lock.
    fn write(&self, bytes: &[u8], at: Option<u64>) -> std::io::Result<()> {
        let Some(quota) = &self.quota else {
            // Nothing to charge: no size to measure (a `statx` a write).
            return self.put(bytes, at);
        };
        let _changes = quota.changes();
        let len = bytes.len() as u64;
        let size = self.file.metadata()?.len();
        let growth = match at {
            Some(at) => at.saturating_add(len).saturating_sub(size),
            None => len,
        };
        quota
            .charge(growth, &self.refused)
            .map_err(|_| std::io::Error::from_raw_os_error(ENOSPC))?;
        let written = self.put(bytes, at);
        if written.is_err() {
            // It failed part way: credit what it did not grow.
            quota.credit_unmade(&self.file, size, growth);
        }
        written
    }

    /// Write `bytes` at `at`, or at the end.
    fn put(&self, bytes: &[u8], at: Option<u64>) -> std::io::Result<()> {
        match at {
            Some(at) => self.file.write_all_at(bytes, at),
            None => append(&self.file, bytes),
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let (Some(quota), Some(holder)) = (&self.quota, self.holder) {
            quota.release(holder);
        }
    }
}

/// Append `bytes` atomically (`RWF_APPEND`, as wasmtime-wasi does), so
/// instances appending to one file without a quota's lock do not write
/// over each other.
fn append(file: &std::fs::File, mut bytes: &[u8]) -> std::io::Result<()> {
    use rustix::io::{Errno, ReadWriteFlags, pwritev2};
    while !bytes.is_empty() {
        let n = match pwritev2(
            file,
            &[std::io::IoSlice::new(bytes)],
            0,
            ReadWriteFlags::APPEND,
        ) {
            Ok(n) => n,
            Err(Errno::NOSYS | Errno::NOTSUP) => {
                // A kernel without it (before 4.16): at the end as it is.
                let end = file.metadata()?.len();
                return file.write_all_at(bytes, end);
            }
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        bytes = &bytes[n..];
    }
    Ok(())
}

/// What a file's output stream is doing.
enum Output {
    Ready,
    /// A write running on the blocking pool.
    Writing(tokio::task::JoinHandle<std::io::Result<()>>),
    /// The last write failed; the next call reports it.
    Failed(std::io::Error),
    Closed,
}

/// A file's output stream (see the module's doc).
pub(super) struct GuestOutput {
    target: Arc<Target>,
    /// Where the next write lands; `None` for an appending stream.
    position: Option<u64>,
    core: Core,
    state: Output,
}

impl GuestOutput {
    pub(super) fn new(target: Target, position: Option<u64>, core: Core) -> Self {
        GuestOutput {
            target: Arc::new(target),
            position,
            core,
            state: Output::Ready,
        }
    }

    /// Where a write of `len` bytes lands, moving the stream past it.
    fn advance(&mut self, len: usize) -> Option<u64> {
        let at = self.position;
        if let Some(position) = &mut self.position {
            *position += len as u64;
        }
        at
    }

    /// Report a failed write once; after it, the stream is closed.
    fn failure(&mut self) -> StreamResult<()> {
        match std::mem::replace(&mut self.state, Output::Closed) {
            Output::Failed(e) => Err(StreamError::LastOperationFailed(e.into())),
            Output::Closed => Err(StreamError::Closed),
            other => {
                self.state = other;
                Ok(())
            }
        }
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for GuestOutput {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.failure()?;
        if !matches!(self.state, Output::Ready) || bytes.len() > WRITE_CAPACITY {
            return Err(StreamError::trap(
                "write not permitted: more than check-write allowed",
            ));
        }
        if bytes.is_empty() {
            return Ok(());
        }
        let at = self.advance(bytes.len());
        let target = self.target.clone();
        let slots = self.core.keep_slots();
        self.state = Output::Writing(tokio::task::spawn_blocking(move || {
            // The instance's slots stay taken until the write ends.
            let _slots = slots;
            target.write(&bytes, at)
        }));
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        // A running write is waited for with the stream's readiness.
        self.failure()
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        self.failure()?;
        Ok(match self.state {
            Output::Ready => WRITE_CAPACITY,
            _ => 0,
        })
    }

    async fn blocking_write_and_flush(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.ready().await;
        self.failure()?;
        self.core
            .hold()
            .await
            .map_err(|t| StreamError::Trap(t.into()))?;
        if bytes.is_empty() {
            return Ok(());
        }
        let at = self.advance(bytes.len());
        self.target.write(&bytes, at).map_err(|e| {
            self.state = Output::Closed;
            StreamError::LastOperationFailed(e.into())
        })
    }

    fn write_zeroes(&mut self, n: usize) -> StreamResult<()> {
        if n > WRITE_CAPACITY {
            return Err(StreamError::trap(
                "write-zeroes not permitted: more than check-write allowed",
            ));
        }
        self.write(bytes::Bytes::from(vec![0; n]))
    }

    async fn cancel(&mut self) {
        // Let a running write finish, as wasmtime-wasi's stream does.
        self.ready().await;
        self.state = Output::Closed;
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for GuestOutput {
    async fn ready(&mut self) {
        if let Output::Writing(task) = &mut self.state {
            self.state = match task.await {
                Ok(Ok(())) => Output::Ready,
                Ok(Err(e)) => Output::Failed(e),
                Err(e) => Output::Failed(std::io::Error::other(e)),
            };
        }
    }
}
