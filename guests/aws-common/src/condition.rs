//! The condition a PUT or DELETE is sent with: what S3's conditional
//! requests compare (below both the S3 calls and the writes built on them).

/// When a PUT may replace what is at its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// Whatever is there.
    Always,
    /// Only if nothing is (`If-None-Match: *`).
    IfAbsent,
    /// Only if the object is still this ETag (`If-Match`): a write whose
    /// request is applied late, after a newer one, is refused then.
    IfMatch(String),
    /// This condition where the store supports conditional writes, none
    /// where it answers 501: a protection, not a requirement (a lock file
    /// needs its condition; a state write under a lock only gains by it).
    Preferably(Box<Condition>),
}

impl Condition {
    /// The condition sent first.
    pub(crate) fn sent(&self) -> &Condition {
        match self {
            Condition::Preferably(inner) => inner,
            other => other,
        }
    }

    /// Whether a store answering 501 to it gets the request again without.
    pub(crate) fn optional(&self) -> bool {
        matches!(self, Condition::Preferably(_))
    }
}
