//! The host's git capability: git operations lent to sandboxed guests.
//!
//! Guests cannot run libgit2, so the host does the git work for them on
//! repositories the operator granted (`allow_git`). The host keeps one local
//! bare clone per repository URL under `clones_dir`, fetches into private
//! tracking refs, builds commits there and pushes them with a compare-and-swap
//! on the remote ref. This module is synchronous and knows nothing about
//! wasmtime: every call blocks, so callers on an async runtime should run it
//! on a blocking thread.
//!
//! Concurrency: calls on the same URL within one [`GitHost`] are serialised by
//! a per-repository mutex (libgit2 repositories are not safe to share between
//! threads, and fetches into the same clone would race). Across processes,
//! the remote ref update is the only arbiter, and it is atomic:
//! `git receive-pack` (git://, ssh, http) checks the old value we send under
//! the ref lock, and for local repositories we update the ref ourselves with
//! libgit2's locked compare-and-swap (libgit2's own local push is NOT a CAS,
//! see [`RepoHandle::push`]).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, Once, PoisonError};
use std::time::Instant;

use git2::build::TreeUpdateBuilder;
use git2::{
    AutotagOption, Cred, CredentialType, Direction, ErrorClass, ErrorCode, FetchOptions, FileMode,
    ObjectType, Oid, PushOptions, Reference, RemoteCallbacks, Repository, Signature, Tree,
};
use sha2::{Digest, Sha256};

/// Where fetched remote refs are kept in a clone: `refs/heads/x` is tracked as
/// `refs/wasmstate/remote/heads/x`. Private so no git tooling mistakes them for
/// branches; they exist so objects stay referenced and so later fetches can
/// tell the remote what we already have (incremental fetch).
const TRACKING_PREFIX: &str = "refs/wasmstate/remote/";
/// libgit2 calls the credential callback again after every refusal, forever;
/// we give up after this many offers.
const MAX_AUTH_ATTEMPTS: u32 = 3;
/// libgit2 server connect timeout (TCP connect, all network transports).
const CONNECT_TIMEOUT_MS: i32 = 10_000;
/// libgit2 server read/write timeout, so a stalled remote cannot hang a call.
const IO_TIMEOUT_MS: i32 = 30_000;
/// Most commits one `file_history` call walks back to report.
const MAX_HISTORY: u32 = 1000;
/// What a clone may hold by default before it is discarded and fetched again.
const DEFAULT_MAX_CLONE_BYTES: u64 = 1 << 30;
/// Largest file `read_file` hands out by default.
const DEFAULT_MAX_FILE_BYTES: u64 = 64 << 20;

mod grant;
mod stat;
pub use grant::{GitAuth, GitError, GitGrant};
pub use stat::FileStat;

pub use wasmstate_types::git::{FileChange, FileVersion, RemoteRef};

/// The host side of the git capability: owns the clones directory and the
/// per-repository locks. One per process is enough; it is `Sync`. Its locks only
/// cover this process, so it claims `clones_dir` for itself (a second
/// process given the same directory uses `clones_dir/replicas/N`).
///
/// Work done for a guest is bounded like the guest: a call waits for its
/// repository's lock and talks to the remote only until the request's
/// deadline ([`RepoHandle::until`]); a file larger than `max_file_bytes` is
/// not read into memory; and a clone whose objects grow past
/// `max_clone_bytes` (commits that were never pushed, deepened history) is
/// a cache past its bound: it is discarded and fetched again, shallow.
pub struct GitHost {
    clones_dir: PathBuf,
    identity: (String, String),
    max_clone_bytes: u64,
    max_file_bytes: u64,
    /// One lock (holding the opened clone, reused across calls) per normalised URL.
    repos: Mutex<HashMap<String, Arc<parking_lot::Mutex<Slot>>>>,
    /// Holds `clones_dir` for this process alone; why not, when it cannot
    /// (every git call then fails saying so).
    owner: Result<std::fs::File, String>,
}

/// What one backend's guest may do with git: the host's clones and the
/// repositories the operator granted it.
#[derive(Clone)]
pub struct GitAccess {
    /// The host's git capability (one clone per repository).
    pub host: Arc<GitHost>,
    /// Repositories granted to this backend, with their credentials.
    pub grants: Arc<[GitGrant]>,
}

/// One repository's clone, opened once and reused across calls.
#[derive(Default)]
pub(super) struct Slot {
    repo: Option<Repository>,
    /// What the clone holds on disk, measured when it is opened and
    /// counted up as objects arrive or are written.
    bytes: Cell<u64>,
    /// A fetch found objects missing that its refs name (an earlier fetch
    /// cut off half-way): the next call starts the clone afresh.
    damaged: Cell<bool>,
}

/// One granted repository, ready for git calls. Cheap; make one per call.
pub struct RepoHandle<'a> {
    host: &'a GitHost,
    auth: &'a GitAuth,
    grant: &'a GitGrant,
    url: String,
    /// Names the clone: the URL with the grant's credentials and scope, so
    /// backends granted one repository differently never share a clone
    /// (objects one could fetch, commits one made, are not the other's).
    clone_key: String,
    slot: Arc<parking_lot::Mutex<Slot>>,
    deadline: Option<Instant>,
}

impl GitHost {
    /// A host keeping its clones under `clones_dir` (created on demand), committing as
    /// `wasmstate <wasmstate@localhost>`. Also sets libgit2's network timeouts (once per process).
    pub fn new(clones_dir: PathBuf) -> Self {
        set_network_timeouts();
        let (clones_dir, owner) = match claim_clones_dir(&clones_dir) {
            Ok((dir, file)) => (dir, Ok(file)),
            Err(why) => (clones_dir, Err(why)),
        };
        GitHost {
            clones_dir,
            owner,
            identity: ("wasmstate".into(), "wasmstate@localhost".into()),
            max_clone_bytes: DEFAULT_MAX_CLONE_BYTES,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            repos: Mutex::default(),
        }
    }

    /// Bound each clone's disk use and the files handed out.
    pub fn with_limits(mut self, max_clone_bytes: u64, max_file_bytes: u64) -> Self {
        self.max_clone_bytes = max_clone_bytes;
        self.max_file_bytes = max_file_bytes;
        self
    }

    /// Use `name <email>` as author and committer of the commits this host creates.
    pub fn with_identity(mut self, name: impl Into<String>, email: impl Into<String>) -> Self {
        self.identity = (name.into(), email.into());
        self
    }

    /// The handle for `url` if one of `grants` covers it (exact match, ignoring
    /// surrounding whitespace and trailing slashes), else [`GitError::Denied`].
    pub fn repo<'a>(
        &'a self,
        grants: &'a [GitGrant],
        url: &str,
    ) -> Result<RepoHandle<'a>, GitError> {
        let url = normalize_url(url);
        let grant = grants.iter().find(|g| normalize_url(&g.url) == url).ok_or_else(|| {
            GitError::Denied(format!(
                "git repository {} is not granted to this backend; add it to `allow_git` in the backend's configuration",
                redact(&url)
            ))
        })?;
        if let Err(why) = &self.owner {
            return Err(GitError::Internal(format!(
                "the host keeps no git clones: {why}"
            )));
        }
        let clone_key = clone_key(&url, grant);
        let slot = lock(&self.repos)
            .entry(clone_key.clone())
            .or_default()
            .clone();
        Ok(RepoHandle {
            host: self,
            auth: &grant.auth,
            grant,
            url,
            clone_key,
            slot,
            deadline: None,
        })
    }
}

impl RepoHandle<'_> {
    /// Stop at `deadline`: waiting for the repository's lock, and talking to
    /// the remote (libgit2 cancels at its next progress callback).
    pub fn until(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// The remote's refs whose full name starts with `prefix` (all refs for `""`;
    /// `HEAD` and peeled tag entries are left out). One connection, no objects fetched.
    pub fn list_remote_refs(&self, prefix: &str) -> Result<Vec<RemoteRef>, GitError> {
        let mut slot = self.lock_slot()?;
        let repo = self.open(&mut slot)?;
        let auth = self.auth();
        let mut remote = repo
            .remote_anonymous(&self.url)
            .or_internal(self, "cannot set up the remote")?;
        let conn = remote
            .connect_auth(Direction::Fetch, Some(auth.callbacks()), None)
            .or_net(self, &auth)?;
        let heads = conn.list().or_net(self, &auth)?;
        Ok(heads
            .iter()
            .filter(|h| {
                h.name().starts_with("refs/")
                    && h.name().starts_with(prefix)
                    && !h.name().ends_with("^{}")
            })
            .map(|h| RemoteRef {
                name: h.name().to_owned(),
                target: h.oid().to_string(),
            })
            .collect())
    }

    /// Fetch `refs` (full names) into the clone and return what each points at on
    /// the remote, in order (`None` if the remote has no such ref). The values come
    /// from the same connection that fetches the objects, so they are consistent.
    pub fn fetch(&self, refs: &[String]) -> Result<Vec<Option<String>>, GitError> {
        refs.iter().try_for_each(|r| check_ref(r))?;
        let mut slot = self.lock_slot()?;
        self.bound_clone(&mut slot)?;
        let (repo, clone_bytes, damaged) = self.open_tracked(&mut slot)?;
        // One download brings at most a clone's bound: a clone past it is
        // started afresh at the next call anyway.
        let auth = self.auth().downloading_at_most(self.host.max_clone_bytes);
        let mut remote = repo
            .remote_anonymous(&self.url)
            .or_internal(self, "cannot set up the remote")?;
        let mut conn = remote
            .connect_auth(Direction::Fetch, Some(auth.callbacks()), None)
            .or_net(self, &auth)?;
        let heads: HashMap<String, Oid> = conn
            .list()
            .or_net(self, &auth)?
            .iter()
            .map(|h| (h.name().to_owned(), h.oid()))
            .collect();
        let found: Vec<Option<Oid>> = refs.iter().map(|r| heads.get(r).copied()).collect();

        let odb = repo
            .odb()
            .or_internal(self, "cannot open the object database")?;
        let mut specs = Vec::new();
        for (name, id) in refs.iter().zip(&found) {
            let tracking = tracking_ref(name);
            match id {
                // Already have the objects (e.g. we pushed this commit ourselves):
                // skip the download round trip, just move the tracking ref.
                Some(id) if odb.exists(*id) => {
                    if repo.refname_to_id(&tracking).ok() != Some(*id) {
                        repo.reference(&tracking, *id, true, "fetch")
                            .or_internal(self, "cannot update a tracking ref")?;
                    }
                }
                Some(_) => specs.push(format!("+{name}:{tracking}")),
                None => {
                    if let Ok(mut stale) = repo.find_reference(&tracking) {
                        let _ = stale.delete(); // tidiness only; a stale tracking ref is harmless
                    }
                }
            }
        }
        if !specs.is_empty() {
            let mut opts = FetchOptions::new();
            opts.remote_callbacks(auth.callbacks())
                .download_tags(AutotagOption::None)
                // A redirect would take the credentials elsewhere.
                .follow_redirects(git2::RemoteRedirect::None)
                .update_fetchhead(false);
            // libgit2's local transport (file:// and paths) refuses shallow fetches
            // ("shallow fetch is not supported by the local transport", ENOTSUPPORTED,
            // see the test below), so only ask for depth 1 over the network.
            if !is_local(&self.url) {
                opts.depth(1);
            }
            // Reuses the connection opened above (libgit2 only reconnects when disconnected).
            if let Err(e) = conn.remote().fetch(&specs, Some(&mut opts), None) {
                if is_damage(&e) {
                    // A fetch cut off before (its answer dropped half-way)
                    // left refs naming objects that never arrived; every
                    // fetch after fails the same way. Start afresh next time.
                    tracing::warn!(url = %redact(&self.url), "git clone is missing objects its refs name: discarding it; the next call fetches afresh");
                    damaged.set(true);
                    return Err(GitError::Unavailable(format!(
                        "the local clone of {} lost objects to an interrupted fetch and is fetched afresh; retry",
                        redact(&self.url)
                    )));
                }
                return Err(self.net_error(&auth, e));
            }
            let received = conn.remote().stats().received_bytes() as u64;
            clone_bytes.set(clone_bytes.get() + received);
        }
        Ok(found
            .into_iter()
            .map(|id| id.map(|id| id.to_string()))
            .collect())
    }

    /// Create (but do not push) a commit: `parent`'s tree (empty for `None`) with
    /// `changes` applied (later changes to the same path win; removing an absent
    /// file is a no-op), authored by the host identity. Returns the commit id.
    pub fn commit(
        &self,
        parent: Option<&str>,
        changes: &[FileChange],
        message: &str,
    ) -> Result<String, GitError> {
        changes.iter().try_for_each(|c| check_path(&c.path))?;
        for change in changes {
            self.check_granted("path", &change.path, &self.grant.paths, "git_paths")?;
        }
        if message.contains('\0') {
            return Err(GitError::InvalidInput(
                "the commit message contains a NUL byte; remove it".into(),
            ));
        }
        // What read_file would refuse must not be committed: the file could
        // never be read back through the host.
        for change in changes {
            if let Some(content) = &change.content {
                self.check_file_size(&change.path, content.len() as u64, "in this commit")?;
            }
        }
        let edits: BTreeMap<&str, Option<&[u8]>> = changes
            .iter()
            .map(|c| (c.path.as_str(), c.content.as_deref()))
            .collect();
        let mut slot = self.lock_slot()?;
        let (repo, clone_bytes) = self.open_counted(&mut slot)?;
        // Commits stay in the clone until a fetch finds it past its bound
        // and starts afresh: without this, commits chained without a fetch
        // grew it past git_clone_max_mib, outside every quota. So a clone
        // holds at most its bound plus one commit (each file in it at most
        // the largest file read back).
        if clone_bytes.get() > self.host.max_clone_bytes {
            return Err(GitError::Unavailable(format!(
                "the clone of {} is past git_clone_max_mib ({} MiB) with unpushed commits; \
                 fetch (which starts it afresh) before committing again",
                redact(&self.url),
                self.host.max_clone_bytes >> 20
            )));
        }
        let parent = parent.map(|p| self.find_commit(repo, p)).transpose()?;
        let base = match &parent {
            Some(c) => c
                .tree()
                .or_internal(self, "cannot read the parent's tree")?,
            None => {
                let empty = repo.treebuilder(None).and_then(|b| b.write());
                empty
                    .and_then(|id| repo.find_tree(id))
                    .or_internal(self, "cannot write the empty tree")?
            }
        };
        let mut update = TreeUpdateBuilder::new();
        for (path, content) in edits {
            match content {
                Some(bytes) => {
                    let id = repo.blob(bytes).or_internal(self, "cannot write a blob")?;
                    clone_bytes.set(clone_bytes.get() + bytes.len() as u64);
                    update.upsert(path, id, FileMode::Blob);
                }
                // libgit2 errors on removing an absent entry; the contract says no-op.
                None if base
                    .get_path(Path::new(path))
                    .is_ok_and(|e| is_file(e.filemode())) =>
                {
                    update.remove(path);
                }
                None => {}
            }
        }
        let tree_id = update.create_updated(repo, &base).map_err(|e| match e.class() {
            ErrorClass::Tree => GitError::InvalidInput(format!(
                "the changes conflict with the tree ({}); a path cannot be both a file and a directory",
                one_line(e.message())
            )),
            _ => self.internal("cannot build the new tree", e),
        })?;
        let tree = repo
            .find_tree(tree_id)
            .or_internal(self, "cannot read the new tree")?;
        let (name, email) = &self.host.identity;
        let sig = Signature::now(name, email).or_internal(self, "bad commit identity")?;
        let parents: Vec<_> = parent.iter().collect();
        let id = repo
            .commit(None, &sig, &sig, message, &tree, &parents)
            .or_internal(self, "cannot write the commit")?;
        Ok(id.to_string())
    }

    /// Point remote ref `name` at local commit `new`, only if it is currently
    /// `expected` (`None`: only if it does not exist). [`GitError::Rejected`]
    /// otherwise, and then the remote is unchanged. An existing ref only moves
    /// forward: `new` must descend from `expected` (never a forced update), and
    /// `name` must match one of the backend's `git_refs` patterns.
    ///
    /// Over the network we read the advertised value on the push connection and
    /// push on that same connection: receive-pack then checks the old value we
    /// send under its ref lock, so a concurrent pusher makes ours fail (a real
    /// CAS). libgit2's local transport instead overwrites refs unconditionally
    /// (`git_reference_create(..., force)` in transports/local.c), so for local
    /// remotes we copy the objects and update the ref ourselves with libgit2's
    /// locked compare-and-swap.
    pub fn push(&self, name: &str, new: &str, expected: Option<&str>) -> Result<(), GitError> {
        check_ref(name)?;
        self.check_granted("ref", name, &self.grant.refs, "git_refs")?;
        let new = parse_oid(new)?;
        let expected = expected.map(parse_oid).transpose()?;
        let mut slot = self.lock_slot()?;
        let (repo, _, damaged) = self.open_tracked(&mut slot)?;
        self.find_commit(repo, &new.to_string())?;
        // Never a forced update (receive-pack checks this over the
        // network; for local remotes, here).
        if let Some(old) = expected {
            self.check_forward(repo, damaged, name, new, old)?;
        }
        if is_local(&self.url) {
            self.update_local(repo, name, Some(new), expected)
        } else {
            self.push_remote(repo, damaged, name, &format!("{new}:{name}"), expected)
        }
    }

    /// Delete remote ref `name`, only if it currently points at `expected`
    /// ([`GitError::Rejected`] otherwise, [`GitError::NotFound`] if it does not exist).
    pub fn delete_ref(&self, name: &str, expected: &str) -> Result<(), GitError> {
        check_ref(name)?;
        self.check_granted("ref", name, &self.grant.refs, "git_refs")?;
        let expected = parse_oid(expected)?;
        let mut slot = self.lock_slot()?;
        let repo = self.open(&mut slot)?;
        if is_local(&self.url) {
            self.update_local(repo, name, None, Some(expected))
        } else {
            self.push_remote(
                repo,
                &Cell::new(false),
                name,
                &format!(":{name}"),
                Some(expected),
            )
        }
    }
}

mod auth;
mod read;
mod transport;
mod util;
pub use util::redact;

use auth::Auth;
use transport::*;
use util::*;

#[cfg(test)]
mod tests;
