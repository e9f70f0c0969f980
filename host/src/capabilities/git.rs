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

/// Why a git call failed; mirrors `git-error` in `wit/backend.wit`. Each
/// message is one line and says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GitError {
    /// The repository URL is not granted to the backend, or its credentials were refused.
    #[error("denied: {0}")]
    Denied(String),
    /// The remote could not be reached or timed out; try again later.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A push or delete whose expected value did not match the remote ref.
    #[error("rejected: {0}")]
    Rejected(String),
    /// A ref, commit or object the call needs does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// A malformed argument: a bad ref name, path or object id.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// Anything else (local disk or libgit2 trouble).
    #[error("internal: {0}")]
    Internal(String),
}

/// Credentials for one granted repository, already resolved (e.g. from the
/// environment) by the caller. Never logged.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct GitAuth {
    /// User name for HTTP basic auth, or the ssh user (default: from the URL, else `git`).
    pub username: Option<String>,
    /// Password or token for HTTP basic auth.
    pub password: Option<String>,
    /// Private key file for ssh; without it ssh uses the ssh-agent.
    pub ssh_key: Option<PathBuf>,
}

impl std::fmt::Debug for GitAuth {
    // Hand-written so a password never ends up in a log line or panic message.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitAuth")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("ssh_key", &self.ssh_key)
            .finish()
    }
}

/// The operator's grant of one repository URL to a backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitGrant {
    /// The repository URL (https://, ssh://, scp-like `user@host:path`, git://, file:// or a path).
    pub url: String,
    /// How to authenticate to it.
    pub auth: GitAuth,
}

/// A ref on the remote and the object id it points at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteRef {
    /// Full ref name, e.g. `refs/heads/locks/prod.tfstate`.
    pub name: String,
    /// The object id (hex) it points at.
    pub target: String,
}

/// One file to add, replace (`Some`) or remove (`None`) in a new commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChange {
    /// `/`-separated path inside the repository.
    pub path: String,
    /// The new content, or `None` to remove the file.
    pub content: Option<Vec<u8>>,
}

/// The host side of the git capability: owns the clones directory and the
/// per-repository locks. One per process is enough; it is `Sync`. Its locks only
/// cover this process, so do not share `clones_dir` between processes.
pub struct GitHost {
    clones_dir: PathBuf,
    identity: (String, String),
    /// One lock (holding the opened clone, reused across calls) per normalised URL.
    repos: Mutex<HashMap<String, Arc<Mutex<Option<Repository>>>>>,
}

/// One granted repository, ready for git calls. Cheap; make one per call.
pub struct RepoHandle<'a> {
    host: &'a GitHost,
    auth: &'a GitAuth,
    url: String,
    slot: Arc<Mutex<Option<Repository>>>,
}

impl GitHost {
    /// A host keeping its clones under `clones_dir` (created on demand), committing as
    /// `wasmstate <wasmstate@localhost>`. Also sets libgit2's network timeouts (once per process).
    pub fn new(clones_dir: PathBuf) -> Self {
        set_network_timeouts();
        GitHost {
            clones_dir,
            identity: ("wasmstate".into(), "wasmstate@localhost".into()),
            repos: Mutex::default(),
        }
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
        let slot = lock(&self.repos).entry(url.clone()).or_default().clone();
        Ok(RepoHandle {
            host: self,
            auth: &grant.auth,
            url,
            slot,
        })
    }
}

impl RepoHandle<'_> {
    /// The remote's refs whose full name starts with `prefix` (all refs for `""`;
    /// `HEAD` and peeled tag entries are left out). One connection, no objects fetched.
    pub fn list_remote_refs(&self, prefix: &str) -> Result<Vec<RemoteRef>, GitError> {
        let mut slot = lock(&self.slot);
        let repo = self.open(&mut slot)?;
        let auth = Auth::new(self.auth);
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
        let mut slot = lock(&self.slot);
        let repo = self.open(&mut slot)?;
        let auth = Auth::new(self.auth);
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
                .update_fetchhead(false);
            // libgit2's local transport (file:// and paths) refuses shallow fetches
            // ("shallow fetch is not supported by the local transport", ENOTSUPPORTED,
            // see the test below), so only ask for depth 1 over the network.
            if !is_local(&self.url) {
                opts.depth(1);
            }
            // Reuses the connection opened above (libgit2 only reconnects when disconnected).
            conn.remote()
                .fetch(&specs, Some(&mut opts), None)
                .or_net(self, &auth)?;
        }
        Ok(found
            .into_iter()
            .map(|id| id.map(|id| id.to_string()))
            .collect())
    }

    /// The bytes of the file at `path` in `commit`, or `None` if there is no file there.
    /// [`GitError::NotFound`] if the commit is not in the clone (fetch it first).
    pub fn read_file(&self, commit: &str, path: &str) -> Result<Option<Vec<u8>>, GitError> {
        check_path(path)?;
        let mut slot = lock(&self.slot);
        let repo = self.open(&mut slot)?;
        let tree = self.commit_tree(repo, commit)?;
        let entry = match tree.get_path(Path::new(path)) {
            Ok(entry) if is_file(entry.filemode()) => entry,
            Ok(_) => return Ok(None),
            Err(e) if e.code() == ErrorCode::NotFound => return Ok(None),
            Err(e) => return Err(self.internal("cannot read the tree", e)),
        };
        let blob = repo
            .find_blob(entry.id())
            .or_internal(self, "cannot read a blob")?;
        Ok(Some(blob.content().to_vec()))
    }

    /// The names of the files directly inside `dir` (`""` = root) in `commit`,
    /// relative to `dir`, sorted. Not recursive; a missing directory lists as empty.
    pub fn list_files(&self, commit: &str, dir: &str) -> Result<Vec<String>, GitError> {
        let dir = dir.strip_suffix('/').unwrap_or(dir);
        if !dir.is_empty() {
            check_path(dir)?;
        }
        let mut slot = lock(&self.slot);
        let repo = self.open(&mut slot)?;
        let root = self.commit_tree(repo, commit)?;
        let tree = if dir.is_empty() {
            root
        } else {
            match root.get_path(Path::new(dir)) {
                Ok(e) if e.kind() == Some(ObjectType::Tree) => repo
                    .find_tree(e.id())
                    .or_internal(self, "cannot read a tree")?,
                Ok(_) => return Ok(Vec::new()),
                Err(e) if e.code() == ErrorCode::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(self.internal("cannot read the tree", e)),
            }
        };
        Ok(tree
            .iter()
            .filter(|e| is_file(e.filemode()))
            .map(|e| String::from_utf8_lossy(e.name_bytes()).into_owned())
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
        if message.contains('\0') {
            return Err(GitError::InvalidInput(
                "the commit message contains a NUL byte; remove it".into(),
            ));
        }
        let edits: BTreeMap<&str, Option<&[u8]>> = changes
            .iter()
            .map(|c| (c.path.as_str(), c.content.as_deref()))
            .collect();
        let mut slot = lock(&self.slot);
        let repo = self.open(&mut slot)?;
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
    /// otherwise, and then the remote is unchanged. `new` need not descend from
    /// the old value (lock refs are replaced, not fast-forwarded).
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
        let new = parse_oid(new)?;
        let expected = expected.map(parse_oid).transpose()?;
        let mut slot = lock(&self.slot);
        let repo = self.open(&mut slot)?;
        self.find_commit(repo, &new.to_string())?;
        if is_local(&self.url) {
            self.update_local(repo, name, Some(new), expected)
        } else {
            self.push_remote(repo, name, &format!("+{new}:{name}"), expected)
        }
    }

    /// Delete remote ref `name`, only if it currently points at `expected`
    /// ([`GitError::Rejected`] otherwise, [`GitError::NotFound`] if it does not exist).
    pub fn delete_ref(&self, name: &str, expected: &str) -> Result<(), GitError> {
        check_ref(name)?;
        let expected = parse_oid(expected)?;
        let mut slot = lock(&self.slot);
        let repo = self.open(&mut slot)?;
        if is_local(&self.url) {
            self.update_local(repo, name, None, Some(expected))
        } else {
            self.push_remote(repo, name, &format!(":{name}"), Some(expected))
        }
    }

    /// Push `refspec` (an update or a deletion of `name`) if the advertised value is `expected`.
    fn push_remote(
        &self,
        repo: &Repository,
        name: &str,
        refspec: &str,
        expected: Option<Oid>,
    ) -> Result<(), GitError> {
        let deleting = refspec.starts_with(':');
        let auth = Auth::new(self.auth);
        let mut remote = repo
            .remote_anonymous(&self.url)
            .or_internal(self, "cannot set up the remote")?;
        let mut conn = remote
            .connect_auth(Direction::Push, Some(auth.callbacks()), None)
            .or_net(self, &auth)?;
        let current = conn
            .list()
            .or_net(self, &auth)?
            .iter()
            .find(|h| h.name() == name)
            .map(|h| h.oid());
        self.check_expected(name, current, expected, deleting)?;
        #[cfg(test)]
        tests::run_before_update_hook();

        let rejection = RefCell::new(None);
        {
            let mut callbacks = auth.callbacks();
            callbacks.push_update_reference(|refname, status| {
                if let Some(msg) = status {
                    *rejection.borrow_mut() = Some(format!("{refname}: {msg}"));
                }
                Ok(())
            });
            let mut opts = PushOptions::new();
            opts.remote_callbacks(callbacks);
            // Same connection: libgit2 reuses a connected transport and sends the
            // old values advertised above, which receive-pack verifies atomically.
            conn.remote()
                .push(&[refspec], Some(&mut opts))
                .or_net(self, &auth)?;
        }
        match rejection.into_inner() {
            Some(msg) => Err(GitError::Rejected(format!(
                "{} refused to update {name} ({}); it probably changed concurrently: fetch it and retry",
                redact(&self.url),
                one_line(&msg)
            ))),
            None => Ok(()),
        }
    }

    /// The local-remote equivalent of [`Self::push_remote`]: `new = None` deletes.
    fn update_local(
        &self,
        repo: &Repository,
        name: &str,
        new: Option<Oid>,
        expected: Option<Oid>,
    ) -> Result<(), GitError> {
        let remote =
            Repository::open_bare(local_path(&self.url)).or_net(self, &Auth::new(self.auth))?;
        let current = match remote.refname_to_id(name) {
            Ok(id) => Some(id),
            Err(e) if e.code() == ErrorCode::NotFound => None,
            Err(e) => return Err(self.internal("cannot read the remote ref", e)),
        };
        self.check_expected(name, current, expected, new.is_none())?;
        #[cfg(test)]
        tests::run_before_update_hook();

        let result = match (new, expected) {
            (Some(new), _) => {
                copy_missing_objects(repo, &remote, new)
                    .or_internal(self, "cannot copy objects to the remote")?;
                match expected {
                    None => remote
                        .reference(name, new, false, "wasmstate push")
                        .map(drop),
                    // Locked compare-and-swap: fails with Modified/NotFound if the ref moved.
                    Some(old) => remote
                        .reference_matching(name, new, true, old, "wasmstate push")
                        .map(drop),
                }
            }
            // git_reference_delete passes the value we looked up as the old value, so
            // the deletion fails if the ref moved after the lookup.
            (None, Some(old)) => match remote.find_reference(name) {
                Ok(mut r) if r.target() == Some(old) => r.delete(),
                Ok(_) => Err(git2::Error::new(
                    ErrorCode::Modified,
                    ErrorClass::Reference,
                    "ref moved",
                )),
                Err(e) => Err(e),
            },
            (None, None) => unreachable!("deletions always carry an expected value"),
        };
        result.map_err(|e| match e.code() {
            ErrorCode::Exists | ErrorCode::Modified | ErrorCode::NotFound => {
                GitError::Rejected(format!(
                    "{name} on {} changed concurrently; fetch it and retry",
                    redact(&self.url)
                ))
            }
            // Another writer holds the ref's lock file right now, i.e. it is changing
            // under us; git's receive-pack answers the same ("failed to lock").
            ErrorCode::Locked => GitError::Rejected(format!(
                "{name} on {} is being updated by someone else ({}); fetch it and retry",
                redact(&self.url),
                self.clean(e.message())
            )),
            _ => self.internal("cannot update the remote ref", e),
        })
    }

    /// Rejected / NotFound unless the remote's `current` value is `expected`.
    fn check_expected(
        &self,
        name: &str,
        current: Option<Oid>,
        expected: Option<Oid>,
        deleting: bool,
    ) -> Result<(), GitError> {
        let url = redact(&self.url);
        match (current, expected) {
            (c, e) if c == e => Ok(()),
            (None, _) if deleting => Err(GitError::NotFound(format!(
                "{name} does not exist on {url}; there is nothing to delete"
            ))),
            (Some(c), None) => Err(GitError::Rejected(format!(
                "{name} already exists on {url} (at {c}); fetch it to see who holds it"
            ))),
            (c, Some(e)) => Err(GitError::Rejected(format!(
                "{name} on {url} is at {}, not the expected {e}; fetch it and retry against the current value",
                c.map_or("nothing (deleted)".into(), |c| c.to_string())
            ))),
            (None, None) => unreachable!("equal values are handled above"),
        }
    }

    /// The clone for this URL, opened once and kept in the slot (reopening costs a config parse).
    fn open<'s>(&self, slot: &'s mut Option<Repository>) -> Result<&'s Repository, GitError> {
        if slot.is_none() {
            let dir = self.host.clones_dir.join(clone_dir_name(&self.url));
            let repo = if dir.join("HEAD").is_file() {
                Repository::open_bare(&dir)
            } else {
                Repository::init_bare(&dir)
            };
            *slot = Some(repo.map_err(|e| {
                GitError::Internal(format!(
                    "cannot open or create the clone at {} ({}); check the clones directory",
                    dir.display(),
                    one_line(e.message())
                ))
            })?);
        }
        Ok(slot.as_ref().expect("set above"))
    }

    fn find_commit<'r>(
        &self,
        repo: &'r Repository,
        commit: &str,
    ) -> Result<git2::Commit<'r>, GitError> {
        let id = parse_oid(commit)?;
        repo.find_commit(id).map_err(|e| match e.code() {
            ErrorCode::NotFound => GitError::NotFound(format!(
                "commit {id} is not in the host's clone of {}; fetch the ref that points at it first",
                redact(&self.url)
            )),
            _ => self.internal("cannot read a commit", e),
        })
    }

    fn commit_tree<'r>(&self, repo: &'r Repository, commit: &str) -> Result<Tree<'r>, GitError> {
        self.find_commit(repo, commit)?
            .tree()
            .or_internal(self, "cannot read a commit's tree")
    }

    fn internal(&self, what: &str, e: git2::Error) -> GitError {
        GitError::Internal(format!(
            "{what} for {}: {}; see the host logs",
            redact(&self.url),
            self.clean(e.message())
        ))
    }

    /// Classify an error from talking to the remote.
    fn net_error(&self, auth: &Auth, e: git2::Error) -> GitError {
        let url = redact(&self.url);
        let msg = self.clean(e.message());
        tracing::debug!(url = %url, code = ?e.code(), class = ?e.class(), "git remote error: {msg}");
        if is_local(&self.url) && !local_path(&self.url).exists() {
            // libgit2 only says "unsupported URL protocol" for a missing plain path.
            return GitError::Unavailable(format!(
                "there is no git repository at {url}; check the path, then retry"
            ));
        }
        if auth.refused.get() || e.code() == ErrorCode::Auth {
            return GitError::Denied(format!(
                "{url} refused the credentials ({msg}); check the username/password or ssh key granted for it"
            ));
        }
        match e.class() {
            ErrorClass::Odb
            | ErrorClass::Object
            | ErrorClass::Tree
            | ErrorClass::Zlib
            | ErrorClass::Index
            | ErrorClass::Reference => {
                self.internal("local clone error while talking to the remote", e)
            }
            _ => GitError::Unavailable(format!(
                "the git remote {url} could not be reached ({msg}); check the URL and that the remote is up, then retry"
            )),
        }
    }

    /// A libgit2 message on one line, without credentials embedded in the URL.
    fn clean(&self, msg: &str) -> String {
        one_line(&msg.replace(&self.url, &redact(&self.url)))
    }
}

/// Shorthands turning libgit2 errors into [`GitError`]s with context.
trait OrGitError<T> {
    fn or_internal(self, h: &RepoHandle<'_>, what: &str) -> Result<T, GitError>;
    fn or_net(self, h: &RepoHandle<'_>, auth: &Auth<'_>) -> Result<T, GitError>;
}

impl<T> OrGitError<T> for Result<T, git2::Error> {
    fn or_internal(self, h: &RepoHandle<'_>, what: &str) -> Result<T, GitError> {
        self.map_err(|e| h.internal(what, e))
    }
    fn or_net(self, h: &RepoHandle<'_>, auth: &Auth<'_>) -> Result<T, GitError> {
        self.map_err(|e| h.net_error(auth, e))
    }
}

/// Credential state for one call: bounds libgit2's retry loop and records a refusal.
struct Auth<'g> {
    auth: &'g GitAuth,
    attempts: Cell<u32>,
    refused: Cell<bool>,
}

impl<'g> Auth<'g> {
    fn new(auth: &'g GitAuth) -> Self {
        Auth {
            auth,
            attempts: Cell::new(0),
            refused: Cell::new(false),
        }
    }

    /// Callbacks offering our credentials. A fresh set is needed per libgit2 call
    /// because fetch/push replace the connection's callbacks with their own.
    fn callbacks(&self) -> RemoteCallbacks<'_> {
        let mut cb = RemoteCallbacks::new();
        cb.credentials(move |_url, url_user, allowed| self.offer(url_user, allowed));
        cb
    }

    fn offer(&self, url_user: Option<&str>, allowed: CredentialType) -> Result<Cred, git2::Error> {
        self.attempts.set(self.attempts.get() + 1);
        let a = self.auth;
        let user = a.username.as_deref().or(url_user).unwrap_or("git");
        let cred = if self.attempts.get() > MAX_AUTH_ATTEMPTS {
            None
        } else if allowed.contains(CredentialType::USERNAME) {
            Some(Cred::username(user))
        } else if allowed.contains(CredentialType::SSH_KEY) {
            Some(match &a.ssh_key {
                Some(key) => Cred::ssh_key(user, None, key, None),
                None => Cred::ssh_key_from_agent(user),
            })
        } else if allowed.contains(CredentialType::USER_PASS_PLAINTEXT) {
            a.password
                .as_deref()
                .map(|p| Cred::userpass_plaintext(user, p))
        } else {
            None
        };
        cred.unwrap_or_else(|| {
            self.refused.set(true);
            Err(git2::Error::from_str("no (more) credentials to offer"))
        })
    }
}

/// Set libgit2's process-wide network timeouts, once.
#[allow(unsafe_code)]
fn set_network_timeouts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: these write plain C globals without synchronisation, so they must
        // not race with libgit2 reading them. Only this module uses libgit2 in the
        // host, and `Once` runs this before the first `GitHost` exists, hence before
        // any of our libgit2 network operations. The setters cannot fail.
        unsafe {
            let _ = git2::opts::set_server_connect_timeout_in_milliseconds(CONNECT_TIMEOUT_MS);
            let _ = git2::opts::set_server_timeout_in_milliseconds(IO_TIMEOUT_MS);
        }
    });
}

/// Write the objects reachable from `tip` that `dst` lacks into one pack in `dst`.
/// Stops at objects `dst` has (their history is there too). A pack appears
/// atomically, so a crash leaves no half-copied history behind.
fn copy_missing_objects(src: &Repository, dst: &Repository, tip: Oid) -> Result<(), git2::Error> {
    let dst_odb = dst.odb()?;
    let mut builder = src.packbuilder()?;
    let (mut stack, mut seen, mut any) = (vec![tip], HashSet::new(), false);
    while let Some(id) = stack.pop() {
        if !seen.insert(id) || dst_odb.exists(id) {
            continue;
        }
        match src.find_object(id, None)?.kind() {
            Some(ObjectType::Commit) => {
                let commit = src.find_commit(id)?;
                stack.push(commit.tree_id());
                stack.extend(commit.parent_ids());
            }
            // Skip gitlinks (submodule commits live in another repository).
            Some(ObjectType::Tree) => stack.extend(
                src.find_tree(id)?
                    .iter()
                    .filter(|e| e.kind() != Some(ObjectType::Commit))
                    .map(|e| e.id()),
            ),
            _ => {}
        }
        builder.insert_object(id, None)?;
        any = true;
    }
    if any {
        builder.write(&dst.path().join("objects").join("pack"), 0)?;
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic mid-call leaves nothing half-done in memory that later calls rely on.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn normalize_url(url: &str) -> String {
    url.trim().trim_end_matches('/').to_owned()
}

/// Local transport (libgit2's: `file://` or a path) as opposed to a network one.
fn is_local(url: &str) -> bool {
    if url.starts_with("file://") {
        return true;
    }
    if url.contains("://") {
        return false;
    }
    // scp-like `user@host:path` is ssh: a ':' before any '/'.
    match (url.find(':'), url.find('/')) {
        (Some(colon), Some(slash)) => colon > slash,
        (Some(_), None) => false,
        _ => true,
    }
}

/// The path of a local remote. (Percent-escapes in `file://` URLs are not decoded.)
fn local_path(url: &str) -> &Path {
    Path::new(url.strip_prefix("file://").unwrap_or(url))
}

/// The URL with any `user:password@` part masked, for messages and logs.
fn redact(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
        if let Some(at) = authority.rfind('@') {
            return format!("{scheme}://***@{}", &rest[at + 1..]);
        }
    }
    url.to_owned()
}

/// The clone directory name: a hash, so any URL maps to one safe name.
fn clone_dir_name(url: &str) -> String {
    format!("{}.git", hex::encode(Sha256::digest(url.as_bytes())))
}

fn tracking_ref(name: &str) -> String {
    format!(
        "{TRACKING_PREFIX}{}",
        name.strip_prefix("refs/").unwrap_or(name)
    )
}

fn is_file(mode: i32) -> bool {
    mode == i32::from(FileMode::Blob) || mode == i32::from(FileMode::BlobExecutable)
}

fn one_line(msg: &str) -> String {
    msg.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn check_ref(name: &str) -> Result<(), GitError> {
    if name.starts_with("refs/") && Reference::is_valid_name(name) {
        Ok(())
    } else {
        Err(GitError::InvalidInput(format!(
            "{name:?} is not a valid full ref name; use e.g. refs/heads/main"
        )))
    }
}

fn check_path(path: &str) -> Result<(), GitError> {
    let bad = path.is_empty()
        || path.starts_with('/')
        || path.contains('\0')
        || path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == ".." || c.eq_ignore_ascii_case(".git"));
    if bad {
        return Err(GitError::InvalidInput(format!(
            "{path:?} is not a valid repository path; use a relative `/`-separated path without `.`, `..`, `.git` or empty parts"
        )));
    }
    Ok(())
}

fn parse_oid(s: &str) -> Result<Oid, GitError> {
    match Oid::from_str(s) {
        Ok(id) if s.len() == 40 || s.len() == 64 => Ok(id),
        _ => Err(GitError::InvalidInput(format!(
            "{s:?} is not a full hex object id; pass the 40-character id"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::process::{Child, Command, Stdio};
    use std::sync::Barrier;
    use std::time::{Duration, Instant};
    use tempfile::TempDir;

    const MAIN: &str = "refs/heads/main";

    thread_local! {
        /// Runs between the expected-value check and the ref update (race injection).
        static BEFORE_UPDATE: RefCell<Option<Box<dyn FnOnce()>>> = RefCell::new(None);
    }

    pub(super) fn run_before_update_hook() {
        if let Some(hook) = BEFORE_UPDATE.with(|h| h.borrow_mut().take()) {
            hook();
        }
    }

    fn set_before_update(hook: impl FnOnce() + 'static) {
        BEFORE_UPDATE.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
    }

    fn git_cmd(dir: &Path) -> Command {
        let mut cmd = Command::new("git");
        cmd.current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@example.com",
                "-c",
                "init.defaultBranch=main",
            ]);
        cmd
    }

    /// Run the git CLI in `dir`, panic on failure, return trimmed stdout.
    fn git(dir: &Path, args: &[&str]) -> String {
        let out = git_cmd(dir).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// A bare remote made by the git CLI, with `main` holding `state.tfstate` = "v1".
    struct Remote {
        tmp: TempDir,
        bare: PathBuf,
        work: PathBuf,
    }

    impl Remote {
        fn new() -> Self {
            let tmp = TempDir::new().unwrap();
            let (bare, work) = (tmp.path().join("remote.git"), tmp.path().join("work"));
            git(tmp.path(), &["init", "-q", "--bare", "remote.git"]);
            git(tmp.path(), &["init", "-q", "work"]);
            std::fs::write(work.join("state.tfstate"), "v1").unwrap();
            git(&work, &["add", "."]);
            git(&work, &["commit", "-q", "-m", "seed"]);
            git(
                &work,
                &["push", "-q", bare.to_str().unwrap(), "HEAD:refs/heads/main"],
            );
            Remote { tmp, bare, work }
        }

        fn path_url(&self) -> String {
            self.bare.to_str().unwrap().to_owned()
        }

        fn urls(&self) -> [String; 2] {
            [self.path_url(), format!("file://{}", self.path_url())]
        }

        /// The remote's value of `name`, read by the git CLI.
        fn rev(&self, name: &str) -> Option<String> {
            let out = git_cmd(&self.bare)
                .args(["rev-parse", "--verify", "-q", name])
                .output()
                .unwrap();
            out.status
                .success()
                .then(|| String::from_utf8(out.stdout).unwrap().trim().to_owned())
        }
    }

    /// Move `name` in the bare repo to a new commit made by the git CLI (a concurrent writer).
    fn interlope(bare: &Path, name: &str) -> String {
        // A unique message: the same tree, message and second would give the same id.
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let msg = format!(
            "interloper {}",
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let c = git(
            bare,
            &["commit-tree", "-m", &msg, &format!("{MAIN}^{{tree}}")],
        );
        git(bare, &["update-ref", name, &c]);
        c
    }

    fn grants(url: &str) -> Vec<GitGrant> {
        vec![GitGrant {
            url: url.into(),
            auth: GitAuth::default(),
        }]
    }

    fn change(path: &str, content: Option<&str>) -> FileChange {
        FileChange {
            path: path.into(),
            content: content.map(|c| c.as_bytes().to_vec()),
        }
    }

    fn fetch_one(h: &RepoHandle<'_>, name: &str) -> Option<String> {
        h.fetch(&[name.to_owned()]).unwrap().remove(0)
    }

    #[test]
    fn fetch_existing_and_missing_refs() {
        let r = Remote::new();
        let host = GitHost::new(r.tmp.path().join("clones"));
        for url in r.urls() {
            let g = grants(&url);
            let h = host.repo(&g, &url).unwrap();
            let got = h
                .fetch(&[MAIN.into(), "refs/heads/missing".into()])
                .unwrap();
            assert_eq!(got, vec![r.rev(MAIN), None]);
            assert_eq!(
                h.read_file(got[0].as_deref().unwrap(), "state.tfstate")
                    .unwrap(),
                Some(b"v1".to_vec())
            );
            // Again, now incremental: same answer.
            assert_eq!(
                h.fetch(&[MAIN.into(), "refs/heads/missing".into()])
                    .unwrap(),
                got
            );
        }
    }

    #[test]
    fn commit_with_nested_paths_then_read_and_list() {
        let r = Remote::new();
        let host = GitHost::new(r.tmp.path().join("clones"));
        let (url, g) = (r.path_url(), grants(&r.path_url()));
        let h = host.repo(&g, &url).unwrap();
        let main = fetch_one(&h, MAIN).unwrap();
        let c1 = h
            .commit(
                Some(&main),
                &[
                    change("a/b/c.tfstate", Some("deep")),
                    change("top.txt", Some("top")),
                ],
                "one",
            )
            .unwrap();
        assert_eq!(
            h.read_file(&c1, "a/b/c.tfstate").unwrap(),
            Some(b"deep".to_vec())
        );
        assert_eq!(
            h.read_file(&c1, "state.tfstate").unwrap(),
            Some(b"v1".to_vec()),
            "parent's files are kept"
        );
        assert_eq!(h.read_file(&c1, "nope").unwrap(), None);
        assert_eq!(
            h.read_file(&c1, "a/b").unwrap(),
            None,
            "a directory is not a file"
        );
        assert_eq!(h.list_files(&c1, "").unwrap(), ["state.tfstate", "top.txt"]);
        assert_eq!(h.list_files(&c1, "a").unwrap(), Vec::<String>::new());
        assert_eq!(h.list_files(&c1, "a/b").unwrap(), ["c.tfstate"]);
        assert_eq!(h.list_files(&c1, "a/b/").unwrap(), ["c.tfstate"]);
        assert_eq!(h.list_files(&c1, "zzz").unwrap(), Vec::<String>::new());

        let changes = [
            change("a/b/c.tfstate", None),
            change("ghost", None),
            change("top.txt", Some("t2")),
        ];
        let c2 = h.commit(Some(&c1), &changes, "two").unwrap();
        assert_eq!(h.read_file(&c2, "a/b/c.tfstate").unwrap(), None);
        assert_eq!(h.list_files(&c2, "a/b").unwrap(), Vec::<String>::new());
        assert_eq!(h.read_file(&c2, "top.txt").unwrap(), Some(b"t2".to_vec()));
        let same_path_twice = [change("x", Some("first")), change("x", Some("last"))];
        let root = h.commit(None, &same_path_twice, "root").unwrap();
        assert_eq!(h.list_files(&root, "").unwrap(), ["x"]);
        assert_eq!(h.read_file(&root, "x").unwrap(), Some(b"last".to_vec()));
        // Commits are local only.
        assert_eq!(r.rev(MAIN), Some(main));

        let unknown = "1111111111111111111111111111111111111111";
        assert!(matches!(
            h.commit(Some(unknown), &[], "m"),
            Err(GitError::NotFound(_))
        ));
        assert!(matches!(
            h.read_file(unknown, "x"),
            Err(GitError::NotFound(_))
        ));
        assert!(matches!(
            h.list_files(unknown, ""),
            Err(GitError::NotFound(_))
        ));
        let conflict = h.commit(Some(&c1), &[change("top.txt/x", Some("?"))], "df");
        assert!(
            matches!(conflict, Err(GitError::InvalidInput(_))),
            "{conflict:?}"
        );
    }

    #[test]
    fn create_only_push_succeeds_once_then_is_rejected() {
        let r = Remote::new();
        let host = GitHost::new(r.tmp.path().join("clones"));
        for (i, url) in r.urls().iter().enumerate() {
            let (g, name) = (grants(url), format!("refs/heads/locks/{i}.tfstate"));
            let h = host.repo(&g, url).unwrap();
            let first = h
                .commit(
                    None,
                    &[change(&format!("{i}.tfstate.lock"), Some("me"))],
                    "lock",
                )
                .unwrap();
            h.push(&name, &first, None).unwrap();
            assert_eq!(r.rev(&name).as_ref(), Some(&first));
            let second = h
                .commit(
                    None,
                    &[change(&format!("{i}.tfstate.lock"), Some("you"))],
                    "lock",
                )
                .unwrap();
            assert!(matches!(
                h.push(&name, &second, None),
                Err(GitError::Rejected(_))
            ));
            assert_eq!(r.rev(&name), Some(first));
        }
    }

    #[test]
    fn push_with_stale_expected_is_rejected_and_changes_nothing() {
        let r = Remote::new();
        let host = GitHost::new(r.tmp.path().join("clones"));
        for url in r.urls() {
            let g = grants(&url);
            let h = host.repo(&g, &url).unwrap();
            let main = fetch_one(&h, MAIN).unwrap();
            let next = h
                .commit(Some(&main), &[change("state.tfstate", Some("v2"))], "v2")
                .unwrap();
            let stale = "1111111111111111111111111111111111111111";
            assert!(matches!(
                h.push(MAIN, &next, Some(stale)),
                Err(GitError::Rejected(_))
            ));
            assert!(matches!(
                h.push("refs/heads/absent", &next, Some(&main)),
                Err(GitError::Rejected(_))
            ));
            assert_eq!(r.rev(MAIN).as_ref(), Some(&main));
            h.push(MAIN, &next, Some(&main)).unwrap();
            assert_eq!(r.rev(MAIN).as_ref(), Some(&next));
            // Not a fast-forward: allowed (lock refs get replaced).
            let unrelated = h
                .commit(None, &[change("other", Some("x"))], "root")
                .unwrap();
            h.push(MAIN, &unrelated, Some(&next)).unwrap();
            assert_eq!(r.rev(MAIN), Some(unrelated.clone()));
            h.push(MAIN, &main, Some(&unrelated)).unwrap(); // restore for the next URL
        }
    }

    #[test]
    fn delete_ref_is_compare_and_swap() {
        let r = Remote::new();
        let host = GitHost::new(r.tmp.path().join("clones"));
        for url in r.urls() {
            let g = grants(&url);
            let h = host.repo(&g, &url).unwrap();
            let name = "refs/heads/locks/x.tfstate";
            let c = h
                .commit(None, &[change("x.tfstate.lock", Some("me"))], "lock")
                .unwrap();
            h.push(name, &c, None).unwrap();
            let wrong = "1111111111111111111111111111111111111111";
            assert!(matches!(
                h.delete_ref(name, wrong),
                Err(GitError::Rejected(_))
            ));
            assert_eq!(r.rev(name).as_ref(), Some(&c));
            h.delete_ref(name, &c).unwrap();
            assert_eq!(r.rev(name), None);
            assert!(matches!(h.delete_ref(name, &c), Err(GitError::NotFound(_))));
        }
    }

    /// The ref moves after our expected-value check but before the update:
    /// the update itself must still fail (the check is not just advisory).
    fn assert_update_is_atomic(r: &Remote, h: &RepoHandle<'_>) {
        let main = fetch_one(h, MAIN).unwrap();
        let next = h
            .commit(
                Some(&main),
                &[change("state.tfstate", Some("mine"))],
                "mine",
            )
            .unwrap();
        let bare = r.bare.clone();
        set_before_update(move || drop(interlope(&bare, MAIN)));
        let res = h.push(MAIN, &next, Some(&main));
        assert!(matches!(res, Err(GitError::Rejected(_))), "{res:?}");
        let theirs = r.rev(MAIN).unwrap();
        assert_ne!(theirs, main);
        assert_ne!(theirs, next);

        let lock = "refs/heads/locks/atomic.tfstate";
        let c = h
            .commit(None, &[change("atomic.tfstate.lock", Some("me"))], "lock")
            .unwrap();
        h.push(lock, &c, None).unwrap();
        let bare = r.bare.clone();
        set_before_update(move || drop(git(&bare, &["update-ref", lock, &theirs])));
        assert!(matches!(h.delete_ref(lock, &c), Err(GitError::Rejected(_))));
        assert!(r.rev(lock).is_some());
        git(&r.bare, &["update-ref", "-d", lock]);
    }

    #[test]
    fn local_update_racing_after_check_is_rejected() {
        let r = Remote::new();
        let host = GitHost::new(r.tmp.path().join("clones"));
        for url in r.urls() {
            let g = grants(&url);
            assert_update_is_atomic(&r, &host.repo(&g, &url).unwrap());
        }
    }

    /// Two hosts (separate clones) push from threads against the same expected
    /// value: exactly one wins each round and the remote holds the winner's commit.
    fn race(r: &Remote, url: &str, rounds: usize) {
        let dirs = TempDir::new_in(r.tmp.path()).unwrap();
        let hosts = [
            GitHost::new(dirs.path().join("a")),
            GitHost::new(dirs.path().join("b")),
        ];
        let g = grants(url);
        for round in 0..rounds {
            let barrier = Barrier::new(2);
            let results: Vec<Result<String, GitError>> = std::thread::scope(|s| {
                let joins: Vec<_> = hosts
                    .iter()
                    .enumerate()
                    .map(|(i, host)| {
                        let (g, barrier) = (&g, &barrier);
                        s.spawn(move || {
                            let h = host.repo(g, url).unwrap();
                            let cur = fetch_one(&h, MAIN).unwrap();
                            let content = format!("round {round} host {i}");
                            let c = h
                                .commit(
                                    Some(&cur),
                                    &[change("state.tfstate", Some(&content))],
                                    "race",
                                )
                                .unwrap();
                            barrier.wait(); // both have read the same value; now push together
                            h.push(MAIN, &c, Some(&cur)).map(|()| c)
                        })
                    })
                    .collect();
                joins.into_iter().map(|j| j.join().unwrap()).collect()
            });
            let winners: Vec<&String> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
            assert_eq!(winners.len(), 1, "round {round}: {results:?}");
            assert!(
                results
                    .iter()
                    .any(|r| matches!(r, Err(GitError::Rejected(_)))),
                "{results:?}"
            );
            assert_eq!(r.rev(MAIN).as_ref(), Some(winners[0]));
        }
    }

    #[test]
    fn concurrent_cas_pushes_on_local_remote_exactly_one_wins() {
        let r = Remote::new();
        for url in r.urls() {
            race(&r, &url, 5);
        }
    }

    #[test]
    fn ungranted_url_is_denied() {
        let r = Remote::new();
        let host = GitHost::new(r.tmp.path().join("clones"));
        let g = grants(&r.path_url());
        let err = host.repo(&g, "/somewhere/else.git").err().unwrap();
        assert!(
            matches!(&err, GitError::Denied(m) if m.contains("allow_git")),
            "{err}"
        );
        assert!(
            host.repo(&g, &format!("{}/", r.path_url())).is_ok(),
            "trailing slash is ignored"
        );
        assert!(matches!(
            host.repo(&[], &r.path_url()),
            Err(GitError::Denied(_))
        ));
    }

    #[test]
    fn invalid_refs_paths_and_oids_are_rejected() {
        let r = Remote::new();
        let host = GitHost::new(r.tmp.path().join("clones"));
        let (url, g) = (r.path_url(), grants(&r.path_url()));
        let h = host.repo(&g, &url).unwrap();
        let main = fetch_one(&h, MAIN).unwrap();
        let invalid = |res: Result<_, GitError>| matches!(res, Err(GitError::InvalidInput(_)));
        for bad in [
            "main",
            "refs/heads/a..b",
            "refs/heads/x.lock",
            "refs/heads/sp ace",
            "refs/heads/",
            "",
        ] {
            assert!(invalid(h.fetch(&[bad.into()]).map(drop)), "{bad:?}");
            assert!(invalid(h.push(bad, &main, None)), "{bad:?}");
            assert!(invalid(h.delete_ref(bad, &main)), "{bad:?}");
        }
        for bad in [
            "",
            "/abs",
            "a/../b",
            "..",
            "./a",
            "a/./b",
            "a//b",
            "a/",
            ".git/config",
            "x/.GIT/y",
            "a\0b",
        ] {
            assert!(invalid(h.read_file(&main, bad).map(drop)), "{bad:?}");
            assert!(
                invalid(
                    h.commit(Some(&main), &[change(bad, Some("x"))], "m")
                        .map(drop)
                ),
                "{bad:?}"
            );
        }
        assert!(invalid(h.list_files(&main, "../x").map(drop)));
        for bad in ["xyz", "abc", "", "g".repeat(40).as_str()] {
            assert!(
                invalid(h.read_file(bad, "state.tfstate").map(drop)),
                "{bad:?}"
            );
            assert!(invalid(h.push(MAIN, bad, None)), "{bad:?}");
            assert!(invalid(h.push(MAIN, &main, Some(bad))), "{bad:?}");
        }
        assert!(invalid(h.commit(None, &[], "nul\0byte").map(drop)));
    }

    #[test]
    fn unreachable_remote_is_unavailable() {
        let r = Remote::new();
        let host = GitHost::new(r.tmp.path().join("clones"));
        for url in r.urls() {
            let g = grants(&url);
            let h = host.repo(&g, &url).unwrap();
            let c = h
                .commit(None, &[change("f", Some("x"))], "offline")
                .unwrap();
            let moved = r.tmp.path().join("moved.git");
            std::fs::rename(&r.bare, &moved).unwrap();
            let unavailable =
                |res: Result<(), GitError>| matches!(res, Err(GitError::Unavailable(_)));
            assert!(
                unavailable(h.fetch(&[MAIN.into()]).map(drop)),
                "{:?}",
                h.fetch(&[MAIN.into()])
            );
            assert!(unavailable(h.list_remote_refs("").map(drop)));
            assert!(unavailable(h.push(MAIN, &c, None)));
            assert!(unavailable(h.delete_ref(MAIN, &c)));
            std::fs::rename(&moved, &r.bare).unwrap();
        }
        // Nothing listens on a port we just released: connection refused.
        let port = free_port();
        let url = format!("git://127.0.0.1:{port}/remote.git");
        let g = grants(&url);
        let res = host.repo(&g, &url).unwrap().fetch(&[MAIN.into()]);
        assert!(
            matches!(&res, Err(GitError::Unavailable(m)) if m.contains(&url)),
            "{res:?}"
        );
    }

    #[test]
    fn lock_branch_pushed_by_git_cli_is_listed_and_readable() {
        let r = Remote::new();
        git(&r.work, &["checkout", "-q", "-b", "locks/foo.tfstate"]);
        std::fs::write(r.work.join("foo.tfstate.lock"), r#"{"ID":"abc"}"#).unwrap();
        git(&r.work, &["add", "foo.tfstate.lock"]);
        git(&r.work, &["commit", "-q", "-m", "lock"]);
        git(
            &r.work,
            &["push", "-q", r.bare.to_str().unwrap(), "locks/foo.tfstate"],
        );
        let name = "refs/heads/locks/foo.tfstate";
        let target = r.rev(name).unwrap();

        let host = GitHost::new(r.tmp.path().join("clones"));
        let (url, g) = (r.path_url(), grants(&r.path_url()));
        let h = host.repo(&g, &url).unwrap();
        let want = RemoteRef {
            name: name.into(),
            target: target.clone(),
        };
        assert_eq!(
            h.list_remote_refs("refs/heads/locks/").unwrap(),
            std::slice::from_ref(&want)
        );
        let all = h.list_remote_refs("").unwrap();
        assert!(
            all.contains(&want) && all.iter().any(|r| r.name == MAIN),
            "{all:?}"
        );
        assert_eq!(fetch_one(&h, name), Some(target.clone()));
        assert_eq!(
            h.read_file(&target, "foo.tfstate.lock").unwrap(),
            Some(br#"{"ID":"abc"}"#.to_vec())
        );
    }

    #[test]
    fn credential_offers_are_bounded_and_secrets_stay_out_of_messages() {
        let with_password = GitAuth {
            password: Some("s3cret".into()),
            ..GitAuth::default()
        };
        let auth = Auth::new(&with_password);
        for _ in 0..MAX_AUTH_ATTEMPTS {
            assert!(
                auth.offer(None, CredentialType::USER_PASS_PLAINTEXT)
                    .is_ok()
            );
        }
        // libgit2 would keep asking forever after the server refuses; we stop.
        assert!(
            auth.offer(None, CredentialType::USER_PASS_PLAINTEXT)
                .is_err()
        );
        assert!(auth.refused.get());
        let none = GitAuth::default();
        let auth = Auth::new(&none);
        assert!(
            auth.offer(None, CredentialType::USER_PASS_PLAINTEXT)
                .is_err(),
            "nothing to offer"
        );
        assert!(auth.refused.get());
        assert!(!format!("{with_password:?}").contains("s3cret"));
        assert_eq!(
            redact("https://u:s3cret@h.example/r.git"),
            "https://***@h.example/r.git"
        );
        assert_eq!(redact("git@h.example:r.git"), "git@h.example:r.git");
        assert!(is_local("/srv/r.git") && is_local("file:///srv/r.git") && is_local("r.git"));
        assert!(
            !is_local("git@h.example:r.git") && !is_local("ssh://h/r") && !is_local("https://h/r")
        );
    }

    /// Why `fetch` does not ask for depth on local remotes.
    #[test]
    fn libgit2_local_transport_refuses_shallow_fetch() {
        let r = Remote::new();
        let repo = Repository::init_bare(r.tmp.path().join("probe.git")).unwrap();
        let mut remote = repo.remote_anonymous(&r.path_url()).unwrap();
        let mut opts = FetchOptions::new();
        opts.depth(1);
        let err = remote
            .fetch(&["+refs/heads/main:refs/probe"], Some(&mut opts), None)
            .unwrap_err();
        assert!(err.message().contains("shallow"), "{err}");
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// `git-daemon` serving the remote over git:// with pushes enabled; killed on drop.
    struct Daemon(Child);

    impl Daemon {
        fn start(base: &Path) -> (Self, u16) {
            let port = free_port();
            // Run git-daemon itself: `git daemon` is a wrapper process, and killing
            // it would leave the real daemon running.
            let exec_path = git(base, &["--exec-path"]);
            let child = Command::new(Path::new(&exec_path).join("git-daemon"))
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .args([
                    "--export-all",
                    "--enable=receive-pack",
                    "--listen=127.0.0.1",
                ])
                .arg(format!("--base-path={}", base.display()))
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let mut daemon = Daemon(child);
            let deadline = Instant::now() + Duration::from_secs(10);
            while TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(daemon.0.try_wait().unwrap().is_none(), "git daemon exited");
                assert!(
                    Instant::now() < deadline,
                    "git daemon did not start listening"
                );
                std::thread::sleep(Duration::from_millis(10)); // poll interval, not synchronisation
            }
            (daemon, port)
        }
    }

    impl Drop for Daemon {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn git_daemon_cas_push_and_shallow_fetch() {
        let r = Remote::new();
        // A second commit, so a depth-1 fetch has something to leave out.
        std::fs::write(r.work.join("state.tfstate"), "v2").unwrap();
        git(&r.work, &["commit", "-q", "-am", "v2"]);
        git(
            &r.work,
            &[
                "push",
                "-q",
                r.bare.to_str().unwrap(),
                "HEAD:refs/heads/main",
            ],
        );
        let (_daemon, port) = Daemon::start(r.tmp.path());
        let url = format!("git://127.0.0.1:{port}/remote.git");
        let host = GitHost::new(r.tmp.path().join("clones"));
        let g = grants(&url);
        let h = host.repo(&g, &url).unwrap();

        let main = fetch_one(&h, MAIN).unwrap();
        assert_eq!(Some(&main), r.rev(MAIN).as_ref());
        let clone =
            Repository::open_bare(r.tmp.path().join("clones").join(clone_dir_name(&url))).unwrap();
        assert!(clone.is_shallow(), "depth 1 works over git://");
        assert_eq!(
            h.read_file(&main, "state.tfstate").unwrap(),
            Some(b"v2".to_vec())
        );

        let lock = "refs/heads/locks/prod.tfstate";
        let mine = h
            .commit(
                Some(&main),
                &[change("prod.tfstate.lock", Some("me"))],
                "lock",
            )
            .unwrap();
        h.push(lock, &mine, None).unwrap();
        assert!(matches!(
            h.push(lock, &mine, None),
            Err(GitError::Rejected(_))
        ));
        assert_eq!(
            h.list_remote_refs("refs/heads/locks/").unwrap(),
            [RemoteRef {
                name: lock.into(),
                target: mine.clone()
            }]
        );

        let next = h
            .commit(Some(&main), &[change("state.tfstate", Some("v3"))], "v3")
            .unwrap();
        assert!(matches!(
            h.push(MAIN, &next, Some(&mine)),
            Err(GitError::Rejected(_))
        ));
        h.push(MAIN, &next, Some(&main)).unwrap();
        assert_eq!(r.rev(MAIN).as_ref(), Some(&next));
        h.delete_ref(lock, &mine).unwrap();
        assert_eq!(r.rev(lock), None);

        // receive-pack itself refuses a stale old value (the ref moves after our check).
        assert_update_is_atomic(&r, &h);
        // A commit we do not have locally is downloaded (incrementally, shallow).
        let theirs = interlope(&r.bare, MAIN);
        assert_eq!(fetch_one(&h, MAIN), Some(theirs.clone()));
        assert_eq!(
            h.read_file(&theirs, "state.tfstate").unwrap(),
            Some(b"v3".to_vec())
        );
        race(&r, &url, 5);
    }
}
