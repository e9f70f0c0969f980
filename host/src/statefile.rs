//! The few things the host reads of a state body, whoever wrote it:
//!
//! - a Terraform or OpenTofu state: a JSON object with a `version`;
//! - an OpenTofu client-side encrypted state (OpenTofu ≥ 1.7): a JSON
//!   object with a non-empty string `encryption_version`, which is
//!   OpenTofu's own rule for "this payload is encrypted"
//!   (`internal/encryption/base.go`, `decrypt`). Its shape, the same from
//!   v1.7.0 to 1.12 (`internal/encryption/state.go`, `base.go`), is
//!   `{"serial":N,"lineage":"…","meta":{…},"encrypted_data":"…","encryption_version":"v0"}`:
//!   `serial` and `lineage` travel in the clear (`serial` may be `null`,
//!   and builds before v1.7.0-beta1 wrote neither), and there is no
//!   `version`.
//!
//! The host never changes either kind: it stores the bytes it was sent and
//! serves them back byte for byte. OpenTofu checks, after decrypting, that
//! the clear `serial` and `lineage` equal the ones inside the ciphertext.

use serde::Deserialize;

/// What kind of state a body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A plain Terraform/OpenTofu state (`version` 4 today).
    Plain,
    /// An OpenTofu client-side encrypted state: its resources and outputs
    /// are ciphertext the host cannot read.
    OpenTofuEncrypted,
}

/// The parts of a state body the host looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Plain or encrypted.
    pub kind: Kind,
    /// `serial`, when the body has one.
    pub serial: Option<u64>,
    /// `lineage`, when the body has a non-empty one.
    pub lineage: Option<String>,
}

impl Header {
    /// `serial` and `lineage`, when the body has both: the pair the
    /// stale-write guard compares.
    pub fn version(&self) -> Option<(&str, u64)> {
        Some((self.lineage.as_deref()?, self.serial?))
    }
}

/// Everything else in the body is skipped unparsed.
#[derive(Deserialize)]
struct Raw {
    version: Option<u64>,
    encryption_version: Option<String>,
    serial: Option<u64>,
    lineage: Option<String>,
}

/// Bytes of a stored state the stale-write guard reads first: Terraform
/// and OpenTofu write `serial` and `lineage` within the first few hundred
/// (Terraform's `version`, `terraform_version`, `serial`, `lineage`;
/// OpenTofu's encrypted states start with them).
pub const PREFIX_BYTES: usize = 64 << 10;

pub use wasmstate_types::state::version_in_prefix;

/// The top-level key that marks a state sealed by the host's encryption at
/// rest. It is written first, so a prefix check tells sealed states from
/// plain ones without parsing; `serial` and `lineage` come last, after the
/// ciphertext.
pub const SEALED_MARKER: &str = "wasmstate_encrypted";

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
        after.starts_with(format!("\"{SEALED_MARKER}\"").as_bytes())
    }
}

/// Bytes at the end of a sealed envelope searched for its clear `serial`
/// and `lineage` (the AWS guests read as many of a version's end).
pub const ENVELOPE_TAIL_BYTES: usize = 64 << 10;

/// `lineage` and `serial` of a sealed envelope, from its last bytes, where
/// the envelope keeps them after the ciphertext: without parsing the
/// ciphertext (a state of any size costs the same). `None` for anything
/// else, or a lineage longer than the tail.
pub fn version_of_envelope(stored: &[u8]) -> Option<(String, u64)> {
    if !is_sealed(stored) {
        return None;
    }
    wasmstate_types::state::version_in_tail(
        &stored[stored.len().saturating_sub(ENVELOPE_TAIL_BYTES)..],
    )
}

/// `state` with its top-level `serial` set to `serial` (added first when it
/// has none), everything else kept byte for byte: key order, numbers beyond
/// f64's precision, the text of every other value. Written in Terraform's
/// own layout (one top-level key a line, two spaces in). For a restore,
/// which must not re-encode a document it only renumbers.
pub fn with_serial(state: &[u8], serial: u64) -> Result<Vec<u8>, String> {
    use serde::de::{MapAccess, Visitor};
    use serde_json::value::RawValue;

    /// The top-level entries in order, values as their raw text.
    struct Entries;

    impl<'de> Visitor<'de> for Entries {
        type Value = Vec<(String, &'de RawValue)>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut entries = Vec::new();
            while let Some(entry) = map.next_entry::<String, &'de RawValue>()? {
                entries.push(entry);
            }
            Ok(entries)
        }
    }

    let mut json = serde_json::Deserializer::from_slice(state);
    let entries = serde::Deserializer::deserialize_map(&mut json, Entries)
        .and_then(|entries| json.end().map(|()| entries))
        .map_err(|e| format!("the state is not a JSON object: {e}"))?;
    let serial_text = serial.to_string();
    let mut lines: Vec<String> = Vec::with_capacity(entries.len() + 1);
    if !entries.iter().any(|(key, _)| key == "serial") {
        lines.push(format!("  \"serial\": {serial_text}"));
    }
    for (key, value) in &entries {
        let key_json = serde_json::to_string(key).expect("a string serialises");
        let value = if key == "serial" {
            &serial_text
        } else {
            value.get()
        };
        lines.push(format!("  {key_json}: {value}"));
    }
    Ok(format!("{{\n{}\n}}\n", lines.join(",\n")).into_bytes())
}

/// Read a state body; `Err` says, in one line, why it is neither kind.
pub fn read(body: &[u8]) -> Result<Header, String> {
    let raw: Raw = serde_json::from_slice(body).map_err(|e| {
        format!(
            "the body is not a Terraform state (a JSON object with a \"version\") nor an OpenTofu encrypted state (with \"encryption_version\"): {e}"
        )
    })?;
    let kind = match (&raw.encryption_version, raw.version) {
        (Some(v), _) if !v.is_empty() => Kind::OpenTofuEncrypted,
        (_, Some(_)) => Kind::Plain,
        _ => {
            return Err(
                "the body is not a Terraform state (it has no \"version\") nor an OpenTofu encrypted state (no non-empty \"encryption_version\")"
                    .into(),
            );
        }
    };
    Ok(Header {
        kind,
        serial: raw.serial,
        lineage: raw.lineage.filter(|l| !l.is_empty()),
    })
}

/// `state` as the `outputs` role sees it: the same `version`,
/// `terraform_version`, `serial` and `lineage`, its outputs that are not
/// sensitive (values as written), and no resources. Terraform reads it as
/// a state (`terraform_remote_state`, `state pull`), so a reader shares a
/// state's outputs without its resources, which hold every attribute of
/// everything managed, secrets included. Sensitive outputs are left out
/// altogether rather than blanked: a reader that uses one fails at plan
/// ("no attribute named …") instead of silently receiving `null`.
/// `Err` (one line) for anything but a plain format-4 state: an
/// encrypted or older state's outputs cannot be told from the rest.
pub fn outputs_only(state: &[u8]) -> Result<Vec<u8>, String> {
    use serde_json::value::RawValue;
    use std::collections::BTreeMap;

    #[derive(Deserialize)]
    struct Full {
        version: u64,
        #[serde(default)]
        terraform_version: Option<String>,
        serial: u64,
        lineage: String,
        #[serde(default)]
        outputs: BTreeMap<String, Output>,
        #[serde(default)]
        encryption_version: Option<serde::de::IgnoredAny>,
    }

    #[derive(Deserialize, serde::Serialize)]
    struct Output {
        value: Box<RawValue>,
        #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
        kind: Option<Box<RawValue>>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        sensitive: bool,
    }

    #[derive(serde::Serialize)]
    struct Shared<'a> {
        version: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        terraform_version: Option<&'a str>,
        serial: u64,
        lineage: &'a str,
        outputs: BTreeMap<&'a str, &'a Output>,
        resources: [(); 0],
    }

    let not_plain = || {
        "its outputs cannot be told apart from the rest of the state (encrypted by its client, or not a format-4 Terraform state)".to_string()
    };
    let full: Full = serde_json::from_slice(state).map_err(|_| not_plain())?;
    if full.version != 4 || full.encryption_version.is_some() {
        return Err(not_plain());
    }
    let shared = Shared {
        version: full.version,
        terraform_version: full.terraform_version.as_deref(),
        serial: full.serial,
        lineage: &full.lineage,
        outputs: full
            .outputs
            .iter()
            .filter(|(_, o)| !o.sensitive)
            .map(|(name, o)| (name.as_str(), o))
            .collect(),
        resources: [],
    };
    let mut text = serde_json::to_vec_pretty(&shared).map_err(|e| e.to_string())?;
    text.push(b'\n');
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_states_need_a_version() {
        let h = read(br#"{"version":4,"serial":3,"lineage":"abc","resources":[]}"#).unwrap();
        assert_eq!(h.kind, Kind::Plain);
        assert_eq!(h.version(), Some(("abc", 3)));
        assert!(read(br#"{"serial":3,"lineage":"abc"}"#).is_err());
        assert!(
            read(b"not json")
                .unwrap_err()
                .contains("not a Terraform state")
        );
    }

    #[test]
    fn opentofu_envelopes_are_recognised_by_opentofus_rule() {
        // As internal/encryption/state.go writes it (v1.7.0 … 1.12).
        let h = read(
            br#"{"serial":7,"lineage":"l-1","meta":{"key_provider.pbkdf2.k":"e30="},"encrypted_data":"AAAA","encryption_version":"v0"}"#,
        )
        .unwrap();
        assert_eq!(h.kind, Kind::OpenTofuEncrypted);
        assert_eq!(h.version(), Some(("l-1", 7)));
        // v1.7.0-alpha1 wrote no serial and lineage; a null serial is legal.
        let h = read(br#"{"meta":{},"encrypted_data":"AAAA","encryption_version":"v0"}"#).unwrap();
        assert_eq!((h.kind, h.version()), (Kind::OpenTofuEncrypted, None));
        let h = read(br#"{"serial":null,"lineage":"","meta":{},"encrypted_data":"","encryption_version":"v0"}"#)
            .unwrap();
        assert_eq!(h.version(), None);
        // An empty encryption_version is not the marker (OpenTofu's rule).
        assert!(read(br#"{"serial":1,"lineage":"l","encryption_version":""}"#).is_err());
    }

    #[test]
    fn with_serial_renumbers_without_re_encoding() {
        let state = br#"{"version":4,"terraform_version":"1.11.4","serial":7,"lineage":"l","outputs":{"big":{"value":12345678901234567890123,"type":"number"},"f":{"value":0.10000000000000000555}},"resources":[]}"#;
        let renumbered = with_serial(state, 1234).unwrap();
        let text = String::from_utf8(renumbered.clone()).unwrap();
        // Key order kept: serial stays before lineage, first 64 KiB reads it.
        assert_eq!(version_in_prefix(&renumbered), Some(("l".into(), 1234)));
        assert!(text.find("\"serial\"").unwrap() < text.find("\"resources\"").unwrap());
        // Numbers beyond f64 kept as written.
        assert!(text.contains("12345678901234567890123"));
        assert!(text.contains("0.10000000000000000555"));
        assert_eq!(read(&renumbered).unwrap().serial, Some(1234));
        // A state without a serial gets one; a non-object is refused.
        let added = with_serial(br#"{"version":4,"lineage":"l"}"#, 1).unwrap();
        assert_eq!(read(&added).unwrap().version(), Some(("l", 1)));
        assert!(with_serial(b"[1,2]", 1).is_err());
        assert!(with_serial(br#"{"version":4} trailing"#, 1).is_err());
    }
}

#[cfg(test)]
mod prefix_tests {
    use super::version_in_prefix;

    #[test]
    fn finds_serial_and_lineage_in_a_cut_state() {
        let state = br#"{"version":4,"terraform_version":"1.11.4","serial":7,"lineage":"abc","outputs":{"x":{"value":"cut he"#;
        assert_eq!(version_in_prefix(state), Some(("abc".into(), 7)));
        let tofu = br#"{"serial":3,"lineage":"l","meta":{"key_provider":"#;
        assert_eq!(version_in_prefix(tofu), Some(("l".into(), 3)));
    }

    #[test]
    fn a_serial_cut_by_the_prefix_is_unknown() {
        let state = br#"{"version":4,"lineage":"abc","serial":1234,"resources":[]}"#;
        let cut = state.iter().position(|&b| b == b'3').unwrap();
        // `1234` cut to `12` must not read as serial 12.
        assert_eq!(version_in_prefix(&state[..cut]), None);
        // Whole, or cut after its comma, it is known.
        assert_eq!(version_in_prefix(state), Some(("abc".into(), 1234)));
        assert_eq!(
            version_in_prefix(&state[..cut + 3]),
            Some(("abc".into(), 1234))
        );
    }

    #[test]
    fn says_none_when_the_prefix_lacks_them() {
        assert_eq!(
            version_in_prefix(br#"{"version":4,"serial":7,"outputs":{"#),
            None
        );
        assert_eq!(
            version_in_prefix(br#"{"version":4,"serial":7,"lineage":""}"#),
            None
        );
        assert_eq!(version_in_prefix(b"not json"), None);
    }
}

#[cfg(test)]
mod outputs_tests {
    use super::*;

    #[test]
    fn the_outputs_role_sees_plain_outputs_and_nothing_else() {
        let state = br#"{"version":4,"terraform_version":"1.11.4","serial":7,"lineage":"l","outputs":{"o":{"value":{"a":[1,2]},"type":["object",{"a":["list","number"]}]},"s":{"value":"hunter2","type":"string","sensitive":true}},"resources":[{"mode":"managed","type":"x","instances":[{"attributes":{"password":"resource-secret"}}]}],"check_results":null}"#;
        let shared = outputs_only(state).unwrap();
        let text = String::from_utf8(shared.clone()).unwrap();
        assert!(
            !text.contains("resource-secret") && !text.contains("hunter2"),
            "{text}"
        );
        let v: serde_json::Value = serde_json::from_slice(&shared).unwrap();
        assert_eq!(v["outputs"]["o"]["value"]["a"][1], 2);
        assert!(v["outputs"].get("s").is_none());
        assert_eq!(v["resources"], serde_json::json!([]));
        assert_eq!(read(&shared).unwrap().version(), Some(("l", 7)));
        assert_eq!(version_in_prefix(&shared), Some(("l".into(), 7)));
        // Encrypted, older or unparsable states: refused, never passed on.
        for other in [
            &br#"{"serial":1,"lineage":"l","meta":{},"encrypted_data":"AAAA","encryption_version":"v0"}"#[..],
            br#"{"version":3,"serial":1,"lineage":"l","modules":[]}"#,
            b"not json",
        ] {
            assert!(outputs_only(other).is_err());
        }
    }
}
