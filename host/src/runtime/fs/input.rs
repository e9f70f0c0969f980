//! A guest's file input streams, read here rather than through
//! wasmtime-wasi's file stream.
//!
//! wasmtime-wasi's stream zeroes a fresh buffer before every read (up to
//! 64 KiB, `BytesMut::zeroed`), which the read then overwrites. A state
//! served through the host's copy (`body.copy-from`, what the SDK's
//! `read_to_state` uses) is nothing but such reads of one file, so every
//! byte of every state served was written twice: the zeroing was the
//! largest single item of a small GET's time on its request thread
//! (docs/benchmarks.md). Here a read fills the buffer's uninitialised
//! capacity (`pread`), at most 64 KiB as before, so what a guest receives
//! per read, and the memory it takes, are unchanged.
//!
//! Every read holds the instance's turn on the cores, as every file call
//! does ([`super::super::turns`]). A blocking one waits for it. A
//! non-blocking one (which cannot wait) reads inline if the turn is free
//! now, and otherwise answers nothing yet; `ready` waits for the turn and
//! reads then, and the next read serves those bytes. (Reading only
//! later, in the read after `ready`, would never happen while the backend
//! is busy: the call hook gives the turn back as that call enters the
//! host, and a turn given back goes to the first waiter.) wasmtime-wasi's
//! handed a non-blocking read to the blocking pool instead.

use super::super::quota::{DirQuota, Holder};
use super::super::turns::Core;
use std::sync::Arc;
use wasmtime_wasi::p2::{InputStream, Pollable, StreamError, StreamResult};

/// Most bytes one read returns (wasmtime-wasi's bound).
const MOST_PER_READ: usize = 64 << 10;

/// A stream reading a file from a position onwards.
pub(super) struct GuestInput {
    file: Arc<std::fs::File>,
    /// Where the next read starts.
    position: u64,
    /// The end was reached or a read failed: every later read answers
    /// `Closed`, as wasmtime-wasi's stream does.
    closed: bool,
    /// What `ready` read while it held the turn (the bytes just before
    /// `position`, or how that read ended): served before anything else.
    ahead: Option<StreamResult<bytes::Bytes>>,
    core: Core,
    /// This stream's place in the backend's register of open files.
    held: Option<(Arc<DirQuota>, Holder)>,
}

impl GuestInput {
    /// A stream on `file` from `position`, taking `held` in the register
    /// of open files until it is dropped.
    pub(super) fn new(
        file: Arc<std::fs::File>,
        position: u64,
        core: Core,
        held: Option<(Arc<DirQuota>, Holder)>,
    ) -> Self {
        GuestInput {
            file,
            position,
            closed: false,
            ahead: None,
            core,
            held,
        }
    }

    /// Up to `size` bytes of what `ready` read, if it read anything (or
    /// how its read ended).
    fn take_ahead(&mut self, size: usize) -> Option<StreamResult<bytes::Bytes>> {
        match self.ahead.take()? {
            Ok(mut bytes) => {
                let chunk = bytes.split_to(size.min(bytes.len()));
                if !bytes.is_empty() {
                    self.ahead = Some(Ok(bytes));
                }
                Some(Ok(chunk))
            }
            ended => Some(ended),
        }
    }

    /// A read for a guest holding the turn: what `ready` read first.
    fn read_holding(&mut self, size: usize) -> StreamResult<bytes::Bytes> {
        match self.take_ahead(size) {
            Some(served) => served,
            None => self.read_now(size),
        }
    }

    /// A skip for a guest holding the turn: what `ready` read first.
    fn skip_holding(&mut self, n: usize) -> StreamResult<usize> {
        match self.take_ahead(n) {
            Some(served) => served.map(|bytes| bytes.len()),
            None => self.skip_now(n),
        }
    }

    /// Up to `size` bytes (at most [`MOST_PER_READ`]) from the position.
    fn read_now(&mut self, size: usize) -> StreamResult<bytes::Bytes> {
        if self.closed {
            return Err(StreamError::Closed);
        }
        if size == 0 {
            return Ok(bytes::Bytes::new());
        }
        let mut buf = Vec::with_capacity(size.min(MOST_PER_READ));
        loop {
            let spare = rustix::buffer::spare_capacity(&mut buf);
            match rustix::io::pread(&*self.file, spare, self.position) {
                Ok(0) => {
                    self.closed = true;
                    return Err(StreamError::Closed);
                }
                Ok(n) => {
                    self.position += n as u64;
                    return Ok(bytes::Bytes::from(buf));
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(self.failed(e.into())),
            }
        }
    }

    /// Move the position on by up to `n` bytes (at most
    /// [`MOST_PER_READ`], as a read would), without reading them. The end
    /// is the file's size as it is now: a file whose size the kernel
    /// reports late (another NFS client's append) may skip short of it
    /// where a read would have found more.
    fn skip_now(&mut self, n: usize) -> StreamResult<usize> {
        if self.closed {
            return Err(StreamError::Closed);
        }
        if n == 0 {
            return Ok(0);
        }
        // A zero-length read fails as a read would where the file may not
        // be read (a descriptor opened for writing only): a skip reads.
        if let Err(e) = rustix::io::pread(&*self.file, &mut [0u8; 0], self.position) {
            return Err(self.failed(e.into()));
        }
        let len = match self.file.metadata() {
            Ok(meta) => meta.len(),
            Err(e) => return Err(self.failed(e)),
        };
        let left = len.saturating_sub(self.position);
        if left == 0 {
            self.closed = true;
            return Err(StreamError::Closed);
        }
        let skipped = left.min(n.min(MOST_PER_READ) as u64);
        self.position += skipped;
        Ok(skipped as usize)
    }

    /// Whether a non-blocking read or skip can answer now: with what
    /// `ready` read, or holding the turn (taken now if it is free).
    fn may_read_now(&self) -> bool {
        self.ahead.is_some() || self.core.try_hold()
    }

    /// A non-blocking answer without the turn: `nothing` (not the end),
    /// unless the stream is closed.
    fn not_ready<T>(&self, nothing: T) -> StreamResult<T> {
        match self.closed {
            true => Err(StreamError::Closed),
            false => Ok(nothing),
        }
    }

    fn failed(&mut self, e: std::io::Error) -> StreamError {
        self.closed = true;
        StreamError::LastOperationFailed(e.into())
    }
}

impl Drop for GuestInput {
    fn drop(&mut self) {
        if let Some((quota, holder)) = self.held.take() {
            quota.release(holder);
        }
    }
}

#[wasmtime_wasi::async_trait]
impl InputStream for GuestInput {
    fn read(&mut self, size: usize) -> StreamResult<bytes::Bytes> {
        if !self.may_read_now() {
            // Not ready yet: `ready` waits for the turn.
            return self.not_ready(bytes::Bytes::new());
        }
        self.read_holding(size)
    }

    async fn blocking_read(&mut self, size: usize) -> StreamResult<bytes::Bytes> {
        self.core
            .hold()
            .await
            .map_err(|t| StreamError::Trap(t.into()))?;
        self.read_holding(size)
    }

    fn skip(&mut self, n: usize) -> StreamResult<usize> {
        if !self.may_read_now() {
            return self.not_ready(0);
        }
        self.skip_holding(n)
    }

    async fn blocking_skip(&mut self, n: usize) -> StreamResult<usize> {
        self.core
            .hold()
            .await
            .map_err(|t| StreamError::Trap(t.into()))?;
        self.skip_holding(n)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for GuestInput {
    /// Ready once there is something to answer: bytes read, or the end.
    /// A regular file is always readable, so this waits only for the turn,
    /// and reads while it holds it. Past the deadline it returns having
    /// read nothing: the next read answers nothing, and the guest is
    /// stopped at its next epoch check.
    async fn ready(&mut self) {
        if self.ahead.is_some() || self.closed {
            return;
        }
        if self.core.hold().await.is_ok() {
            self.ahead = Some(self.read_now(MOST_PER_READ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::turns::Turns;
    use super::*;
    use futures_util::FutureExt;
    use std::io::Write;

    fn core_of(turns: &Turns) -> Core {
        let later = std::time::Instant::now() + std::time::Duration::from_secs(30);
        Core::new(turns.clone(), later, Arc::new(Vec::new()))
    }

    fn core() -> Core {
        core_of(&Turns::new(1))
    }

    fn stream_on(bytes: &[u8], position: u64) -> (tempfile::NamedTempFile, GuestInput) {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(bytes).unwrap();
        let read = Arc::new(std::fs::File::open(file.path()).unwrap());
        (file, GuestInput::new(read, position, core(), None))
    }

    #[test]
    fn reads_in_order_at_most_64_kib_each_then_closed_for_good() {
        let content: Vec<u8> = (0..100 << 10).map(|i| (i % 251) as u8).collect();
        let (_file, mut stream) = stream_on(&content, 0);
        let mut got = Vec::new();
        let mut reads = 0;
        loop {
            match stream.read(1 << 20) {
                Ok(chunk) => {
                    assert!(chunk.len() <= MOST_PER_READ, "{} bytes", chunk.len());
                    got.extend_from_slice(&chunk);
                    reads += 1;
                }
                Err(StreamError::Closed) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(got, content);
        // ext4 and tmpfs fill a read whole: 64 KiB, then the rest.
        assert_eq!(reads, 2);
        assert!(matches!(stream.read(10), Err(StreamError::Closed)));
        assert!(matches!(stream.skip(10), Err(StreamError::Closed)));
    }

    #[test]
    fn starts_at_its_position_and_skips_without_reading() {
        let (_file, mut stream) = stream_on(b"0123456789", 2);
        assert_eq!(stream.read(0).unwrap().len(), 0);
        assert_eq!(stream.skip(3).unwrap(), 3);
        assert_eq!(&stream.read(2).unwrap()[..], b"56");
        assert_eq!(stream.skip(100).unwrap(), 3);
        assert!(matches!(stream.read(1), Err(StreamError::Closed)));
    }

    /// A stream on a 10-byte file opened for writing only: reading it
    /// fails (EBADF).
    fn write_only_stream() -> (tempfile::NamedTempFile, GuestInput) {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), b"0123456789").unwrap();
        let write_only = std::fs::OpenOptions::new()
            .write(true)
            .open(file.path())
            .unwrap();
        (file, GuestInput::new(Arc::new(write_only), 0, core(), None))
    }

    #[test]
    fn a_failed_read_is_reported_once_then_closed() {
        let (_file, mut stream) = write_only_stream();
        assert!(matches!(
            stream.read(10),
            Err(StreamError::LastOperationFailed(_))
        ));
        assert!(matches!(stream.read(10), Err(StreamError::Closed)));
    }

    #[test]
    fn a_read_returns_at_most_what_was_asked() {
        let (_file, mut stream) = stream_on(&[7u8; 1000], 0);
        assert_eq!(stream.read(10).unwrap().len(), 10);
        assert_eq!(stream.read(5000).unwrap().len(), 990);
    }

    #[test]
    fn a_skip_where_reading_is_not_allowed_fails_as_a_read_would() {
        let (_file, mut stream) = write_only_stream();
        assert!(matches!(
            stream.skip(3),
            Err(StreamError::LastOperationFailed(_))
        ));
        assert!(matches!(stream.skip(3), Err(StreamError::Closed)));
    }

    #[tokio::test]
    async fn reads_wait_for_the_turn_and_ready_reads_while_it_holds_it() {
        let turns = Turns::new(1);
        let other = core_of(&turns);
        other.hold().await.unwrap();
        let (_file, mut stream) = stream_on(b"abc", 0);
        stream.core = core_of(&turns);
        // The backend's one turn is taken: nothing is read yet.
        assert_eq!(stream.read(10).unwrap().len(), 0);
        assert_eq!(stream.skip(1).unwrap(), 0);
        let mut blocked = Box::pin(stream.blocking_read(0));
        assert!(blocked.as_mut().now_or_never().is_none());
        drop(blocked);
        let mut ready = Box::pin(stream.ready());
        assert!(ready.as_mut().now_or_never().is_none());
        other.release();
        ready.await;
        // The next call into the host gives the turn back (the call hook),
        // to the instance waiting for it: what `ready` read is served all
        // the same, in order.
        let mut waiting = Box::pin(other.hold());
        assert!(waiting.as_mut().now_or_never().is_none());
        stream.core.release();
        assert_eq!(&stream.read(2).unwrap()[..], b"ab");
        assert_eq!(stream.skip(5).unwrap(), 1);
        waiting.await.unwrap();
        // The turn taken again: nothing yet, which is not the end.
        assert_eq!(stream.read(10).unwrap().len(), 0);
        other.release();
        // A blocking read of nothing is empty, not the end.
        assert_eq!(stream.blocking_read(0).await.unwrap().len(), 0);
        assert!(matches!(
            stream.blocking_read(1).await,
            Err(StreamError::Closed)
        ));
    }

    #[tokio::test]
    async fn ready_reports_the_end_it_found() {
        let (_file, mut stream) = stream_on(b"", 0);
        stream.ready().await;
        assert!(matches!(stream.read(1), Err(StreamError::Closed)));
        stream.ready().await;
        assert!(matches!(stream.read(1), Err(StreamError::Closed)));
    }
}
