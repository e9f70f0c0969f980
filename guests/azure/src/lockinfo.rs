//! The lock as Terraform's azurerm backend keeps it: an infinite lease on
//! the state blob, whose ID is the lock ID, and metadata `terraformlockid`
//! holding base64 (standard alphabet) of the LockInfo JSON, Go field names,
//! with `ID` = the lease ID.
//!
//! A lease ID must be a GUID. wasmstate's clients pick their own lock IDs:
//! Terraform's are UUIDs and are used as they are; any other ID is mapped
//! to a name-based UUID (version 5, SHA-1, in [`NAMESPACE`]) of it, the
//! same on every host, and the original is kept beside it in the JSON as
//! `WasmstateID` (Terraform ignores fields it does not know). So the
//! holder is reported with the ID it locked with, wasmstate's unlock by
//! that ID works, and Terraform's own `force-unlock <lease ID>` works too.
//! A GUID's lease ID is its lowercase form: Azure compares lease IDs
//! without case, so `ABC…` and `abc…` are one lease, and the stored info
//! names which of them holds it.
//!
//! `Created` must be RFC 3339 (Terraform unmarshals it into a Go
//! `time.Time` and cannot read the lock otherwise): one that is not is
//! stored as the time the lock was taken.

use base64::Engine;
use serde::{Deserialize, Serialize};
use wasmstate_guest::LockInfo;

/// The metadata key, lowercase as Terraform writes it.
pub const META_KEY: &str = "terraformlockid";

/// Namespace of the name-based lease IDs of lock IDs that are not GUIDs
/// (a fixed, random UUID: `wasmstate azure lease`).
const NAMESPACE: uuid::Uuid = uuid::uuid!("6f1b3c9e-2d4a-4e8b-9a37-5c0d8e2f7b14");

/// The lease ID for lock ID `id`: `id` itself, lowercase, when it is a
/// GUID (in its 8-4-4-4-12 form), else a name-based UUID of it.
pub fn lease_id(id: &str) -> String {
    let hyphenated = id.len() == 36 && id.matches('-').count() == 4;
    match uuid::Uuid::try_parse(id) {
        Ok(_) if hyphenated => id.to_ascii_lowercase(),
        _ => uuid::Uuid::new_v5(&NAMESPACE, id.as_bytes()).to_string(),
    }
}

/// The LockInfo JSON in the metadata.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Stored {
    /// Terraform's fields; `ID` is the lease ID.
    #[serde(flatten)]
    pub info: LockInfo,
    /// The lock ID the holder gave, when it is not the lease ID.
    #[serde(
        rename = "WasmstateID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub wasmstate_id: Option<String>,
}

impl Stored {
    /// What `info` is stored as, for the blob at `path`.
    pub fn new(info: &LockInfo, path: String) -> Stored {
        let lease = lease_id(&info.id);
        let wasmstate_id = (lease != info.id).then(|| info.id.clone());
        let mut info = info.clone();
        info.id = lease;
        info.path = path;
        if !is_rfc3339(&info.created) {
            info.created = wasmstate_guest::clock::now_rfc3339();
        }
        Stored { info, wasmstate_id }
    }

    /// The lock ID its holder gave.
    pub fn original(&self) -> &str {
        self.wasmstate_id.as_deref().unwrap_or(&self.info.id)
    }

    /// The lease ID it holds.
    pub fn lease(&self) -> &str {
        &self.info.id
    }

    /// Whether `id` names this lock (its lease ID or the ID it was taken
    /// with), as an unlock may name it. Taking the lock again (a retried
    /// request) needs the very ID it was taken with: other IDs of the same
    /// lease (`X` and its name-based GUID, a GUID's other case) are other
    /// lockers.
    pub fn is(&self, id: &str) -> bool {
        self.info.id == id || self.wasmstate_id.as_deref() == Some(id)
    }

    /// The holder as reported to clients: with the ID it was taken with.
    pub fn reported(&self) -> LockInfo {
        let mut info = self.info.clone();
        if let Some(id) = &self.wasmstate_id {
            info.id = id.clone();
        }
        info
    }

    /// The metadata value.
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).expect("LockInfo serialises");
        base64::engine::general_purpose::STANDARD.encode(json)
    }

    /// Read a metadata value; why not, when it is not base64 LockInfo JSON.
    pub fn decode(value: &str) -> Result<Stored, String> {
        let json = base64::engine::general_purpose::STANDARD
            .decode(value.trim())
            .map_err(|e| format!("not base64: {e}"))?;
        serde_json::from_slice(&json).map_err(|e| format!("not LockInfo JSON: {e}"))
    }
}

/// Whether `text` is an RFC 3339 time as Go's `time.Time` reads one from
/// JSON: `2006-01-02T15:04:05`, an optional fraction, `Z` or `±07:00`.
pub fn is_rfc3339(text: &str) -> bool {
    let b = text.as_bytes();
    let num = |range: std::ops::Range<usize>| -> Option<u32> {
        let digits = b.get(range)?;
        digits
            .iter()
            .all(u8::is_ascii_digit)
            .then(|| digits.iter().fold(0, |n, d| n * 10 + u32::from(d - b'0')))
    };
    let separators = [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':')];
    if b.len() < 20 || separators.iter().any(|&(i, c)| b[i] != c) {
        return false;
    }
    let (Some(year), Some(month), Some(day), Some(hour), Some(min), Some(sec)) = (
        num(0..4),
        num(5..7),
        num(8..10),
        num(11..13),
        num(14..16),
        num(17..19),
    ) else {
        return false;
    };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        1..=12 => 31,
        _ => return false,
    };
    if day == 0 || day > days || hour > 23 || min > 59 || sec > 59 {
        return false;
    }
    let mut rest = &text[19..];
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return false;
        }
        rest = &fraction[digits..];
    }
    match rest.as_bytes() {
        b"Z" => true,
        [sign, ..] if rest.len() == 6 && matches!(sign, b'+' | b'-') => {
            let zone = rest.as_bytes();
            zone[3] == b':'
                && num(text.len() - 5..text.len() - 3).is_some_and(|h| h <= 23)
                && num(text.len() - 2..text.len()).is_some_and(|m| m <= 59)
        }
        _ => false,
    }
}

/// The holder reported for a lease that carries no readable lock info (a
/// lease taken by another tool, or a locker between its two steps).
pub fn unknown_holder(path: String, why: &str) -> LockInfo {
    LockInfo {
        id: String::new(),
        operation: String::new(),
        info: format!(
            "the blob is leased, but its {META_KEY} metadata {why}; force-unlock breaks the lease"
        ),
        who: "unknown (an Azure lease)".into(),
        version: String::new(),
        created: String::new(),
        path,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guids_are_kept_and_other_ids_mapped_stably() {
        let guid = "0b6a7d0e-5c7e-4b52-9c1f-3f2b8a1d9e44";
        assert_eq!(lease_id(guid), guid);
        assert_eq!(lease_id("first"), lease_id("first"));
        assert_ne!(lease_id("first"), lease_id("second"));
        assert!(uuid::Uuid::try_parse(&lease_id("first")).is_ok());
        // Braced or bare forms are not what Azure takes as a lease ID.
        assert_ne!(
            lease_id("0b6a7d0e5c7e4b529c1f3f2b8a1d9e44"),
            "0b6a7d0e5c7e4b529c1f3f2b8a1d9e44"
        );
    }

    #[test]
    fn a_guids_cases_are_one_lease_held_by_the_case_given() {
        let upper = "0B6A7D0E-5C7E-4B52-9C1F-3F2B8A1D9E44";
        let lower = upper.to_ascii_lowercase();
        assert_eq!(lease_id(upper), lower);
        let stored = Stored::new(
            &LockInfo {
                id: upper.into(),
                ..LockInfo::default()
            },
            String::new(),
        );
        assert_eq!(stored.lease(), lower);
        assert_eq!(stored.original(), upper);
        assert_eq!(stored.reported().id, upper);
        // The lease's other names are other lockers.
        let mapped = Stored::new(
            &LockInfo {
                id: "first".into(),
                ..LockInfo::default()
            },
            String::new(),
        );
        assert_eq!(mapped.original(), "first");
        assert_ne!(mapped.original(), lease_id("first"));
    }

    #[test]
    fn created_is_kept_when_rfc3339_and_replaced_by_now_otherwise() {
        for good in [
            "2026-01-02T15:04:05Z",
            "2026-01-02T15:04:05.123456789Z",
            "2024-02-29T23:59:59+05:30",
            "2026-01-02T15:04:05.1-07:00",
        ] {
            assert!(is_rfc3339(good), "{good}");
        }
        for bad in [
            "",
            "yesterday",
            "2026-01-02 15:04:05Z",
            "2026-01-02T15:04:05",
            "2025-02-29T00:00:00Z",
            "2026-13-02T15:04:05Z",
            "2026-01-02T15:04:05.Z",
            "2026-01-02T15:04:05+0700",
            "2026-01-02T24:00:00Z",
        ] {
            assert!(!is_rfc3339(bad), "{bad}");
        }
        let stored = Stored::new(
            &LockInfo {
                id: "x".into(),
                created: "not a time".into(),
                ..LockInfo::default()
            },
            String::new(),
        );
        assert!(is_rfc3339(&stored.info.created), "{}", stored.info.created);
        assert!(stored.info.created.ends_with('Z'));
    }

    #[test]
    fn stored_info_round_trips_with_go_names() {
        let info = LockInfo {
            id: "r0-l3".into(),
            who: "me@host".into(),
            ..LockInfo::default()
        };
        let stored = Stored::new(&info, "tfstate/prod.tfstate".into());
        let text = String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(stored.encode())
                .unwrap(),
        )
        .unwrap();
        assert!(text.starts_with(r#"{"ID":""#), "{text}");
        assert!(text.contains(r#""WasmstateID":"r0-l3""#), "{text}");
        let back = Stored::decode(&stored.encode()).unwrap();
        assert!(back.is("r0-l3") && back.is(&lease_id("r0-l3")));
        assert_eq!(back.reported().id, "r0-l3");
        assert_eq!(back.info.path, "tfstate/prod.tfstate");
    }
}
