//! The records of the WIT `git` interface in plain Rust, shared by the
//! host's git capability and the SDK's `git` module, so both sides of the
//! boundary speak the same types.

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

impl FileChange {
    /// Add or replace `path` with `content`.
    pub fn put(path: impl Into<String>, content: Vec<u8>) -> Self {
        FileChange {
            path: path.into(),
            content: Some(content),
        }
    }

    /// Remove `path`.
    pub fn remove(path: impl Into<String>) -> Self {
        FileChange {
            path: path.into(),
            content: None,
        }
    }
}

/// A commit that changed a file, as listed by `file-history`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileVersion {
    /// The commit id (hex).
    pub commit: String,
    /// Committer time, milliseconds since the Unix epoch.
    pub time_unix_ms: u64,
    /// The file's size in that commit (0 when the commit removed it).
    pub size: u64,
}
