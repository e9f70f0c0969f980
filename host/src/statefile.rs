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
}
