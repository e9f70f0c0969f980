//! The sealed form of a state: AES-256-GCM under a data key, as a JSON
//! envelope that keeps the state's `serial` and `lineage` in clear at the
//! top level, as OpenTofu's encrypted state does, so tools that only
//! compare versions keep working:
//!
//! ```json
//! {"wasmstate_encrypted":{"format":2,"algorithm":"AES-256-GCM","key_id":"2026-11",
//!   "nonce":"…","ciphertext":"…"},"serial":7,"lineage":"…"}
//! ```
//!
//! - **Format 2**: sealed directly with a configured key's material.
//! - **Format 3**: sealed with a fresh data key that a key service (AWS
//!   KMS) wrapped; the wrapped key travels as `wrapped_key`.
//! - **Format 1** (wasmstate before 2026-11) bound neither backend nor
//!   workspace; read only in migration mode.
//!
//! The clear `serial` and `lineage`, and the backend and workspace the
//! state belongs to, are bound to the ciphertext as associated data:
//! editing them, or moving an envelope to another workspace or backend,
//! makes the state fail to open. Every write uses a fresh random nonce.
//! The key id names which configured key sealed it, so keys can rotate.
//! Which key seals and how keys are fetched is [`super::sealer`]'s.
//!
//! Formats 2 and 3 may also carry `started`: when the state's current life
//! on storage began (Unix nanoseconds; see [`super::rollback`]), in clear
//! beside a `started_tag`, an HMAC-SHA256 under a key derived from the
//! sealing key over the same bound fields, `started` and the envelope's
//! nonce. It is bound by its own tag, not by the ciphertext's associated
//! data, so wasmstate builds that predate it still open these envelopes
//! (they ignore both fields). Editing `started` or moving it to another
//! envelope makes the state fail to open here; removing both fields makes
//! it read as started 0, the earliest, which can only make the rollback
//! check refuse it.

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};

/// Sealed directly with a configured key.
pub const FORMAT_DIRECT: u32 = 2;
/// Sealed with a data key a key service wrapped.
pub const FORMAT_WRAPPED: u32 = 3;
/// Envelopes that bound only serial and lineage; read in migration mode.
pub const FORMAT_UNBOUND: u32 = 1;
const ALGORITHM: &str = "AES-256-GCM";

/// Parse key material as written by `wasmstate generate-key`: 32 bytes,
/// base64 (surrounding whitespace ignored). `id` names it in errors.
pub fn parse_material(id: &str, text: &str) -> Result<[u8; 32], String> {
    let bytes = BASE64.decode(text.trim()).map_err(|e| {
        format!("key {id:?} is not base64 ({e}); make one with `wasmstate generate-key`")
    })?;
    bytes.try_into().map_err(|b: Vec<u8>| {
        format!(
            "key {id:?} is {} bytes; AES-256 needs 32 (make one with `wasmstate generate-key`)",
            b.len()
        )
    })
}

/// A fresh random key, base64-encoded.
pub fn generate_material() -> String {
    BASE64.encode(Aes256Gcm::generate_key(&mut OsRng))
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
    /// When the state's life began (Unix ns); absent (0) in older envelopes.
    #[serde(default, skip_serializing_if = "is_zero")]
    started: u64,
    /// The tag binding `started` (base64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    started_tag: Option<String>,
    /// Format 3: the data key, wrapped by the key service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wrapped_key: Option<String>,
    nonce: String,
    ciphertext: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Whether `stored` is an envelope written with `allow_force_push` on
/// ([`Sealed`]'s `restarts`). Reads the whole envelope: for the rare
/// history walk that needs it, never for a request's state.
pub fn restarts(stored: &[u8]) -> bool {
    is_sealed(stored) && label(stored).is_some_and(|l| l.restarts)
}

/// The clear fields of a state (or of an envelope).
#[derive(Deserialize, Default, Debug, Clone, PartialEq, Eq)]
pub struct StateHeader {
    /// Terraform's `serial`.
    pub serial: Option<u64>,
    /// Terraform's `lineage`.
    pub lineage: Option<String>,
    /// When the state's life began, from its envelope (0: not sealed, or
    /// sealed before envelopes carried it). Never read from a state.
    #[serde(skip)]
    pub started: u64,
}

impl StateHeader {
    /// Read `serial` and `lineage` from a state or envelope; empty when the
    /// bytes are not a JSON object.
    pub fn of(bytes: &[u8]) -> StateHeader {
        serde_json::from_slice(bytes).unwrap_or_default()
    }
}

pub use crate::statefile::is_sealed;

/// What an envelope says of itself, without its ciphertext decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    /// 1, 2 or 3.
    pub format: u32,
    /// The key that sealed it.
    pub key_id: String,
    /// Written with `allow_force_push` on.
    pub restarts: bool,
    /// When the state's life began, as written in clear (0 when absent);
    /// unchecked until the envelope is opened.
    pub started: u64,
}

/// The label of a sealed `stored`; `None` when it is not an envelope.
pub fn label(stored: &[u8]) -> Option<Label> {
    #[derive(Deserialize)]
    struct Fields {
        format: u32,
        key_id: String,
        #[serde(default)]
        restarts: bool,
        #[serde(default)]
        started: u64,
    }
    #[derive(Deserialize)]
    struct Outer {
        wasmstate_encrypted: Fields,
    }
    let outer: Outer = serde_json::from_slice(stored).ok()?;
    let f = outer.wasmstate_encrypted;
    Some(Label {
        format: f.format,
        key_id: f.key_id,
        restarts: f.restarts,
        started: f.started,
    })
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The MAC binding `started` to the envelope sealed under `key` with
/// `nonce`: HMAC-SHA256 under a key derived from `key` (the sealing key is
/// not used as is for a second primitive), over what the associated data
/// binds, `started` and the nonce.
fn started_mac(
    key: &[u8; 32],
    format: u32,
    place: Place<'_>,
    header: &StateHeader,
    started: u64,
    nonce: &[u8],
) -> HmacSha256 {
    use hmac::Mac;
    let mut derive = <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    derive.update(b"wasmstate-started-key");
    let derived = derive.finalize().into_bytes();
    let mut mac = <HmacSha256 as Mac>::new_from_slice(&derived).expect("HMAC takes any key length");
    let serial = header.serial.map(|s| s.to_string()).unwrap_or_default();
    let bound = serde_json::to_vec(&(
        "wasmstate-started",
        format,
        place.backend,
        place.workspace,
        header.lineage.as_deref().unwrap_or(""),
        serial,
        started.to_string(),
        BASE64.encode(nonce),
    ))
    .expect("strings serialise");
    mac.update(&bound);
    mac
}

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

/// The key a state is sealed with, and how it travels.
pub struct Sealing<'a> {
    /// The configured key's id, written into the envelope.
    pub key_id: &'a str,
    /// The AES-256 key: the material itself, or a fresh data key.
    pub key: &'a [u8; 32],
    /// The data key as the key service wrapped it (format 3).
    pub wrapped: Option<&'a [u8]>,
}

/// Encrypt a plain state of `place`, whose clear fields are `header`,
/// into an envelope; `restarts` when written with `allow_force_push`. The
/// envelope says its life began at `header.started` (none when 0).
pub fn seal(
    sealing: Sealing<'_>,
    place: Place<'_>,
    state: &[u8],
    header: &StateHeader,
    restarts: bool,
) -> Result<Vec<u8>, String> {
    let format = if sealing.wrapped.is_some() {
        FORMAT_WRAPPED
    } else {
        FORMAT_DIRECT
    };
    let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(sealing.key));
    let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
    let aad = associated_data(format, place, header);
    let ciphertext = cipher
        .encrypt(
            &nonce,
            Payload {
                msg: state,
                aad: &aad,
            },
        )
        .map_err(|_| "AES-GCM encryption failed".to_string())?;
    let started = header.started;
    let started_tag = (started != 0).then(|| {
        use hmac::Mac;
        let mac = started_mac(sealing.key, format, place, header, started, &nonce);
        BASE64.encode(mac.finalize().into_bytes())
    });
    let envelope = Envelope {
        wasmstate_encrypted: Sealed {
            format,
            algorithm: ALGORITHM.into(),
            key_id: sealing.key_id.to_string(),
            restarts,
            started,
            started_tag,
            wrapped_key: sealing.wrapped.map(|w| BASE64.encode(w)),
            nonce: BASE64.encode(nonce),
            ciphertext: BASE64.encode(ciphertext),
        },
        serial: header.serial,
        lineage: header.lineage.clone(),
    };
    serde_json::to_vec(&envelope).map_err(|e| e.to_string())
}

/// An envelope read and checked, its ciphertext decoded, not yet opened.
pub struct Parsed {
    /// 1, 2 or 3.
    pub format: u32,
    /// The configured key it names.
    pub key_id: String,
    /// Format 3: the wrapped data key.
    pub wrapped: Option<Vec<u8>>,
    /// Its clear fields, `started` among them.
    pub header: StateHeader,
    /// The tag binding `header.started` (when not 0).
    started_tag: Option<Vec<u8>>,
    nonce: Vec<u8>,
    ciphertext: Vec<u8>,
}

impl Parsed {
    /// How many bytes decrypting it runs over.
    pub fn ciphertext_len(&self) -> usize {
        self.ciphertext.len()
    }
}

/// Read a sealed `stored` (format 1 only with `accept_unbound`).
pub fn parse(stored: &[u8], accept_unbound: bool) -> Result<Parsed, String> {
    let envelope: Envelope = serde_json::from_slice(stored).map_err(|e| {
        format!("the stored state looks encrypted but its envelope is malformed: {e}")
    })?;
    let sealed = envelope.wasmstate_encrypted;
    if sealed.format == FORMAT_UNBOUND && !accept_unbound {
        return Err(
            "the stored state is sealed in format 1, which binds neither backend nor workspace; \
             set encryption.accept_plain = true once to read it, and it is sealed again on its next write"
                .into(),
        );
    }
    let known = match sealed.format {
        FORMAT_UNBOUND | FORMAT_DIRECT => sealed.wrapped_key.is_none(),
        FORMAT_WRAPPED => sealed.wrapped_key.is_some(),
        _ => false,
    };
    if !known || sealed.algorithm != ALGORITHM {
        return Err(format!(
            "the stored state is encrypted with format {} / {}{}, which this wasmstate does not know",
            sealed.format,
            sealed.algorithm,
            if sealed.wrapped_key.is_some() {
                " with a wrapped key"
            } else {
                ""
            }
        ));
    }
    let decode = |what: &str, text: &str| {
        BASE64
            .decode(text)
            .map_err(|e| format!("the stored state's {what} is not base64: {e}"))
    };
    let nonce = decode("nonce", &sealed.nonce)?;
    if nonce.len() != 12 {
        return Err("the stored state's nonce is not 12 bytes".into());
    }
    // `started` comes with its tag, or neither is there.
    let started_tag = match (sealed.started, &sealed.started_tag) {
        (0, None) => None,
        (started, Some(tag)) if started != 0 && sealed.format != FORMAT_UNBOUND => {
            Some(decode("started tag", tag)?)
        }
        _ => {
            return Err(
                "the stored state's envelope has `started` without its tag, or a tag without `started`: \
                 it was altered"
                    .into(),
            );
        }
    };
    Ok(Parsed {
        format: sealed.format,
        wrapped: sealed
            .wrapped_key
            .as_deref()
            .map(|w| decode("wrapped key", w))
            .transpose()?,
        ciphertext: decode("ciphertext", &sealed.ciphertext)?,
        key_id: sealed.key_id,
        header: StateHeader {
            serial: envelope.serial,
            lineage: envelope.lineage,
            started: sealed.started,
        },
        started_tag,
        nonce,
    })
}

/// Decrypt `parsed` for `place` with `key` (the material, or the data key
/// its wrapped key held).
pub fn decrypt(parsed: &Parsed, key: &[u8; 32], place: Place<'_>) -> Result<Vec<u8>, String> {
    let altered = || {
        format!(
            "the stored state does not open with key {:?} for {}/{}: it was sealed with other key \
             material, for another backend or workspace, or its bytes were altered",
            parsed.key_id, place.backend, place.workspace
        )
    };
    if let Some(tag) = &parsed.started_tag {
        use hmac::Mac;
        let header = &parsed.header;
        started_mac(
            key,
            parsed.format,
            place,
            header,
            header.started,
            &parsed.nonce,
        )
        .verify_slice(tag)
        .map_err(|_| altered())?;
    }
    let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(key));
    let aad = associated_data(parsed.format, place, &parsed.header);
    cipher
        .decrypt(
            Nonce::from_slice(&parsed.nonce),
            Payload {
                msg: &parsed.ciphertext,
                aad: &aad,
            },
        )
        .map_err(|_| altered())
}

#[cfg(test)]
#[path = "envelope_tests.rs"]
mod tests;
