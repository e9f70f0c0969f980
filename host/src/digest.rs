//! Content digests, as pins and cache keys name components.

use sha2::{Digest, Sha256};

/// The sha256 of `bytes`, hex-encoded.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}
