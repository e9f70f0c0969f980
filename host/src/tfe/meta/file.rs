//! The per-replica metadata file, `<data_dir>/tfe/workspaces.json`: where
//! TFE metadata lives for a backend whose storage keeps none (a guest
//! built for a contract before 0.3.0, or one that answers so), and where
//! metadata written before 0.3.0 is found until it moves to the storage.
//!
//! Shared safely by servers on one data directory: every change re-reads
//! the file under an exclusive file lock.

use super::{MAX_TAGS, WorkspaceMeta};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// backend → workspace → metadata.
type All = BTreeMap<String, BTreeMap<String, WorkspaceMeta>>;

/// The replica's metadata file. Every change re-reads it under an
/// exclusive file lock and writes it back through a uniquely named
/// temporary file, so servers sharing the data directory never erase each
/// other's changes; a file that cannot be read is never overwritten.
/// Reads answer from what this server last loaded or wrote.
pub struct FileStore {
    path: Option<PathBuf>,
    all: Mutex<All>,
}

impl FileStore {
    /// The metadata kept in `data_dir`; `None`: in memory only (tests).
    /// A file that cannot be read is logged, kept as it is, and every
    /// change refused until it is fixed or removed.
    pub fn open(data_dir: Option<PathBuf>) -> Self {
        let path = data_dir.map(|d| d.join("tfe").join("workspaces.json"));
        let all = match path.as_deref().map(load) {
            Some(Ok(all)) => all,
            Some(Err(e)) => {
                tracing::error!(error = %e, "TFE workspace tags cannot be changed until the file is fixed");
                All::default()
            }
            None => All::default(),
        };
        FileStore {
            path,
            all: Mutex::new(all),
        }
    }

    /// `backend`/`workspace`'s metadata (empty when none is kept).
    pub fn get(&self, backend: &str, workspace: &str) -> WorkspaceMeta {
        self.find(backend, workspace).unwrap_or_default()
    }

    /// `backend`/`workspace`'s metadata, `None` when the file has none.
    pub fn find(&self, backend: &str, workspace: &str) -> Option<WorkspaceMeta> {
        let all = self.all.lock().unwrap_or_else(|e| e.into_inner());
        all.get(backend).and_then(|b| b.get(workspace)).cloned()
    }

    /// Change `backend`/`workspace`'s metadata with `change` and save it
    /// (file work off the async workers); nothing changes when saving
    /// fails, or when the change leaves more than [`MAX_TAGS`] tags
    /// (`InvalidInput`).
    pub async fn update(
        self: &Arc<Self>,
        backend: &str,
        workspace: &str,
        change: impl FnOnce(&mut WorkspaceMeta) + Send + 'static,
    ) -> std::io::Result<WorkspaceMeta> {
        let (backend, workspace) = (backend.to_string(), workspace.to_string());
        self.modify(move |all| {
            let meta = all
                .entry(backend)
                .or_default()
                .entry(workspace)
                .or_default();
            change(meta);
            if meta.tags.len() > MAX_TAGS {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "a workspace has at most {MAX_TAGS} tags; remove some first (nothing was changed)"
                    ),
                ));
            }
            Ok(meta.clone())
        })
        .await
    }

    /// Forget `backend`/`workspace` (deleted).
    pub async fn remove(self: &Arc<Self>, backend: &str, workspace: &str) -> std::io::Result<()> {
        let (backend, workspace) = (backend.to_string(), workspace.to_string());
        self.modify(move |all| {
            if let Some(b) = all.get_mut(&backend) {
                b.remove(&workspace);
            }
            Ok(())
        })
        .await
    }

    /// Apply `change` to the file's current content, under the file lock,
    /// and save it, on a blocking thread.
    async fn modify<T: Send + 'static>(
        self: &Arc<Self>,
        change: impl FnOnce(&mut All) -> std::io::Result<T> + Send + 'static,
    ) -> std::io::Result<T> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut all = store.all.lock().unwrap_or_else(|e| e.into_inner());
            let Some(path) = &store.path else {
                let mut next = all.clone();
                let answer = change(&mut next)?;
                *all = next;
                return Ok(answer);
            };
            let dir = path.parent().expect("the file is in a folder");
            std::fs::create_dir_all(dir)?;
            // Held until the new file is in place: another server's change
            // waits, then reads this one's.
            let lock = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(dir.join("workspaces.json.lock"))?;
            lock.lock()?;
            let mut next = load(path)?;
            let answer = change(&mut next)?;
            save(path, &next)?;
            *all = next;
            Ok(answer)
        })
        .await
        .map_err(std::io::Error::other)?
    }
}

/// The file's content: none when it does not exist; an error (which
/// leaves it untouched) when it cannot be read.
fn load(path: &std::path::Path) -> std::io::Result<All> {
    let unreadable = |e: &dyn std::fmt::Display| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "the TFE workspace metadata file {} is unreadable ({e}): fix it or move it away (its tags are then lost); nothing was changed",
                path.display()
            ),
        )
    };
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| unreadable(&e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(All::default()),
        Err(e) => Err(unreadable(&e)),
    }
}

/// Written whole to a uniquely named temporary file and renamed over the
/// old one, so a crash leaves the old file or the new one.
fn save(path: &std::path::Path, all: &All) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().expect("the file is in a folder");
    let bytes = serde_json::to_vec_pretty(all).map_err(std::io::Error::other)?;
    let mut temp = tempfile::NamedTempFile::new_in(dir)?;
    temp.write_all(&bytes)?;
    temp.as_file().sync_all()?;
    temp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn metadata_survives_a_restart_and_deletes_and_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FileStore::open(Some(dir.path().to_path_buf())));
        store
            .update("b", "w", |m| {
                m.tags.insert("app".into());
            })
            .await
            .unwrap();
        // Another server on the same directory, opened before: its change
        // keeps this one's.
        let other = Arc::new(FileStore::open(Some(dir.path().to_path_buf())));
        store
            .update("b", "v", |m| {
                m.tags.insert("late".into());
            })
            .await
            .unwrap();
        other
            .update("b", "w", |m| {
                m.tags.insert("more".into());
            })
            .await
            .unwrap();
        let again = Arc::new(FileStore::open(Some(dir.path().to_path_buf())));
        assert_eq!(again.get("b", "w").tags.len(), 2);
        assert!(again.get("b", "v").tags.contains("late"));
        let too_many = again
            .update("b", "w", |m| {
                m.tags.extend((0..60).map(|i| format!("t{i}")))
            })
            .await
            .unwrap_err();
        assert_eq!(too_many.kind(), std::io::ErrorKind::InvalidInput);
        assert_eq!(again.get("b", "w").tags.len(), 2);
        again.remove("b", "w").await.unwrap();
        assert_eq!(
            FileStore::open(Some(dir.path().to_path_buf())).get("b", "w"),
            WorkspaceMeta::default()
        );
    }

    #[tokio::test]
    async fn an_unreadable_file_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tfe").join("workspaces.json");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, b"{broken").unwrap();
        let store = Arc::new(FileStore::open(Some(dir.path().to_path_buf())));
        let refused = store
            .update("b", "w", |m| {
                m.tags.insert("x".into());
            })
            .await
            .unwrap_err();
        assert!(refused.to_string().contains("unreadable"), "{refused}");
        assert_eq!(std::fs::read(&file).unwrap(), b"{broken");
    }
}
