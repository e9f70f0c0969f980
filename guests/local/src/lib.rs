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
//!
//! With `fsync` (the default) every change is on stable storage before it is
//! acknowledged: the file's data, then the directory entry naming it (a
//! rename or link is only durable once its directory is synced).
//!
//! Files a request left behind when it was stopped mid-way (a deadline, a
//! trap, a killed host) are swept once they are older than [`STALE_AFTER`],
//! so they do not count against the disk quota forever.

use std::hash::{BuildHasher, Hasher};
use std::io::{ErrorKind, Read};
use wasmstate_guest::fs::Dir;
use wasmstate_guest::{
    Backend, Config, Error, LockInfo, StateReader, StateWriter, register_backend,
};

const STATE_FILE: &str = "terraform.tfstate";
const LOCK_FILE: &str = "terraform.tfstate.lock";
/// Prefix of files being written, renamed or linked into place.
const TEMP_PREFIX: &str = ".tmp-";
/// Age past which a temporary file is debris: longer than any request may
/// run (the host caps a backend's `timeout_ms` at one hour).
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(2 * 3600);

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
            Ok(()) => self.sync_dir("."),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(Error::io("creating workspace directory", e)),
        }
    }

    /// Make the entries of `dir` durable (with `fsync` on).
    fn sync_dir(&self, dir: &str) -> Result<(), Error> {
        if !self.fsync {
            return Ok(());
        }
        self.root
            .sync_dir(dir)
            .map_err(|e| Error::io("syncing directory", e))
    }

    /// Remove temporary files in `workspace` older than [`STALE_AFTER`]:
    /// what requests stopped mid-way left. Best effort: a sweep that fails
    /// leaves them for the next.
    fn sweep_debris(&self, workspace: &str) {
        let Ok(entries) = self.root.list(workspace) else {
            return;
        };
        let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) else {
            return;
        };
        for (name, is_dir) in entries {
            if is_dir || !name.starts_with(TEMP_PREFIX) {
                continue;
            }
            let path = format!("{workspace}/{name}");
            if let Ok(Some(modified)) = self.root.modified_secs(&path)
                && now.as_secs().saturating_sub(modified) > STALE_AFTER.as_secs()
            {
                let _ = self.root.remove_file(&path);
            }
        }
    }

    /// Write what `source` yields to a fresh, uniquely named file beside
    /// the target and return its path; the caller renames or links it into
    /// place.
    fn write_temp(&self, workspace: &str, source: &mut dyn Read) -> Result<String, Error> {
        self.ensure_workspace(workspace)?;
        loop {
            let path = format!("{workspace}/{TEMP_PREFIX}{:016x}", random_u64());
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
                Ok(()) => return self.sync_dir(workspace),
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
        // The host copies the file into the state: it never passes
        // through this instance's memory.
        self.root
            .read_to_state(&state_path(workspace), out)
            .map_err(|e| Error::io("reading state", e))
    }

    fn write_from(
        &self,
        workspace: &str,
        state: &mut StateReader<'_>,
        lock_id: Option<&str>,
    ) -> Result<(), Error> {
        // Checked first so a refused write costs nothing (no temp file, no
        // workspace made, no quota taken)...
        self.check_lock(workspace, lock_id)?;
        let temp = self.write_temp(workspace, state)?;
        // ...and again once the body is written and synced, just before
        // the rename: a force-unlock that landed while a slow body was
        // written then refuses this write instead of letting it replace
        // what the new holder wrote meanwhile. What stays open is the gap
        // between this check and the rename (two host calls; longer only
        // if the guest loses its turn on the cores in between), as in
        // Terraform's own backends.
        let replaced = self.check_lock(workspace, lock_id).and_then(|()| {
            self.root
                .rename(&temp, &state_path(workspace))
                .map_err(|e| Error::io("replacing state", e))
        });
        if let Err(e) = replaced {
            let _ = self.root.remove_file(&temp);
            return Err(e);
        }
        // The rename is what makes the new state the state: durable only
        // once the directory holding both names is.
        self.sync_dir(workspace)
    }

    fn delete(&self, workspace: &str, lock_id: Option<&str>) -> Result<(), Error> {
        self.check_lock(workspace, lock_id)?;
        ignore_missing(
            self.root.remove_file(&state_path(workspace)),
            "deleting state",
        )?;
        self.sync_dir(workspace)
    }

    fn lock(&self, workspace: &str, info: &LockInfo) -> Result<(), Error> {
        let temp = self.write_temp(workspace, &mut &info.to_json()[..])?;
        let result = self.link_lock(workspace, &temp, info);
        let _ = self.root.remove_file(&temp);
        // Once per apply is often enough to keep debris bounded.
        self.sweep_debris(workspace);
        result
    }

    /// Remove the lock only if it is `id`'s; another holder's is refused
    /// untouched. A filesystem has no "remove if it is still this file", so
    /// the lock file is read again right before it is removed, and removed
    /// only if it is still the very lock read (its whole content, with the
    /// holder's id and creation time): a lock force-unlocked and taken by
    /// someone else since the first read is left alone. What remains is
    /// the moment between that second read and the removal.
    fn unlock(&self, workspace: &str, id: &str) -> Result<(), Error> {
        let path = lock_path(workspace);
        let read = |what: &str| self.root.read(&path).map_err(|e| Error::io(what, e));
        let Some(first) = read("reading lock file")? else {
            return Ok(());
        };
        match LockInfo::from_json(&first) {
            Ok(holder) if holder.id == id => {}
            Ok(holder) => return Err(Error::lock_mismatch(Some(holder))),
            Err(_) => return Err(Error::lock_mismatch(None)),
        }
        match read("reading lock file again")? {
            Some(again) if again == first => {}
            Some(other) => return Err(Error::lock_mismatch(LockInfo::from_json(&other).ok())),
            None => return Ok(()),
        }
        ignore_missing(self.root.remove_file(&path), "removing lock")?;
        self.sync_dir(workspace)
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
        self.sync_dir(workspace)?;
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
            Ok(()) => self.sync_dir(".").map(|()| true),
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
            .map_err(|e| Error::io("deleting workspace", e))?;
        self.sync_dir(".")
    }
}

register_backend!(Local);
