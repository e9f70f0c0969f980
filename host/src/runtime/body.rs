//! The WIT `body` interface for guests: the host side of the resources
//! in [`super::chunks`], looked up in the instance's resource table.

use super::bindings::wasmstate::backend::body as wit;
use super::chunks::{StateSink, StateSource};
use super::sandbox::Sandbox;
use wasmtime::component::Resource;

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

    fn drop(&mut self, source: Resource<StateSource>) -> wasmtime::Result<()> {
        self.table.delete(source)?;
        Ok(())
    }
}

impl wit::HostStateSink for Sandbox {
    fn write(&mut self, sink: Resource<StateSink>, bytes: Vec<u8>) -> wasmtime::Result<bool> {
        // What the host keeps is memory the guest made it hold: charged to
        // the budgets, so concurrent reads cannot hold more than they allow.
        let growth = self.table.get(&sink)?.growth(bytes.len()) as u64;
        if !self.limiter.charge_host(growth) {
            wasmtime::bail!("the state handed back is past the guest memory budget");
        }
        Ok(self.table.get_mut(&sink)?.write(&bytes))
    }

    fn drop(&mut self, sink: Resource<StateSink>) -> wasmtime::Result<()> {
        self.table.delete(sink)?;
        Ok(())
    }
}
