//! wasmstate guest: Terraform state in a git repository, in the layout of
//! [terraform-backend-git](https://github.com/plumber-cd/terraform-backend-git),
//! so its users point wasmstate at the same repository and carry on.
//!
//! ```text
//! refs/heads/<ref>         <dir>/<workspace>.tfstate      the state (P below)
//! refs/heads/locks/<P>     <P>.lock                       LockInfo JSON while locked
//! ```
//!
//! Configuration: `repository` (the URL the operator granted with
//! `allow_git`), `ref` (branch, default `main`), `dir` (directory of the
//! state files, default the repository root).
//!
//! - A state is replaced by a commit on `ref`, pushed with compare-and-swap
//!   against the tip it was built on. A push that loses to another writer
//!   (usually one of another workspace: they share the branch) is rebuilt
//!   on the new tip, so no update is lost and none is merged blindly.
//! - A lock is a branch that exists only while held. Taking it is a
//!   create-only push, so exactly one of several lockers wins; releasing it
//!   deletes the branch only if it still holds the commit we read, so an
//!   unlock never removes a lock someone else took meanwhile. Our lock
//!   commit is a root commit holding just `<P>.lock` (one small push);
//!   terraform-backend-git's lock branches fork `ref` and carry the whole
//!   tree, and are read the same way, as only `<P>.lock` matters.
//! - An empty state file marks a workspace that exists without state, so
//!   `delete` empties the file and `delete_workspace` removes it.
//! - Checking the lock and pushing the state are two steps on two refs,
//!   as in terraform-backend-git: Terraform takes the lock before it writes,
//!   so only clients running with locking disabled can slip between them.
//!
//! - Contract 0.3.0 ([`conditional`]): a state's version is its file's
//!   blob id in the tip of `ref`; a conditional write re-checks it on every
//!   fresh tip and pushes expecting that tip. Each workspace's metadata is
//!   `<dir>/.wasmstate/metadata/<workspace>.json` on `ref`, removed with
//!   the workspace.
//!
//! Every git call goes through the host, which holds the credentials and a
//! clone; this guest names the repository by URL and nothing else.

mod conditional;
mod layout;

use layout::{Paths, Settings, commit_message, state_serial, workspace_of};
use wasmstate_guest::git::{FileChange, GitError, Repo};
use wasmstate_guest::{
    Backend, Config, Error, Expect, Head, LockInfo, Metadata, StateReader, StateWriter, Version,
    check_lock, register_backend,
};

/// Pushes to `ref` tried before giving up when other writers keep moving
/// it; each attempt re-reads the lock, so a lock taken meanwhile is honoured.
const PUSH_ATTEMPTS: usize = 8;

/// Rounds of "create the lock branch, read the holder" before giving up
/// when the lock is released and retaken between the two.
const LOCK_ATTEMPTS: usize = 20;

/// Most versions `list_versions` reports (the newest).
const MAX_VERSIONS: u32 = 100;

/// Holder id reported for a lock branch whose lock file is missing or
/// unreadable; `force-unlock` removes such a branch.
const UNKNOWN_HOLDER: &str = "unknown";

/// A holder made up for an unreadable lock branch. No client's lock id may
/// match it (a client could send `unknown`): only force-unlock removes it.
fn is_unreadable(holder: &LockInfo) -> bool {
    holder.id == UNKNOWN_HOLDER && holder.who == UNKNOWN_HOLDER && holder.version.is_empty()
}

/// [`check_lock`], except that an unreadable lock is never the caller's.
fn check_holder(holder: Option<&LockInfo>, lock_id: Option<&str>) -> Result<(), Error> {
    match holder {
        Some(h) if is_unreadable(h) => Err(Error::locked(h.clone())),
        _ => check_lock(holder.cloned(), lock_id),
    }
}

/// The git storage guest: configuration only; each call fetches afresh, as
/// nothing survives between requests anyway.
struct Git {
    repo: Repo,
    settings: Settings,
}

/// A lock branch as fetched: its commit (for compare-and-swap deletes) and
/// the holder recorded in it.
struct Lock {
    commit: String,
    holder: LockInfo,
}

/// What one fetch saw of a workspace: the tip of `ref` and its lock.
struct Snapshot {
    tip: Option<String>,
    lock: Option<Lock>,
}

impl Snapshot {
    fn holder(&self) -> Option<&LockInfo> {
        self.lock.as_ref().map(|l| &l.holder)
    }
}

/// The file changes and the commit message planned from a [`Snapshot`]
/// (the state being written, when there is one, is committed with them).
type Change = (Vec<FileChange>, String);

/// Turn a git failure into the storage error it means (the SDK's mapping:
/// unreachable remote → retryable `Unavailable`, ungranted repository →
/// configuration) and say what was being done.
fn failed(doing: &str) -> impl FnOnce(GitError) -> Error + '_ {
    move |err| match Error::from(err) {
        Error::Unavailable(m) => Error::Unavailable(format!("{m} while {doing}")),
        Error::Internal(m) => Error::Internal(format!("{m} while {doing}")),
        Error::InvalidInput(m) => Error::InvalidInput(format!("{m} while {doing}")),
        Error::InvalidConfig(mut diagnostics) => {
            for d in &mut diagnostics {
                d.message = format!("{} while {doing}", d.message);
            }
            Error::InvalidConfig(diagnostics)
        }
        other => other,
    }
}

impl Git {
    fn paths(&self, workspace: &str) -> Result<Paths, Error> {
        self.settings.paths(workspace)
    }

    /// Fetch `refs` in one round trip; what each points at, in order.
    fn fetch<const N: usize>(
        &self,
        refs: [&str; N],
        doing: &str,
    ) -> Result<[Option<String>; N], Error> {
        let tips = self.repo.fetch(&refs).map_err(failed(doing))?;
        let count = tips.len();
        tips.try_into().map_err(|_| {
            Error::Internal(format!(
                "the host answered a fetch of {N} refs with {count} while {doing}"
            ))
        })
    }

    /// The holder recorded in lock commit `commit`. A lock branch without a
    /// readable lock file still locks: ignoring it could let two writers in.
    fn holder_in(&self, paths: &Paths, commit: &str, doing: &str) -> Result<LockInfo, Error> {
        let why = match self.repo.read_file(commit, &paths.lock_file) {
            Ok(Some(bytes)) => match LockInfo::from_json(&bytes) {
                Ok(holder) => return Ok(holder),
                Err(e) => format!("its {} is not LockInfo JSON ({e})", paths.lock_file),
            },
            Ok(None) => format!("it has no file {}", paths.lock_file),
            Err(e) => return Err(failed(doing)(e)),
        };
        Ok(LockInfo {
            id: UNKNOWN_HOLDER.into(),
            who: UNKNOWN_HOLDER.into(),
            info: format!(
                "lock branch {} exists but {why}; force-unlock to remove it",
                paths.lock_ref
            ),
            path: paths.state.clone(),
            ..LockInfo::default()
        })
    }

    fn lock_at(
        &self,
        paths: &Paths,
        commit: Option<String>,
        doing: &str,
    ) -> Result<Option<Lock>, Error> {
        commit
            .map(|commit| {
                let holder = self.holder_in(paths, &commit, doing)?;
                Ok(Lock { commit, holder })
            })
            .transpose()
    }

    /// The lock branch of `paths` as it is now on the remote.
    fn fetch_lock(&self, paths: &Paths, doing: &str) -> Result<Option<Lock>, Error> {
        let [commit] = self.fetch([paths.lock_ref.as_str()], doing)?;
        self.lock_at(paths, commit, doing)
    }

    /// The tip of `ref` and the lock, fetched together in one round trip.
    fn snapshot(&self, paths: &Paths, doing: &str) -> Result<Snapshot, Error> {
        let [tip, lock] = self.fetch([&self.settings.main_ref, &paths.lock_ref], doing)?;
        Ok(Snapshot {
            tip,
            lock: self.lock_at(paths, lock, doing)?,
        })
    }

    /// The state file's bytes at `tip` (`None`: no branch or no file).
    fn file_at(
        &self,
        tip: Option<&str>,
        paths: &Paths,
        doing: &str,
    ) -> Result<Option<Vec<u8>>, Error> {
        match tip {
            None => Ok(None),
            Some(tip) => self
                .repo
                .read_file(tip, &paths.state)
                .map_err(failed(doing)),
        }
    }

    /// Commit the change `plan` makes to a fresh snapshot on top of its tip
    /// and push it if `ref` has not moved since; on losing that race, plan
    /// again from the new tip (refused if this workspace's state changed
    /// meanwhile, unless `plan` checks that itself: `rechecks`). `plan`
    /// returns `None` when nothing needs changing; the result says whether
    /// a commit was pushed.
    fn update(
        &self,
        paths: &Paths,
        doing: &str,
        state: Option<&StateReader<'_>>,
        rechecks: bool,
        mut plan: impl FnMut(&Snapshot) -> Result<Option<Change>, Error>,
    ) -> Result<bool, Error> {
        // The first tip seen.
        let mut began_at: Option<Option<String>> = None;
        for _ in 0..PUSH_ATTEMPTS {
            let snapshot = self.snapshot(paths, doing)?;
            match &began_at {
                None => began_at = Some(snapshot.tip.clone()),
                Some(_) if rechecks => {}
                Some(first) => self.refuse_if_moved(paths, first.as_deref(), &snapshot, doing)?,
            }
            let Some((changes, message)) = plan(&snapshot)? else {
                return Ok(false);
            };
            let tip = snapshot.tip.as_deref();
            let commit = match state {
                // The host commits the state it holds: this guest never
                // does, and can commit it again after a lost race.
                Some(state) => self
                    .repo
                    .commit_state(tip, &paths.state, state, &changes, &message),
                None => self.repo.commit(tip, &changes, &message),
            }
            .map_err(failed(doing))?;
            match self.repo.push(&self.settings.main_ref, &commit, tip) {
                Ok(()) => return Ok(true),
                Err(GitError::Rejected(_)) => continue,
                Err(e) => return Err(failed(doing)(e)),
            }
        }
        Err(Error::Unavailable(format!(
            "branch {} is busy: {PUSH_ATTEMPTS} pushes in a row lost to other writers while {doing}",
            self.settings.main_ref
        )))
    }
}

impl Git {
    /// After a lost race for `ref`: whether this workspace's state file
    /// changed since the tip `first` this call began from (read at both
    /// tips: a tree look-up, no history walked). Another writer's change is
    /// refused, not overwritten: the caller checked the lock, and the host
    /// the state, against what it read, not against that. Other
    /// workspaces' commits (the usual cause of a lost race) pass.
    fn refuse_if_moved(
        &self,
        paths: &Paths,
        first: Option<&str>,
        now: &Snapshot,
        doing: &str,
    ) -> Result<(), Error> {
        let before = self.file_at(first, paths, doing)?;
        let after = self.file_at(now.tip.as_deref(), paths, doing)?;
        if before == after {
            return Ok(());
        }
        Err(Error::Unavailable(format!(
            "{doing}: another writer changed this workspace's state meanwhile; nothing was written, \
             read it again"
        )))
    }
}

impl Backend for Git {
    fn new(config: &Config) -> Result<Self, Error> {
        // Only parses: validation must not touch the remote, and neither
        // does building a `Repo`.
        let settings = Settings::from_config(config)?;
        Ok(Git {
            repo: Repo::new(&settings.repository),
            settings,
        })
    }

    fn read_into(&self, ws: &str, out: &mut StateWriter<'_>) -> Result<bool, Error> {
        let paths = self.paths(ws)?;
        let doing = format!("reading the state of workspace {ws}");
        let [tip] = self.fetch([&self.settings.main_ref], &doing)?;
        let Some(tip) = tip else {
            return Ok(false);
        };
        let size = self
            .repo
            .read_file_into(&tip, &paths.state, out)
            .map_err(failed(&doing))?;
        // An empty file is a workspace without state.
        Ok(size.is_some_and(|size| size > 0))
    }

    fn write_from(
        &self,
        ws: &str,
        state: &mut StateReader<'_>,
        lock_id: Option<&str>,
    ) -> Result<(), Error> {
        let paths = self.paths(ws)?;
        let doing = format!("writing the state of workspace {ws}");
        let serial = state.serial();
        self.update(&paths, &doing, Some(state), false, |snapshot| {
            check_holder(snapshot.holder(), lock_id)?;
            let who = snapshot.holder().map(|h| h.who.as_str());
            let message = commit_message("Update", &paths, ws, serial, who, lock_id);
            Ok(Some((Vec::new(), message)))
        })?;
        Ok(())
    }

    fn head(&self, ws: &str, prefix: &mut StateWriter<'_>) -> Result<Option<Head>, Error> {
        self.head_of(ws, prefix)
    }

    fn write_if(
        &self,
        ws: &str,
        state: &mut StateReader<'_>,
        lock_id: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, Error> {
        match expect {
            Expect::Any => self.write_from(ws, state, lock_id).map(|()| true),
            _ => self.write_expecting(ws, state, lock_id, expect),
        }
    }

    fn read_metadata(&self, ws: &str) -> Result<Option<Metadata>, Error> {
        self.metadata_of(ws)
    }

    fn write_metadata(
        &self,
        ws: &str,
        content: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, Error> {
        self.set_metadata(ws, content, expect)
    }

    fn delete(&self, ws: &str, lock_id: Option<&str>) -> Result<(), Error> {
        let paths = self.paths(ws)?;
        let doing = format!("deleting the state of workspace {ws}");
        self.update(&paths, &doing, None, false, |snapshot| {
            check_holder(snapshot.holder(), lock_id)?;
            match self.file_at(snapshot.tip.as_deref(), &paths, &doing)? {
                // Absent stays absent (no workspace is created), and an
                // already empty file needs no commit: a retry is a no-op.
                None => Ok(None),
                Some(state) if state.is_empty() => Ok(None),
                Some(_) => {
                    let who = snapshot.holder().map(|h| h.who.as_str());
                    let message = commit_message("Clear", &paths, ws, None, who, lock_id);
                    Ok(Some((
                        vec![FileChange::put(&paths.state, Vec::new())],
                        message,
                    )))
                }
            }
        })?;
        Ok(())
    }

    fn lock(&self, ws: &str, info: &LockInfo) -> Result<(), Error> {
        let paths = self.paths(ws)?;
        let doing = format!("locking workspace {ws}");
        // The message terraform-backend-git uses for its lock commits.
        let message = format!("Lock {}", paths.state);
        let lock_file = FileChange::put(&paths.lock_file, info.to_json());
        let commit = self
            .repo
            .commit(None, &[lock_file], &message)
            .map_err(failed(&doing))?;
        for _ in 0..LOCK_ATTEMPTS {
            match self.repo.push(&paths.lock_ref, &commit, None) {
                Ok(()) => return Ok(()),
                Err(GitError::Rejected(_)) => {}
                Err(e) => return Err(failed(&doing)(e)),
            }
            match self.fetch_lock(&paths, &doing)? {
                // Our own earlier attempt got through: a retry is harmless.
                Some(lock) if lock.holder.id == info.id && !is_unreadable(&lock.holder) => {
                    return Ok(());
                }
                Some(lock) => return Err(Error::locked(lock.holder)),
                // Released between our push and our read: try again.
                None => continue,
            }
        }
        Err(Error::Unavailable(format!(
            "the lock of workspace {ws} changed hands {LOCK_ATTEMPTS} times while being taken"
        )))
    }

    fn unlock(&self, ws: &str, id: &str) -> Result<(), Error> {
        let paths = self.paths(ws)?;
        let doing = format!("unlocking workspace {ws}");
        for _ in 0..LOCK_ATTEMPTS {
            let Some(lock) = self.fetch_lock(&paths, &doing)? else {
                return Ok(()); // not locked: a retried unlock is harmless
            };
            if lock.holder.id != id || is_unreadable(&lock.holder) {
                return Err(Error::lock_mismatch(Some(lock.holder)));
            }
            // Delete only the lock we just read, never one taken since.
            match self.repo.delete_ref(&paths.lock_ref, &lock.commit) {
                Ok(()) | Err(GitError::NotFound(_)) => return Ok(()),
                Err(GitError::Rejected(_)) => continue, // re-read and report
                Err(e) => return Err(failed(&doing)(e)),
            }
        }
        Err(Error::Unavailable(format!(
            "the lock of workspace {ws} changed hands {LOCK_ATTEMPTS} times while being released"
        )))
    }

    fn current_lock(&self, ws: &str) -> Result<Option<LockInfo>, Error> {
        let paths = self.paths(ws)?;
        let doing = format!("reading the lock of workspace {ws}");
        Ok(self.fetch_lock(&paths, &doing)?.map(|l| l.holder))
    }

    fn force_unlock(&self, ws: &str) -> Result<Option<LockInfo>, Error> {
        let paths = self.paths(ws)?;
        let doing = format!("force-unlocking workspace {ws}");
        for _ in 0..LOCK_ATTEMPTS {
            let Some(lock) = self.fetch_lock(&paths, &doing)? else {
                return Ok(None);
            };
            match self.repo.delete_ref(&paths.lock_ref, &lock.commit) {
                // NotFound: released meanwhile; the holder we saw is gone.
                Ok(()) | Err(GitError::NotFound(_)) => return Ok(Some(lock.holder)),
                // Retaken meanwhile: force means whoever holds it now.
                Err(GitError::Rejected(_)) => continue,
                Err(e) => return Err(failed(&doing)(e)),
            }
        }
        Err(Error::Unavailable(format!(
            "the lock of workspace {ws} changed hands {LOCK_ATTEMPTS} times while being forced open"
        )))
    }

    fn list_workspaces(&self) -> Result<Vec<String>, Error> {
        let doing = "listing workspaces";
        let [tip] = self.fetch([&self.settings.main_ref], doing)?;
        let Some(tip) = tip else {
            return Ok(Vec::new()); // no branch yet: nothing written
        };
        let files = match self.repo.list_files(&tip, &self.settings.dir) {
            Ok(files) => files,
            // A missing directory lists as empty; NotFound means the tip
            // just fetched is not in the clone (a damaged cache), and an
            // empty list would claim no workspace exists: retryable.
            Err(GitError::NotFound(m)) => {
                return Err(Error::Unavailable(format!("{m} while {doing}; retry")));
            }
            Err(e) => return Err(failed(doing)(e)),
        };
        // Like the other guests, only what exists: the host adds `default`.
        Ok(files
            .iter()
            .filter_map(|f| workspace_of(f).map(str::to_string))
            .collect())
    }

    fn create_workspace(&self, ws: &str) -> Result<bool, Error> {
        let paths = self.paths(ws)?;
        let doing = format!("creating workspace {ws}");
        self.update(&paths, &doing, None, false, |snapshot| {
            if self
                .file_at(snapshot.tip.as_deref(), &paths, &doing)?
                .is_some()
            {
                return Ok(None);
            }
            let message = commit_message("Create", &paths, ws, None, None, None);
            Ok(Some((
                vec![FileChange::put(&paths.state, Vec::new())],
                message,
            )))
        })
    }

    fn delete_workspace(&self, ws: &str) -> Result<(), Error> {
        let paths = self.paths(ws)?;
        let doing = format!("deleting workspace {ws}");
        self.update(&paths, &doing, None, false, |snapshot| {
            if let Some(holder) = snapshot.holder() {
                return Err(Error::locked(holder.clone()));
            }
            if self
                .file_at(snapshot.tip.as_deref(), &paths, &doing)?
                .is_none()
            {
                return Err(Error::NotFound);
            }
            // Its metadata, where there is some, goes in the same commit
            // (only then: an operator's own `git_paths` may not grant it).
            let message = commit_message("Remove", &paths, ws, None, None, None);
            let mut changes = vec![FileChange::remove(&paths.state)];
            if self.has_metadata(snapshot.tip.as_deref(), &paths, &doing)? {
                changes.push(FileChange::remove(&paths.metadata));
            }
            Ok(Some((changes, message)))
        })?;
        Ok(())
    }

    /// Every commit on the branch that changed the workspace's state file is
    /// a version: `git log` is the history.
    fn list_versions(&self, ws: &str) -> Result<Option<Vec<Version>>, Error> {
        let paths = self.paths(ws)?;
        let doing = format!("listing the versions of workspace {ws}");
        let [tip] = self.fetch([&self.settings.main_ref], &doing)?;
        let Some(tip) = tip else {
            return Ok(Some(Vec::new()));
        };
        let history = self
            .repo
            .file_history(&tip, &paths.state, MAX_VERSIONS)
            .map_err(failed(&doing))?;
        let mut versions = Vec::new();
        for v in history {
            // A commit that removed the file, or emptied it, is a moment
            // without a state: listed with 0 bytes (the host shows it to no
            // one, and its rollback check starts afresh after it).
            if v.size == 0 {
                versions.push(Version {
                    serial: None,
                    id: v.commit,
                    created_unix_ms: v.time_unix_ms,
                    bytes: 0,
                });
                continue;
            }
            let state = self
                .repo
                .read_file(&v.commit, &paths.state)
                .map_err(failed(&doing))?;
            versions.push(Version {
                serial: state.as_deref().and_then(state_serial),
                id: v.commit,
                created_unix_ms: v.time_unix_ms,
                bytes: v.size,
            });
        }
        Ok(Some(versions))
    }

    fn read_version(&self, ws: &str, id: &str) -> Result<Option<Vec<u8>>, Error> {
        let paths = self.paths(ws)?;
        // Only commit ids: anything else is no version of ours.
        if id.len() != 40 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(None);
        }
        match self.repo.read_file(id, &paths.state) {
            Ok(state) => Ok(state.filter(|s| !s.is_empty())),
            Err(GitError::NotFound(_)) => {
                // Not in the host's clone yet: list the versions (which fetches
                // the history), then look again.
                self.list_versions(ws)?;
                match self.repo.read_file(id, &paths.state) {
                    Ok(state) => Ok(state.filter(|s| !s.is_empty())),
                    Err(GitError::NotFound(_)) => Ok(None),
                    Err(e) => Err(failed("reading a version")(e)),
                }
            }
            Err(e) => Err(failed("reading a version")(e)),
        }
    }
}

register_backend!(Git);
