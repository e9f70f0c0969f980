//! Publisher signatures on guests: minisign (Ed25519) signatures, key files
//! and `.minisig` files compatible with the `minisign` command-line tool.
//!
//! The signature covers the component's bytes; its trusted comment names
//! the guest, version and sha256, so a signature cannot be moved to another
//! guest unnoticed.

use minisign::{KeyPair, PublicKey, PublicKeyBox, SecretKeyBox, SignatureBox};
use std::io::Cursor;
use std::path::Path;

/// Environment variable holding the password of a secret key (empty when
/// unset, for unattended signing in CI).
pub const PASSWORD_ENV: &str = "WASMSTATE_SIGNING_PASSWORD";

fn password() -> Option<String> {
    Some(std::env::var(PASSWORD_ENV).unwrap_or_default())
}

/// Make a key pair: writes the secret key to `secret_path` (password from
/// `WASMSTATE_SIGNING_PASSWORD`) and returns the public key, base64, for
/// operators' `trusted_keys`.
pub fn generate(secret_path: &Path) -> Result<String, String> {
    if secret_path.exists() {
        return Err(format!(
            "{} exists; not overwriting a key",
            secret_path.display()
        ));
    }
    let KeyPair { pk, sk } =
        KeyPair::generate_encrypted_keypair(password()).map_err(|e| e.to_string())?;
    let boxed = sk
        .to_box(Some("wasmstate guest signing key"))
        .map_err(|e| e.to_string())?;
    std::fs::write(secret_path, boxed.to_string())
        .map_err(|e| format!("cannot write {}: {e}", secret_path.display()))?;
    Ok(pk.to_base64())
}

/// Sign `wasm` (a guest named `name` at `version`) with the secret key in
/// `secret_path`; returns the `.minisig` text.
pub fn sign(
    wasm: &[u8],
    name: &str,
    version: &str,
    sha256: &str,
    secret_path: &Path,
) -> Result<String, String> {
    let text = std::fs::read_to_string(secret_path)
        .map_err(|e| format!("cannot read {}: {e}", secret_path.display()))?;
    let sk = SecretKeyBox::from_string(&text)
        .and_then(|b| b.into_secret_key(password()))
        .map_err(|e| format!("{}: not a usable minisign secret key ({e}); set {PASSWORD_ENV} if it has a password", secret_path.display()))?;
    let trusted = format!("wasmstate-guest {name} {version} sha256:{sha256}");
    let signature = minisign::sign(None, &sk, Cursor::new(wasm), Some(&trusted), None)
        .map_err(|e| e.to_string())?;
    Ok(signature.into_string())
}

/// A trusted publisher key: the base64 line of a minisign public key, or a
/// path to a `.pub` file.
pub fn parse_public_key(text: &str) -> Result<PublicKey, String> {
    let path = Path::new(text);
    if text.ends_with(".pub") && path.is_file() {
        let content = std::fs::read_to_string(path).map_err(|e| format!("{text}: {e}"))?;
        return PublicKeyBox::from_string(&content)
            .and_then(PublicKeyBox::into_public_key)
            .map_err(|e| format!("{text}: not a minisign public key: {e}"));
    }
    PublicKey::from_base64(text.trim())
        .map_err(|e| format!("trusted key {text:?}: not a minisign public key: {e}"))
}

/// Check `signature` over `wasm` against the trusted keys. Returns the
/// key id (hex) that signed it.
pub fn verify(
    wasm: &[u8],
    sha256: &str,
    signature: &str,
    trusted: &[PublicKey],
) -> Result<String, String> {
    let signature =
        SignatureBox::from_string(signature).map_err(|e| format!("malformed signature: {e}"))?;
    let trusted_comment = signature.trusted_comment().unwrap_or_default();
    if !trusted_comment.ends_with(&format!("sha256:{sha256}")) {
        return Err(format!(
            "the signature was made for another component ({trusted_comment:?})"
        ));
    }
    let key_id = hex_key_id(signature.keynum());
    for key in trusted {
        if minisign::verify(key, &signature, Cursor::new(wasm), true, false, false).is_ok() {
            return Ok(key_id);
        }
    }
    Err(format!(
        "the signature (key id {key_id}) does not verify with any trusted publisher key; add the publisher's key to [marketplace] trusted_keys, or set allow_unsigned = true to accept unverified guests"
    ))
}

fn hex_key_id(keynum: &[u8]) -> String {
    keynum.iter().rev().map(|b| format!("{b:02X}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_with_its_key_and_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("publisher.key");
        let public = parse_public_key(&generate(&key).unwrap()).unwrap();
        let other_key = dir.path().join("other.key");
        let other = parse_public_key(&generate(&other_key).unwrap()).unwrap();
        let wasm = b"\0asm component bytes";
        let sig = sign(wasm, "etcd", "1.0.0", "abc", &key).unwrap();
        assert!(verify(wasm, "abc", &sig, std::slice::from_ref(&public)).is_ok());
        assert!(
            verify(wasm, "abc", &sig, &[other])
                .unwrap_err()
                .contains("trusted")
        );
        assert!(verify(b"tampered", "abc", &sig, std::slice::from_ref(&public)).is_err());
        assert!(
            verify(wasm, "def", &sig, &[public])
                .unwrap_err()
                .contains("another component")
        );
        assert!(generate(&key).unwrap_err().contains("exists"));
    }
}
