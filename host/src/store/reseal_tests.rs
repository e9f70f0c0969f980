//! `reseal` against storage in memory that keeps versions itself (as S3
//! with versioning does), and whose lock call can fail after taking it.

use super::super::keys::{EncryptionSpec, KeySource, KeySpec};
use super::super::{Store, envelope};
use crate::backend::{LockInfo, Storage, StorageError, StorageResult, Version};
use crate::resealing::{Outcome, ResealRequest};
use bytes::Bytes;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// One workspace, every write kept as a version, newest first.
#[derive(Default)]
struct Versioned {
    versions: Mutex<Vec<Vec<u8>>>,
    lock: Mutex<Option<LockInfo>>,
    /// The next lock call takes the lock, then answers an error.
    lose_lock_answer: AtomicBool,
    /// Lands as the newest version right after the next read answers (a
    /// write under a lock that was forced open).
    land_after_read: Mutex<Option<Vec<u8>>>,
}

impl Storage for Versioned {
    async fn read(&self, _: &str) -> StorageResult<Option<Vec<u8>>> {
        let mut versions = self.versions.lock().unwrap();
        let newest = versions.first().cloned();
        if let Some(landed) = self.land_after_read.lock().unwrap().take() {
            versions.insert(0, landed);
        }
        Ok(newest)
    }
    async fn write(&self, _: &str, state: Bytes, id: Option<&str>) -> StorageResult<()> {
        match (&*self.lock.lock().unwrap(), id) {
            (Some(held), Some(id)) if held.id == id => {}
            (Some(held), _) => return Err(StorageError::Locked(held.clone())),
            (None, _) => {}
        }
        self.versions.lock().unwrap().insert(0, state.to_vec());
        Ok(())
    }
    async fn delete(&self, _: &str, _: Option<&str>) -> StorageResult<()> {
        Ok(())
    }
    async fn lock(&self, _: &str, info: LockInfo) -> StorageResult<()> {
        let mut lock = self.lock.lock().unwrap();
        if let Some(held) = &*lock {
            return Err(StorageError::Locked(held.clone()));
        }
        *lock = Some(info);
        if self.lose_lock_answer.swap(false, Ordering::SeqCst) {
            return Err(StorageError::Unavailable("the answer was lost".into()));
        }
        Ok(())
    }
    async fn unlock(&self, _: &str, id: &str) -> StorageResult<()> {
        let mut lock = self.lock.lock().unwrap();
        match &*lock {
            Some(held) if held.id == id => *lock = None,
            Some(held) => return Err(StorageError::LockMismatch(Some(held.clone()))),
            None => {}
        }
        Ok(())
    }
    async fn current_lock(&self, _: &str) -> StorageResult<Option<LockInfo>> {
        Ok(self.lock.lock().unwrap().clone())
    }
    async fn force_unlock(&self, _: &str) -> StorageResult<Option<LockInfo>> {
        Ok(self.lock.lock().unwrap().take())
    }
    async fn list_workspaces(&self) -> StorageResult<Vec<String>> {
        Ok(vec!["default".into()])
    }
    async fn create_workspace(&self, _: &str) -> StorageResult<bool> {
        Ok(false)
    }
    async fn delete_workspace(&self, _: &str) -> StorageResult<()> {
        Ok(())
    }
    async fn list_versions(&self, _: &str) -> StorageResult<Vec<Version>> {
        let versions = self.versions.lock().unwrap();
        Ok((0..versions.len())
            .map(|i| Version {
                id: i.to_string(),
                serial: envelope::StateHeader::of(&versions[i]).serial,
                created_unix_ms: 0,
                bytes: versions[i].len() as u64,
                written_by: None,
            })
            .collect())
    }
    async fn read_version(&self, _: &str, id: &str) -> StorageResult<Option<Vec<u8>>> {
        let versions = self.versions.lock().unwrap();
        Ok(id
            .parse::<usize>()
            .ok()
            .and_then(|i| versions.get(i).cloned()))
    }
}

fn material(id: &str) -> KeySpec {
    KeySpec {
        id: id.into(),
        source: KeySource::Material(
            envelope::parse_material(id, &envelope::generate_material()).unwrap(),
        ),
    }
}

fn store(storage: Versioned, keys: Vec<KeySpec>) -> Store<Versioned> {
    let spec = EncryptionSpec {
        keys,
        accept_plain: false,
        data_key_cache: Duration::ZERO,
    };
    Store::new(
        storage,
        "prod",
        Some(&spec),
        None,
        Default::default(),
        1 << 20,
    )
}

fn state(serial: u64) -> Bytes {
    Bytes::from(format!(
        r#"{{"version":4,"serial":{serial},"lineage":"l"}}"#
    ))
}

fn request() -> ResealRequest {
    ResealRequest {
        who: "test".into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn versions_the_storage_keeps_are_reported_read_only_not_unfinished() {
    let old = material("old");
    let before = store(Versioned::default(), vec![old.clone()]);
    for serial in 1..=2 {
        before.write("default", state(serial), None).await.unwrap();
    }
    let storage = before.inner;
    let rotated = store(storage, vec![material("new"), old]);
    let report = rotated
        .reseal_workspace("default", &request())
        .await
        .unwrap();
    assert_eq!(report.state, Outcome::Resealed { from: "old".into() });
    assert_eq!(report.versions_kept_by, "storage");
    // The re-sealed state is now the newest version; the two before it
    // still need the old key, and no run can change that.
    let still: Vec<_> = report.versions.iter().map(|v| &v.outcome).collect();
    assert_eq!(
        still,
        [
            &Outcome::Current,
            &Outcome::KeptByStorage {
                still: "old".into()
            },
            &Outcome::KeptByStorage {
                still: "old".into()
            },
        ]
    );
    assert!(!report.pending(), "{report:?}");
    assert_eq!(
        rotated.read("default").await.unwrap(),
        Some(state(2).to_vec())
    );
    assert!(
        rotated.inner.lock.lock().unwrap().is_none(),
        "lock released"
    );
}

#[tokio::test]
async fn a_lock_taken_behind_a_lost_answer_is_released() {
    let store = store(Versioned::default(), vec![material("k")]);
    store.write("default", state(1), None).await.unwrap();
    store.inner.lose_lock_answer.store(true, Ordering::SeqCst);
    let err = store
        .reseal_workspace("default", &request())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("answer was lost"), "{err}");
    assert!(err.to_string().contains("force-unlock"), "{err}");
    assert!(
        store.inner.lock.lock().unwrap().is_none(),
        "lock left behind"
    );
}

#[tokio::test]
async fn a_held_lock_is_skipped_and_named_and_nothing_changes() {
    let old = material("old");
    let before = store(Versioned::default(), vec![old.clone()]);
    before.write("default", state(1), None).await.unwrap();
    let storage = before.inner;
    *storage.lock.lock().unwrap() = Some(LockInfo {
        id: "theirs".into(),
        who: "ops@elsewhere".into(),
        operation: "OperationTypeApply".into(),
        ..Default::default()
    });
    let rotated = store(storage, vec![material("new"), old]);
    for dry_run in [true, false] {
        let request = ResealRequest {
            dry_run,
            ..request()
        };
        let report = rotated.reseal_workspace("default", &request).await.unwrap();
        let Outcome::Skipped { reason } = &report.state else {
            panic!("{report:?}");
        };
        assert!(reason.contains("ops@elsewhere") && reason.contains("OperationTypeApply"));
        assert!(report.pending());
    }
    assert_eq!(
        rotated.inner.versions.lock().unwrap().len(),
        1,
        "nothing written"
    );
    let holder = rotated.inner.lock.lock().unwrap().clone().unwrap();
    assert_eq!(holder.id, "theirs", "their lock untouched");
}

#[tokio::test]
async fn a_state_that_lands_while_resealing_is_not_replaced_by_the_older_one() {
    let old = material("old");
    let before = store(Versioned::default(), vec![old.clone()]);
    before.write("default", state(33), None).await.unwrap();
    // Serial 34, sealed under the old key by a writer whose lock was
    // forced open, lands after the reseal has read serial 33.
    before.write("default", state(34), None).await.unwrap();
    let storage = before.inner;
    let landed = storage.versions.lock().unwrap().remove(0);
    *storage.land_after_read.lock().unwrap() = Some(landed.clone());
    let rotated = store(storage, vec![material("new"), old]);
    let report = rotated
        .reseal_workspace("default", &request())
        .await
        .unwrap();
    match &report.state {
        Outcome::Skipped { reason } => {
            assert!(reason.contains("run the re-seal again"), "{reason}")
        }
        other => panic!("expected the reseal to leave the new state alone, got {other:?}"),
    }
    assert_eq!(rotated.inner.versions.lock().unwrap()[0], landed);
    assert!(
        rotated.inner.lock.lock().unwrap().is_none(),
        "lock released"
    );
}
