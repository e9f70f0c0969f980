//! wasmstate's default storage guest: one directory per workspace inside the
//! single directory the host grants (mounted at `/data`):
//!
//! ```text
//! /data/<workspace>/terraform.tfstate        the state
//! /data/<workspace>/terraform.tfstate.lock   LockInfo JSON while locked
//! /data/.wasmstate/metadata/<workspace>.json the workspace's metadata
//! ```
//!
//! Correctness across threads and host processes rests on three atomic
//! filesystem operations: `rename` (a state is replaced whole, never torn),
//! `link` (creates the lock file with its full content, or fails because
//! it exists — so a lock is never granted twice and never seen half-written)
//! and create-new (`O_EXCL`), which makes a conditional write's check and
//! rename one step for every writer of the directory ([`cas`]). A state's
//! storage version is its file's identity, modification time and size
//! ([`stamp`]).
//!
//! With `fsync` (the default) every change is on stable storage before it is
//! acknowledged: the file's data, then the directory entry naming it (a
//! rename or link is only durable once its directory is synced).
//!
//! Files a request left behind when it was stopped mid-way (a deadline, a
//! trap, a killed host) are swept once they are older than [`STALE_AFTER`],
//! so they do not count against the disk quota forever.

mod cas;
mod locks;
mod stamp;

use cas::{Opened, Slot};
use locks::Missing;
use std::hash::{BuildHasher, Hasher};
use std::io::ErrorKind;
use wasmstate_guest::fs::Dir;
use wasmstate_guest::{
    Backend, Config, Error, Expect, Head, LockInfo, Metadata, StateReader, StateWriter,
    register_backend,
};

const STATE_FILE: &str = "terraform.tfstate";
/// Where workspaces' metadata lives: a name no workspace can have (they
/// never start with `.`), a directory Terraform never reads.
const METADATA_DIR: &str = ".wasmstate/metadata";
/// Largest metadata document kept (the contract's bound).
const MAX_METADATA_BYTES: u64 = 64 << 10;
const LOCK_FILE: &str = "terraform.tfstate.lock";
/// The start of the id of the lock a workspace delete takes.
const DELETE_LOCK_PREFIX: &str = "wasmstate-delete-";
/// Prefix of files being written, renamed or linked into place.
const TEMP_PREFIX: &str = ".tmp-";
/// Age past which a temporary file is debris: longer than any request may
/// run (the host caps a backend's `timeout_ms` at one hour).
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(2 * 3600);
/// One lock in this many, at random, sweeps its workspace for debris. A
/// listing is more host calls than the rest of a lock's work, and debris
/// is rare (only a request stopped mid-way leaves any, and only once it is
/// two hours old may it go); it waits about this many locks of its
/// workspace longer to go.
const SWEEP_EVERY: u64 = 8;

/// What a temporary file is written from.
enum Body<'s, 'a> {
    /// A state: the host copies it into the file.
    State(&'s mut StateReader<'a>),
    /// A lock or a metadata document, made here.
    Bytes(&'s [u8]),
}

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

fn metadata_name(workspace: &str) -> String {
    format!("{workspace}.json")
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
    /// Create the workspace's directory unless it exists; whether it was
    /// made now.
    fn ensure_workspace(&self, workspace: &str) -> Result<bool, Error> {
        self.ensure_dir(workspace, ".")
    }

    /// Create directory `dir` (inside `parent`) unless it exists; whether
    /// it was made now.
    fn ensure_dir(&self, dir: &str, parent: &str) -> Result<bool, Error> {
        match self.root.create_dir(dir) {
            Ok(()) => self.sync_dir(parent).map(|()| true),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(Error::io("creating directory", e)),
        }
    }

    fn ensure_metadata_dir(&self) -> Result<bool, Error> {
        let (parent, _) = METADATA_DIR.split_once('/').expect("two levels");
        self.ensure_dir(parent, ".")?;
        self.ensure_dir(METADATA_DIR, parent)
    }

    /// Make the entries of `dir` durable (with `fsync` on).
    fn sync_dir(&self, dir: &str) -> Result<(), Error> {
        self.sync_in(&self.root, dir)
    }

    /// [`Self::sync_dir`], where a directory a workspace delete removed
    /// meanwhile needs none: that delete synced its removal, and nothing in
    /// it is left to make durable.
    fn sync_dir_unless_deleted(&self, dir: &str) -> Result<(), Error> {
        match self.sync_dir(dir) {
            Err(_) if !self.root.is_dir(dir) => Ok(()),
            other => other,
        }
    }

    /// Make the entries of directory `path` of `dir` durable (with `fsync`
    /// on); `"."` is `dir` itself.
    fn sync_in(&self, dir: &Dir, path: &str) -> Result<(), Error> {
        if !self.fsync {
            return Ok(());
        }
        dir.sync_dir(path)
            .map_err(|e| Error::io("syncing directory", e))
    }

    /// Remove temporary files in directory `path` of `dir` (`"."`: `dir`
    /// itself) older than [`STALE_AFTER`]: what requests stopped mid-way
    /// left. Best effort: a sweep that fails leaves them for the next.
    fn sweep_debris(dir: &Dir, path: &str) {
        let Ok(entries) = dir.list(path) else {
            return;
        };
        let mut temps = entries
            .into_iter()
            .filter(|(name, is_dir)| !is_dir && name.starts_with(TEMP_PREFIX))
            .peekable();
        // The clock is asked only once a temporary file is found: most
        // sweeps find none.
        if temps.peek().is_none() {
            return;
        }
        let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) else {
            return;
        };
        for (name, _) in temps {
            let child = match path {
                "." => name,
                _ => format!("{path}/{name}"),
            };
            if let Ok(Some(modified)) = dir.modified_secs(&child)
                && now.as_secs().saturating_sub(modified) > STALE_AFTER.as_secs()
            {
                let _ = dir.remove_file(&child);
            }
        }
    }

    /// Write `body` to a fresh, uniquely named file in `dir` (made by
    /// `make_dir` when missing: asked only then, to spare a call per write;
    /// it answers whether it made it now) and return its path; the caller
    /// renames or links it into place.
    fn write_temp(
        &self,
        dir: &str,
        mut body: Body<'_, '_>,
        make_dir: impl Fn() -> Result<bool, Error>,
    ) -> Result<String, Error> {
        // Made again when a workspace delete removed it between its making
        // and the file's creation (a lock's first call, racing a delete):
        // the file then lands in the workspace made afresh, after the
        // delete, as if it had come a moment later.
        const MAKES: usize = 3;
        let (mut made, mut made_last) = (0, false);
        loop {
            let path = format!("{dir}/{TEMP_PREFIX}{:016x}", random_u64());
            let created = match &mut body {
                Body::State(state) => self.root.create_new_from_state(&path, state, self.fsync),
                Body::Bytes(bytes) => self.root.create_new(&path, bytes, self.fsync),
            };
            match created {
                Ok(()) => return Ok(path),
                // Both fail so only as the file is opened, before anything
                // is taken from the body.
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) if e.kind() == ErrorKind::NotFound && made < MAKES => {
                    // `false`: another request made it meanwhile.
                    made_last = make_dir()?;
                    made += 1;
                }
                // The last make found it there, yet no file can be made in
                // it (a dangling symbolic link, most likely): no retry helps.
                Err(e) if e.kind() == ErrorKind::NotFound && !made_last => {
                    return Err(Error::io("writing temporary file", e));
                }
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    return Err(Error::Unavailable(format!(
                        "{dir:?} was deleted {MAKES} times while this request wrote to it; \
                         nothing was stored: send it again"
                    )));
                }
                Err(e) => {
                    let _ = self.root.remove_file(&path);
                    return Err(Error::io("writing temporary file", e));
                }
            }
        }
    }

    /// After [`cas::switch`]: remove the temporary file unless it became
    /// the target, and make a switch durable (the rename is only once the
    /// directory holding both names is).
    fn settle(&self, temp: &str, switched: Result<bool, Error>, dir: &str) -> Result<bool, Error> {
        if !matches!(switched, Ok(true)) {
            let _ = self.root.remove_file(temp);
        }
        let switched = switched?;
        if switched {
            // Gone: written, then deleted by a delete that came after it.
            self.sync_dir_unless_deleted(dir)?;
        }
        Ok(switched)
    }

    /// Refuse a change unless `lock_id` matches the lock (or nothing is
    /// locked and no id was presented).
    fn check_lock(&self, workspace: &str, lock_id: Option<&str>) -> Result<(), Error> {
        wasmstate_guest::check_lock(self.holder(workspace)?, lock_id)
    }

    /// Remove the emptied directory of workspace `name`. A request racing
    /// the delete may have left a temporary file in it (a lock refused, a
    /// write whose directory went): removed, since none of theirs was
    /// acknowledged, and the directory tried again. Anything else (a lock,
    /// a state) landed once the delete let go of its lock and is kept.
    fn remove_emptied(&self, name: &str) -> Result<(), Error> {
        for tries_left in (0..4).rev() {
            match self.root.remove_dir(name) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
                Err(e) if e.kind() == ErrorKind::DirectoryNotEmpty && tries_left > 0 => {}
                Err(e) if e.kind() == ErrorKind::DirectoryNotEmpty => break,
                Err(e) => return Err(Error::io("removing the workspace", e)),
            }
            let entries = match self.root.list(name) {
                Ok(entries) => entries,
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(Error::io("listing the workspace", e)),
            };
            if entries
                .iter()
                .any(|(entry, is_dir)| *is_dir || !entry.starts_with(TEMP_PREFIX))
            {
                break;
            }
            for (entry, _) in entries {
                let _ = self.root.remove_file(&format!("{name}/{entry}"));
            }
        }
        Err(Error::Unavailable(format!(
            "a lock or a write reached workspace {name:?} as it was being deleted; it is kept: \
             delete the workspace again"
        )))
    }

    /// Everything in workspace `name` removed but its lock, which the
    /// delete removing it holds (`id`). The metadata first: a delete that
    /// fails midway leaves a workspace without metadata (a retry finishes
    /// it), never metadata that a new workspace of the same name would
    /// inherit. The state under its write marker: see [`cas::empty_dir`].
    fn empty_workspace(&self, name: &str, id: &str) -> Result<(), Error> {
        self.write_metadata(name, None, &Expect::Any)?;
        let slot = Slot {
            dir: name,
            name: STATE_FILE,
        };
        cas::empty_dir(&self.root, &slot, LOCK_FILE, || {
            match self.holder(name)? {
                Some(holder) if holder.id == id => Ok(()),
                Some(holder) => Err(Error::locked(holder)),
                None => Err(Error::Unavailable(format!(
                    "the delete's lock of workspace {name:?} was force-unlocked while it ran; \
                 delete the workspace again"
                ))),
            }
        })
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

    fn head(&self, workspace: &str, prefix: &mut StateWriter<'_>) -> Result<Option<Head>, Error> {
        // Stamp and bytes from one open file: they agree even if a writer
        // replaces the state meanwhile. Open, stat, hash, one read and one
        // host call ([`Opened::copy_prefix`]).
        let Some(file) = Opened::open(&self.root, &state_path(workspace))? else {
            return Ok(None);
        };
        let Some(stamp) = stamp::stored(Some(file.stamp)) else {
            return Ok(None);
        };
        file.copy_prefix(prefix)?;
        Ok(Some(Head {
            version: stamp.version(),
            size: stamp.size,
            digest: None,
        }))
    }

    fn write_from(
        &self,
        workspace: &str,
        state: &mut StateReader<'_>,
        lock_id: Option<&str>,
    ) -> Result<(), Error> {
        self.write_if(workspace, state, lock_id, &Expect::Any)
            .map(|_| ())
    }

    fn write_if(
        &self,
        workspace: &str,
        state: &mut StateReader<'_>,
        lock_id: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, Error> {
        // Checked first so a refused write costs nothing (no temp file, no
        // workspace made, no quota taken)...
        self.check_lock(workspace, lock_id)?;
        // A workspace that is not there holds no lock: a write presenting
        // one is refused before anything is made.
        let temp = self.write_temp(workspace, Body::State(state), || {
            self.check_lock(workspace, lock_id)?;
            self.ensure_workspace(workspace)
        })?;
        // ...and again under the write marker, once the body is written
        // and synced, just before the version check and the rename: a
        // force-unlock that landed while a slow body was written then
        // refuses this write instead of letting it replace what the new
        // holder wrote meanwhile. (Locks are not taken under the marker,
        // so what stays open is the gap between this check and the rename:
        // a few calls, as in Terraform's own backends.)
        let slot = Slot {
            dir: workspace,
            name: STATE_FILE,
        };
        let switched = cas::switch(&self.root, &slot, Some(&temp), expect, || {
            self.check_lock(workspace, lock_id)
        });
        self.settle(&temp, switched, workspace)
    }

    fn delete(&self, workspace: &str, lock_id: Option<&str>) -> Result<(), Error> {
        self.check_lock(workspace, lock_id)?;
        // Under the write marker too: a conditional write's check and
        // rename must not straddle a delete.
        let slot = Slot {
            dir: workspace,
            name: STATE_FILE,
        };
        cas::switch(&self.root, &slot, None, &Expect::Any, || {
            self.check_lock(workspace, lock_id)
        })?;
        // No workspace, no state: deleting it succeeds.
        self.sync_dir_unless_deleted(workspace)
    }

    fn lock(&self, workspace: &str, info: &LockInfo) -> Result<(), Error> {
        self.take_lock(workspace, info, Missing::Make)
    }

    fn unlock(&self, workspace: &str, id: &str) -> Result<(), Error> {
        self.release_lock(workspace, id)
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

    /// Delete the workspace under its own lock, as Terraform's CLI does:
    /// a client's lock is refused while the delete runs or comes after it
    /// (the workspace made afresh), and the delete never removes a lock it
    /// did not take. A lock or a write that reaches the directory once the
    /// delete let go of its lock is kept: the delete then answers
    /// `unavailable`, to be run again.
    fn delete_workspace(&self, name: &str) -> Result<(), Error> {
        if !self.root.is_dir(name) {
            return Err(Error::NotFound);
        }
        let deleting = LockInfo {
            id: format!("{DELETE_LOCK_PREFIX}{:016x}", random_u64()),
            operation: "OperationTypeDeleteWorkspace".into(),
            who: "wasmstate".into(),
            info: "a workspace delete holds this lock while it runs; if none is running \
                   (one stopped midway), force-unlock the workspace and delete it again"
                .into(),
            created: wasmstate_guest::clock::now_rfc3339(),
            ..LockInfo::default()
        };
        match self.take_lock(name, &deleting, Missing::NotFound) {
            Err(Error::Locked(holder)) if holder.id.starts_with(DELETE_LOCK_PREFIX) => {
                return Err(Error::Unavailable(format!(
                    "another delete of workspace {name:?} is under way (since {}); if none \
                     is, force-unlock the workspace and delete it again",
                    holder.created
                )));
            }
            taken => taken?,
        }
        let emptied = self.empty_workspace(name, &deleting.id);
        let released = self.release_lock(name, &deleting.id);
        emptied?;
        if released.is_err() {
            return Err(Error::Unavailable(format!(
                "workspace {name:?} was emptied, but the delete's lock was force-unlocked and \
                 taken meanwhile: the workspace is kept; delete it again"
            )));
        }
        self.remove_emptied(name)?;
        self.sync_dir(".")
    }

    fn read_metadata(&self, workspace: &str) -> Result<Option<Metadata>, Error> {
        let path = format!("{METADATA_DIR}/{}", metadata_name(workspace));
        let Some(file) = Opened::open(&self.root, &path)? else {
            return Ok(None);
        };
        let Some(stamp) = stamp::stored(Some(file.stamp)) else {
            return Ok(None);
        };
        if stamp.size > MAX_METADATA_BYTES {
            return Err(Error::Internal(format!(
                "{path} is over 64 KiB, more than wasmstate ever writes; remove it"
            )));
        }
        let content = String::from_utf8(file.read_all()?).map_err(|_| {
            Error::Internal(format!(
                "{path} is not UTF-8, so not wasmstate's; remove it"
            ))
        })?;
        Ok(Some(Metadata {
            content,
            version: stamp.version(),
        }))
    }

    fn write_metadata(
        &self,
        workspace: &str,
        content: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, Error> {
        let name = metadata_name(workspace);
        let slot = Slot {
            dir: METADATA_DIR,
            name: &name,
        };
        let Some(content) = content else {
            let removed = cas::switch(&self.root, &slot, None, expect, || Ok(()))?;
            if removed && self.root.is_dir(METADATA_DIR) {
                self.sync_dir(METADATA_DIR)?;
            }
            return Ok(removed);
        };
        // An empty file reads as no metadata; the host never writes one.
        if content.is_empty() || content.len() as u64 > MAX_METADATA_BYTES {
            return Err(Error::InvalidInput(format!(
                "workspace metadata must be 1 byte to 64 KiB, not {} bytes",
                content.len()
            )));
        }
        let temp = self.write_temp(METADATA_DIR, Body::Bytes(content.as_bytes()), || {
            self.ensure_metadata_dir()
        })?;
        let switched = cas::switch(&self.root, &slot, Some(&temp), expect, || Ok(()));
        // Rare enough to afford a look for what a stopped request left.
        Self::sweep_debris(&self.root, METADATA_DIR);
        self.settle(&temp, switched, METADATA_DIR)
    }
}

register_backend!(Local);
