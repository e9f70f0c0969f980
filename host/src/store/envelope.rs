//! Encryption at rest: the host seals a state with AES-256-GCM before a
//! guest stores it and opens it after a guest reads it, so a guest (first
//! party or a stranger's) only ever holds ciphertext.
//!
//! The stored form is a JSON envelope that keeps the state's `serial` and
//! `lineage` in clear at the top level, as OpenTofu's encrypted state does,
//! so tools that only compare versions keep working:
//!
//! ```json
//! {"wasmstate_encrypted":{"format":1,"algorithm":"AES-256-GCM","key_id":"2026-11",
//!   "nonce":"…","ciphertext":"…"},"serial":7,"lineage":"…"}
//! ```
//!
//! The clear `serial` and `lineage` are bound to the ciphertext as
//! associated data: editing them makes the state fail to open. Every write
//! uses a fresh random nonce. The key id names which configured key sealed
//! it, so keys can rotate: new writes use the first key, old states open
//! with whichever key they name.

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};

/// The top-level key that marks a sealed state. It is written first, so a
/// prefix check tells sealed states from plain ones without parsing.
const MARKER: &str = "wasmstate_encrypted";
const FORMAT: u32 = 1;
const ALGORITHM: &str = "AES-256-GCM";

/// One AES-256 key and the id stored beside states it seals.
#[derive(Clone)]
pub struct EncryptionKey {
    /// Short name written into every envelope, e.g. `2026-11`.
    pub id: String,
    /// The 32-byte key.
    pub key: [u8; 32],
}

impl std::fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material, not even in debug logs.
        write!(f, "EncryptionKey({:?}, <redacted>)", self.id)
    }
}

impl EncryptionKey {
    /// Parse key material as written by `wasmstate generate-key`: 32 bytes,
    /// base64 (surrounding whitespace ignored).
    pub fn parse(id: &str, text: &str) -> Result<Self, String> {
        let bytes = BASE64.decode(text.trim()).map_err(|e| {
            format!("key {id:?} is not base64 ({e}); make one with `wasmstate generate-key`")
        })?;
        let key: [u8; 32] = bytes.try_into().map_err(|b: Vec<u8>| {
            format!(
                "key {id:?} is {} bytes; AES-256 needs 32 (make one with `wasmstate generate-key`)",
                b.len()
            )
        })?;
        Ok(EncryptionKey {
            id: id.to_string(),
            key,
        })
    }

    /// A fresh random key, base64-encoded.
    pub fn generate() -> String {
        BASE64.encode(Aes256Gcm::generate_key(&mut OsRng))
    }
}

/// Seals and opens states with a backend's keys; the first key seals.
#[derive(Debug, Clone)]
pub struct Sealer {
    keys: Vec<EncryptionKey>,
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    wasmstate_encrypted: Sealed,
    #[serde(skip_serializing_if = "Option::is_none")]
    serial: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lineage: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct Sealed {
    format: u32,
    algorithm: String,
    key_id: String,
    nonce: String,
    ciphertext: String,
}

/// The clear fields of a state (or of an envelope).
#[derive(Deserialize, Default, Debug, Clone, PartialEq, Eq)]
pub struct StateHeader {
    /// Terraform's `serial`.
    pub serial: Option<u64>,
    /// Terraform's `lineage`.
    pub lineage: Option<String>,
}

impl StateHeader {
    /// Read `serial` and `lineage` from a state or envelope; empty when the
    /// bytes are not a JSON object.
    pub fn of(bytes: &[u8]) -> StateHeader {
        serde_json::from_slice(bytes).unwrap_or_default()
    }
}

/// True when `stored` is a sealed envelope rather than a plain state.
pub fn is_sealed(stored: &[u8]) -> bool {
    let start = stored
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(stored.len());
    let rest = &stored[start..];
    rest.starts_with(b"{") && {
        let after = &rest[1..];
        let after = &after[after
            .iter()
            .position(|b| !b.is_ascii_whitespace())
            .unwrap_or(after.len())..];
        after.starts_with(format!("\"{MARKER}\"").as_bytes())
    }
}

fn associated_data(header: &StateHeader) -> Vec<u8> {
    format!(
        "wasmstate-state:{FORMAT}:{}:{}",
        header.lineage.as_deref().unwrap_or(""),
        header.serial.map(|s| s.to_string()).unwrap_or_default()
    )
    .into_bytes()
}

impl Sealer {
    /// A sealer using `keys[0]` for new states; `None` without keys.
    pub fn new(keys: Vec<EncryptionKey>) -> Option<Self> {
        (!keys.is_empty()).then_some(Sealer { keys })
    }

    /// Encrypt a plain state, whose clear fields are `header`, into an
    /// envelope.
    pub fn seal(&self, state: &[u8], header: &StateHeader) -> Result<Vec<u8>, String> {
        let key = &self.keys[0];
        let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&key.key));
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let aad = associated_data(header);
        let ciphertext = cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: state,
                    aad: &aad,
                },
            )
            .map_err(|_| "AES-GCM encryption failed".to_string())?;
        let envelope = Envelope {
            wasmstate_encrypted: Sealed {
                format: FORMAT,
                algorithm: ALGORITHM.into(),
                key_id: key.id.clone(),
                nonce: BASE64.encode(nonce),
                ciphertext: BASE64.encode(ciphertext),
            },
            serial: header.serial,
            lineage: header.lineage.clone(),
        };
        serde_json::to_vec(&envelope).map_err(|e| e.to_string())
    }

    /// Decrypt what a guest returned. Plain states (written before
    /// encryption was enabled) pass through unchanged.
    pub fn open(&self, stored: Vec<u8>) -> Result<Vec<u8>, String> {
        open_with(&self.keys, stored)
    }
}

/// Decrypt `stored` with `keys`; plain states pass through. With no keys, a
/// sealed state is an error that says so, never ciphertext for Terraform.
pub fn open_with(keys: &[EncryptionKey], stored: Vec<u8>) -> Result<Vec<u8>, String> {
    if !is_sealed(&stored) {
        return Ok(stored);
    }
    let envelope: Envelope = serde_json::from_slice(&stored).map_err(|e| {
        format!("the stored state looks encrypted but its envelope is malformed: {e}")
    })?;
    let sealed = &envelope.wasmstate_encrypted;
    if sealed.format != FORMAT || sealed.algorithm != ALGORITHM {
        return Err(format!(
            "the stored state is encrypted with format {} / {}, which this wasmstate does not know",
            sealed.format, sealed.algorithm
        ));
    }
    let Some(key) = keys.iter().find(|k| k.id == sealed.key_id) else {
        let known: Vec<&str> = keys.iter().map(|k| k.id.as_str()).collect();
        return Err(format!(
            "the stored state is encrypted with key {:?}, which is not configured for this backend \
             (configured: [{}]); add it to the backend's encryption.keys",
            sealed.key_id,
            known.join(", ")
        ));
    };
    let decode = |what: &str, text: &str| {
        BASE64
            .decode(text)
            .map_err(|e| format!("the stored state's {what} is not base64: {e}"))
    };
    let nonce = decode("nonce", &sealed.nonce)?;
    if nonce.len() != 12 {
        return Err("the stored state's nonce is not 12 bytes".into());
    }
    let ciphertext = decode("ciphertext", &sealed.ciphertext)?;
    let header = StateHeader {
        serial: envelope.serial,
        lineage: envelope.lineage.clone(),
    };
    let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&key.key));
    cipher
        .decrypt(
            Nonce::from_slice(&nonce),
            Payload { msg: &ciphertext, aad: &associated_data(&header) },
        )
        .map_err(|_| {
            format!(
                "the stored state does not decrypt with key {:?}: the key's material is not the one \
                 it was sealed with, or the stored bytes were altered",
                sealed.key_id
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> EncryptionKey {
        EncryptionKey::parse(id, &EncryptionKey::generate()).unwrap()
    }

    const STATE: &[u8] =
        br#"{"version":4,"serial":7,"lineage":"abc","outputs":{"pw":{"value":"hunter2"}}}"#;

    #[test]
    fn round_trip_keeps_serial_and_lineage_readable_and_hides_the_rest() {
        let sealer = Sealer::new(vec![key("k1")]).unwrap();
        let sealed = sealer.seal(STATE, &StateHeader::of(STATE)).unwrap();
        assert!(is_sealed(&sealed));
        let text = String::from_utf8(sealed.clone()).unwrap();
        assert!(!text.contains("hunter2"), "{text}");
        assert_eq!(
            StateHeader::of(&sealed),
            StateHeader {
                serial: Some(7),
                lineage: Some("abc".into())
            }
        );
        assert_eq!(sealer.open(sealed).unwrap(), STATE);
    }

    #[test]
    fn nonces_are_fresh() {
        let sealer = Sealer::new(vec![key("k1")]).unwrap();
        assert_ne!(
            sealer.seal(STATE, &StateHeader::of(STATE)).unwrap(),
            sealer.seal(STATE, &StateHeader::of(STATE)).unwrap()
        );
    }

    #[test]
    fn plain_states_pass_through() {
        let sealer = Sealer::new(vec![key("k1")]).unwrap();
        assert_eq!(sealer.open(STATE.to_vec()).unwrap(), STATE);
    }

    #[test]
    fn rotation_opens_old_states_with_the_key_they_name() {
        let old = key("old");
        let sealed = Sealer::new(vec![old.clone()])
            .unwrap()
            .seal(STATE, &StateHeader::of(STATE))
            .unwrap();
        let rotated = Sealer::new(vec![key("new"), old]).unwrap();
        assert_eq!(rotated.open(sealed).unwrap(), STATE);
    }

    #[test]
    fn wrong_or_missing_key_is_an_error_not_garbage() {
        let sealed = Sealer::new(vec![key("k1")])
            .unwrap()
            .seal(STATE, &StateHeader::of(STATE))
            .unwrap();
        let wrong = Sealer::new(vec![key("k1")])
            .unwrap()
            .open(sealed.clone())
            .unwrap_err();
        assert!(
            wrong.contains("does not decrypt with key \"k1\""),
            "{wrong}"
        );
        let missing = Sealer::new(vec![key("k2")])
            .unwrap()
            .open(sealed.clone())
            .unwrap_err();
        assert!(
            missing.contains("key \"k1\", which is not configured"),
            "{missing}"
        );
        let none = open_with(&[], sealed).unwrap_err();
        assert!(none.contains("not configured"), "{none}");
    }

    #[test]
    fn tampering_with_the_clear_serial_is_detected() {
        let sealer = Sealer::new(vec![key("k1")]).unwrap();
        let sealed =
            String::from_utf8(sealer.seal(STATE, &StateHeader::of(STATE)).unwrap()).unwrap();
        let forged = sealed.replace("\"serial\":7", "\"serial\":70");
        assert_ne!(forged, sealed);
        assert!(sealer.open(forged.into_bytes()).is_err());
    }

    #[test]
    fn bad_key_material_is_explained() {
        assert!(
            EncryptionKey::parse("k", "not base64!")
                .unwrap_err()
                .contains("generate-key")
        );
        assert!(
            EncryptionKey::parse("k", "AAAA")
                .unwrap_err()
                .contains("needs 32")
        );
    }
}
