//! Content digests, as pins and cache keys name components, and as
//! storage heads give them (contract 0.3.0's `state-head.digest`).

use sha2::{Digest, Sha256};

/// The sha256 of `bytes`, hex-encoded.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Whether `digest` (`<algorithm>:<hex>`, as a head gives it) is the digest
/// of `body`; `None` for an algorithm this host does not know (or a value
/// that is no digest), which then says nothing.
pub fn digest_says(digest: &str, body: &[u8]) -> Option<bool> {
    use md5::Md5;
    let (algorithm, hex) = digest.split_once(':')?;
    let hex = hex.to_ascii_lowercase();
    let computed = match (algorithm, hex.len()) {
        ("md5", 32) => hex::encode(Md5::digest(body)),
        ("sha256", 64) => hex::encode(Sha256::digest(body)),
        // A git blob id: SHA-1 (or, in a SHA-256 repository, SHA-256) of
        // `blob <size>\0` and the bytes.
        ("git-blob", 40) => git2::Oid::hash_object(git2::ObjectType::Blob, body)
            .ok()?
            .to_string(),
        ("git-blob", 64) => {
            let mut hasher = Sha256::new();
            hasher.update(format!("blob {}\0", body.len()).as_bytes());
            hasher.update(body);
            hex::encode(hasher.finalize())
        }
        _ => return None,
    };
    Some(computed == hex)
}

#[cfg(test)]
mod tests {
    use super::digest_says;

    #[test]
    fn digests_of_every_algorithm_a_head_names_are_checked() {
        let body = b"hello\n";
        // `md5sum`, `sha256sum`, `git hash-object` of the same bytes.
        assert_eq!(
            digest_says("md5:b1946ac92492d2347c6235b4d2611184", body),
            Some(true)
        );
        assert_eq!(
            digest_says(
                "sha256:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03",
                body
            ),
            Some(true)
        );
        assert_eq!(
            digest_says("git-blob:ce013625030ba8dba906f756967f9e9ca394464a", body),
            Some(true)
        );
        assert_eq!(
            digest_says("md5:b1946ac92492d2347c6235b4d2611185", body),
            Some(false)
        );
        assert_eq!(
            digest_says("GIT-BLOB:ce013625030ba8dba906f756967f9e9ca394464a", body),
            None
        );
        assert_eq!(digest_says("crc32c:abcd", body), None);
        assert_eq!(digest_says("md5:short", body), None);
        assert_eq!(digest_says("no colon", body), None);
    }
}
