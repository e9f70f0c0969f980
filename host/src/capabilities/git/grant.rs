//! What the git capability is given (a grant of one repository and its
//! credentials) and what it answers when a call fails.

use std::path::PathBuf;

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
    /// Refs the guest may update or delete there (`*` within a segment,
    /// `**` across); fetching and reading are not limited.
    pub refs: Vec<String>,
    /// Paths its commits may add, change or remove (same patterns).
    pub paths: Vec<String>,
}
