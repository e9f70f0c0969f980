//! Data keys a key service wrapped or unwrapped recently, kept in memory
//! for a short, configured time (`encryption.data_key_cache_seconds`,
//! five minutes unless set), so reading a state this host just wrote or
//! read costs no call to the service.
//!
//! An entry is found only by the same key id, the same wrapped bytes and
//! the same context, so a cached key never opens a state the service
//! would not have opened. The cost: for that long after access to a key
//! is revoked, states this host already opened still open here. Writes
//! never reuse a data key: each asks the service for a fresh one.

use super::Context;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The most data keys kept at once (about 100 bytes each).
pub const MAX_ENTRIES: usize = 4096;

/// Recently used data keys of one backend.
pub struct DataKeyCache {
    lifetime: Duration,
    entries: Mutex<HashMap<[u8; 32], Entry>>,
}

struct Entry {
    key: [u8; 32],
    until: Instant,
}

fn fingerprint(key_id: &str, wrapped: &[u8], context: &Context) -> [u8; 32] {
    let mut hash = Sha256::new();
    // Lengths first: no two different inputs hash the same bytes.
    for part in [key_id.as_bytes(), wrapped] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    for (name, value) in context.pairs() {
        for part in [name.as_bytes(), value.as_bytes()] {
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part);
        }
    }
    hash.finalize().into()
}

impl DataKeyCache {
    /// Keep keys for `lifetime`; zero keeps none.
    pub fn new(lifetime: Duration) -> Self {
        DataKeyCache {
            lifetime,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The data key `wrapped` holds for `context`, when kept and fresh.
    pub fn get(&self, key_id: &str, wrapped: &[u8], context: &Context) -> Option<[u8; 32]> {
        if self.lifetime.is_zero() {
            return None;
        }
        let print = fingerprint(key_id, wrapped, context);
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(&print)
            .filter(|e| e.until > Instant::now())
            .map(|e| e.key)
    }

    /// Keep `key`, which `wrapped` holds for `context`.
    pub fn put(&self, key_id: &str, wrapped: &[u8], context: &Context, key: [u8; 32]) {
        if self.lifetime.is_zero() {
            return;
        }
        let print = fingerprint(key_id, wrapped, context);
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= MAX_ENTRIES {
            entries.retain(|_, e| e.until > now);
        }
        if entries.len() >= MAX_ENTRIES
            && let Some(oldest) = entries.iter().min_by_key(|(_, e)| e.until).map(|(k, _)| *k)
        {
            entries.remove(&oldest);
        }
        entries.insert(
            print,
            Entry {
                key,
                until: now + self.lifetime,
            },
        );
    }

    /// How many keys are kept now (expired ones included until pruned).
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(serial: u64) -> Context {
        Context {
            backend: "prod".into(),
            workspace: "net".into(),
            lineage: Some("abc".into()),
            serial: Some(serial),
        }
    }

    #[test]
    fn a_key_is_found_only_for_the_same_id_bytes_and_context() {
        let cache = DataKeyCache::new(Duration::from_secs(60));
        cache.put("k", b"wrapped", &context(1), [1; 32]);
        assert_eq!(cache.get("k", b"wrapped", &context(1)), Some([1; 32]));
        assert_eq!(cache.get("k", b"wrapped", &context(2)), None);
        assert_eq!(cache.get("k", b"other", &context(1)), None);
        assert_eq!(cache.get("j", b"wrapped", &context(1)), None);
    }

    #[test]
    fn zero_lifetime_keeps_nothing_and_expired_keys_are_not_served() {
        let off = DataKeyCache::new(Duration::ZERO);
        off.put("k", b"w", &context(1), [1; 32]);
        assert!(off.is_empty());
        let short = DataKeyCache::new(Duration::from_nanos(1));
        short.put("k", b"w", &context(1), [1; 32]);
        let deadline = Instant::now() + Duration::from_secs(5);
        while short.get("k", b"w", &context(1)).is_some() {
            assert!(Instant::now() < deadline, "a 1 ns entry never expired");
        }
    }

    #[test]
    fn the_cache_never_holds_more_than_its_bound() {
        let cache = DataKeyCache::new(Duration::from_secs(60));
        for serial in 0..(MAX_ENTRIES as u64 + 10) {
            cache.put("k", b"w", &context(serial), [0; 32]);
        }
        assert_eq!(cache.len(), MAX_ENTRIES);
        // The newest is kept.
        let newest = MAX_ENTRIES as u64 + 9;
        assert!(cache.get("k", b"w", &context(newest)).is_some());
    }
}
