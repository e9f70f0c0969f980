//! Version history kept by the host: after every successful write, the
//! bytes handed to the guest (ciphertext when encryption is on) are copied
//! to `<data_dir>/history/<backend>/<workspace>/`, keeping the newest
//! `keep` per workspace.
//!
//! Each replica keeps the writes that went through it; replicas that share
//! the data directory share the history.

use crate::backend::Version;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The history folder of one backend.
#[derive(Debug, Clone)]
pub struct History {
    root: PathBuf,
    keep: usize,
}

const SUFFIX: &str = ".tfstate";

impl History {
    /// One line for the console.
    pub fn describe(&self) -> String {
        format!("the newest {} versions of each workspace", self.keep)
    }

    /// Keep `keep` versions per workspace under `root`.
    pub fn new(root: PathBuf, keep: usize) -> Self {
        History { root, keep }
    }

    fn dir(&self, workspace: &str) -> PathBuf {
        self.root.join(workspace)
    }

    /// Record `stored` (a state with `serial`) as the newest version of
    /// `workspace`, then prune.
    pub async fn record(
        &self,
        workspace: &str,
        stored: bytes::Bytes,
        serial: Option<u64>,
    ) -> io::Result<()> {
        let dir = self.dir(workspace);
        let keep = self.keep;
        tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&dir)?;
            let serial = serial.map_or_else(|| "none".to_string(), |s| s.to_string());
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            let id = format!("{:013}-{serial}", now.as_millis());
            // Write whole, then rename: a listed version is always complete.
            let mut temp = tempfile::NamedTempFile::new_in(&dir)?;
            std::io::Write::write_all(&mut temp, &stored)?;
            temp.persist(dir.join(format!("{id}{SUFFIX}")))
                .map_err(|e| e.error)?;
            prune(&dir, keep)
        })
        .await
        .map_err(io::Error::other)?
    }

    /// Kept versions of `workspace`, newest first.
    pub async fn list(&self, workspace: &str) -> io::Result<Vec<Version>> {
        let dir = self.dir(workspace);
        tokio::task::spawn_blocking(move || {
            let mut versions = Vec::new();
            for (id, path) in ids(&dir)? {
                let Some((ms, serial)) = parse_id(&id) else {
                    continue;
                };
                // A concurrent prune may remove a file between the listing
                // and this call: skip it.
                let Ok(meta) = std::fs::metadata(&path) else {
                    continue;
                };
                versions.push(Version {
                    id,
                    serial,
                    created_unix_ms: ms,
                    bytes: meta.len(),
                    written_by: None,
                });
            }
            versions.reverse();
            Ok(versions)
        })
        .await
        .map_err(io::Error::other)?
    }

    /// The lineage, `started` (0 where none) and serial of the newest kept
    /// version of `workspace` (read from its clear fields, sealed or not),
    /// if it has a serial.
    pub async fn newest_version(&self, workspace: &str) -> Option<(Option<String>, u64, u64)> {
        let newest = self.list(workspace).await.ok()?.into_iter().next()?;
        newest.serial?;
        let stored = self.read(workspace, &newest.id).await.ok()??;
        let header = super::envelope::StateHeader::of(&stored);
        let started = match super::envelope::is_sealed(&stored) {
            true => super::envelope::label(&stored).map_or(0, |l| l.started),
            false => 0,
        };
        Some((header.lineage, started, header.serial?))
    }

    /// The stored bytes of version `id`, `None` when it is not kept (or the
    /// id is not one this history could have made).
    pub async fn read(&self, workspace: &str, id: &str) -> io::Result<Option<Vec<u8>>> {
        if parse_id(id).is_none() {
            return Ok(None);
        }
        match tokio::fs::read(self.dir(workspace).join(format!("{id}{SUFFIX}"))).await {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl History {
    /// The history of another backend kept beside this one (the same
    /// `history` folder): where a renamed backend's versions were kept.
    pub fn sibling(&self, backend: &str) -> History {
        let parent = self.root.parent().unwrap_or(&self.root);
        History::new(parent.join(backend), self.keep)
    }

    /// Put `stored` in place of version `id` of `workspace`, whole (written
    /// beside it, then renamed). `create`: also when there is no such
    /// version yet (moving one in); else `false` when it is gone (pruned)
    /// and nothing was written. The check and the rename are not one step:
    /// a prune between them leaves the version back, one above `keep`,
    /// until the next prune.
    pub async fn put(
        &self,
        workspace: &str,
        id: &str,
        stored: Vec<u8>,
        create: bool,
    ) -> io::Result<bool> {
        if parse_id(id).is_none() {
            return Err(io::Error::other(format!("{id:?} is not a version id")));
        }
        let dir = self.dir(workspace);
        let path = dir.join(format!("{id}{SUFFIX}"));
        tokio::task::spawn_blocking(move || {
            if !create && !path.exists() {
                return Ok(false);
            }
            std::fs::create_dir_all(&dir)?;
            let mut temp = tempfile::NamedTempFile::new_in(&dir)?;
            std::io::Write::write_all(&mut temp, &stored)?;
            temp.as_file().sync_all()?;
            temp.persist(&path).map_err(|e| e.error)?;
            Ok(true)
        })
        .await
        .map_err(io::Error::other)?
    }

    /// Remove version `id` of `workspace` (gone already is fine).
    pub async fn remove(&self, workspace: &str, id: &str) -> io::Result<()> {
        if parse_id(id).is_none() {
            return Ok(());
        }
        match tokio::fs::remove_file(self.dir(workspace).join(format!("{id}{SUFFIX}"))).await {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// `(id, path)` of every version file, oldest first.
fn ids(dir: &Path) -> io::Result<Vec<(String, PathBuf)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut ids = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(id) = name.strip_suffix(SUFFIX)
            && parse_id(id).is_some()
        {
            ids.push((id.to_string(), entry.path()));
        }
    }
    // Zero-padded milliseconds first, so text order is time order.
    ids.sort();
    Ok(ids)
}

fn prune(dir: &Path, keep: usize) -> io::Result<()> {
    let ids = ids(dir)?;
    for (_, path) in ids.iter().take(ids.len().saturating_sub(keep)) {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// `<13 digits>-<serial digits | none>` → (ms, serial). Anything else is
/// not an id (which also keeps path tricks out of `read`).
fn parse_id(id: &str) -> Option<(u64, Option<u64>)> {
    let (ms, serial) = id.split_once('-')?;
    if ms.len() != 13 || !ms.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let serial = match serial {
        "none" => None,
        s if !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit()) => {
            Some(s.parse().ok()?)
        }
        _ => return None,
    };
    Some((ms.parse().ok()?, serial))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(serial: u64) -> Vec<u8> {
        format!(r#"{{"version":4,"serial":{serial},"lineage":"l"}}"#).into_bytes()
    }

    #[tokio::test]
    async fn keeps_the_newest_versions_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let history = History::new(dir.path().to_path_buf(), 3);
        for serial in 1..=5 {
            history
                .record("prod", state(serial).into(), Some(serial))
                .await
                .unwrap();
        }
        let versions = history.list("prod").await.unwrap();
        let serials: Vec<_> = versions.iter().map(|v| v.serial).collect();
        assert_eq!(serials, [Some(5), Some(4), Some(3)]);
        let newest = history.read("prod", &versions[0].id).await.unwrap();
        assert_eq!(newest, Some(state(5)));
        assert!(history.list("other").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn ids_that_history_never_made_are_not_read() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret"), b"x").unwrap();
        let history = History::new(dir.path().join("h"), 3);
        for id in ["../../secret", "1-2", "0000000000001-../x", ""] {
            assert_eq!(history.read("prod", id).await.unwrap(), None, "{id}");
        }
    }
}
