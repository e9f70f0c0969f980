//! Pure naming logic, free of host calls so it can be tested natively: the
//! configuration, where a workspace's state and lock live, and the commit
//! messages.

use wasmstate_guest::{Config, Diagnostic, Error, validate_workspace_name};

/// Configuration keys this guest understands.
pub const KEYS: &[&str] = &["repository", "ref", "dir"];

/// The branch used when `ref` is not set.
pub const DEFAULT_REF: &str = "main";

/// Suffix of state files: `<dir>/<workspace>.tfstate`.
pub const STATE_SUFFIX: &str = ".tfstate";

/// Where workspaces' metadata lives, inside the state directory.
pub const METADATA_DIR: &str = ".wasmstate/metadata";

/// The operator's configuration, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// URL of the repository, exactly as granted to the backend.
    pub repository: String,
    /// Full name of the branch holding the states, `refs/heads/<ref>`.
    pub main_ref: String,
    /// Directory of the state files, `""` for the repository root.
    pub dir: String,
}

impl Settings {
    /// Read and check the configuration; every problem is reported at once,
    /// one diagnostic per key, so the operator fixes them in one go.
    pub fn from_config(config: &Config) -> Result<Self, Error> {
        config.reject_unknown(KEYS)?;
        let mut problems = Vec::new();
        let repository = config.get("repository").unwrap_or_default();
        if repository.trim().is_empty() {
            problems.push(Diagnostic::key(
                "repository",
                "missing required key `repository` (the git URL granted with allow_git)",
            ));
        }
        let branch = config.get("ref").unwrap_or(DEFAULT_REF);
        if let Err(why) = check_ref_path(branch) {
            problems.push(Diagnostic::key("ref", format!("ref {branch:?}: {why}")));
        } else if branch.starts_with("refs/") {
            problems.push(Diagnostic::key(
                "ref",
                format!("ref {branch:?}: give the branch name only, e.g. \"main\""),
            ));
        } else if branch == "locks" || branch.starts_with("locks/") {
            // Git cannot hold both `refs/heads/locks` and `refs/heads/locks/x`,
            // and `locks/…` branches are the lock branches.
            problems.push(Diagnostic::key(
                "ref",
                format!("ref {branch:?} collides with the lock branches refs/heads/locks/…"),
            ));
        }
        let dir = config.get("dir").unwrap_or_default();
        if !dir.is_empty() {
            // The directory becomes part of the lock branch's name, so it must
            // obey git's ref-name rules as well as path rules.
            if let Err(why) = check_ref_path(dir) {
                problems.push(Diagnostic::key("dir", format!("dir {dir:?}: {why}")));
            }
        }
        if !problems.is_empty() {
            return Err(Error::InvalidConfig(problems));
        }
        Ok(Settings {
            repository: repository.to_string(),
            main_ref: format!("refs/heads/{branch}"),
            dir: dir.to_string(),
        })
    }

    /// Where workspace `workspace` lives. Refuses names git cannot put in a
    /// branch name (`..`), which the host's name rule lets through.
    pub fn paths(&self, workspace: &str) -> Result<Paths, Error> {
        if workspace.contains("..") {
            return Err(Error::InvalidInput(format!(
                "workspace name {workspace:?} contains \"..\", which git refuses in the \
                 name of its lock branch"
            )));
        }
        let state = if self.dir.is_empty() {
            format!("{workspace}{STATE_SUFFIX}")
        } else {
            format!("{}/{workspace}{STATE_SUFFIX}", self.dir)
        };
        let metadata = if self.dir.is_empty() {
            format!("{METADATA_DIR}/{workspace}.json")
        } else {
            format!("{}/{METADATA_DIR}/{workspace}.json", self.dir)
        };
        Ok(Paths {
            lock_ref: format!("refs/heads/locks/{state}"),
            lock_file: format!("{state}.lock"),
            state,
            metadata,
        })
    }
}

/// The names belonging to one workspace, as terraform-backend-git derives
/// them from its `state` parameter `P`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    /// `P`: the state file's path in the repository.
    pub state: String,
    /// `refs/heads/locks/P`: exists exactly while the state is locked.
    pub lock_ref: String,
    /// `P.lock`: the LockInfo JSON inside the lock branch's commit.
    pub lock_file: String,
    /// `<dir>/.wasmstate/metadata/<workspace>.json`: the workspace's
    /// metadata, on the states' branch (Terraform never reads it, and a
    /// listing of `<dir>` sees only files, not this directory).
    pub metadata: String,
}

/// The workspace a file listed in the state directory belongs to, if it is
/// a state file with a name wasmstate accepts (other tools may keep files
/// with any name there).
pub fn workspace_of(file: &str) -> Option<&str> {
    let name = file.strip_suffix(STATE_SUFFIX)?;
    (validate_workspace_name(name).is_ok() && !name.contains("..")).then_some(name)
}

/// Check a `/`-separated name by git's ref-name rules (`git
/// check-ref-format`), stricter where harmless: it is used for branch names
/// and for the state directory, which ends up inside the lock branch name.
pub fn check_ref_path(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("is empty".into());
    }
    if value.starts_with('/') || value.ends_with('/') {
        return Err("must not start or end with '/'".into());
    }
    if let Some(c) = value
        .chars()
        .find(|c| c.is_ascii_control() || " ~^:?*[\\".contains(*c))
    {
        return Err(format!("contains {c:?}, which git refuses in ref names"));
    }
    if value.contains("..") || value.contains("@{") || value == "@" {
        return Err("contains \"..\" or \"@{\", which git refuses in ref names".into());
    }
    for part in value.split('/') {
        if part.is_empty() {
            return Err("contains an empty path segment (\"//\")".into());
        }
        if part.starts_with('.') || part.ends_with('.') || part.ends_with(".lock") {
            return Err(format!(
                "segment {part:?} starts or ends with '.' or ends with \".lock\", \
                 which git refuses in ref names"
            ));
        }
    }
    Ok(())
}

/// The top-level `serial` of a Terraform state, for the commit message;
/// `None` for anything that is not such JSON. Fields other than `serial` are
/// skipped without being built, so a large state costs one scan.
pub fn state_serial(state: &[u8]) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Serial {
        serial: Option<u64>,
    }
    serde_json::from_slice::<Serial>(state).ok()?.serial
}

/// `<verb> <P> (workspace W[, serial N])[ by WHO][ [lock ID]]`: enough to
/// tell from `git log` who changed which state under which lock.
pub fn commit_message(
    verb: &str,
    paths: &Paths,
    workspace: &str,
    serial: Option<u64>,
    who: Option<&str>,
    lock_id: Option<&str>,
) -> String {
    let mut message = format!("{verb} {} (workspace {workspace}", paths.state);
    if let Some(serial) = serial {
        message += &format!(", serial {serial}");
    }
    message.push(')');
    if let Some(who) = who.filter(|w| !w.is_empty()) {
        message += &format!(" by {who}");
    }
    if let Some(id) = lock_id {
        message += &format!(" [lock {id}]");
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<Settings, Error> {
        Settings::from_config(&Config::from_pairs(
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        ))
    }

    #[test]
    fn defaults_and_paths() {
        let s = settings(&[("repository", "https://git.example/s.git")]).unwrap();
        assert_eq!(s.main_ref, "refs/heads/main");
        let p = s.paths("prod").unwrap();
        assert_eq!(p.state, "prod.tfstate");
        assert_eq!(p.lock_ref, "refs/heads/locks/prod.tfstate");
        assert_eq!(p.lock_file, "prod.tfstate.lock");
        assert_eq!(p.metadata, ".wasmstate/metadata/prod.json");

        let s = settings(&[("repository", "r"), ("ref", "master"), ("dir", "env/aws")]).unwrap();
        assert_eq!(s.main_ref, "refs/heads/master");
        let p = s.paths("default").unwrap();
        assert_eq!(p.state, "env/aws/default.tfstate");
        assert_eq!(p.lock_ref, "refs/heads/locks/env/aws/default.tfstate");
        assert_eq!(p.lock_file, "env/aws/default.tfstate.lock");
        assert_eq!(p.metadata, "env/aws/.wasmstate/metadata/default.json");
        assert!(s.paths("a..b").is_err());
    }

    #[test]
    fn bad_config_is_reported_per_key() {
        let Err(Error::InvalidConfig(d)) = settings(&[
            ("ref", "refs/heads/main"),
            ("dir", "/abs/../x/"),
            ("colour", "blue"),
        ]) else {
            panic!("accepted");
        };
        assert_eq!(d.len(), 1, "unknown keys are reported first: {d:?}");
        let Err(Error::InvalidConfig(d)) =
            settings(&[("ref", "refs/heads/main"), ("dir", "a/../b")])
        else {
            panic!("accepted");
        };
        let keys: Vec<_> = d.iter().map(|d| d.key.as_deref().unwrap()).collect();
        assert_eq!(keys, ["repository", "ref", "dir"]);
        for bad in ["locks", "locks/x", "a b", "x.lock", ".hidden", "a//b", "a/"] {
            assert!(
                settings(&[("repository", "r"), ("ref", bad)]).is_err(),
                "{bad}"
            );
        }
        for bad in ["/x", "x/", "a/../b", "..", "a//b"] {
            assert!(
                settings(&[("repository", "r"), ("dir", bad)]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn listing_keeps_only_state_files_with_valid_names() {
        assert_eq!(workspace_of("prod.tfstate"), Some("prod"));
        assert_eq!(workspace_of("prod.tfstate.lock"), None);
        assert_eq!(workspace_of("README.md"), None);
        assert_eq!(workspace_of(".tfstate"), None);
        assert_eq!(workspace_of("bad name.tfstate"), None);
        assert_eq!(workspace_of("a..b.tfstate"), None);
    }

    #[test]
    fn serial_and_message() {
        assert_eq!(
            state_serial(br#"{"version":4,"serial":7,"x":[1,{"serial":9}]}"#),
            Some(7)
        );
        assert_eq!(state_serial(b"5"), None);
        assert_eq!(state_serial(&[0xff, 0]), None);
        let p = Settings {
            repository: "r".into(),
            main_ref: "refs/heads/main".into(),
            dir: String::new(),
        }
        .paths("prod")
        .unwrap();
        assert_eq!(
            commit_message("Update", &p, "prod", Some(3), Some("me@host"), Some("id1")),
            "Update prod.tfstate (workspace prod, serial 3) by me@host [lock id1]"
        );
        assert_eq!(
            commit_message("Update", &p, "prod", None, None, None),
            "Update prod.tfstate (workspace prod)"
        );
    }
}
