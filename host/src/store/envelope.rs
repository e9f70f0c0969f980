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
//! The clear `serial` and `lineage`, and the backend and workspace the
//! state belongs to, are bound to the ciphertext as associated data:
//! editing them, or moving an envelope to another workspace or backend,
//! makes the state fail to open. Every write uses a fresh random nonce. The
//! key id names which configured key sealed it, so keys can rotate: new
//! writes use the first key, old states open with whichever key they name.
//!
//! With encryption on, what storage hands back must be an envelope:
//! a plain state (which a storage guest could return in place of the real
//! one) is refused, as is a format-1 envelope (wasmstate before 2026-11,
//! which bound neither backend nor workspace), unless the backend is in the
//! one-time migration mode (`encryption.accept_plain`).

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};

const FORMAT: u32 = 2;
/// Envelopes that bound only serial and lineage; read in migration mode.
const FORMAT_UNBOUND: u32 = 1;
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
    accept_plain: bool,
}

/// Where a state belongs: what an envelope is bound to.
#[derive(Debug, Clone, Copy)]
pub struct Place<'a> {
    /// The backend's name.
    pub backend: &'a str,
    /// The workspace's name.
    pub workspace: &'a str,
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
    /// Written with `allow_force_push` on: an older state may follow newer
    /// ones on purpose here, so the rollback check of a replica that seeds
    /// from the storage's history starts at this version. In clear and not
    /// bound (earlier wasmstate builds open such envelopes as they are):
    /// it can only make that check start later, never refuse a state.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    restarts: bool,
    nonce: String,
    ciphertext: String,
}

/// Whether `stored` is an envelope written with `allow_force_push` on
/// ([`Sealed`]'s `restarts`). Reads the whole envelope: for the rare
/// history walk that needs it, never for a request's state.
pub fn restarts(stored: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Flags {
        #[serde(default)]
        restarts: bool,
    }
    #[derive(Deserialize)]
    struct Outer {
        wasmstate_encrypted: Flags,
    }
    is_sealed(stored)
        && serde_json::from_slice::<Outer>(stored).is_ok_and(|o| o.wasmstate_encrypted.restarts)
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

pub use crate::statefile::is_sealed;

fn associated_data(format: u32, place: Place<'_>, header: &StateHeader) -> Vec<u8> {
    let serial = header.serial.map(|s| s.to_string()).unwrap_or_default();
    let lineage = header.lineage.as_deref().unwrap_or("");
    if format == FORMAT_UNBOUND {
        return format!("wasmstate-state:{format}:{lineage}:{serial}").into_bytes();
    }
    // JSON: unambiguous whatever the lineage holds.
    serde_json::to_vec(&(
        "wasmstate-state",
        format,
        place.backend,
        place.workspace,
        lineage,
        serial,
    ))
    .expect("strings serialise")
}

impl Sealer {
    /// One line for the console: which key seals, how many open.
    pub fn describe(&self) -> String {
        format!(
            "AES-256-GCM, sealing with key {:?}, {} key(s) to open{}",
            self.keys[0].id,
            self.keys.len(),
            if self.accept_plain {
                ", plain states accepted (migration)"
            } else {
                ""
            }
        )
    }

    /// A sealer using `keys[0]` for new states; `None` without keys.
    /// With `accept_plain`, states stored before encryption still open.
    pub fn new(keys: Vec<EncryptionKey>, accept_plain: bool) -> Option<Self> {
        (!keys.is_empty()).then_some(Sealer { keys, accept_plain })
    }

    /// Encrypt a plain state of `place`, whose clear fields are `header`,
    /// into an envelope; `restarts` when written with `allow_force_push`.
    pub fn seal(
        &self,
        place: Place<'_>,
        state: &[u8],
        header: &StateHeader,
        restarts: bool,
    ) -> Result<Vec<u8>, String> {
        let key = &self.keys[0];
        let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&key.key));
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let aad = associated_data(FORMAT, place, header);
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
                restarts,
                nonce: BASE64.encode(nonce),
                ciphertext: BASE64.encode(ciphertext),
            },
            serial: header.serial,
            lineage: header.lineage.clone(),
        };
        serde_json::to_vec(&envelope).map_err(|e| e.to_string())
    }

    /// Decrypt what a guest returned for `place`; with the clear fields
    /// the envelope carried.
    pub fn open(
        &self,
        place: Place<'_>,
        stored: Vec<u8>,
    ) -> Result<(Vec<u8>, StateHeader), String> {
        if !is_sealed(&stored) {
            if self.accept_plain {
                let header = StateHeader::of(&stored);
                return Ok((stored, header));
            }
            return Err(
                "storage returned a state that is not sealed, though encryption is on for this backend; \
                 refused (it could be anyone's). To read states written before encryption was enabled, \
                 set encryption.accept_plain = true once, until each has been written again"
                    .into(),
            );
        }
        open_with(&self.keys, place, self.accept_plain, stored)
    }
}

/// Decrypt a sealed `stored` for `place` with `keys` (format-1 envelopes
/// only with `accept_unbound`). A plain state is returned as it is; callers
/// with encryption on refuse it first ([`Sealer::open`]).
pub fn open_with(
    keys: &[EncryptionKey],
    place: Place<'_>,
    accept_unbound: bool,
    stored: Vec<u8>,
) -> Result<(Vec<u8>, StateHeader), String> {
    if !is_sealed(&stored) {
        let header = StateHeader::of(&stored);
        return Ok((stored, header));
    }
    let envelope: Envelope = serde_json::from_slice(&stored).map_err(|e| {
        format!("the stored state looks encrypted but its envelope is malformed: {e}")
    })?;
    let sealed = &envelope.wasmstate_encrypted;
    if sealed.format == FORMAT_UNBOUND && !accept_unbound {
        return Err(
            "the stored state is sealed in format 1, which binds neither backend nor workspace; \
             set encryption.accept_plain = true once to read it, and it is sealed again on its next write"
                .into(),
        );
    }
    if !(sealed.format == FORMAT || sealed.format == FORMAT_UNBOUND)
        || sealed.algorithm != ALGORITHM
    {
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
    let aad = associated_data(sealed.format, place, &header);
    let state = cipher
        .decrypt(Nonce::from_slice(&nonce), Payload { msg: &ciphertext, aad: &aad })
        .map_err(|_| {
            format!(
                "the stored state does not open with key {:?} for {}/{}: it was sealed with other key \
                 material, for another backend or workspace, or its bytes were altered",
                sealed.key_id, place.backend, place.workspace
            )
        })?;
    Ok((state, header))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> EncryptionKey {
        EncryptionKey::parse(id, &EncryptionKey::generate()).unwrap()
    }

    fn sealer(keys: Vec<EncryptionKey>) -> Sealer {
        Sealer::new(keys, false).unwrap()
    }

    const STATE: &[u8] =
        br#"{"version":4,"serial":7,"lineage":"abc","outputs":{"pw":{"value":"hunter2"}}}"#;
    const HERE: Place<'static> = Place {
        backend: "prod",
        workspace: "net",
    };

    fn seal(sealer: &Sealer, place: Place<'_>) -> Vec<u8> {
        sealer
            .seal(place, STATE, &StateHeader::of(STATE), false)
            .unwrap()
    }

    #[test]
    fn round_trip_keeps_serial_and_lineage_readable_and_hides_the_rest() {
        let sealer = sealer(vec![key("k1")]);
        let sealed = seal(&sealer, HERE);
        assert!(is_sealed(&sealed));
        let text = String::from_utf8(sealed.clone()).unwrap();
        assert!(!text.contains("hunter2"), "{text}");
        let clear = StateHeader {
            serial: Some(7),
            lineage: Some("abc".into()),
        };
        assert_eq!(StateHeader::of(&sealed), clear);
        // What the history listing reads without parsing the ciphertext.
        assert_eq!(
            crate::statefile::version_of_envelope(&sealed),
            Some(("abc".to_string(), 7))
        );
        assert_eq!(crate::statefile::version_of_envelope(STATE), None);
        assert!(!restarts(&sealed));
        let forced = sealer
            .seal(HERE, STATE, &StateHeader::of(STATE), true)
            .unwrap();
        assert!(restarts(&forced));
        assert_eq!(sealer.open(HERE, forced).unwrap().0, STATE.to_vec());
        assert_eq!(sealer.open(HERE, sealed).unwrap(), (STATE.to_vec(), clear));
    }

    #[test]
    fn nonces_are_fresh() {
        let sealer = sealer(vec![key("k1")]);
        assert_ne!(seal(&sealer, HERE), seal(&sealer, HERE));
    }

    #[test]
    fn plain_states_are_refused_unless_migrating() {
        let k = key("k1");
        let err = sealer(vec![k.clone()])
            .open(HERE, STATE.to_vec())
            .unwrap_err();
        assert!(
            err.contains("not sealed") && err.contains("accept_plain"),
            "{err}"
        );
        let migrating = Sealer::new(vec![k], true).unwrap();
        assert_eq!(migrating.open(HERE, STATE.to_vec()).unwrap().0, STATE);
    }

    #[test]
    fn an_envelope_opens_only_where_it_was_sealed() {
        let sealer = sealer(vec![key("k1")]);
        for elsewhere in [
            Place {
                backend: "prod",
                workspace: "other",
            },
            Place {
                backend: "dev",
                workspace: "net",
            },
        ] {
            let err = sealer.open(elsewhere, seal(&sealer, HERE)).unwrap_err();
            assert!(err.contains("for another backend or workspace"), "{err}");
        }
    }

    #[test]
    fn rotation_opens_old_states_with_the_key_they_name() {
        let old = key("old");
        let sealed = seal(&sealer(vec![old.clone()]), HERE);
        let rotated = sealer(vec![key("new"), old]);
        assert_eq!(rotated.open(HERE, sealed).unwrap().0, STATE);
    }

    #[test]
    fn wrong_or_missing_key_is_an_error_not_garbage() {
        let sealed = seal(&sealer(vec![key("k1")]), HERE);
        let wrong = sealer(vec![key("k1")])
            .open(HERE, sealed.clone())
            .unwrap_err();
        assert!(wrong.contains("does not open with key \"k1\""), "{wrong}");
        let missing = sealer(vec![key("k2")])
            .open(HERE, sealed.clone())
            .unwrap_err();
        assert!(
            missing.contains("key \"k1\", which is not configured"),
            "{missing}"
        );
        let none = open_with(&[], HERE, false, sealed).unwrap_err();
        assert!(none.contains("not configured"), "{none}");
    }

    #[test]
    fn tampering_with_the_clear_serial_is_detected() {
        let sealer = sealer(vec![key("k1")]);
        let sealed = String::from_utf8(seal(&sealer, HERE)).unwrap();
        let forged = sealed.replace("\"serial\":7", "\"serial\":70");
        assert_ne!(forged, sealed);
        assert!(sealer.open(HERE, forged.into_bytes()).is_err());
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
