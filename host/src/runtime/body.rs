//! The WIT `body` interface for guests: the host side of the resources
//! in [`super::chunks`], looked up in the instance's resource table.

use super::bindings::wasmstate::backend::body as wit;
use super::chunks::{MAX_CHUNK, StateSink, StateSource};
use super::sandbox::Sandbox;
use wasmtime::component::Resource;
use wasmtime_wasi::p2::{DynInputStream, DynOutputStream, StreamError};

impl wit::Host for Sandbox {}

impl wit::HostStateSource for Sandbox {
    fn size(&mut self, source: Resource<StateSource>) -> wasmtime::Result<u64> {
        Ok(self.table.get(&source)?.bytes().len() as u64)
    }

    fn serial(&mut self, source: Resource<StateSource>) -> wasmtime::Result<Option<u64>> {
        Ok(self.table.get(&source)?.serial())
    }

    fn read(&mut self, source: Resource<StateSource>, max: u32) -> wasmtime::Result<Vec<u8>> {
        Ok(self.table.get_mut(&source)?.next_chunk(max))
    }

    async fn copy_to(
        &mut self,
        source: Resource<StateSource>,
        dest: Resource<DynOutputStream>,
    ) -> wasmtime::Result<Result<u64, String>> {
        let mut written = 0u64;
        loop {
            // Slices of the request body itself: no copy, and the stream
            // holds at most one chunk while it writes.
            let chunk = self.table.get_mut(&source)?.next_shared(MAX_CHUNK);
            if chunk.is_empty() {
                return Ok(Ok(written));
            }
            let len = chunk.len() as u64;
            let stream = self.table.get_mut(&dest)?;
            if let Err(e) = stream.blocking_write_and_flush(chunk).await {
                return stream_failed(e, "writing the state to the stream");
            }
            written += len;
        }
    }

    fn drop(&mut self, source: Resource<StateSource>) -> wasmtime::Result<()> {
        self.table.delete(source)?;
        Ok(())
    }
}

impl wit::HostStateSink for Sandbox {
    fn write(&mut self, sink: Resource<StateSink>, bytes: Vec<u8>) -> wasmtime::Result<bool> {
        self.charge_sink(&sink, bytes.len())?;
        Ok(self.table.get_mut(&sink)?.write(&bytes))
    }

    async fn copy_from(
        &mut self,
        sink: Resource<StateSink>,
        src: Resource<DynInputStream>,
    ) -> wasmtime::Result<Result<u64, String>> {
        let mut taken = 0u64;
        while self.table.get(&sink)?.wants_more() {
            let stream = self.table.get_mut(&src)?;
            let chunk = match stream.blocking_read(MAX_CHUNK as usize).await {
                Ok(chunk) => chunk,
                Err(StreamError::Closed) => break,
                Err(e) => return stream_failed(e, "reading the state from the stream"),
            };
            self.charge_sink(&sink, chunk.len())?;
            self.table.get_mut(&sink)?.write(&chunk);
            taken += chunk.len() as u64;
        }
        Ok(Ok(taken))
    }

    fn drop(&mut self, sink: Resource<StateSink>) -> wasmtime::Result<()> {
        self.table.delete(sink)?;
        Ok(())
    }
}

impl Sandbox {
    /// What the host keeps is memory the guest made it hold: charged to
    /// the budgets, so concurrent reads cannot hold more than they allow.
    fn charge_sink(&mut self, sink: &Resource<StateSink>, len: usize) -> wasmtime::Result<()> {
        let growth = self.table.get(sink)?.growth(len) as u64;
        if !self.limiter.charge_host(growth) {
            wasmtime::bail!("the state handed back is past the guest memory budget");
        }
        Ok(())
    }
}

/// A stream's failure as the guest sees it: a line saying what failed; a
/// trap (the stream's own host code failed) stays a trap.
fn stream_failed(e: StreamError, doing: &str) -> wasmtime::Result<Result<u64, String>> {
    match e {
        StreamError::Closed => Ok(Err(format!("{doing}: the stream was closed"))),
        StreamError::LastOperationFailed(e) => Ok(Err(format!("{doing}: {e:#}"))),
        StreamError::Trap(e) => Err(e),
    }
}
