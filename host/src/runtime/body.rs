//! The WIT `body` interface for guests: the host side of the resources
//! in [`super::chunks`], looked up in the instance's resource table.

use super::bindings::wasmstate::backend::body as wit;
use super::chunks::{StateSink, StateSource};
use super::sandbox::Sandbox;
use std::time::Instant;
use wasmtime::component::Resource;
use wasmtime_wasi::p2::{DynInputStream, DynOutputStream, StreamError};

/// Most bytes one step of a host-side copy moves (a file's stream gives at
/// most 64 KiB a read, wasmtime-wasi's cap). Every step checks the
/// deadline, and every this many bytes or epoch tick the copy passes its
/// turn on the cores ([`Sandbox::copy_step`]), so a long copy neither
/// outlives the request nor holds a core (a file's stream does its I/O
/// inline while it holds the turn).
const COPY_STEP: u32 = 1 << 20;

/// When a copy next passes its turn.
struct CopyStep {
    next_bytes: u64,
    since: Instant,
}

impl CopyStep {
    /// After passing it with `copied` bytes copied.
    fn after(copied: u64) -> Self {
        CopyStep {
            next_bytes: copied + u64::from(COPY_STEP),
            since: Instant::now(),
        }
    }
}

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
        let (mut written, mut step) = (0u64, CopyStep::after(0));
        loop {
            self.copy_step(written, &mut step).await?;
            // Slices of the request body itself: no copy, and the stream
            // holds at most one chunk while it writes.
            let chunk = self.table.get_mut(&source)?.next_shared(COPY_STEP);
            if chunk.is_empty() {
                return Ok(Ok(written));
            }
            let len = chunk.len() as u64;
            let stream = self.table.get_mut(&dest)?;
            if let Err(e) = stream.blocking_write_and_flush(chunk).await {
                // The state is partly written: whatever the guest answers,
                // this write is not acknowledged.
                self.table.get_mut(&source)?.fail();
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
        let (mut taken, mut step) = (0u64, CopyStep::after(0));
        while self.table.get(&sink)?.wants_more() {
            self.copy_step(taken, &mut step).await?;
            let stream = self.table.get_mut(&src)?;
            let chunk = match stream.blocking_read(COPY_STEP as usize).await {
                Ok(chunk) => chunk,
                Err(StreamError::Closed) => break,
                Err(e) => {
                    // What the host holds is partial: whatever the guest
                    // answers, this read does not succeed.
                    self.table.get_mut(&sink)?.fail();
                    return stream_failed(e, "reading the state from the stream");
                }
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
    /// Between two steps of a copy: past the deadline the guest is stopped
    /// (as the epoch would stop its wasm); otherwise, now and then, the
    /// copy gives up any turn on the cores and lets others run. It never
    /// waits for a turn: a file's stream takes one for its own I/O, and a
    /// network stream must not hold one while it waits on the remote.
    ///
    /// The turn is passed once [`COPY_STEP`] bytes or an epoch tick's
    /// time have gone by since it was last passed (`step`): a file's
    /// stream reads 64 KiB at a time, and passing the turn before each
    /// read made every read of a small state queue for it again behind
    /// the backend's other calls, while a slow disk still shares the
    /// cores as wasm does.
    async fn copy_step(&mut self, copied: u64, step: &mut CopyStep) -> wasmtime::Result<()> {
        self.check_deadline()?;
        if copied < step.next_bytes && step.since.elapsed() < super::engine::EPOCH_TICK {
            return Ok(());
        }
        *step = CopyStep::after(copied);
        self.core.release();
        tokio::task::yield_now().await;
        self.check_deadline()
    }

    fn check_deadline(&self) -> wasmtime::Result<()> {
        if Instant::now() >= self.core.deadline() {
            return Err(wasmtime::Trap::Interrupt.into());
        }
        Ok(())
    }

    /// Charge `len` bytes a host capability (git, postgres) puts into
    /// `sink` as the copies do; past the budget the sink is marked failed
    /// (so no success is believed) and the reason returned, for the
    /// capability's own error.
    pub(super) fn charge_capability_sink(
        &mut self,
        sink: &Resource<StateSink>,
        len: usize,
    ) -> Result<(), String> {
        if self.charge_sink(sink, len).is_ok() {
            return Ok(());
        }
        if let Ok(sink) = self.table.get_mut(sink) {
            sink.fail();
        }
        Err("the state is past the guest memory budget".into())
    }

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

/// A guest answered success after the host's copy of its state failed
/// (the target is partial): never believed.
pub(super) fn copy_failed(call: &str) -> super::bindings::wasmstate::backend::types::Error {
    super::bindings::wasmstate::backend::types::Error::Internal(format!(
        "the guest answered success to {call} after the host's copy of the state failed; nothing is acknowledged"
    ))
}
