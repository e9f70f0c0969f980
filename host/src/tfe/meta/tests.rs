use super::*;
use crate::backend::{LockInfo, Metadata, StorageResult};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Workspaces and their metadata in memory, as a 0.3.0 guest keeps them
/// (`keeps_none`: as a guest built before 0.3.0 answers). `interfere`:
/// so many next conditional writes find another writer got there first;
/// `deleting`: so many find the workspace deleted by then. `writes`
/// counts the metadata writes; `writes_make_workspaces`: a write makes its
/// workspace, as a guest keeping metadata in the workspace's directory does.
#[derive(Default)]
struct Memory {
    keeps_none: bool,
    workspaces: Mutex<BTreeSet<String>>,
    metadata: Mutex<BTreeMap<String, Metadata>>,
    versions: AtomicUsize,
    interfere: AtomicUsize,
    deleting: AtomicUsize,
    writes: AtomicUsize,
    writes_make_workspaces: bool,
    refuses_when_gone: bool,
    busy: AtomicUsize,
}

impl Memory {
    fn with(names: &[&str]) -> Self {
        let memory = Memory::default();
        for name in names {
            memory.workspaces.lock().unwrap().insert(name.to_string());
        }
        memory
    }

    fn content(&self, ws: &str) -> Option<Value> {
        let all = self.metadata.lock().unwrap();
        Some(serde_json::from_str(&all.get(ws)?.content).unwrap())
    }

    fn put(&self, ws: &str, content: &str) {
        let version = self.versions.fetch_add(1, Ordering::SeqCst).to_string();
        let content = content.into();
        let metadata = Metadata { content, version };
        self.metadata.lock().unwrap().insert(ws.into(), metadata);
    }
}

impl Storage for Memory {
    async fn read(&self, _: &str) -> StorageResult<Option<Vec<u8>>> {
        Ok(None)
    }
    async fn write(&self, _: &str, _: bytes::Bytes, _: Option<&str>) -> StorageResult<()> {
        Ok(())
    }
    async fn delete(&self, _: &str, _: Option<&str>) -> StorageResult<()> {
        Ok(())
    }
    async fn lock(&self, _: &str, _: LockInfo) -> StorageResult<()> {
        Ok(())
    }
    async fn unlock(&self, _: &str, _: &str) -> StorageResult<()> {
        Ok(())
    }
    async fn current_lock(&self, _: &str) -> StorageResult<Option<LockInfo>> {
        Ok(None)
    }
    async fn force_unlock(&self, _: &str) -> StorageResult<Option<LockInfo>> {
        Ok(None)
    }
    async fn list_workspaces(&self) -> StorageResult<Vec<String>> {
        Ok(self.workspaces.lock().unwrap().iter().cloned().collect())
    }
    async fn create_workspace(&self, name: &str) -> StorageResult<bool> {
        Ok(self.workspaces.lock().unwrap().insert(name.into()))
    }
    async fn delete_workspace(&self, name: &str) -> StorageResult<()> {
        self.workspaces.lock().unwrap().remove(name);
        self.metadata.lock().unwrap().remove(name);
        Ok(())
    }
    async fn read_metadata(&self, ws: &str) -> StorageResult<Option<Metadata>> {
        if self.keeps_none {
            return Err(StorageError::NoMetadata("built for 0.2.1".into()));
        }
        Ok(self.metadata.lock().unwrap().get(ws).cloned())
    }
    async fn write_metadata(
        &self,
        ws: &str,
        content: Option<String>,
        expect: Expect,
    ) -> StorageResult<bool> {
        if self.keeps_none {
            return Err(StorageError::NoMetadata("built for 0.2.1".into()));
        }
        self.writes.fetch_add(1, Ordering::SeqCst);
        let next = |counter: &AtomicUsize| {
            counter
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        };
        if next(&self.interfere) {
            self.put(ws, r#"{"tfe":{"tags":["theirs"]},"other":1}"#);
        }
        if next(&self.deleting) {
            self.delete_workspace(ws).await?;
        }
        if next(&self.busy) {
            return Err(StorageError::Unavailable("busy".into()));
        }
        if self.refuses_when_gone && !self.workspaces.lock().unwrap().contains(ws) {
            return Err(StorageError::Unavailable(format!(
                "workspace {ws:?} was deleted meanwhile; nothing was stored"
            )));
        }
        let current = self.metadata.lock().unwrap().get(ws).cloned();
        let fits = match (&expect, &current) {
            (Expect::Any, _) | (Expect::Absent, None) => true,
            (Expect::Version(v), Some(m)) => *v == m.version,
            _ => false,
        };
        if !fits {
            return Ok(false);
        }
        match content {
            Some(content) => {
                if self.writes_make_workspaces {
                    self.workspaces.lock().unwrap().insert(ws.into());
                }
                self.put(ws, &content)
            }
            None => {
                self.metadata.lock().unwrap().remove(ws);
            }
        }
        Ok(true)
    }
}

fn add(tag: &'static str) -> impl Fn(&mut WorkspaceMeta) + Send + 'static {
    move |m| {
        m.tags.insert(tag.into());
    }
}

#[tokio::test]
async fn metadata_lives_in_the_storage_and_replicas_agree_without_a_shared_dir() {
    let storage = Memory::with(&["w"]);
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let one = MetaStore::open(Some(a.path().into()));
    let two = MetaStore::open(Some(b.path().into()));
    one.update(&storage, "b", "w", add("app")).await.unwrap();
    two.update(&storage, "b", "w", add("db")).await.unwrap();
    let seen = one.get(&storage, "b", "w").await.unwrap();
    assert_eq!(seen.tags.into_iter().collect::<Vec<_>>(), ["app", "db"]);
    assert_eq!(storage.content("w").unwrap()["tfe"]["tags"][0], "app");
    // Nothing went to either replica's file.
    assert!(!a.path().join("tfe").join("workspaces.json").exists());
    assert!(!b.path().join("tfe").join("workspaces.json").exists());
}

#[tokio::test]
async fn a_change_retries_on_a_concurrent_writer_and_keeps_other_keys() {
    let storage = Memory::with(&["w"]);
    storage.put("w", r#"{"tfe":{"tags":["old"]},"other":1}"#);
    let store = MetaStore::open(None);
    storage.interfere.store(2, Ordering::SeqCst);
    let meta = store.update(&storage, "b", "w", add("mine")).await.unwrap();
    // Applied to what the other writer left, not to what was first read.
    assert_eq!(
        meta.tags.into_iter().collect::<Vec<_>>(),
        ["mine", "theirs"]
    );
    assert_eq!(storage.content("w").unwrap()["other"], 1);
    // A writer that always gets there first: a clear 409, nothing changed.
    storage.interfere.store(MAX_TRIES, Ordering::SeqCst);
    let refused = store
        .update(&storage, "b", "w", add("late"))
        .await
        .unwrap_err();
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    let kept = store.get(&storage, "b", "w").await.unwrap();
    assert!(!kept.tags.contains("late"));
    // Bounded: too many tags change nothing.
    let many = store
        .update(&storage, "b", "w", |m| {
            m.tags.extend((0..60).map(|i| format!("t{i}")))
        })
        .await
        .unwrap_err();
    assert_eq!(many.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

/// A delete between a change's read and its write: the write is defeated,
/// and the next try, finding no metadata, asks whether the workspace is
/// still there before writing any afresh (a guest keeping metadata in the
/// workspace's directory would make the workspace again with it).
#[tokio::test]
async fn a_change_of_a_workspace_deleted_meanwhile_writes_nothing_afresh() {
    let storage = Memory {
        writes_make_workspaces: true,
        ..Memory::with(&["w"])
    };
    storage.put("w", r#"{"tfe":{"tags":["old"]}}"#);
    deleted_under_the_first_write_is_a_404(&storage).await;
    assert!(storage.workspaces.lock().unwrap().is_empty());
}

/// A change of `w` on `storage`, whose first write meets a delete: a 404
/// saying so, after that write alone, and no metadata left.
async fn deleted_under_the_first_write_is_a_404(storage: &Memory) {
    let store = MetaStore::open(None);
    storage.deleting.store(1, Ordering::SeqCst);
    let refused = store
        .update(storage, "b", "w", add("late"))
        .await
        .unwrap_err();
    assert_eq!(refused.status(), StatusCode::NOT_FOUND, "{refused:?}");
    assert!(
        format!("{refused:?}").contains("deleted meanwhile"),
        "{refused:?}"
    );
    assert_eq!(
        storage.writes.load(Ordering::SeqCst),
        1,
        "only the defeated write"
    );
    assert!(storage.content("w").is_none());
}

/// A first change of a workspace (no metadata yet) deleted between the
/// host's look and the guest's write, by a guest that says so (503, as
/// the templates do): a 404 on the first try, as a retry would answer,
/// and nothing stored.
#[tokio::test]
async fn a_first_change_refused_as_deleted_meanwhile_is_a_404() {
    let storage = Memory {
        refuses_when_gone: true,
        ..Memory::with(&["w"])
    };
    deleted_under_the_first_write_is_a_404(&storage).await;
    // A storage that is unavailable with the workspace there: a 503.
    let storage = Memory::with(&["w"]);
    storage.busy.store(1, Ordering::SeqCst);
    let busy = MetaStore::open(None)
        .update(&storage, "b", "w", add("late"))
        .await
        .unwrap_err();
    assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE, "{busy:?}");
}

#[tokio::test]
async fn the_old_file_is_used_then_moved_to_the_storage() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tfe").join("workspaces.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    // As 0.2.x servers wrote it.
    std::fs::write(
        &file,
        r#"{"b":{"w":{"tags":["legacy"],"terraform_version":"1.11.4","created_at":"2026-01-01T00:00:00Z"}}}"#,
    )
    .unwrap();
    let storage = Memory::with(&["w"]);
    let store = MetaStore::open(Some(dir.path().into()));
    let seen = store.get(&storage, "b", "w").await.unwrap();
    assert!(seen.tags.contains("legacy"), "{seen:?}");
    assert_eq!(seen.terraform_version.as_deref(), Some("1.11.4"));
    store.update(&storage, "b", "w", add("new")).await.unwrap();
    let stored = storage.content("w").unwrap();
    assert_eq!(stored["tfe"]["tags"], serde_json::json!(["legacy", "new"]));
    assert_eq!(stored["tfe"]["terraform-version"], "1.11.4");
    // Moved: the file no longer has it.
    let left = std::fs::read_to_string(&file).unwrap();
    assert!(!left.contains("legacy"), "{left}");
}

#[tokio::test]
async fn a_storage_that_keeps_none_uses_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Memory {
        keeps_none: true,
        ..Memory::with(&["w"])
    };
    let store = MetaStore::open(Some(dir.path().into()));
    store.update(&storage, "b", "w", add("app")).await.unwrap();
    assert!(store.without("b"));
    let again = MetaStore::open(Some(dir.path().into()));
    assert!(
        again
            .get(&storage, "b", "w")
            .await
            .unwrap()
            .tags
            .contains("app")
    );
    // A workspace created again starts fresh; a delete forgets it.
    let fresh = WorkspaceMeta {
        terraform_version: Some("1.11.4".into()),
        ..WorkspaceMeta::default()
    };
    again
        .create(&storage, "b", "w", fresh.clone())
        .await
        .unwrap();
    assert_eq!(again.get(&storage, "b", "w").await.unwrap(), fresh);
    again.deleted("b", "w").await;
    assert_eq!(
        again.get(&storage, "b", "w").await.unwrap(),
        WorkspaceMeta::default()
    );
}

#[tokio::test]
async fn a_create_replaces_what_a_lost_race_left_and_a_gone_workspace_loses_its_metadata() {
    let storage = Memory::with(&["w"]);
    storage.put("w", r#"{"tfe":{"tags":["stale"]},"other":1}"#);
    let store = MetaStore::open(None);
    let fresh = WorkspaceMeta {
        tags: ["app".to_string()].into(),
        ..WorkspaceMeta::default()
    };
    store
        .create(&storage, "b", "w", fresh.clone())
        .await
        .unwrap();
    assert_eq!(store.get(&storage, "b", "w").await.unwrap(), fresh);
    assert_eq!(storage.content("w").unwrap()["other"], 1);
    // Still listed: kept.
    store.forget_if_gone(&storage, "b", "w").await;
    assert_eq!(store.get(&storage, "b", "w").await.unwrap(), fresh);
    // Gone (its state deleted where that deletes the workspace) with its
    // metadata left behind: removed.
    storage.workspaces.lock().unwrap().remove("w");
    store.forget_if_gone(&storage, "b", "w").await;
    assert_eq!(storage.content("w"), None);
    // The guest's delete-workspace takes it; a create after it starts
    // fresh even when this replica's file still has the old tags.
    storage.workspaces.lock().unwrap().insert("w".into());
    store
        .update(&storage, "b", "w", add("again"))
        .await
        .unwrap();
    storage.delete_workspace("w").await.unwrap();
    storage.create_workspace("w").await.unwrap();
    assert_eq!(
        store.get(&storage, "b", "w").await.unwrap(),
        WorkspaceMeta::default()
    );
}

/// A tag change that lands after the workspace was deleted (the caller
/// saw it, then a delete at either door, on any replica, came first):
/// refused (404), and nothing of it stays for a workspace created again
/// by that name outside the TFE door (a state push) to inherit.
#[tokio::test]
async fn a_change_racing_a_delete_leaves_no_metadata_behind() {
    let storage = Memory::with(&["w"]);
    let store = MetaStore::open(None);
    store.update(&storage, "b", "w", add("app")).await.unwrap();
    storage.delete_workspace("w").await.unwrap();
    let refused = store
        .update(&storage, "b", "w", add("late"))
        .await
        .unwrap_err();
    assert_eq!(refused.status(), StatusCode::NOT_FOUND);
    assert_eq!(storage.content("w"), None);
    storage.create_workspace("w").await.unwrap();
    assert_eq!(
        store.get(&storage, "b", "w").await.unwrap(),
        WorkspaceMeta::default()
    );
}
