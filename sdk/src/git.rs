//! Git through the host: read and commit files, and update refs on a remote
//! with compare-and-swap, without libgit2 in the guest.
//!
//! The operator grants a backend the repositories it may use (`allow_git`);
//! the host holds the credentials and a local clone, so the guest only ever
//! names the repository by URL.
//!
//! ```no_run
//! use wasmstate_guest::git::{FileChange, Repo};
//!
//! # fn main() -> Result<(), wasmstate_guest::git::GitError> {
//! let repo = Repo::new("https://git.example.com/infra/state.git");
//! let main = repo.fetch(&["refs/heads/main"])?.remove(0);
//! let change = FileChange::put("prod.tfstate", b"{}".to_vec());
//! let commit = repo.commit(main.as_deref(), &[change], "update prod")?;
//! // Succeeds only if nobody moved main since the fetch.
//! repo.push("refs/heads/main", &commit, main.as_deref())?;
//! # Ok(()) }
//! ```

use crate::Error;
use crate::export::wit::wasmstate::backend::git as wit;
use std::fmt;

/// Why a git call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GitError {
    /// The operator did not grant this repository to the backend.
    Denied(String),
    /// The remote could not be reached; a retry may succeed.
    Unavailable(String),
    /// A push or delete lost a compare-and-swap: the remote ref is not at
    /// the expected value (or already exists, for a create-only push).
    Rejected(String),
    /// A ref, commit or object does not exist.
    NotFound(String),
    /// A malformed ref name, path or object id.
    InvalidInput(String),
    /// Anything else.
    Internal(String),
}

impl fmt::Display for GitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GitError::Denied(m) => write!(f, "git access denied: {m}"),
            GitError::Unavailable(m) => write!(f, "git remote unavailable: {m}"),
            GitError::Rejected(m) => write!(f, "git push rejected: {m}"),
            GitError::NotFound(m) => write!(f, "git object not found: {m}"),
            GitError::InvalidInput(m) => write!(f, "invalid git argument: {m}"),
            GitError::Internal(m) => write!(f, "git error: {m}"),
        }
    }
}

impl std::error::Error for GitError {}

impl From<GitError> for Error {
    /// The storage error a git failure means when nothing more specific
    /// applies: an unreachable remote or a lost race is worth a retry
    /// (`Unavailable`, a 503 Terraform retries); a denied repository is the
    /// operator's configuration; the rest are internal.
    fn from(err: GitError) -> Self {
        match err {
            GitError::Unavailable(_) | GitError::Rejected(_) => Error::Unavailable(err.to_string()),
            GitError::Denied(_) => Error::InvalidConfig(vec![crate::Diagnostic {
                key: Some("repository".into()),
                message: err.to_string(),
            }]),
            GitError::InvalidInput(m) => Error::InvalidInput(m),
            GitError::NotFound(_) | GitError::Internal(_) => Error::Internal(err.to_string()),
        }
    }
}

impl From<wit::GitError> for GitError {
    fn from(err: wit::GitError) -> Self {
        match err {
            wit::GitError::Denied(m) => GitError::Denied(m),
            wit::GitError::Unavailable(m) => GitError::Unavailable(m),
            wit::GitError::Rejected(m) => GitError::Rejected(m),
            wit::GitError::NotFound(m) => GitError::NotFound(m),
            wit::GitError::InvalidInput(m) => GitError::InvalidInput(m),
            wit::GitError::Internal(m) => GitError::Internal(m),
        }
    }
}

pub use wasmstate_types::git::{FileChange, FileVersion, RemoteRef};

/// A file's blob id and size in a commit ([`Repo::stat_file`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStat {
    /// The blob's object id (hex).
    pub blob: String,
    /// The file's size in bytes.
    pub size: u64,
}

/// A remote repository the operator granted, named by URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repo {
    url: String,
}

impl Repo {
    /// The repository at `url`. Nothing is contacted until a call.
    pub fn new(url: impl Into<String>) -> Self {
        Repo { url: url.into() }
    }

    /// The URL this handle names.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Refs on the remote whose full name starts with `prefix`.
    pub fn list_remote_refs(&self, prefix: &str) -> Result<Vec<RemoteRef>, GitError> {
        let refs = wit::list_remote_refs(&self.url, prefix)?;
        Ok(refs
            .into_iter()
            .map(|r| RemoteRef {
                name: r.name,
                target: r.target,
            })
            .collect())
    }

    /// Fetch `refs` (full names) and return what each points at on the
    /// remote, in order (`None`: no such ref).
    pub fn fetch(&self, refs: &[&str]) -> Result<Vec<Option<String>>, GitError> {
        let refs: Vec<String> = refs.iter().map(|r| r.to_string()).collect();
        Ok(wit::fetch(&self.url, &refs)?)
    }

    /// A file's bytes in `commit`, or `None` when there is no such file.
    pub fn read_file(&self, commit: &str, path: &str) -> Result<Option<Vec<u8>>, GitError> {
        Ok(wit::read_file(&self.url, commit, path)?)
    }

    /// Write the file at `path` in `commit` into `out`, straight from the
    /// host's clone (this guest never holds it); its size, `None` when
    /// there is no such file.
    pub fn read_file_into(
        &self,
        commit: &str,
        path: &str,
        out: &mut crate::StateWriter<'_>,
    ) -> Result<Option<u64>, GitError> {
        if let Some(sink) = out.host_sink() {
            return Ok(wit::read_file_into(&self.url, commit, path, sink)?);
        }
        let Some(bytes) = self.read_file(commit, path)? else {
            return Ok(None);
        };
        // A memory writer never stops early.
        let _ = std::io::Write::write_all(out, &bytes);
        Ok(Some(bytes.len() as u64))
    }

    /// The blob id and size of the file at `path` in `commit`, without
    /// reading it (`None`: no such file). The blob id is a digest of the
    /// file's bytes: it changes exactly when they do, so it serves as the
    /// file's version for a compare-and-swap.
    pub fn stat_file(&self, commit: &str, path: &str) -> Result<Option<FileStat>, GitError> {
        Ok(wit::stat_file(&self.url, commit, path)?.map(|s| FileStat {
            blob: s.blob,
            size: s.size,
        }))
    }

    /// File names directly inside `dir` (`""`: the root) of `commit`'s tree.
    pub fn list_files(&self, commit: &str, dir: &str) -> Result<Vec<String>, GitError> {
        Ok(wit::list_files(&self.url, commit, dir)?)
    }

    /// Create a commit (not pushed) on top of `parent` (`None`: a root
    /// commit with an empty tree) with `changes` applied.
    pub fn commit(
        &self,
        parent: Option<&str>,
        changes: &[FileChange],
        message: &str,
    ) -> Result<String, GitError> {
        Ok(wit::commit(&self.url, parent, &to_wit(changes), message)?)
    }

    /// [`Repo::commit`] with the file at `path` set to `state`, which the
    /// host reads (this guest never holds it); it can be committed again
    /// after a lost push.
    pub fn commit_state(
        &self,
        parent: Option<&str>,
        path: &str,
        state: &crate::StateReader<'_>,
        changes: &[FileChange],
        message: &str,
    ) -> Result<String, GitError> {
        let mut wit_changes = to_wit(changes);
        match state.host_source() {
            Some(source) => Ok(wit::commit_state(
                &self.url,
                parent,
                path,
                source,
                &wit_changes,
                message,
            )?),
            None => {
                // The simple path: the bytes are already in this guest.
                wit_changes.push(wit::FileChange {
                    path: path.to_string(),
                    content: Some(state.in_memory().unwrap_or_default().to_vec()),
                });
                Ok(wit::commit(&self.url, parent, &wit_changes, message)?)
            }
        }
    }

    /// Point remote ref `name` at `new` only if it is now `expected`
    /// (`None`: only if it does not exist).
    pub fn push(&self, name: &str, new: &str, expected: Option<&str>) -> Result<(), GitError> {
        Ok(wit::push(&self.url, name, new, expected)?)
    }

    /// The commits reachable from `commit` that changed `path`, newest
    /// first, at most `limit` (the host fetches missing history first).
    pub fn file_history(
        &self,
        commit: &str,
        path: &str,
        limit: u32,
    ) -> Result<Vec<FileVersion>, GitError> {
        let versions = wit::file_history(&self.url, commit, path, limit)?;
        Ok(versions
            .into_iter()
            .map(|v| FileVersion {
                commit: v.commit,
                time_unix_ms: v.time_unix_ms,
                size: v.size,
            })
            .collect())
    }

    /// Delete remote ref `name` only if it now points at `expected`.
    pub fn delete_ref(&self, name: &str, expected: &str) -> Result<(), GitError> {
        Ok(wit::delete_ref(&self.url, name, expected)?)
    }
}

fn to_wit(changes: &[FileChange]) -> Vec<wit::FileChange> {
    changes
        .iter()
        .map(|c| wit::FileChange {
            path: c.path.clone(),
            content: c.content.clone(),
        })
        .collect()
}
