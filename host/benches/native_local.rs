//! The `local` guest's file layout and protocol, natively in Rust: the
//! baseline that tells what the sandbox costs. Same files, same syscalls
//! (temp file + fsync + rename for state, hard link for locks, the
//! workspace's directory synced after each; an unlock moves the lock
//! aside, checks it there and removes it).

use std::fs;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use wasmstate::backend::{LockInfo, Storage, StorageError, StorageResult};

/// Native twin of `guests/local`.
pub struct NativeLocal {
    root: PathBuf,
    next: AtomicU64,
}

fn io(context: &str, e: std::io::Error) -> StorageError {
    StorageError::Internal(format!("{context}: {e}"))
}

impl NativeLocal {
    /// Store under `root`.
    pub fn new(root: &Path) -> Self {
        fs::create_dir_all(root).unwrap();
        NativeLocal {
            root: root.to_path_buf(),
            next: AtomicU64::new(0),
        }
    }

    fn write_temp(&self, ws: &str, bytes: &[u8]) -> StorageResult<PathBuf> {
        let dir = self.root.join(ws);
        fs::create_dir_all(&dir).map_err(|e| io("mkdir", e))?;
        let path = dir.join(format!(
            ".tmp-{}",
            self.next.fetch_add(1, Ordering::Relaxed)
        ));
        let mut file = fs::File::create_new(&path).map_err(|e| io("create", e))?;
        file.write_all(bytes).map_err(|e| io("write", e))?;
        file.sync_all().map_err(|e| io("fsync", e))?;
        Ok(path)
    }

    fn holder(&self, ws: &str) -> StorageResult<Option<LockInfo>> {
        match fs::read(self.root.join(ws).join("terraform.tfstate.lock")) {
            Ok(bytes) => Ok(Some(
                serde_json::from_slice(&bytes)
                    .map_err(|e| StorageError::Internal(e.to_string()))?,
            )),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("read lock", e)),
        }
    }

    /// Make the directory entries of `ws` durable, as the guest does.
    fn sync_dir(&self, ws: &str) -> StorageResult<()> {
        fs::File::open(self.root.join(ws))
            .and_then(|dir| dir.sync_all())
            .map_err(|e| io("fsync dir", e))
    }

    fn check_lock(&self, ws: &str, lock_id: Option<&str>) -> StorageResult<()> {
        match (self.holder(ws)?, lock_id) {
            (Some(h), Some(id)) if h.id == id => Ok(()),
            (Some(h), _) => Err(StorageError::Locked(h)),
            (None, Some(_)) => Err(StorageError::LockMismatch(None)),
            (None, None) => Ok(()),
        }
    }
}

impl Storage for NativeLocal {
    async fn read(&self, ws: &str) -> StorageResult<Option<Vec<u8>>> {
        match fs::read(self.root.join(ws).join("terraform.tfstate")) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("read", e)),
        }
    }

    /// What a native backend would do for the stale-write guard: read
    /// only the beginning of the file.
    async fn read_prefix(&self, ws: &str, max: usize) -> StorageResult<Option<Vec<u8>>> {
        use std::io::Read;
        let file = match fs::File::open(self.root.join(ws).join("terraform.tfstate")) {
            Ok(file) => file,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("open", e)),
        };
        let mut prefix = Vec::with_capacity(max);
        file.take(max as u64)
            .read_to_end(&mut prefix)
            .map_err(|e| io("read", e))?;
        Ok(Some(prefix))
    }

    async fn write(
        &self,
        ws: &str,
        state: bytes::Bytes,
        lock_id: Option<&str>,
    ) -> StorageResult<()> {
        self.check_lock(ws, lock_id)?;
        let temp = self.write_temp(ws, &state)?;
        fs::rename(temp, self.root.join(ws).join("terraform.tfstate"))
            .map_err(|e| io("rename", e))?;
        self.sync_dir(ws)
    }

    async fn delete(&self, ws: &str, lock_id: Option<&str>) -> StorageResult<()> {
        self.check_lock(ws, lock_id)?;
        let _ = fs::remove_file(self.root.join(ws).join("terraform.tfstate"));
        Ok(())
    }

    async fn lock(&self, ws: &str, info: LockInfo) -> StorageResult<()> {
        let temp = self.write_temp(ws, &serde_json::to_vec(&info).unwrap())?;
        let linked = fs::hard_link(&temp, self.root.join(ws).join("terraform.tfstate.lock"));
        let _ = fs::remove_file(&temp);
        match linked {
            Ok(()) => self.sync_dir(ws),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => match self.holder(ws)? {
                Some(h) if h.id == info.id => Ok(()),
                Some(h) => Err(StorageError::Locked(h)),
                None => Err(StorageError::Unavailable("retry".into())),
            },
            Err(e) => Err(io("link", e)),
        }
    }

    async fn unlock(&self, ws: &str, id: &str) -> StorageResult<()> {
        match self.holder(ws)? {
            None => Ok(()),
            Some(h) if h.id == id => {
                let aside = self.root.join(ws).join(".unlocking");
                let _ = fs::rename(self.root.join(ws).join("terraform.tfstate.lock"), &aside);
                let _ = fs::read(&aside);
                let _ = fs::remove_file(&aside);
                self.sync_dir(ws)
            }
            Some(h) => Err(StorageError::LockMismatch(Some(h))),
        }
    }

    async fn current_lock(&self, ws: &str) -> StorageResult<Option<LockInfo>> {
        self.holder(ws)
    }

    async fn force_unlock(&self, ws: &str) -> StorageResult<Option<LockInfo>> {
        let holder = self.holder(ws)?;
        let _ = fs::remove_file(self.root.join(ws).join("terraform.tfstate.lock"));
        Ok(holder)
    }

    async fn list_workspaces(&self) -> StorageResult<Vec<String>> {
        Ok(fs::read_dir(&self.root)
            .map_err(|e| io("list", e))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect())
    }

    async fn create_workspace(&self, name: &str) -> StorageResult<bool> {
        match fs::create_dir(self.root.join(name)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(io("mkdir", e)),
        }
    }

    async fn delete_workspace(&self, name: &str) -> StorageResult<()> {
        fs::remove_dir_all(self.root.join(name)).map_err(|e| io("rmdir", e))
    }
}
