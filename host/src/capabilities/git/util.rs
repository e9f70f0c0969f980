//! Small helpers: URL and name checks, clone directory names, messages.

use super::*;

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic mid-call leaves nothing half-done in memory that later calls rely on.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The sum of `count` over every file under `dir` (what cannot be read
/// counts nothing).
fn sum_files(dir: &Path, count: &impl Fn(&std::fs::DirEntry) -> u64) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => sum_files(&e.path(), count),
            Ok(t) if t.is_file() => count(&e),
            _ => 0,
        })
        .sum()
}

/// Bytes of the files under `dir` (0 when it cannot be read).
pub(super) fn dir_size(dir: &Path) -> u64 {
    sum_files(dir, &|e| e.metadata().map_or(0, |m| m.len()))
}

/// The clones directory this process owns: `dir`, or when another
/// process holds it (replicas sharing a data directory), the first free
/// `dir/replicas/N`. Held by an exclusive `flock` on `.owner` in it for
/// the life of the returned file: clones are only safe (and stale lock
/// files only safe to remove) when one process uses them. Only "held by
/// another" moves on to the next; a filesystem without working locks is
/// an error, never a directory shared unowned.
pub(super) fn claim_clones_dir(dir: &Path) -> Result<(PathBuf, std::fs::File), String> {
    use rustix::fs::{FlockOperation, flock};
    let candidates = std::iter::once(dir.to_path_buf())
        .chain((1..=64).map(|n| dir.join("replicas").join(n.to_string())));
    for candidate in candidates {
        let file = std::fs::create_dir_all(&candidate)
            .and_then(|()| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(candidate.join(".owner"))
            })
            .map_err(|e| format!("cannot create {}: {e}", candidate.display()))?;
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok((candidate, file)),
            Err(rustix::io::Errno::WOULDBLOCK) => continue,
            Err(e) => {
                return Err(format!(
                    "cannot lock {} ({e}); keep data_dir on a filesystem with working flock",
                    candidate.join(".owner").display()
                ));
            }
        }
    }
    Err(format!(
        "all 65 clone directories under {} are held by other processes",
        dir.display()
    ))
}

/// Remove every `*.lock` file under `dir`, returning how many there were.
/// libgit2 takes a ref or the index by creating `<file>.lock` and renaming
/// it into place; a host killed in between leaves the lock behind and every
/// later update of that file fails with "locked" forever. Only for a clone
/// this process owns (`clones_dir` is not shared) and opens afresh, so no
/// call of ours can hold one.
pub(super) fn remove_stale_locks(dir: &Path) -> u64 {
    sum_files(dir, &|e| {
        let lock = e.file_name().to_string_lossy().ends_with(".lock");
        u64::from(lock && std::fs::remove_file(e.path()).is_ok())
    })
}

/// Whether `pattern` covers `name`: `*` matches within one `/`-separated
/// segment, `**` matches across segments; everything else literally.
pub(super) fn matches_pattern(pattern: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match p {
            [] => n.is_empty(),
            [b'*', b'*', rest @ ..] => (0..=n.len()).any(|i| go(rest, &n[i..])),
            [b'*', rest @ ..] => (0..=n.len())
                .take_while(|&i| i == 0 || n[i - 1] != b'/')
                .any(|i| go(rest, &n[i..])),
            [c, rest @ ..] => n.first() == Some(c) && go(rest, &n[1..]),
        }
    }
    go(pattern.as_bytes(), name.as_bytes())
}

/// Whether libgit2's `asking` URL is the granted repository or below it
/// (ignoring a trailing slash, a `.git` suffix and user info): a redirect
/// to another host or repository is not.
pub(super) fn same_repository(granted: &str, asking: &str) -> bool {
    // Parsed, never cut at a character: an `@` in a path is not a user
    // name's end (`https://evil.example/x@git.example.com/org/repo`).
    match (
        url::Url::parse(granted.trim()),
        url::Url::parse(asking.trim()),
    ) {
        (Ok(granted), Ok(asking)) => {
            granted.scheme() == asking.scheme()
                && granted.host() == asking.host()
                && granted.port_or_known_default() == asking.port_or_known_default()
                && within(repository_path(&granted), asking.path())
        }
        // Local paths and scp-like `git@host:org/repo` have no URL form;
        // credentials are never offered to them over the network anyway.
        _ => {
            let plain = |url: &str| normalize_url(url).trim_end_matches(".git").to_owned();
            plain(granted) == plain(asking)
        }
    }
}

/// The repository's path without a trailing `/` or `.git`.
fn repository_path(url: &url::Url) -> &str {
    let path = url.path().trim_end_matches('/');
    path.strip_suffix(".git").unwrap_or(path)
}

/// `asking` is the repository at `granted` or a path inside it
/// (`/info/refs`, `.git/git-upload-pack`).
fn within(granted: &str, asking: &str) -> bool {
    asking
        .strip_prefix(granted)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/') || rest.starts_with(".git"))
}

pub(super) fn normalize_url(url: &str) -> String {
    url.trim().trim_end_matches('/').to_owned()
}

/// Local transport (libgit2's: `file://` or a path) as opposed to a network one.
pub(super) fn is_local(url: &str) -> bool {
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
pub(super) fn local_path(url: &str) -> &Path {
    Path::new(url.strip_prefix("file://").unwrap_or(url))
}

/// The URL with any `user:password@` part masked, for messages and logs.
pub fn redact(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
        if let Some(at) = authority.rfind('@') {
            return format!("{scheme}://***@{}", &rest[at + 1..]);
        }
    }
    url.to_owned()
}

/// Whether a libgit2 error says the clone lacks objects its refs name
/// (what a fetch cut off half-way can leave behind).
pub(super) fn is_damage(error: &git2::Error) -> bool {
    matches!(
        error.class(),
        git2::ErrorClass::Odb | git2::ErrorClass::Object
    ) || error.message().contains("object not found")
}

/// The clone directory name: a hash, so any key maps to one safe name.
pub(super) fn clone_dir_name(key: &str) -> String {
    format!("{}.git", hex::encode(Sha256::digest(key.as_bytes())))
}

/// What a clone is shared by: one URL under one grant (the same
/// credentials, refs and paths).
pub(super) fn clone_key(url: &str, grant: &super::GitGrant) -> String {
    let auth = &grant.auth;
    let mut identity = Sha256::new();
    for part in [
        auth.username.as_deref().unwrap_or(""),
        auth.password.as_deref().unwrap_or(""),
        &auth
            .ssh_key
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        &grant.refs.join("\n"),
        &grant.paths.join("\n"),
    ] {
        identity.update(part.as_bytes());
        identity.update([0]);
    }
    format!("{url}#{}", hex::encode(identity.finalize()))
}

pub(super) fn tracking_ref(name: &str) -> String {
    format!(
        "{TRACKING_PREFIX}{}",
        name.strip_prefix("refs/").unwrap_or(name)
    )
}

pub(super) fn is_file(mode: i32) -> bool {
    mode == i32::from(FileMode::Blob) || mode == i32::from(FileMode::BlobExecutable)
}

pub(super) fn one_line(msg: &str) -> String {
    msg.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub(super) fn check_ref(name: &str) -> Result<(), GitError> {
    if name.starts_with("refs/") && Reference::is_valid_name(name) {
        Ok(())
    } else {
        Err(GitError::InvalidInput(format!(
            "{name:?} is not a valid full ref name; use e.g. refs/heads/main"
        )))
    }
}

pub(super) fn check_path(path: &str) -> Result<(), GitError> {
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

pub(super) fn parse_oid(s: &str) -> Result<Oid, GitError> {
    match Oid::from_str(s) {
        Ok(id) if s.len() == 40 || s.len() == 64 => Ok(id),
        _ => Err(GitError::InvalidInput(format!(
            "{s:?} is not a full hex object id; pass the 40-character id"
        ))),
    }
}

#[cfg(test)]
mod pattern_tests {
    use super::*;

    #[test]
    fn patterns_match_within_and_across_segments() {
        assert!(matches_pattern("refs/heads/main", "refs/heads/main"));
        assert!(!matches_pattern("refs/heads/main", "refs/heads/main2"));
        assert!(matches_pattern(
            "refs/heads/locks/**",
            "refs/heads/locks/env/prod.tfstate"
        ));
        assert!(!matches_pattern("refs/heads/locks/**", "refs/heads/main"));
        assert!(matches_pattern("states/*.tfstate", "states/prod.tfstate"));
        assert!(!matches_pattern(
            "states/*.tfstate",
            "states/x/prod.tfstate"
        ));
        assert!(!matches_pattern(
            "states/*.tfstate",
            ".github/workflows/x.yml"
        ));
        assert!(matches_pattern("*.tfstate.lock", "prod.tfstate.lock"));
    }

    #[test]
    fn credentials_follow_only_the_granted_repository() {
        let granted = "https://git.example.com/infra/state.git";
        assert!(same_repository(
            granted,
            "https://git.example.com/infra/state.git"
        ));
        assert!(same_repository(
            granted,
            "https://git.example.com/infra/state.git/info/refs"
        ));
        assert!(same_repository(
            granted,
            "https://user@git.example.com/infra/state"
        ));
        assert!(!same_repository(
            granted,
            "https://evil.example/infra/state.git"
        ));
        assert!(!same_repository(
            granted,
            "https://git.example.com/infra/state-other.git"
        ));
        // A redirect's target with the granted host in its path (issue 27,
        // finding 3): the text after its `@` looked like the granted URL.
        assert!(!same_repository(
            granted,
            "https://evil.example/x@git.example.com/infra/state.git"
        ));
        assert!(!same_repository(
            granted,
            "http://git.example.com/infra/state.git"
        ));
        assert!(!same_repository(
            granted,
            "https://git.example.com:8443/infra/state.git"
        ));
        assert!(same_repository(
            granted,
            "https://git.example.com:443/infra/state.git/info/refs?service=git-upload-pack"
        ));
    }
}
