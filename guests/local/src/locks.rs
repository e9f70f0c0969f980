//! A workspace's lock: a file linked into place (so it exists whole or not
//! at all, and only one link wins), removed only by the holder it names,
//! and taken by a workspace's delete too, as Terraform's CLI takes it
//! before it deletes one.

use super::{Body, LOCK_FILE, Local, SWEEP_EVERY, ignore_missing, lock_path, random_u64};
use std::io::ErrorKind;
use wasmstate_guest::fs::Dir;
use wasmstate_guest::{Error, LockInfo};

/// How many times a lock is taken afresh when its workspace's directory
/// (or the temporary file in it) went away while it was being taken: a
/// workspace delete ran beside it, and the lock comes after it.
const VANISHED_TRIES: usize = 3;

/// What a lock does when its workspace's directory does not exist.
#[derive(Clone, Copy)]
pub enum Missing {
    /// Make it: a lock may be a workspace's first call.
    Make,
    /// Answer `NotFound`: a delete locks only a workspace that exists.
    NotFound,
}

/// The lock holder of the lock file at `path` in `dir` (of `workspace`),
/// `None` when unlocked.
pub fn holder_at(dir: &Dir, path: &str, workspace: &str) -> Result<Option<LockInfo>, Error> {
    match dir.read(path) {
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

/// One try at a lock: taken or refused, or its directory went away.
enum Attempt {
    Done(Result<(), Error>),
    Vanished,
}

impl Local {
    /// The lock holder, `None` when unlocked.
    pub fn holder(&self, workspace: &str) -> Result<Option<LockInfo>, Error> {
        holder_at(&self.root, &lock_path(workspace), workspace)
    }

    /// Take `workspace`'s lock for `info` (`Locked` with the holder when
    /// another holds it).
    pub fn take_lock(
        &self,
        workspace: &str,
        info: &LockInfo,
        missing: Missing,
    ) -> Result<(), Error> {
        for _ in 0..VANISHED_TRIES {
            if let Attempt::Done(result) = self.try_lock(workspace, info, missing) {
                return result;
            }
        }
        Err(Error::Unavailable(format!(
            "workspace {workspace:?} was deleted {VANISHED_TRIES} times while being locked; \
             lock it again"
        )))
    }

    fn try_lock(&self, workspace: &str, info: &LockInfo, missing: Missing) -> Attempt {
        let temp =
            match self.write_temp(workspace, Body::Bytes(&info.to_json()), || match missing {
                Missing::Make => self.ensure_workspace(workspace),
                Missing::NotFound => Err(Error::NotFound),
            }) {
                Ok(temp) => temp,
                Err(e) => return Attempt::Done(Err(e)),
            };
        // The workspace holds the temporary file now: the calls that
        // follow are made in its directory, each on a single name.
        let dir = match self.root.open_dir(workspace) {
            Ok(dir) => dir,
            Err(e) => {
                let _ = self.root.remove_file(&temp);
                return match e.kind() {
                    ErrorKind::NotFound => Attempt::Vanished,
                    _ => Attempt::Done(Err(Error::io("opening the workspace", e))),
                };
            }
        };
        let temp = temp
            .rsplit_once('/')
            .map_or(temp.as_str(), |(_, name)| name);
        let attempt = self.link_lock(&dir, workspace, temp, info);
        let _ = dir.remove_file(temp);
        if matches!(missing, Missing::Make) && random_u64().is_multiple_of(SWEEP_EVERY) {
            Self::sweep_debris(&dir, ".");
        }
        attempt
    }

    /// Link the prepared lock file `temp` of the workspace's directory
    /// `dir` into place: succeeds only if no lock exists. When one exists
    /// but is gone by the time we read it (its holder just unlocked), try
    /// again rather than fail the caller.
    fn link_lock(&self, dir: &Dir, workspace: &str, temp: &str, info: &LockInfo) -> Attempt {
        const ATTEMPTS: usize = 100;
        for _ in 0..ATTEMPTS {
            match dir.hard_link(temp, LOCK_FILE) {
                Ok(()) => return Attempt::Done(self.sync_in(dir, ".")),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    match holder_at(dir, LOCK_FILE, workspace) {
                        // A retry of a lock we already hold.
                        Ok(Some(holder)) if holder.id == info.id => return Attempt::Done(Ok(())),
                        Ok(Some(holder)) => return Attempt::Done(Err(Error::locked(holder))),
                        Ok(None) => continue,
                        Err(e) => return Attempt::Done(Err(e)),
                    }
                }
                // The temporary file, or the directory, was removed by a
                // workspace delete that ran meanwhile.
                Err(e) if e.kind() == ErrorKind::NotFound => return Attempt::Vanished,
                Err(e) => return Attempt::Done(Err(Error::io("creating lock file", e))),
            }
        }
        Attempt::Done(Err(Error::Unavailable(format!(
            "the lock of workspace {workspace:?} changed hands {ATTEMPTS} times while being taken"
        ))))
    }

    /// Remove the lock only if it is `id`'s; another holder's is refused
    /// untouched. A filesystem has no "remove if it is still this file", so
    /// the lock file is read again right before it is removed, and removed
    /// only if it is still the very lock read (its whole content, with the
    /// holder's id and creation time): a lock force-unlocked and taken by
    /// someone else since the first read is left alone. Read again by
    /// name, not checked by identity through the first descriptor: on a
    /// network filesystem a name's look-up may be served from a cache, and
    /// NFSv3 may give a new file the number of one still held open
    /// elsewhere; an open by name asks the server. What remains is the
    /// moment between that second read and the removal.
    pub fn release_lock(&self, workspace: &str, id: &str) -> Result<(), Error> {
        // Every call below is in the workspace's directory, on one name.
        let dir = match self.root.open_dir(workspace) {
            Ok(dir) => dir,
            // No workspace, no lock.
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io("opening the workspace", e)),
        };
        let read = |what: &str| dir.read(LOCK_FILE).map_err(|e| Error::io(what, e));
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
        ignore_missing(dir.remove_file(LOCK_FILE), "removing lock")?;
        self.sync_in(&dir, ".")
    }
}
