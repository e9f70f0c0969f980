//! A state's bytes in chunks: [`StateReader`] for a state the host hands
//! to [`crate::Backend::write_from`], [`StateWriter`] for one a guest hands
//! back from [`crate::Backend::read_into`]. They are [`std::io::Read`] and
//! [`std::io::Write`], so `std::io::copy` moves a state between a file or
//! an HTTP body and the host without holding it whole.

use crate::export::wit::wasmstate::backend::body::{StateSink, StateSource};
use std::io;
use wasip2::io::streams::{InputStream, OutputStream, StreamError};

/// Most bytes `blocking-write-and-flush` takes per call (WASI's rule).
const STREAM_WRITE: usize = 4096;

/// Bytes asked of the host per chunk: large enough that a call's cost does
/// not matter, small enough to keep a guest's memory low.
pub const CHUNK_BYTES: usize = 1 << 20;

/// A state arriving from the host, read in order, once.
pub struct StateReader<'a> {
    from: Source<'a>,
    size: u64,
}

enum Source<'a> {
    Host(&'a StateSource),
    Slice(&'a [u8]),
}

impl<'a> StateReader<'a> {
    pub(crate) fn host(source: &'a StateSource) -> Self {
        StateReader {
            size: source.size(),
            from: Source::Host(source),
        }
    }

    /// A reader over bytes already in memory (what the simple
    /// [`crate::Backend::write`] path hands a streaming implementation).
    pub fn from_slice(bytes: &'a [u8]) -> Self {
        StateReader {
            size: bytes.len() as u64,
            from: Source::Slice(bytes),
        }
    }

    /// The state's total size in bytes (an S3 `Content-Length`, say).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The state's `serial`, read by the host from its first bytes
    /// (`None` when they hold no serial and lineage); reading it takes
    /// nothing from the reader.
    pub fn serial(&self) -> Option<u64> {
        match &self.from {
            Source::Host(source) => source.serial(),
            Source::Slice(bytes) => {
                #[derive(serde::Deserialize)]
                struct Head {
                    serial: Option<u64>,
                    lineage: Option<String>,
                }
                let head: Head = serde_json::from_slice(bytes).ok()?;
                head.lineage.filter(|l| !l.is_empty())?;
                head.serial
            }
        }
    }

    /// What is left to read, when the state is in this guest's memory.
    pub(crate) fn in_memory(&self) -> Option<&'a [u8]> {
        match &self.from {
            Source::Slice(rest) => Some(rest),
            Source::Host(_) => None,
        }
    }

    /// The host's source, when the state is still with the host.
    pub(crate) fn host_source(&self) -> Option<&StateSource> {
        match &self.from {
            Source::Host(source) => Some(source),
            Source::Slice(_) => None,
        }
    }

    /// The next chunk, of at most `max` bytes; empty at the end. Avoids the
    /// copy of [`io::Read::read`] when the chunk goes straight on.
    pub fn next_chunk(&mut self, max: usize) -> Vec<u8> {
        match &mut self.from {
            Source::Host(source) => source.read(max.min(u32::MAX as usize) as u32),
            Source::Slice(rest) => {
                let (chunk, tail) = rest.split_at(max.min(rest.len()));
                *rest = tail;
                chunk.to_vec()
            }
        }
    }

    /// Write the rest of the state into `dest` (a file's
    /// `write_via_stream`, an HTTP body's stream), flushed: the host copies
    /// it, so the bytes never pass through this guest's memory. The number
    /// of bytes written, or why `dest` failed (then the target is partial,
    /// and the host refuses to acknowledge the write whatever you return).
    pub fn copy_to(&mut self, dest: &OutputStream) -> Result<u64, String> {
        match &mut self.from {
            Source::Host(source) => source.copy_to(dest),
            Source::Slice(rest) => {
                let total = rest.len() as u64;
                for chunk in rest.chunks(STREAM_WRITE) {
                    dest.blocking_write_and_flush(chunk).map_err(describe)?;
                }
                *rest = &[];
                Ok(total)
            }
        }
    }

    /// All remaining bytes, in one buffer sized up front (the simple path).
    pub fn read_all(&mut self) -> Vec<u8> {
        let mut all = Vec::with_capacity(usize::try_from(self.size).unwrap_or(0));
        loop {
            let chunk = self.next_chunk(CHUNK_BYTES);
            if chunk.is_empty() {
                return all;
            }
            all.extend_from_slice(&chunk);
        }
    }
}

impl io::Read for StateReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Source::Slice(rest) = &mut self.from {
            let n = buf.len().min(rest.len());
            buf[..n].copy_from_slice(&rest[..n]);
            *rest = &rest[n..];
            return Ok(n);
        }
        let chunk = self.next_chunk(buf.len().min(CHUNK_BYTES));
        buf[..chunk.len()].copy_from_slice(&chunk);
        Ok(chunk.len())
    }
}

/// A state on its way to the host, written in order.
///
/// When the host needs only the beginning of a state (to check its
/// serial), a write fails with [`StateWriter::is_stopped`] set: stop and
/// return the error, or anything; the SDK answers the host with success.
pub struct StateWriter<'a> {
    to: Sink<'a>,
    stopped: bool,
}

enum Sink<'a> {
    Host(&'a StateSink),
    Memory(Vec<u8>),
}

impl<'a> StateWriter<'a> {
    pub(crate) fn host(sink: &'a StateSink) -> Self {
        StateWriter {
            to: Sink::Host(sink),
            stopped: false,
        }
    }

    /// A writer into memory (what the simple [`crate::Backend::read`] path
    /// uses to call a streaming implementation).
    pub fn memory() -> StateWriter<'static> {
        StateWriter {
            to: Sink::Memory(Vec::new()),
            stopped: false,
        }
    }

    /// The host's sink, when the bytes go to the host.
    pub(crate) fn host_sink(&self) -> Option<&StateSink> {
        match &self.to {
            Sink::Host(sink) => Some(sink),
            Sink::Memory(_) => None,
        }
    }

    /// Append everything `src` yields until it ends (a file's
    /// `read_via_stream`, an HTTP body's stream): the host copies it, so
    /// the bytes never pass through this guest's memory, and stops by itself
    /// once it has what it needs. The number of bytes taken, or why `src`
    /// failed (then the host refuses the read whatever you return).
    pub fn copy_from(&mut self, src: &InputStream) -> Result<u64, String> {
        match &mut self.to {
            Sink::Host(sink) => sink.copy_from(src),
            Sink::Memory(bytes) => {
                let mut taken = 0u64;
                loop {
                    match src.blocking_read(CHUNK_BYTES as u64) {
                        Ok(chunk) => {
                            taken += chunk.len() as u64;
                            bytes.extend_from_slice(&chunk);
                        }
                        Err(StreamError::Closed) => return Ok(taken),
                        Err(e) => return Err(describe(e)),
                    }
                }
            }
        }
    }

    /// The host said it has what it needs; nothing more is taken.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// What a memory writer gathered (empty for the host's).
    pub fn into_bytes(self) -> Vec<u8> {
        match self.to {
            Sink::Memory(bytes) => bytes,
            Sink::Host(_) => Vec::new(),
        }
    }
}

impl io::Write for StateWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.stopped {
            return Err(stopped());
        }
        match &mut self.to {
            Sink::Memory(bytes) => bytes.extend_from_slice(buf),
            Sink::Host(sink) => {
                // Large writes go in bounded chunks: each is copied into
                // the host's memory in one call.
                for chunk in buf.chunks(CHUNK_BYTES) {
                    if !sink.write(chunk) {
                        self.stopped = true;
                        return Err(stopped());
                    }
                }
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn stopped() -> io::Error {
    io::Error::other("the host has read all it needs of this state")
}

/// A WASI stream's failure, in words.
fn describe(e: StreamError) -> String {
    match e {
        StreamError::Closed => "the stream was closed".to_string(),
        StreamError::LastOperationFailed(e) => e.to_debug_string(),
    }
}
