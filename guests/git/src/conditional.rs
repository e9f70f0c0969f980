//! Contract 0.3.0 on git: a state's version is its file's blob id in the
//! branch tip (`git-blob:<id>` is also its digest: the id is a hash of the
//! bytes), read from the tree without reading the blob. A conditional
//! write fetches the tip, checks the file's blob is still the expected one
//! (or that there is none), commits on top and pushes expecting that tip;
//! a lost push (usually another workspace's commit: they share the branch)
//! fetches again and re-checks, so only a change to this workspace's file
//! makes the write answer `false`. Metadata is a file beside the states,
//! `<dir>/.wasmstate/metadata/<workspace>.json`, written the same way.

use crate::layout::Paths;
use crate::{Git, PUSH_ATTEMPTS, failed};
use wasmstate_guest::git::{FileChange, FileStat, GitError};
use wasmstate_guest::{Error, Expect, Head, LockInfo, Metadata, StateReader, StateWriter};

/// Whether what is stored (`found`: its blob) is what `expect` says.
fn matches(expect: &Expect, found: Option<&FileStat>) -> bool {
    match (expect, found) {
        (Expect::Any, _) | (Expect::Absent, None) => true,
        (Expect::Version(version), Some(stat)) => stat.blob == *version,
        (Expect::Absent, Some(_)) | (Expect::Version(_), None) => false,
    }
}

impl Git {
    /// The blob of the file at `path` in `tip` (`None`: no branch, or no
    /// such file).
    fn stat_at(
        &self,
        tip: Option<&str>,
        path: &str,
        doing: &str,
    ) -> Result<Option<FileStat>, Error> {
        match tip {
            None => Ok(None),
            Some(tip) => self.repo.stat_file(tip, path).map_err(failed(doing)),
        }
    }

    /// The state file's blob in `tip`; an empty file (a workspace created
    /// without state) is no state.
    fn state_at(
        &self,
        tip: Option<&str>,
        paths: &Paths,
        doing: &str,
    ) -> Result<Option<FileStat>, Error> {
        Ok(self
            .stat_at(tip, &paths.state, doing)?
            .filter(|stat| stat.size > 0))
    }

    /// Whether `tip` holds the workspace's metadata file.
    pub(crate) fn has_metadata(
        &self,
        tip: Option<&str>,
        paths: &Paths,
        doing: &str,
    ) -> Result<bool, Error> {
        Ok(self.stat_at(tip, &paths.metadata, doing)?.is_some())
    }

    /// `Backend::head`: one fetch of the branch, the blob's id and size
    /// from the tree, and the first bytes from the host's clone.
    pub(crate) fn head_of(
        &self,
        ws: &str,
        prefix: &mut StateWriter<'_>,
    ) -> Result<Option<Head>, Error> {
        let paths = self.paths(ws)?;
        let doing = format!("reading the head of workspace {ws}'s state");
        let [tip] = self.fetch([&self.settings.main_ref], &doing)?;
        let Some(stat) = self.state_at(tip.as_deref(), &paths, &doing)? else {
            return Ok(None);
        };
        let tip = tip.expect("a file was found in it");
        // The host's sink keeps the beginning and stops there.
        self.repo
            .read_file_into(&tip, &paths.state, prefix)
            .map_err(failed(&doing))?;
        Ok(Some(Head {
            digest: Some(format!("git-blob:{}", stat.blob)),
            version: stat.blob,
            size: stat.size,
        }))
    }

    /// `Backend::write_if` for `Absent` and `Version`: the lock rule, then
    /// the expectation, checked again on every fresh tip.
    pub(crate) fn write_expecting(
        &self,
        ws: &str,
        state: &mut StateReader<'_>,
        lock_id: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, Error> {
        let paths = self.paths(ws)?;
        let doing = format!("writing the state of workspace {ws}");
        let serial = state.serial();
        self.update(&paths, &doing, Some(state), true, |snapshot| {
            crate::check_holder(snapshot.holder(), lock_id)?;
            let found = self.state_at(snapshot.tip.as_deref(), &paths, &doing)?;
            if !matches(expect, found.as_ref()) {
                return Ok(None);
            }
            let who = snapshot.holder().map(|h: &LockInfo| h.who.as_str());
            let message = crate::layout::commit_message("Update", &paths, ws, serial, who, lock_id);
            Ok(Some((Vec::new(), message)))
        })
    }

    /// `Backend::read_metadata`: the file and its blob id, at one tip.
    pub(crate) fn metadata_of(&self, ws: &str) -> Result<Option<Metadata>, Error> {
        let paths = self.paths(ws)?;
        let doing = format!("reading the metadata of workspace {ws}");
        let [tip] = self.fetch([&self.settings.main_ref], &doing)?;
        let Some(stat) = self.stat_at(tip.as_deref(), &paths.metadata, &doing)? else {
            return Ok(None);
        };
        let tip = tip.expect("a file was found in it");
        let Some(bytes) = self
            .repo
            .read_file(&tip, &paths.metadata)
            .map_err(failed(&doing))?
        else {
            return Err(Error::Unavailable(format!(
                "{} vanished from commit {tip} while {doing}; retry",
                paths.metadata
            )));
        };
        let content = String::from_utf8(bytes).map_err(|_| {
            Error::Internal(format!(
                "{} in commit {tip} is not UTF-8 text; remove it to start afresh",
                paths.metadata
            ))
        })?;
        Ok(Some(Metadata {
            content,
            version: stat.blob,
        }))
    }

    /// `Backend::write_metadata`: fetch the tip, check the metadata file's
    /// blob, commit on top, push expecting the tip; a lost push checks
    /// again on the new tip. Needs no lock.
    pub(crate) fn set_metadata(
        &self,
        ws: &str,
        content: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, Error> {
        let paths = self.paths(ws)?;
        let doing = format!("writing the metadata of workspace {ws}");
        for _ in 0..PUSH_ATTEMPTS {
            let [tip] = self.fetch([&self.settings.main_ref], &doing)?;
            let found = self.stat_at(tip.as_deref(), &paths.metadata, &doing)?;
            if !matches(expect, found.as_ref()) {
                return Ok(false);
            }
            let (change, verb) = match content {
                Some(content) => (
                    FileChange::put(&paths.metadata, content.as_bytes().to_vec()),
                    "Set",
                ),
                // Nothing to remove: done.
                None if found.is_none() => return Ok(true),
                None => (FileChange::remove(&paths.metadata), "Remove"),
            };
            let message = format!("{verb} the metadata of workspace {ws} ({})", paths.metadata);
            let commit = match self.repo.commit(tip.as_deref(), &[change], &message) {
                Ok(commit) => commit,
                // The operator's own `git_paths` leave it out: this storage
                // keeps no metadata (the host keeps it per replica).
                Err(GitError::Denied(why)) => {
                    return Err(Error::InvalidInput(format!(
                        "this backend may not commit {}, so it keeps no workspace metadata in \
                         the repository; add \"{}\" to its git_paths ({why})",
                        paths.metadata,
                        metadata_pattern(&paths.metadata)
                    )));
                }
                Err(e) => return Err(failed(&doing)(e)),
            };
            match self
                .repo
                .push(&self.settings.main_ref, &commit, tip.as_deref())
            {
                Ok(()) => return Ok(true),
                Err(GitError::Rejected(_)) => continue,
                Err(e) => return Err(failed(&doing)(e)),
            }
        }
        Err(Error::Unavailable(format!(
            "branch {} is busy: {PUSH_ATTEMPTS} pushes in a row lost to other writers while {doing}",
            self.settings.main_ref
        )))
    }
}

/// The `git_paths` pattern granting every workspace's metadata file
/// beside `path`.
fn metadata_pattern(path: &str) -> String {
    match path.rsplit_once('/') {
        Some((dir, _)) => format!("{dir}/*.json"),
        None => "*.json".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expectations_match_only_what_they_name() {
        let stat = FileStat {
            blob: "a".repeat(40),
            size: 3,
        };
        assert!(matches(&Expect::Any, None));
        assert!(matches(&Expect::Any, Some(&stat)));
        assert!(matches(&Expect::Absent, None));
        assert!(!matches(&Expect::Absent, Some(&stat)));
        assert!(matches(&Expect::Version("a".repeat(40)), Some(&stat)));
        assert!(!matches(&Expect::Version("b".repeat(40)), Some(&stat)));
        assert!(!matches(&Expect::Version("a".repeat(40)), None));
    }

    #[test]
    fn the_pattern_named_in_a_refusal_grants_the_metadata_files() {
        assert_eq!(
            metadata_pattern("env/.wasmstate/metadata/prod.json"),
            "env/.wasmstate/metadata/*.json"
        );
    }
}
