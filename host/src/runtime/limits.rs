//! Memory caps for guest instances: one per instance (`memory_mib`), one per
//! backend (its share of the server's budget) and one for the whole server
//! (`max_guest_memory_mib`).
//!
//! wasmtime's `StoreLimits` caps each linear memory on its own; a guest with
//! several memories could use a multiple of the limit. This limiter counts
//! all of an instance's memories together, and charges every byte it grants
//! against the backend's and the server's budgets too (semaphores counting
//! 64 KiB wasm pages), giving them back when the instance is dropped. It
//! never waits: a growth past any cap is refused at once (`memory.grow`
//! returns -1, which a Rust guest turns into an allocation-failure trap),
//! and it remembers which cap refused, so the request gets the right answer.

use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The unit the budgets count in.
pub const WASM_PAGE: u64 = 64 * 1024;

/// Which cap refused a growth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The instance's own `memory_mib`.
    Instance,
    /// The backend's share of the server's budget.
    Backend,
    /// The server-wide budget.
    Server,
}

/// A budget of guest memory shared by instances: the server's, or one
/// backend's share of it.
#[derive(Debug, Clone)]
pub struct Budget {
    pages: Arc<Semaphore>,
    total_pages: u64,
}

impl Budget {
    /// A budget of `bytes` (rounded down to whole pages).
    pub fn new(bytes: u64) -> Self {
        let total_pages = (bytes / WASM_PAGE).min(Semaphore::MAX_PERMITS as u64);
        Budget {
            pages: Arc::new(Semaphore::new(total_pages as usize)),
            total_pages,
        }
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> u64 {
        self.total_pages * WASM_PAGE
    }

    /// Bytes charged to it right now.
    pub fn used_bytes(&self) -> u64 {
        (self.total_pages - self.pages.available_permits() as u64) * WASM_PAGE
    }

    /// Take `pages` as a permit of their own (`Some(None)` for none),
    /// `None` when the budget has not that many free.
    pub fn take_owned(&self, pages: u64) -> Option<Option<OwnedSemaphorePermit>> {
        let mut held = None;
        self.take(pages, &mut held).then_some(held)
    }

    /// Take `pages` more into `held`, or `false` without taking any.
    fn take(&self, pages: u64, held: &mut Option<OwnedSemaphorePermit>) -> bool {
        if pages == 0 {
            return true;
        }
        let Ok(pages) = u32::try_from(pages) else {
            return false;
        };
        match self.pages.clone().try_acquire_many_owned(pages) {
            Ok(permit) => {
                match held {
                    Some(h) => h.merge(permit),
                    None => *held = Some(permit),
                }
                true
            }
            Err(_) => false,
        }
    }
}

impl crate::metrics::Usage for Budget {
    fn used(&self) -> u64 {
        Budget::used_bytes(self)
    }
    fn limit(&self) -> u64 {
        self.bytes()
    }
}

/// Caps the total linear memory of one store, charging it to the budgets.
#[derive(Debug)]
pub struct MemoryLimiter {
    limit: u64,
    used: u64,
    backend: Budget,
    server: Budget,
    held_backend: Option<OwnedSemaphorePermit>,
    held_server: Option<OwnedSemaphorePermit>,
    /// Bytes the host holds for this instance (a state it hands back),
    /// charged to the budgets apart from its linear memory.
    host_bytes: u64,
    host_backend: Option<OwnedSemaphorePermit>,
    host_server: Option<OwnedSemaphorePermit>,
    refused: Option<Refusal>,
}

impl MemoryLimiter {
    /// A limiter allowing `limit` bytes of linear memory in total, charged
    /// to `backend` and `server`.
    pub fn new(limit: u64, backend: Budget, server: Budget) -> Self {
        MemoryLimiter {
            limit,
            used: 0,
            backend,
            server,
            held_backend: None,
            held_server: None,
            host_bytes: 0,
            host_backend: None,
            host_server: None,
            refused: None,
        }
    }

    /// Charge `bytes` more that the host holds for this instance (what it
    /// writes into a state sink) to the backend's and the server's budgets,
    /// as its linear memory is: `false` past either, remembering which
    /// (the request is then answered 503, as for memory). Given back with
    /// the instance. Not counted against `memory_mib`, which is the
    /// guest's own memory.
    pub fn charge_host(&mut self, bytes: u64) -> bool {
        let after = self.host_bytes + bytes;
        let pages = after.div_ceil(WASM_PAGE);
        let for_backend = pages.saturating_sub(Self::held(&self.host_backend));
        if !self.backend.take(for_backend, &mut self.host_backend) {
            self.refused = Some(Refusal::Backend);
            return false;
        }
        let for_server = pages.saturating_sub(Self::held(&self.host_server));
        if !self.server.take(for_server, &mut self.host_server) {
            if let Some(held) = &mut self.host_backend
                && for_backend > 0
            {
                drop(held.split(for_backend as usize));
            }
            self.refused = Some(Refusal::Server);
            return false;
        }
        self.host_bytes = after;
        true
    }

    /// Cap this instance's linear memory at `limit` from now on (an
    /// instance made ahead is held to less until a call takes it).
    pub fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }

    /// Linear memory this instance holds now (its most: memory never
    /// shrinks).
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Everything charged to the budgets for this instance: its linear
    /// memory and what the host holds for it.
    pub fn charged(&self) -> u64 {
        self.used + self.host_bytes
    }

    /// Which cap refused a growth, if one did.
    pub fn refused(&self) -> Option<Refusal> {
        self.refused
    }

    fn held(permit: &Option<OwnedSemaphorePermit>) -> u64 {
        permit.as_ref().map_or(0, |p| p.num_permits() as u64)
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Past the memory's declared maximum the growth fails anyway:
        // charge nothing for it.
        if maximum.is_some_and(|m| desired > m) {
            return Ok(false);
        }
        let after = self.used - (current as u64).min(self.used) + desired as u64;
        if after > self.limit {
            self.refused = Some(Refusal::Instance);
            return Ok(false);
        }
        let pages = after.div_ceil(WASM_PAGE);
        let for_backend = pages.saturating_sub(Self::held(&self.held_backend));
        if !self.backend.take(for_backend, &mut self.held_backend) {
            self.refused = Some(Refusal::Backend);
            return Ok(false);
        }
        let for_server = pages.saturating_sub(Self::held(&self.held_server));
        if !self.server.take(for_server, &mut self.held_server) {
            // Give the backend's pages of this growth back.
            if let Some(held) = &mut self.held_backend
                && for_backend > 0
            {
                drop(held.split(for_backend as usize));
            }
            self.refused = Some(Refusal::Server);
            return Ok(false);
        }
        self.used = after;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Tables hold function references; a storage guest needs a few
        // thousand at most. A runaway table is refused like runaway memory.
        Ok(desired <= 100_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::ResourceLimiter;

    const MIB: usize = 1 << 20;

    fn limiter(limit: usize, backend: &Budget, server: &Budget) -> MemoryLimiter {
        MemoryLimiter::new(limit as u64, backend.clone(), server.clone())
    }

    #[test]
    fn host_buffers_are_charged_to_the_budgets_not_the_instance() {
        let backend = Budget::new(10 * MIB as u64);
        let server = Budget::new(100 * MIB as u64);
        let mut limiter = limiter(MIB, &backend, &server);
        assert!(
            limiter.charge_host(6 * MIB as u64),
            "past memory_mib is fine"
        );
        assert_eq!(backend.used_bytes(), 6 * MIB as u64);
        assert!(!limiter.charge_host(5 * MIB as u64));
        assert_eq!(limiter.refused(), Some(Refusal::Backend));
        assert_eq!(
            backend.used_bytes(),
            6 * MIB as u64,
            "a refused charge takes nothing"
        );
        drop(limiter);
        assert_eq!((backend.used_bytes(), server.used_bytes()), (0, 0));
    }

    #[test]
    fn counts_all_memories_together() {
        let big = Budget::new(1 << 30);
        let mut limiter = limiter(100 * MIB, &big, &big.clone());
        assert!(limiter.memory_growing(0, 60 * MIB, None).unwrap());
        assert_eq!(limiter.refused(), None);
        // A second memory of 60 would exceed the total of 100.
        assert!(!limiter.memory_growing(0, 60 * MIB, None).unwrap());
        assert_eq!(limiter.refused(), Some(Refusal::Instance));
        // Growing the first memory within the limit still works.
        assert!(limiter.memory_growing(60 * MIB, 100 * MIB, None).unwrap());
        assert!(!limiter.memory_growing(100 * MIB, 101 * MIB, None).unwrap());
    }

    #[test]
    fn budgets_are_shared_and_given_back_when_an_instance_ends() {
        let server = Budget::new(100 * MIB as u64);
        let (a, b) = (Budget::new(60 * MIB as u64), Budget::new(60 * MIB as u64));
        let mut first = limiter(256 * MIB, &a, &server);
        assert!(first.memory_growing(0, 50 * MIB, None).unwrap());
        // The backend's share refuses before the server's budget does.
        let mut second = limiter(256 * MIB, &a, &server);
        assert!(!second.memory_growing(0, 20 * MIB, None).unwrap());
        assert_eq!(second.refused(), Some(Refusal::Backend));
        // Another backend reaches the server's budget.
        let mut third = limiter(256 * MIB, &b, &server);
        assert!(!third.memory_growing(0, 55 * MIB, None).unwrap());
        assert_eq!(third.refused(), Some(Refusal::Server));
        assert_eq!(b.used_bytes(), 0, "a refused growth keeps nothing");
        assert_eq!(server.used_bytes(), 50 * MIB as u64);
        drop(first);
        assert_eq!((a.used_bytes(), server.used_bytes()), (0, 0));
        assert!(third.memory_growing(0, 55 * MIB, None).unwrap());
    }

    #[test]
    fn growth_past_the_declared_maximum_charges_nothing() {
        let budget = Budget::new(1 << 30);
        let mut limiter = limiter(256 * MIB, &budget, &budget.clone());
        assert!(!limiter.memory_growing(0, 2 * MIB, Some(MIB)).unwrap());
        assert_eq!((limiter.refused(), budget.used_bytes()), (None, 0));
    }
}
