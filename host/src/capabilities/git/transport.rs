//! Talking to the remote: fetch/push connections, credentials and
//! timeouts, and the compare-and-swap ref update (over the network through
//! receive-pack, for local repositories with libgit2's locked update).

use super::*;

impl RepoHandle<'_> {
    /// Push `refspec` (an update or a deletion of `name`) if the advertised
    /// value is `expected`. A push that finds the clone missing objects it
    /// needs (a fetch or a host cut off part way) sets `damaged`: the clone
    /// is fetched afresh at the next call, and this one is retryable.
    pub(super) fn push_remote(
        &self,
        repo: &Repository,
        damaged: &Cell<bool>,
        name: &str,
        refspec: &str,
        expected: Option<Oid>,
    ) -> Result<(), GitError> {
        let deleting = refspec.starts_with(':');
        let auth = self.auth();
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
        super::tests::run_before_update_hook();

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
            opts.remote_callbacks(callbacks)
                .follow_redirects(git2::RemoteRedirect::None);
            // Same connection: libgit2 reuses a connected transport and sends the
            // old values advertised above, which receive-pack verifies atomically.
            if let Err(e) = conn.remote().push(&[refspec], Some(&mut opts)) {
                if is_damage(&e) {
                    tracing::warn!(url = %redact(&self.url), "git clone is missing objects a push needs: discarding it; the next call fetches afresh");
                    damaged.set(true);
                    return Err(GitError::Unavailable(format!(
                        "the local clone of {} is missing objects ({}) and is fetched afresh; retry",
                        redact(&self.url),
                        self.clean(e.message())
                    )));
                }
                return Err(self.net_error(&auth, e));
            }
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
    pub(super) fn update_local(
        &self,
        repo: &Repository,
        name: &str,
        new: Option<Oid>,
        expected: Option<Oid>,
    ) -> Result<(), GitError> {
        let remote = Repository::open_bare(local_path(&self.url)).or_net(self, &self.auth())?;
        let current = match remote.refname_to_id(name) {
            Ok(id) => Some(id),
            Err(e) if e.code() == ErrorCode::NotFound => None,
            Err(e) => return Err(self.internal("cannot read the remote ref", e)),
        };
        self.check_expected(name, current, expected, new.is_none())?;
        #[cfg(test)]
        super::tests::run_before_update_hook();

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
    pub(super) fn check_expected(
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

    /// This repository's slot, waiting for it no longer than the deadline.
    pub(super) fn lock_slot(&self) -> Result<parking_lot::MutexGuard<'_, Slot>, GitError> {
        match self.deadline {
            None => Ok(self.slot.lock()),
            Some(deadline) => self.slot.try_lock_until(deadline).ok_or_else(|| {
                GitError::Unavailable(format!(
                    "the host's clone of {} was busy with other requests until this one's deadline; retry",
                    redact(&self.url)
                ))
            }),
        }
    }

    /// Credentials (for this repository's URL only) and the deadline for
    /// one libgit2 call.
    pub(super) fn auth(&self) -> Auth<'_> {
        Auth::new(self.auth, self.deadline).for_url(&self.url)
    }

    /// Refuse a ref or path the operator did not grant this backend.
    pub(super) fn check_granted(
        &self,
        what: &str,
        name: &str,
        patterns: &[String],
        key: &str,
    ) -> Result<(), GitError> {
        if patterns.iter().any(|p| matches_pattern(p, name)) {
            return Ok(());
        }
        Err(GitError::Denied(format!(
            "{what} {name:?} of {} is not granted to this backend; the operator must add a pattern covering it to {key}",
            redact(&self.url)
        )))
    }

    fn clone_dir(&self) -> std::path::PathBuf {
        self.host.clones_dir.join(clone_dir_name(&self.clone_key))
    }

    /// The clone for this URL, opened once and kept in the slot (reopening costs a config parse).
    pub(super) fn open<'s>(&self, slot: &'s mut Slot) -> Result<&'s Repository, GitError> {
        self.open_counted(slot).map(|(repo, _)| repo)
    }

    /// [`Self::open`], with the counter of the clone's bytes beside it.
    pub(super) fn open_counted<'s>(
        &self,
        slot: &'s mut Slot,
    ) -> Result<(&'s Repository, &'s Cell<u64>), GitError> {
        self.open_tracked(slot)
            .map(|(repo, bytes, _)| (repo, bytes))
    }

    /// [`Self::open_counted`], with the flag that has the clone discarded
    /// on the next call (see [`Slot`]).
    pub(super) fn open_tracked<'s>(
        &self,
        slot: &'s mut Slot,
    ) -> Result<(&'s Repository, &'s Cell<u64>, &'s Cell<bool>), GitError> {
        if slot.repo.is_none() {
            let dir = self.clone_dir();
            let prepared = |repo: Repository| {
                // libgit2 follows a redirect on a connection's first request
                // unless told not to; connect_auth takes no option for it,
                // the clone's config does. Credentials must not follow one.
                repo.config()?.set_str("http.followRedirects", "false")?;
                Ok(repo)
            };
            let opened = match dir.join("HEAD").is_file() {
                true => {
                    let stale = remove_stale_locks(&dir);
                    if stale > 0 {
                        tracing::warn!(url = %redact(&self.url), stale, "git clone had lock files left by a stopped host: removed them");
                    }
                    Repository::open_bare(&dir).and_then(prepared)
                }
                false => Err(git2::Error::from_str("no clone yet")),
            };
            // A clone is a cache: one that cannot be opened (its creation or
            // removal cut off by a killed host) is started afresh, or every
            // call on it would fail until someone removed it by hand.
            let repo = opened.or_else(|e| {
                if dir.exists() {
                    tracing::warn!(url = %redact(&self.url), "git clone unusable ({}): starting it afresh", one_line(e.message()));
                    let _ = std::fs::remove_dir_all(&dir);
                }
                Repository::init_bare(&dir).and_then(prepared)
            });
            slot.repo = Some(repo.map_err(|e| {
                GitError::Internal(format!(
                    "cannot open or create the clone at {} ({}); check the clones directory",
                    dir.display(),
                    one_line(e.message())
                ))
            })?);
            slot.bytes.set(dir_size(&dir));
        }
        Ok((
            slot.repo.as_ref().expect("set above"),
            &slot.bytes,
            &slot.damaged,
        ))
    }

    /// A clone past its bound is a cache past its bound: throw it away (the
    /// remote holds everything that was pushed) and start a fresh one.
    /// A clone a fetch found damaged is thrown away the same way.
    pub(super) fn bound_clone(&self, slot: &mut Slot) -> Result<(), GitError> {
        let past = slot.bytes.get() > self.host.max_clone_bytes;
        if !slot.damaged.get() && (slot.repo.is_none() || !past) {
            return Ok(());
        }
        let dir = self.clone_dir();
        if past {
            tracing::info!(
                url = %redact(&self.url),
                mib = slot.bytes.get() >> 20,
                max_mib = self.host.max_clone_bytes >> 20,
                "git clone past its bound (git_clone_max_mib): discarding it; the next fetch starts afresh"
            );
        }
        slot.repo = None;
        slot.bytes.set(0);
        // The damage flag is cleared only once the clone is gone: a clone
        // that could not be removed must not be opened again as if whole.
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| {
                slot.damaged.set(true);
                GitError::Unavailable(format!(
                    "cannot remove the damaged or oversized clone at {}: {e}; check the clones directory",
                    dir.display()
                ))
            })?;
        }
        slot.damaged.set(false);
        Ok(())
    }

    /// Refused unless `new` is `old` or descends from it: a ref moves only
    /// forward from the value it was expected to have.
    pub(super) fn check_forward(
        &self,
        repo: &Repository,
        damaged: &Cell<bool>,
        name: &str,
        new: Oid,
        old: Oid,
    ) -> Result<(), GitError> {
        if old == new {
            return Ok(());
        }
        // An expected value the clone never had is not the remote's (it
        // was fetched): refused. Walking the graph otherwise fails only on
        // a clone missing objects: a damaged cache, so retryable, and the
        // clone is fetched afresh (a refusal would be final, and repeated).
        // Only a commit: a tree or blob id the clone holds would fail the
        // walk below and pass for damage.
        let known = repo.find_commit(old).is_ok();
        let descends = known
            && repo.graph_descendant_of(new, old).map_err(|e| {
                damaged.set(true);
                GitError::Unavailable(format!(
                    "cannot walk the history of {} in the local clone ({}); it is fetched afresh, retry",
                    redact(&self.url),
                    one_line(e.message())
                ))
            })?;
        match descends {
            true => Ok(()),
            false => Err(GitError::Rejected(format!(
                "{new} does not descend from {name}'s current {old}; a ref only moves forward (no forced updates)"
            ))),
        }
    }

    /// Refuse a file of `size` bytes at `path` larger than the host reads
    /// into memory for a guest: never read, and never committed (it could
    /// not be read back). `what` says where it was met.
    pub(super) fn check_file_size(
        &self,
        path: &str,
        size: u64,
        what: &str,
    ) -> Result<(), GitError> {
        let max = self.host.max_file_bytes;
        if size <= max {
            return Ok(());
        }
        Err(GitError::InvalidInput(format!(
            "{path} is {} MiB {what}, more than the {} MiB the host reads for a guest",
            size >> 20,
            max >> 20
        )))
    }

    pub(super) fn find_commit<'r>(
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

    pub(super) fn commit_tree<'r>(
        &self,
        repo: &'r Repository,
        commit: &str,
    ) -> Result<Tree<'r>, GitError> {
        self.find_commit(repo, commit)?
            .tree()
            .or_internal(self, "cannot read a commit's tree")
    }

    pub(super) fn internal(&self, what: &str, e: git2::Error) -> GitError {
        GitError::Internal(format!(
            "{what} for {}: {}; see the host logs",
            redact(&self.url),
            self.clean(e.message())
        ))
    }

    /// Classify an error from talking to the remote.
    pub(super) fn net_error(&self, auth: &Auth, e: git2::Error) -> GitError {
        let url = redact(&self.url);
        let msg = self.clean(e.message());
        tracing::debug!(url = %url, code = ?e.code(), class = ?e.class(), "git remote error: {msg}");
        if is_local(&self.url) && !local_path(&self.url).exists() {
            // libgit2 only says "unsupported URL protocol" for a missing plain path.
            return GitError::Unavailable(format!(
                "there is no git repository at {url}; check the path, then retry"
            ));
        }
        if auth.expired.get() {
            return GitError::Unavailable(format!(
                "talking to {url} was stopped at the request's deadline; retry"
            ));
        }
        if auth.over.get() {
            // Retrying would download the same again: say what to change.
            return GitError::Denied(format!(
                "{url} sent more than the host's clone may hold (git_clone_max_mib = {} MiB, what it \
                 holds already counted): the download was stopped and nothing was kept; raise \
                 git_clone_max_mib for this repository's history",
                self.host.max_clone_bytes >> 20
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
    pub(super) fn clean(&self, msg: &str) -> String {
        one_line(&msg.replace(&self.url, &redact(&self.url)))
    }
}

/// Shorthands turning libgit2 errors into [`GitError`]s with context.
pub(super) trait OrGitError<T> {
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

/// Set libgit2's process-wide network timeouts, once.
#[allow(unsafe_code)]
pub(super) fn set_network_timeouts() {
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
pub(super) fn copy_missing_objects(
    src: &Repository,
    dst: &Repository,
    tip: Oid,
) -> Result<(), git2::Error> {
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
