//! A guest's file streams: writes charged to the directory's quota before
//! they happen, and blocking reads and writes (which run inline) holding
//! the instance's turn on the cores.

use super::super::quota::DirQuota;
use super::super::turns::Core;
use super::ENOSPC;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use wasmtime_wasi::p2::{
    DynInputStream, DynOutputStream, InputStream, OutputStream, Pollable, StreamError, StreamResult,
};

/// A file's output stream: every write charged to the quota first, and
/// the blocking ones (which run inline) holding the instance's turn.
pub(super) struct GuestOutput {
    pub(super) inner: DynOutputStream,
    pub(super) file: Arc<std::fs::File>,
    /// Where the next write lands; `None` for an appending stream.
    pub(super) position: Option<u64>,
    pub(super) quota: Option<Arc<DirQuota>>,
    pub(super) refused: Arc<AtomicBool>,
    pub(super) core: Core,
}

impl GuestOutput {
    fn charge(&mut self, len: usize) -> StreamResult<()> {
        let len = len as u64;
        if let Some(quota) = &self.quota {
            let growth = match self.position {
                None => len,
                Some(position) => {
                    // The stream finishes one write before taking the next,
                    // so the file's size includes every earlier write.
                    let size = self
                        .file
                        .metadata()
                        .map_err(|e| StreamError::LastOperationFailed(e.into()))?
                        .len();
                    (position + len).saturating_sub(size)
                }
            };
            quota.charge(growth, &self.refused).map_err(|_| {
                StreamError::LastOperationFailed(std::io::Error::from_raw_os_error(ENOSPC).into())
            })?;
        }
        if let Some(position) = &mut self.position {
            *position += len;
        }
        Ok(())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for GuestOutput {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.charge(bytes.len())?;
        self.inner.write(bytes)
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.inner.flush()
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        self.inner.check_write()
    }

    async fn blocking_write_and_flush(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.charge(bytes.len())?;
        self.core
            .hold()
            .await
            .map_err(|t| StreamError::Trap(t.into()))?;
        self.inner.blocking_write_and_flush(bytes).await
    }

    fn write_zeroes(&mut self, n: usize) -> StreamResult<()> {
        self.charge(n)?;
        self.inner.write_zeroes(n)
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for GuestOutput {
    async fn ready(&mut self) {
        self.inner.ready().await
    }
}

/// A file's input stream whose blocking reads (which run inline) hold the
/// instance's turn.
pub(super) struct GuestInput {
    pub(super) inner: DynInputStream,
    pub(super) core: Core,
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
