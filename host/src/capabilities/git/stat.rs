//! A file's blob id and size in a commit, from its tree and the object's
//! header: the blob itself is never read, whatever its size.

use std::cell::Cell;
use std::path::Path;

use git2::ErrorCode;

use super::util::{check_path, is_damage, is_file, redact};
use super::{GitError, RepoHandle};

/// What [`RepoHandle::stat_file`] knows of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStat {
    /// The blob's object id (hex): a digest of the file's bytes, so equal
    /// ids mean equal files.
    pub blob: String,
    /// The file's size in bytes.
    pub size: u64,
}

impl RepoHandle<'_> {
    /// The blob id and size of the file at `path` in `commit`, or `None` if
    /// there is no file there. [`GitError::NotFound`] if the commit is not
    /// in the clone (fetch it first).
    pub fn stat_file(&self, commit: &str, path: &str) -> Result<Option<FileStat>, GitError> {
        check_path(path)?;
        let mut slot = self.lock_slot()?;
        let (repo, _, damaged) = self.open_tracked(&mut slot)?;
        let tree = self
            .find_commit(repo, commit)?
            .tree()
            .map_err(|e| self.broken(damaged, "cannot read a commit's tree", e))?;
        let entry = match tree.get_path(Path::new(path)) {
            Ok(entry) if is_file(entry.filemode()) => entry,
            Ok(_) => return Ok(None),
            Err(e) if e.code() == ErrorCode::NotFound => return Ok(None),
            Err(e) => return Err(self.broken(damaged, "cannot read the tree", e)),
        };
        let (size, _) = repo
            .odb()
            .and_then(|odb| odb.read_header(entry.id()))
            .map_err(|e| self.broken(damaged, "cannot read a blob's header", e))?;
        Ok(Some(FileStat {
            blob: entry.id().to_string(),
            size: size as u64,
        }))
    }

    /// `e` while reading objects of a commit the clone holds: objects
    /// missing mean a damaged clone (a cut-off transfer), discarded on the
    /// next call instead of this one failing the same way forever.
    pub(super) fn broken(&self, damaged: &Cell<bool>, what: &str, e: git2::Error) -> GitError {
        if is_damage(&e) {
            tracing::warn!(url = %redact(&self.url), "git clone is missing objects of a commit it holds: discarding it; the next call fetches afresh");
            damaged.set(true);
            return GitError::Unavailable(format!(
                "the local clone of {} lost objects and is fetched afresh; retry",
                redact(&self.url)
            ));
        }
        self.internal(what, e)
    }
}
