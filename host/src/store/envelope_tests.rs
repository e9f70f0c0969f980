//! Sealing, opening and tampering with envelopes.

use super::*;

const STATE: &[u8] =
    br#"{"version":4,"serial":7,"lineage":"abc","outputs":{"pw":{"value":"hunter2"}}}"#;
const HERE: Place<'static> = Place {
    backend: "prod",
    workspace: "net",
};
const KEY: [u8; 32] = [7; 32];

fn sealed(wrapped: Option<&[u8]>, place: Place<'_>, restarts: bool) -> Vec<u8> {
    let sealing = Sealing {
        key_id: "k1",
        key: &KEY,
        wrapped,
    };
    seal(sealing, place, STATE, &StateHeader::of(STATE), restarts).unwrap()
}

fn open(stored: &[u8], key: &[u8; 32], place: Place<'_>) -> Result<Vec<u8>, String> {
    decrypt(&parse(stored, false)?, key, place)
}

#[test]
fn round_trip_keeps_serial_and_lineage_readable_and_hides_the_rest() {
    for wrapped in [None, Some(&b"wrapped by KMS"[..])] {
        let stored = sealed(wrapped, HERE, false);
        assert!(is_sealed(&stored));
        let text = String::from_utf8(stored.clone()).unwrap();
        assert!(!text.contains("hunter2"), "{text}");
        let clear = StateHeader {
            serial: Some(7),
            lineage: Some("abc".into()),
            ..StateHeader::default()
        };
        assert_eq!(StateHeader::of(&stored), clear);
        // What the history listing reads without parsing the ciphertext.
        assert_eq!(
            crate::statefile::version_of_envelope(&stored),
            Some(("abc".to_string(), 7))
        );
        let parsed = parse(&stored, false).unwrap();
        assert_eq!(parsed.wrapped.as_deref(), wrapped);
        let format = if wrapped.is_some() { 3 } else { 2 };
        assert_eq!(parsed.format, format);
        assert_eq!(
            label(&stored),
            Some(Label {
                format,
                key_id: "k1".into(),
                restarts: false,
                started: 0,
            })
        );
        assert_eq!(open(&stored, &KEY, HERE).unwrap(), STATE);
    }
    assert_eq!(crate::statefile::version_of_envelope(STATE), None);
    assert!(!restarts(&sealed(None, HERE, false)));
    assert!(restarts(&sealed(None, HERE, true)));
}

#[test]
fn nonces_are_fresh() {
    assert_ne!(sealed(None, HERE, false), sealed(None, HERE, false));
}

#[test]
fn an_envelope_opens_only_where_it_was_sealed_and_with_its_key() {
    for wrapped in [None, Some(&b"w"[..])] {
        let stored = sealed(wrapped, HERE, false);
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
            let err = open(&stored, &KEY, elsewhere).unwrap_err();
            assert!(err.contains("for another backend or workspace"), "{err}");
        }
        let err = open(&stored, &[8; 32], HERE).unwrap_err();
        assert!(err.contains("does not open with key \"k1\""), "{err}");
    }
}

#[test]
fn tampering_with_the_clear_serial_or_the_format_is_detected() {
    let stored = String::from_utf8(sealed(None, HERE, false)).unwrap();
    let forged = stored.replace("\"serial\":7", "\"serial\":70");
    assert_ne!(forged, stored);
    assert!(open(forged.as_bytes(), &KEY, HERE).is_err());
    // A format-3 envelope relabelled format 2 (dropping its wrapped
    // key) or the reverse is refused before any key is used.
    let wrapped = String::from_utf8(sealed(Some(b"w"), HERE, false)).unwrap();
    let relabelled = wrapped.replace("\"format\":3", "\"format\":2");
    let err = parse(relabelled.as_bytes(), false).err().unwrap();
    assert!(err.contains("does not know"), "{err}");
    let unknown = stored.replace("\"format\":2", "\"format\":9");
    assert!(parse(unknown.as_bytes(), false).is_err());
}

fn sealed_at(wrapped: Option<&[u8]>, started: u64) -> String {
    let sealing = Sealing {
        key_id: "k1",
        key: &KEY,
        wrapped,
    };
    let header = StateHeader {
        started,
        ..StateHeader::of(STATE)
    };
    String::from_utf8(seal(sealing, HERE, STATE, &header, false).unwrap()).unwrap()
}

/// Issue 47, data 4: `started` is bound to the envelope. Edited,
/// moved to another envelope, or half removed, the state does not
/// open; removed whole, it opens as started 0 (so the ciphertext's
/// associated data is what earlier builds check, and they open it).
#[test]
fn the_started_stamp_is_bound_and_earlier_builds_still_open_the_envelope() {
    for wrapped in [None, Some(&b"w"[..])] {
        let stored = sealed_at(wrapped, 1_764_000_000_000_000_123);
        let parsed = parse(stored.as_bytes(), false).unwrap();
        assert_eq!(parsed.header.started, 1_764_000_000_000_000_123);
        assert_eq!(
            label(stored.as_bytes()).unwrap().started,
            parsed.header.started
        );
        assert_eq!(decrypt(&parsed, &KEY, HERE).unwrap(), STATE);
        // The clear serial and lineage still end the envelope.
        assert_eq!(
            crate::statefile::version_of_envelope(stored.as_bytes()),
            Some(("abc".to_string(), 7))
        );
        let later = stored.replace(
            "\"started\":1764000000000000123",
            "\"started\":1764000000000000124",
        );
        assert_ne!(later, stored);
        let err = open(later.as_bytes(), &KEY, HERE).unwrap_err();
        assert!(err.contains("altered"), "{err}");
        // Another envelope's stamp and tag (same place, serial and
        // lineage, a later life) do not fit this one.
        let other = sealed_at(wrapped, 1_764_000_000_000_000_999);
        let field = |text: &str, name: &str| {
            let at = text.find(&format!("\"{name}\":")).unwrap();
            let end = at + text[at..].find(',').unwrap();
            text[at..end].to_string()
        };
        let moved = stored
            .replace(&field(&stored, "started"), &field(&other, "started"))
            .replace(
                &field(&stored, "started_tag"),
                &field(&other, "started_tag"),
            );
        assert!(open(moved.as_bytes(), &KEY, HERE).is_err());
        // Half removed: refused as altered.
        let half = stored.replace(&format!("{},", field(&stored, "started")), "");
        assert!(
            parse(half.as_bytes(), false)
                .err()
                .unwrap()
                .contains("altered")
        );
        // Whole removed: the envelope earlier builds wrote, started 0.
        let stripped = half.replace(&format!("{},", field(&stored, "started_tag")), "");
        let parsed = parse(stripped.as_bytes(), false).unwrap();
        assert_eq!(parsed.header.started, 0);
        assert_eq!(decrypt(&parsed, &KEY, HERE).unwrap(), STATE);
    }
    // Without a stamp, nothing is added.
    let unstamped = sealed_at(None, 0);
    assert!(!unstamped.contains("started"), "{unstamped}");
}

#[test]
fn format_one_needs_the_migration_switch() {
    let stored = String::from_utf8(sealed(None, HERE, false))
        .unwrap()
        .replace("\"format\":2", "\"format\":1");
    let err = parse(stored.as_bytes(), false).err().unwrap();
    assert!(err.contains("format 1"), "{err}");
    assert!(parse(stored.as_bytes(), true).is_ok());
}

#[test]
fn bad_key_material_is_explained() {
    assert!(
        parse_material("k", "not base64!")
            .unwrap_err()
            .contains("generate-key")
    );
    assert!(
        parse_material("k", "AAAA")
            .unwrap_err()
            .contains("needs 32")
    );
    assert!(parse_material("k", &generate_material()).is_ok());
}
