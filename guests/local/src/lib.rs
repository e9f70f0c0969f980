//! wasmstate's default storage guest: one directory per workspace inside the
//! single directory the host grants (mounted at `/data`):
//!
//! ```text
//! /data/<workspace>/terraform.tfstate        the state
//! /data/<workspace>/terraform.tfstate.lock   LockInfo JSON while locked
//! ```
//!
//! Correctness across threads and host processes rests on two atomic
//! filesystem operations: `rename` (a state is replaced whole, never torn)
//! and `link` (creates the lock file with its full content, or fails because
//! it exists — so a lock is never granted twice and never seen half-written).

use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use wasmstate_guest::{Backend, Config, Error, LockInfo, register_backend};

const ROOT: &str = "/data";
const STATE_FILE: &str = "terraform.tfstate";
const LOCK_FILE: &str = "terraform.tfstate.lock";

struct Local {
    root: PathBuf,
    fsync: bool,
}

impl Local {
    fn dir(&self, workspace: &str) -> PathBuf {
        self.root.join(workspace)
    }

    fn state_path(&self, workspace: &str) -> PathBuf {
        self.dir(workspace).join(STATE_FILE)
    }

    fn lock_path(&self, workspace: &str) -> PathBuf {
        self.dir(workspace).join(LOCK_FILE)
    }

    /// Write `bytes` to a fresh, uniquely named file beside the target and
    /// return its path; the caller renames or links it into place.
    fn write_temp(&self, workspace: &str, bytes: &[u8]) -> Result<PathBuf, Error> {
        let dir = self.dir(workspace);
        fs::create_dir_all(&dir).map_err(|e| Error::io("creating workspace directory", e))?;
        loop {
            let path = dir.join(format!(".tmp-{:016x}", random_u64()));
            let mut file = match fs::File::create_new(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io("creating temporary file", e)),
            };
            let written = file
                .write_all(bytes)
                .and_then(|()| if self.fsync { file.sync_all() } else { Ok(()) });
            if let Err(e) = written {
                let _ = fs::remove_file(&path);
                return Err(Error::io("writing temporary file", e));
            }
            return Ok(path);
        }
    }

    /// Link the prepared lock file `temp` into place: succeeds only if no
    /// lock exists. When one exists but is gone by the time we read it (its
    /// holder just unlocked), try again rather than fail the caller.
    fn link_lock(&self, workspace: &str, temp: &Path, info: &LockInfo) -> Result<(), Error> {
        const ATTEMPTS: usize = 100;
        for _ in 0..ATTEMPTS {
            match fs::hard_link(temp, self.lock_path(workspace)) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => match self.holder(workspace)? {
                    // A retry of a lock we already hold.
                    Some(holder) if holder.id == info.id => return Ok(()),
                    Some(holder) => return Err(Error::Locked(holder)),
                    None => continue,
                },
                Err(e) => return Err(Error::io("creating lock file", e)),
            }
        }
        Err(Error::Unavailable(format!(
            "the lock of workspace {workspace:?} changed hands {ATTEMPTS} times while being taken"
        )))
    }

    /// The lock holder, `None` when unlocked.
    fn holder(&self, workspace: &str) -> Result<Option<LockInfo>, Error> {
        match fs::read(self.lock_path(workspace)) {
            Ok(bytes) => LockInfo::from_json(&bytes).map(Some).map_err(|e| {
                Error::Internal(format!(
                    "lock file of workspace {workspace:?} is not LockInfo JSON ({e}); \
                     force-unlock it to recover"
                ))
            }),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("reading lock file", e)),
        }
    }

    /// Refuse a change unless `lock_id` matches the lock (or nothing is
    /// locked and no id was presented).
    fn check_lock(&self, workspace: &str, lock_id: Option<&str>) -> Result<(), Error> {
        match (self.holder(workspace)?, lock_id) {
            (Some(holder), Some(id)) if holder.id == id => Ok(()),
            (Some(holder), _) => Err(Error::Locked(holder)),
            (None, Some(_)) => Err(Error::LockMismatch(None)),
            (None, None) => Ok(()),
        }
    }
}

/// A random number from the host (WASI random seeds std's hasher keys).
fn random_u64() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(0);
    hasher.finish()
}

fn ignore_missing(result: std::io::Result<()>, context: &str) -> Result<(), Error> {
    match result {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(Error::io(context, e)),
        _ => Ok(()),
    }
}

impl Backend for Local {
    fn new(config: &Config) -> Result<Self, Error> {
        config.reject_unknown(&["fsync"])?;
        Ok(Local {
            root: PathBuf::from(ROOT),
            fsync: config.parse_or("fsync", true)?,
        })
    }

    fn read(&self, workspace: &str) -> Result<Option<Vec<u8>>, Error> {
        match fs::read(self.state_path(workspace)) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("reading state", e)),
        }
    }

    fn write(&self, workspace: &str, state: &[u8], lock_id: Option<&str>) -> Result<(), Error> {
        self.check_lock(workspace, lock_id)?;
        let temp = self.write_temp(workspace, state)?;
        fs::rename(&temp, self.state_path(workspace)).map_err(|e| {
            let _ = fs::remove_file(&temp);
            Error::io("replacing state", e)
        })
    }

    fn delete(&self, workspace: &str, lock_id: Option<&str>) -> Result<(), Error> {
        self.check_lock(workspace, lock_id)?;
        ignore_missing(
            fs::remove_file(self.state_path(workspace)),
            "deleting state",
        )
    }

    fn lock(&self, workspace: &str, info: &LockInfo) -> Result<(), Error> {
        let temp = self.write_temp(workspace, &info.to_json())?;
        let result = self.link_lock(workspace, &temp, info);
        let _ = fs::remove_file(&temp);
        result
    }

    fn unlock(&self, workspace: &str, id: &str) -> Result<(), Error> {
        match self.holder(workspace)? {
            None => Ok(()),
            Some(holder) if holder.id == id => {
                ignore_missing(fs::remove_file(self.lock_path(workspace)), "removing lock")
            }
            Some(holder) => Err(Error::LockMismatch(Some(holder))),
        }
    }

    fn current_lock(&self, workspace: &str) -> Result<Option<LockInfo>, Error> {
        self.holder(workspace)
    }

    fn force_unlock(&self, workspace: &str) -> Result<Option<LockInfo>, Error> {
        let holder = self.holder(workspace);
        ignore_missing(fs::remove_file(self.lock_path(workspace)), "removing lock")?;
        // A corrupt lock file is still removed: that is what force is for.
        Ok(holder.unwrap_or(None))
    }

    fn list_workspaces(&self) -> Result<Vec<String>, Error> {
        let entries = match fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(e) => return Err(Error::io("listing workspaces", e)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| Error::io("listing workspaces", e))?;
            let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_dir && !name.starts_with('.') {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn create_workspace(&self, name: &str) -> Result<bool, Error> {
        match fs::create_dir(self.dir(name)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(Error::io("creating workspace", e)),
        }
    }

    fn delete_workspace(&self, name: &str) -> Result<(), Error> {
        if !self.dir(name).is_dir() {
            return Err(Error::NotFound);
        }
        if let Some(holder) = self.holder(name)? {
            return Err(Error::Locked(holder));
        }
        fs::remove_dir_all(self.dir(name)).map_err(|e| Error::io("deleting workspace", e))
    }
}

register_backend!(Local);
