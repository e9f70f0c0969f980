//! Per-instance memory cap.
//!
//! wasmtime's `StoreLimits` caps each linear memory on its own; a guest with
//! several memories could use a multiple of the limit. This limiter counts
//! all of an instance's memories together and remembers whether it refused a
//! growth, so a trap that follows can be reported as "out of memory".

/// Caps the total linear memory of one store.
#[derive(Debug)]
pub struct MemoryLimiter {
    limit: usize,
    used: usize,
    refused: bool,
}

impl MemoryLimiter {
    /// A limiter allowing `limit` bytes of linear memory in total.
    pub fn new(limit: u64) -> Self {
        MemoryLimiter {
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            used: 0,
            refused: false,
        }
    }

    /// Whether a growth was refused: the guest hit its memory limit.
    pub fn refused(&self) -> bool {
        self.refused
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let after = self.used - current.min(self.used) + desired;
        if after > self.limit {
            self.refused = true;
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
    use super::MemoryLimiter;
    use wasmtime::ResourceLimiter;

    #[test]
    fn counts_all_memories_together() {
        let mut limiter = MemoryLimiter::new(100);
        assert!(limiter.memory_growing(0, 60, None).unwrap());
        assert!(!limiter.refused());
        // A second memory of 60 would exceed the total of 100.
        assert!(!limiter.memory_growing(0, 60, None).unwrap());
        assert!(limiter.refused());
        // Growing the first memory within the limit still works.
        assert!(limiter.memory_growing(60, 100, None).unwrap());
        assert!(!limiter.memory_growing(100, 101, None).unwrap());
    }
}
