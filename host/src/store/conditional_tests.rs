//! Heads and conditional writes through [`Store`]: under encryption the
//! guard judges the opened state (from the head alone for a small one),
//! through the rollback check; a refused conditional write leaves no
//! version in the host's history and no mark.

use super::super::history::History;
use super::super::keys::{EncryptionSpec, KeySource, KeySpec};
use super::super::memory::Memory;
use super::super::{Store, envelope};
use crate::backend::{Expect, Storage, StorageError};
use bytes::Bytes;
use std::time::Duration;

fn sealed(inner: Memory, history: Option<History>) -> Store<Memory> {
    let spec = EncryptionSpec {
        keys: vec![KeySpec {
            id: "k1".into(),
            source: KeySource::Material(
                envelope::parse_material("k1", &envelope::generate_material()).unwrap(),
            ),
        }],
        accept_plain: false,
        data_key_cache: Duration::ZERO,
    };
    Store::new(
        inner,
        "prod",
        Some(&spec),
        history,
        Default::default(),
        64 << 20,
    )
}

fn state(serial: u64, pad: usize) -> Bytes {
    let pad = "p".repeat(pad);
    Bytes::from(format!(
        r#"{{"version":4,"serial":{serial},"lineage":"l","pad":"{pad}"}}"#
    ))
}

#[tokio::test]
async fn a_small_sealed_state_is_judged_from_its_head_alone() {
    let store = sealed(Memory::default(), None);
    let written = state(3, 100);
    assert!(
        store
            .write_if("default", written.clone(), None, Expect::Absent)
            .await
            .unwrap()
    );
    store.inner().take_calls();
    let head = store.head("default").await.unwrap().unwrap();
    // The opened state's size and bytes; the storage's version; no
    // digest (the envelope's says nothing of the state).
    assert_eq!(head.prefix, written);
    assert_eq!(head.size, written.len() as u64);
    assert_eq!(head.digest, None);
    assert_eq!(head.version, "1");
    assert_eq!(store.inner().take_calls(), ["head"]);
    // The storage holds an envelope, not the state.
    assert!(envelope::is_sealed(&store.inner().stored().unwrap()));
}

#[tokio::test]
async fn a_large_sealed_state_is_read_whole_after_its_head() {
    let store = sealed(Memory::default(), None);
    let written = state(3, 80 << 10);
    store.write("default", written.clone(), None).await.unwrap();
    store.inner().take_calls();
    let head = store.head("default").await.unwrap().unwrap();
    assert_eq!(store.inner().take_calls(), ["head", "read"]);
    assert_eq!(head.size, written.len() as u64);
    assert_eq!(head.prefix, written[..crate::statefile::PREFIX_BYTES]);
    assert_eq!(head.version, "1");
}

#[tokio::test]
async fn a_sealed_head_goes_through_the_rollback_check() {
    let store = sealed(Memory::default(), None);
    store.write("default", state(3, 10), None).await.unwrap();
    let older = store.inner().stored().unwrap();
    store.write("default", state(5, 10), None).await.unwrap();
    // Storage hands back the older envelope.
    store.inner().put(&older);
    match store.head("default").await {
        Err(StorageError::Encryption(why)) => assert!(why.contains("rollback"), "{why}"),
        other => panic!("an older envelope's head was not refused: {other:?}"),
    }
}

#[tokio::test]
async fn terraforms_plain_empty_state_heads_as_no_state_but_keeps_its_version() {
    let empty = br#"{"version":4,"terraform_version":"1.11.4","serial":1,"lineage":"pg","outputs":{},"resources":[]}"#;
    let store = sealed(Memory::holding(empty), None);
    let head = store.head("default").await.unwrap().unwrap();
    assert_eq!((head.size, head.prefix.len()), (0, 0));
    assert_eq!(head.version, "1");
    // So a write of any lineage replaces it only while it is there.
    assert!(
        store
            .write_if("default", state(1, 0), None, Expect::Version(head.version))
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn a_refused_conditional_write_keeps_no_version_in_the_history() {
    let dir = tempfile::tempdir().unwrap();
    let history = History::new(dir.path().join("history"), 10);
    let store = sealed(Memory::default(), Some(history.clone()));
    assert!(
        store
            .write_if("default", state(1, 0), None, Expect::Absent)
            .await
            .unwrap()
    );
    let refused = store
        .write_if(
            "default",
            state(2, 0),
            None,
            Expect::Version("stale".into()),
        )
        .await
        .unwrap();
    assert!(!refused);
    let kept = history.list("default").await.unwrap();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0].serial, Some(1));
    // Nor a mark: serial 1 still reads, not refused as older than a 2
    // that was never written.
    let read = store.read("default").await.unwrap().unwrap();
    assert_eq!(read, state(1, 0));
}

/// Review finding (0.3.0): an unlocked write takes no lock, so it can pass
/// the guest's lock check before a reseal's lock and land after the
/// reseal's last read. The reseal's write back expects the version a head
/// saw before that read, so it is refused and the landed state stays.
#[tokio::test]
async fn a_reseal_never_writes_back_over_a_write_landing_after_its_read() {
    let old = KeySpec {
        id: "old".into(),
        source: KeySource::Material(
            envelope::parse_material("old", &envelope::generate_material()).unwrap(),
        ),
    };
    let spec = |keys: Vec<KeySpec>| EncryptionSpec {
        keys,
        accept_plain: false,
        data_key_cache: Duration::ZERO,
    };
    let before = Store::new(
        Memory::default(),
        "prod",
        Some(&spec(vec![old.clone()])),
        None,
        Default::default(),
        64 << 20,
    );
    before.write("default", state(33, 10), None).await.unwrap();
    // Serial 34, sealed under the old key, as an unlocked writer's.
    let landing = {
        let other = Store::new(
            Memory::default(),
            "prod",
            Some(&spec(vec![old.clone()])),
            None,
            Default::default(),
            64 << 20,
        );
        other.write("default", state(34, 10), None).await.unwrap();
        other.inner.stored().unwrap()
    };
    // The reseal reads twice (once to seal, once just before writing
    // back); the write lands right after the second.
    *before.inner.after_read.lock().unwrap() = Some((2, landing.clone()));
    let inner = before.inner;
    let new = KeySpec {
        id: "new".into(),
        source: KeySource::Material(
            envelope::parse_material("new", &envelope::generate_material()).unwrap(),
        ),
    };
    let rotated = Store::new(
        inner,
        "prod",
        Some(&spec(vec![new, old])),
        None,
        Default::default(),
        64 << 20,
    );
    let request = crate::resealing::ResealRequest {
        who: "test".into(),
        ..Default::default()
    };
    let report = rotated.reseal_workspace("default", &request).await.unwrap();
    assert!(
        !matches!(report.state, crate::resealing::Outcome::Resealed { .. }),
        "the reseal wrote back over the landed state: {:?}",
        report.state
    );
    assert_eq!(
        rotated.inner.stored().unwrap(),
        landing,
        "the state that landed during the reseal was replaced"
    );
}
