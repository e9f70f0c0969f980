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

/// How far into a head's prefix the host looks for lineage and serial.
const VERSION_SEEK_BYTES: usize = 16 << 10;

/// Whether the first bytes of a state, `bytes`, hold its lineage and
/// serial: looked for only near the start, where Terraform and OpenTofu
/// write them (a sealed envelope keeps them after its ciphertext), and
/// again only once the bytes kept have doubled since the last look, so a
/// guest writing a byte at a time costs the host a few parses, not one
/// per byte.
fn holds_version(bytes: &[u8], next_look: &mut usize) -> bool {
    if bytes.len() > VERSION_SEEK_BYTES || bytes.len() < *next_look {
        return false;
    }
    *next_look = bytes.len() * 2;
    crate::statefile::version_in_prefix(bytes).is_some()
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
        /// For a head ([`StateSink::head`]), which stops as soon as they
        /// hold a state's lineage and serial: how many bytes must be kept
        /// before they are looked at again. `None`: never looked at.
        next_look: Option<usize>,
        /// No more is wanted.
        enough: bool,
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
            next_look: None,
            enough: limit == 0,
        })
    }

    /// A head's prefix: the first `limit` bytes, or fewer, the guest told to
    /// stop as soon as they hold the state's lineage and serial (all the
    /// stale-write guard needs; Terraform and OpenTofu write them in the
    /// first few hundred bytes). What else a write's judgement may want of
    /// the stored state (is it empty, is it this very body) is read then,
    /// and only then. A guest that hands over its first 4 KiB is spared
    /// copying the rest of a 64 KiB read.
    pub fn head(limit: usize) -> Self {
        StateSink::new(Keep::Prefix {
            bytes: Vec::new(),
            limit,
            next_look: Some(0),
            enough: limit == 0,
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
            Keep::Prefix { bytes, limit, .. } => len.min(limit - bytes.len()),
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
            Keep::Prefix {
                bytes,
                limit,
                next_look,
                enough,
            } => {
                // Nothing more is taken once the guest was told to stop.
                if *enough || chunk.is_empty() {
                    return !*enough;
                }
                let room = *limit - bytes.len();
                bytes.extend_from_slice(&chunk[..chunk.len().min(room)]);
                *enough = bytes.len() >= *limit
                    || next_look
                        .as_mut()
                        .is_some_and(|next| holds_version(bytes, next));
                !*enough
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
            Keep::Prefix { enough, .. } => !enough,
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
    fn a_head_stops_once_it_holds_lineage_and_serial() {
        let state = br#"{"version":4,"serial":7,"lineage":"abc","resources":[]}"#;
        let mut head = StateSink::head(64 << 10);
        // A serial that touches the end of what is kept may be cut off
        // (`7` of `71`): not enough yet.
        assert!(head.write(&state[..23]));
        assert!(head.wants_more());
        // Looked at again once what is kept has doubled.
        assert!(!head.write(&state[23..]), "lineage and serial are there");
        assert!(!head.wants_more());
        // Told to stop, it takes nothing more.
        assert!(!head.write(b"more"));
        assert_eq!(head.into_bytes().0, state);
        // Without them (a sealed envelope), up to the limit.
        let mut sealed = StateSink::head(8);
        assert!(sealed.write(br#"{"wasms"#));
        assert!(!sealed.write(b"tate_encrypted"));
        assert_eq!(sealed.into_bytes().0, br#"{"wasmst"#);
        // Lineage and serial past the first 16 KiB are not looked for.
        let mut late = format!(r#"{{"pad":"{}","#, "x".repeat(16 << 10)).into_bytes();
        late.extend_from_slice(br#""serial":7,"lineage":"abc"}"#);
        let mut far = StateSink::head(64 << 10);
        assert!(far.write(&late) && far.wants_more());
        assert_eq!(far.into_bytes().0.len(), late.len());
        // An empty write neither stops nor adds anything.
        let mut empty = StateSink::head(64 << 10);
        assert!(empty.write(b"") && empty.wants_more());
        // A plain prefix never stops early.
        let mut prefix = StateSink::prefix(64 << 10);
        assert!(prefix.write(state) && prefix.wants_more());
        // Nothing wanted at all: it says so before the first write.
        assert!(!StateSink::prefix(0).wants_more() && !StateSink::head(0).wants_more());
    }

    #[test]
    fn a_head_written_a_byte_at_a_time_is_looked_at_only_as_it_doubles() {
        let mut state = br#"{"version":4,"serial":7,"lineage":"abc","pad":""#.to_vec();
        state.resize(1000, b'x');
        let mut head = StateSink::head(64 << 10);
        let written = state.chunks(1).take_while(|byte| head.write(byte)).count();
        // Complete at byte 40, found at the next look: byte 64 (looks at
        // 1, 2, 4, ... bytes, not at every one).
        assert_eq!(written, 63, "the 64th write is the one told to stop");
        assert_eq!(head.into_bytes().0.len(), 64);
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
