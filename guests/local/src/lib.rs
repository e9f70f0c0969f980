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

use std::hash::{BuildHasher, Hasher};
use std::io::{ErrorKind, Read};
use wasmstate_guest::fs::Dir;
use wasmstate_guest::{
    Backend, Config, Error, LockInfo, StateReader, StateWriter, register_backend,
};

const STATE_FILE: &str = "terraform.tfstate";
const LOCK_FILE: &str = "terraform.tfstate.lock";

struct Local {
    root: Dir,
    fsync: bool,
}

fn state_path(workspace: &str) -> String {
    format!("{workspace}/{STATE_FILE}")
}

fn lock_path(workspace: &str) -> String {
    format!("{workspace}/{LOCK_FILE}")
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

impl Local {
    fn ensure_workspace(&self, workspace: &str) -> Result<(), Error> {
        match self.root.create_dir(workspace) {
            Err(e) if e.kind() != ErrorKind::AlreadyExists => {
                Err(Error::io("creating workspace directory", e))
            }
            _ => Ok(()),
        }
    }

    /// Write what `source` yields to a fresh, uniquely named file beside
    /// the target and return its path; the caller renames or links it into
    /// place.
    fn write_temp(&self, workspace: &str, source: &mut dyn Read) -> Result<String, Error> {
        self.ensure_workspace(workspace)?;
        loop {
            let path = format!("{workspace}/.tmp-{:016x}", random_u64());
            match self.root.create_new_from(&path, source, self.fsync) {
                Ok(()) => return Ok(path),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    let _ = self.root.remove_file(&path);
                    return Err(Error::io("writing temporary file", e));
                }
            }
        }
    }

    /// The lock holder, `None` when unlocked.
    fn holder(&self, workspace: &str) -> Result<Option<LockInfo>, Error> {
        match self.root.read(&lock_path(workspace)) {
            Ok(Some(bytes)) => LockInfo::from_json(&bytes).map(Some).map_err(|e| {
                Error::Internal(format!(
                    "lock file of workspace {workspace:?} is not LockInfo JSON ({e}); \
                     force-unlock it to recover"
                ))
            }),
            Ok(None) => Ok(None),
            Err(e) => Err(Error::io("reading lock file", e)),
        }
    }

    /// Refuse a change unless `lock_id` matches the lock (or nothing is
    /// locked and no id was presented).
    fn check_lock(&self, workspace: &str, lock_id: Option<&str>) -> Result<(), Error> {
        wasmstate_guest::check_lock(self.holder(workspace)?, lock_id)
    }

    /// Link the prepared lock file `temp` into place: succeeds only if no
    /// lock exists. When one exists but is gone by the time we read it (its
    /// holder just unlocked), try again rather than fail the caller.
    fn link_lock(&self, workspace: &str, temp: &str, info: &LockInfo) -> Result<(), Error> {
        const ATTEMPTS: usize = 100;
        for _ in 0..ATTEMPTS {
            match self.root.hard_link(temp, &lock_path(workspace)) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => match self.holder(workspace)? {
                    // A retry of a lock we already hold.
                    Some(holder) if holder.id == info.id => return Ok(()),
                    Some(holder) => return Err(Error::locked(holder)),
                    None => continue,
                },
                Err(e) => return Err(Error::io("creating lock file", e)),
            }
        }
        Err(Error::Unavailable(format!(
            "the lock of workspace {workspace:?} changed hands {ATTEMPTS} times while being taken"
        )))
    }
}

impl Backend for Local {
    fn new(config: &Config) -> Result<Self, Error> {
        config.reject_unknown(&["fsync"])?;
        let fsync = config.parse_or("fsync", true)?;
        let root = Dir::granted().map_err(|e| Error::Internal(e.to_string()))?;
        Ok(Local { root, fsync })
    }

    fn read_into(&self, workspace: &str, out: &mut StateWriter<'_>) -> Result<bool, Error> {
        self.root
            .read_to(&state_path(workspace), out)
            .map_err(|e| Error::io("reading state", e))
    }

    fn write_from(
        &self,
        workspace: &str,
        state: &mut StateReader<'_>,
        lock_id: Option<&str>,
    ) -> Result<(), Error> {
        self.check_lock(workspace, lock_id)?;
        let temp = self.write_temp(workspace, state)?;
        self.root
            .rename(&temp, &state_path(workspace))
            .map_err(|e| {
                let _ = self.root.remove_file(&temp);
                Error::io("replacing state", e)
            })
    }

    fn delete(&self, workspace: &str, lock_id: Option<&str>) -> Result<(), Error> {
        self.check_lock(workspace, lock_id)?;
        ignore_missing(
            self.root.remove_file(&state_path(workspace)),
            "deleting state",
        )
    }

    fn lock(&self, workspace: &str, info: &LockInfo) -> Result<(), Error> {
        let temp = self.write_temp(workspace, &mut &info.to_json()[..])?;
        let result = self.link_lock(workspace, &temp, info);
        let _ = self.root.remove_file(&temp);
        result
    }

    fn unlock(&self, workspace: &str, id: &str) -> Result<(), Error> {
        match self.holder(workspace)? {
            None => Ok(()),
            Some(holder) if holder.id == id => ignore_missing(
                self.root.remove_file(&lock_path(workspace)),
                "removing lock",
            ),
            Some(holder) => Err(Error::lock_mismatch(Some(holder))),
        }
    }

    fn current_lock(&self, workspace: &str) -> Result<Option<LockInfo>, Error> {
        self.holder(workspace)
    }

    fn force_unlock(&self, workspace: &str) -> Result<Option<LockInfo>, Error> {
        let holder = self.holder(workspace);
        ignore_missing(
            self.root.remove_file(&lock_path(workspace)),
            "removing lock",
        )?;
        // A corrupt lock file is still removed: that is what force is for.
        Ok(holder.unwrap_or(None))
    }

    fn list_workspaces(&self) -> Result<Vec<String>, Error> {
        let entries = self
            .root
            .list(".")
            .map_err(|e| Error::io("listing workspaces", e))?;
        Ok(entries
            .into_iter()
            .filter(|(name, is_dir)| *is_dir && !name.starts_with('.'))
            .map(|(name, _)| name)
            .collect())
    }

    fn create_workspace(&self, name: &str) -> Result<bool, Error> {
        match self.root.create_dir(name) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(Error::io("creating workspace", e)),
        }
    }

    fn delete_workspace(&self, name: &str) -> Result<(), Error> {
        if !self.root.is_dir(name) {
            return Err(Error::NotFound);
        }
        if let Some(holder) = self.holder(name)? {
            return Err(Error::locked(holder));
        }
        self.root
            .remove_dir_all(name)
            .map_err(|e| Error::io("deleting workspace", e))
    }
}

register_backend!(Local);
