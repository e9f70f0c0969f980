//! The shapes of contract 0.3.0's conditional calls in the host's terms:
//! a stored state's [`Head`], the [`Expect`]ation a write is conditional
//! on, and a workspace's [`Metadata`].

/// What the stale-write guard needs of a stored state, without its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The storage's own version of the stored bytes (ETag, generation, row
    /// version, blob id): opaque, compared by [`Expect::Version`].
    pub version: String,
    /// The stored state's size in bytes.
    pub size: u64,
    /// `<algorithm>:<hex>` of the stored bytes, where the storage keeps one
    /// without reading them.
    pub digest: Option<String>,
    /// The stored state's first bytes (at most
    /// [`crate::statefile::PREFIX_BYTES`]): serial and lineage are there.
    pub prefix: Vec<u8>,
}

/// Which stored state a conditional write may replace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Whatever is stored, or nothing.
    Any,
    /// Only when nothing is stored.
    Absent,
    /// Only while the stored version is still this one.
    Version(String),
}

impl Expect {
    /// What a write must expect to replace exactly what `head` describes.
    pub fn of(head: Option<&Head>) -> Expect {
        match head {
            Some(head) => Expect::Version(head.version.clone()),
            None => Expect::Absent,
        }
    }
}

/// A workspace's metadata as storage keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    /// A small JSON document (at most [`MAX_METADATA_BYTES`]).
    pub content: String,
    /// Opaque; compared by [`Expect::Version`].
    pub version: String,
}

/// Largest metadata document the host writes or accepts from a guest.
pub const MAX_METADATA_BYTES: usize = 64 << 10;
