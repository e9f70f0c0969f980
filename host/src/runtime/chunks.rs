//! A state's bytes on their way between host and guest, in chunks: what
//! the host lends a guest for one call (the `body` interface's resources,
//! whose WIT glue is in [`super::body`]). A write lends the request body
//! itself (shared, not copied); a read collects what the guest writes into
//! one buffer, which becomes the response body, or keeps only what the
//! host needs (the beginning, or whether it equals a body).

use bytes::Bytes;
/// Most bytes one `state-source.read` hands out, whatever the guest asks:
/// each chunk is copied into the guest's memory, which is capped.
pub const MAX_CHUNK: u32 = 4 << 20;

/// A state on its way into a guest: the request body, shared.
pub struct StateSource {
    bytes: Bytes,
    read: usize,
    serial: Option<u64>,
    /// A host-side copy of it failed: the guest's target is partial.
    failed: bool,
}

impl StateSource {
    /// Lend `bytes` to a guest.
    pub fn new(bytes: Bytes) -> Self {
        let head = &bytes[..bytes.len().min(crate::statefile::PREFIX_BYTES)];
        // A sealed state keeps its serial after the ciphertext.
        let serial = crate::statefile::version_in_prefix(head)
            .or_else(|| crate::statefile::version_of_envelope(&bytes))
            .map(|(_, serial)| serial);
        StateSource {
            bytes,
            read: 0,
            serial,
            failed: false,
        }
    }

    /// Note that a host-side copy of it failed.
    pub fn fail(&mut self) {
        self.failed = true;
    }

    /// Whether a host-side copy of it failed (then a guest answering
    /// success must not be believed).
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// The state's serial, from its first bytes.
    pub fn serial(&self) -> Option<u64> {
        self.serial
    }

    /// The whole state, for the host's own use (the 0.1.0 adapter).
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The next bytes, at most `max` (and [`MAX_CHUNK`]); empty at the end.
    pub fn next_chunk(&mut self, max: u32) -> Vec<u8> {
        self.next_shared(max).to_vec()
    }

    /// The next bytes, at most `max` (and [`MAX_CHUNK`]), shared with the
    /// body rather than copied (for a host-side copy); empty at the end.
    pub fn next_shared(&mut self, max: u32) -> Bytes {
        let start = self.read;
        let end = (start + max.min(MAX_CHUNK) as usize).min(self.bytes.len());
        self.read = end;
        self.bytes.slice(start..end)
    }
}

/// Where a guest writes a state it reads: what the host keeps of the
/// bytes, and whether a host-side copy into it failed.
pub struct StateSink {
    keep: Keep,
    failed: bool,
}

/// What the host keeps of the bytes a guest writes into a sink.
enum Keep {
    /// All of them, up to `limit` bytes: more is refused as `overflowed`.
    Collect {
        /// What arrived so far.
        bytes: Vec<u8>,
        /// Most bytes accepted.
        limit: usize,
        /// The guest wrote more than `limit`.
        overflowed: bool,
    },
    /// The first `limit` bytes; then the guest is told to stop.
    Prefix {
        /// What arrived so far.
        bytes: Vec<u8>,
        /// How many are wanted.
        limit: usize,
    },
    /// Whether they equal `expected`, compared as they come: the guest is
    /// told to stop at the first difference.
    Compare {
        /// The bytes to compare with.
        expected: Bytes,
        /// How many matched so far.
        matched: usize,
        /// No difference seen yet.
        equal: bool,
    },
}

impl StateSink {
    fn new(keep: Keep) -> Self {
        StateSink {
            keep,
            failed: false,
        }
    }

    /// Keep everything, refusing more than `limit` bytes.
    pub fn collect(limit: usize) -> Self {
        StateSink::new(Keep::Collect {
            bytes: Vec::new(),
            limit,
            overflowed: false,
        })
    }

    /// Keep the first `limit` bytes.
    pub fn prefix(limit: usize) -> Self {
        StateSink::new(Keep::Prefix {
            bytes: Vec::with_capacity(limit),
            limit,
        })
    }

    /// Compare with `expected`.
    pub fn compare(expected: Bytes) -> Self {
        StateSink::new(Keep::Compare {
            expected,
            matched: 0,
            equal: true,
        })
    }

    /// Note that a host-side copy into it failed.
    pub fn fail(&mut self) {
        self.failed = true;
    }

    /// Whether a host-side copy into it failed (then what it holds is
    /// partial, whatever the guest answers).
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// How many bytes taking a chunk of `len` would add to what is kept.
    pub fn growth(&self, len: usize) -> usize {
        match &self.keep {
            Keep::Collect { bytes, limit, .. } if bytes.len() + len <= *limit => len,
            Keep::Collect { .. } | Keep::Compare { .. } => 0,
            Keep::Prefix { bytes, limit } => len.min(limit - bytes.len()),
        }
    }

    /// Take `chunk`; `false` when no more is wanted.
    pub fn write(&mut self, chunk: &[u8]) -> bool {
        match &mut self.keep {
            Keep::Collect {
                bytes,
                limit,
                overflowed,
            } => {
                if bytes.len() + chunk.len() > *limit {
                    *overflowed = true;
                    return false;
                }
                bytes.extend_from_slice(chunk);
                true
            }
            Keep::Prefix { bytes, limit } => {
                let room = *limit - bytes.len();
                bytes.extend_from_slice(&chunk[..chunk.len().min(room)]);
                bytes.len() < *limit
            }
            Keep::Compare {
                expected,
                matched,
                equal,
            } => {
                let end = *matched + chunk.len();
                *equal = *equal && expected.get(*matched..end) == Some(chunk);
                *matched = end;
                *equal
            }
        }
    }

    /// Whether the host still wants bytes (`false` once it has what it
    /// needs, as [`StateSink::write`] last answered).
    pub fn wants_more(&self) -> bool {
        match &self.keep {
            Keep::Collect { overflowed, .. } => !overflowed,
            Keep::Prefix { bytes, limit } => bytes.len() < *limit,
            Keep::Compare { equal, .. } => *equal,
        }
    }

    /// Whether the guest wrote exactly the expected bytes (for
    /// [`Keep::Compare`]; `false` for the others).
    pub fn matched(&self) -> bool {
        matches!(&self.keep, Keep::Compare { expected, matched, equal } if *equal && *matched == expected.len())
    }

    /// The bytes kept, and whether the guest wrote more than the limit.
    pub fn into_bytes(self) -> (Vec<u8>, bool) {
        match self.keep {
            Keep::Collect {
                bytes, overflowed, ..
            } => (bytes, overflowed),
            Keep::Prefix { bytes, .. } => (bytes, false),
            Keep::Compare { .. } => (Vec::new(), false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::StateSink;

    #[test]
    fn collect_refuses_past_its_limit() {
        let mut sink = StateSink::collect(5);
        assert!(sink.write(b"abc"));
        assert!(!sink.write(b"def"));
        let (bytes, overflowed) = sink.into_bytes();
        assert_eq!((bytes.as_slice(), overflowed), (&b"abc"[..], true));
    }

    #[test]
    fn prefix_keeps_the_beginning_and_says_stop() {
        let mut sink = StateSink::prefix(4);
        assert!(sink.write(b"ab"));
        assert!(!sink.write(b"cdef"));
        assert_eq!(sink.into_bytes().0, b"abcd");
    }

    #[test]
    fn compare_tells_equal_from_prefix_longer_and_different() {
        let expected = bytes::Bytes::from_static(b"abcdef");
        let mut equal = StateSink::compare(expected.clone());
        assert!(equal.write(b"abc") && equal.write(b"def"));
        assert!(equal.matched());
        let mut prefix = StateSink::compare(expected.clone());
        prefix.write(b"abc");
        assert!(!prefix.matched(), "a prefix is not equal");
        let mut longer = StateSink::compare(expected.clone());
        longer.write(b"abcdef");
        assert!(!longer.write(b"g") && !longer.matched());
        let mut different = StateSink::compare(expected);
        assert!(!different.write(b"abX"));
        assert!(!different.matched());
    }
}
