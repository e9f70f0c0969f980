//! Reading a clone: a file's history, a file at a commit, the files of a
//! directory (a shallow clone deepened first where history is asked for).

use super::*;

impl RepoHandle<'_> {
    /// The commits reachable from `commit` that changed the file at `path`
    /// (first-parent comparison), newest first, at most `limit`. A shallow
    /// clone is deepened first, so the whole history is seen.
    pub fn file_history(
        &self,
        commit: &str,
        path: &str,
        limit: u32,
    ) -> Result<Vec<FileVersion>, GitError> {
        check_path(path)?;
        let start = parse_oid(commit)?;
        let limit = limit.min(MAX_HISTORY);
        let mut slot = self.lock_slot()?;
        let (repo, clone_bytes) = self.open_counted(&mut slot)?;
        if repo.is_shallow() {
            self.unshallow(repo, clone_bytes)?;
        }
        self.find_commit(repo, commit)?;
        let blob_at = |c: &git2::Commit<'_>| {
            c.tree()
                .ok()
                .and_then(|t| t.get_path(Path::new(path)).ok())
                .filter(|e| is_file(e.filemode()))
                .map(|e| e.id())
        };
        let mut walk = repo
            .revwalk()
            .or_internal(self, "cannot walk the history")?;
        walk.set_sorting(git2::Sort::TOPOLOGICAL | git2::Sort::TIME)
            .or_internal(self, "cannot walk the history")?;
        walk.push(start)
            .or_internal(self, "cannot walk the history")?;
        let mut versions = Vec::new();
        for id in walk {
            if versions.len() >= limit as usize {
                break;
            }
            let id = id.or_internal(self, "cannot walk the history")?;
            let c = repo
                .find_commit(id)
                .or_internal(self, "cannot read a commit")?;
            let mine = blob_at(&c);
            let before = c.parents().next().and_then(|p| blob_at(&p));
            if mine == before {
                continue;
            }
            let size = match mine {
                Some(blob) => repo
                    .find_blob(blob)
                    .or_internal(self, "cannot read a blob")?
                    .size() as u64,
                None => 0,
            };
            versions.push(FileVersion {
                commit: id.to_string(),
                time_unix_ms: u64::try_from(c.time().seconds()).unwrap_or(0) * 1000,
                size,
            });
        }
        Ok(versions)
    }

    /// Fetch the full history behind the tracking refs of a shallow clone,
    /// as far as the clone's bound allows: a history past it is refused
    /// while it downloads, and nothing is kept.
    fn unshallow(&self, repo: &Repository, clone_bytes: &Cell<u64>) -> Result<(), GitError> {
        let specs: Vec<String> = repo
            .references_glob(&format!("{TRACKING_PREFIX}*"))
            .or_internal(self, "cannot list tracking refs")?
            .filter_map(Result::ok)
            .filter_map(|r| r.name().map(str::to_owned))
            .map(|tracking| {
                let remote = format!("refs/{}", &tracking[TRACKING_PREFIX.len()..]);
                format!("+{remote}:{tracking}")
            })
            .collect();
        let room = self.host.max_clone_bytes.saturating_sub(clone_bytes.get());
        let auth = self.auth().downloading_at_most(room);
        let mut remote = repo
            .remote_anonymous(&self.url)
            .or_internal(self, "cannot set up the remote")?;
        let mut opts = FetchOptions::new();
        opts.remote_callbacks(auth.callbacks())
            .download_tags(AutotagOption::None)
            // A redirect would take the credentials elsewhere.
            .follow_redirects(git2::RemoteRedirect::None)
            .update_fetchhead(false)
            // libgit2's GIT_FETCH_DEPTH_UNSHALLOW.
            .depth(i32::MAX);
        let fetched = remote
            .fetch(&specs, Some(&mut opts), None)
            .or_net(self, &auth);
        clone_bytes.set(clone_bytes.get() + remote.stats().received_bytes() as u64);
        fetched
    }

    /// The bytes of the file at `path` in `commit`, or `None` if there is no file there.
    /// [`GitError::NotFound`] if the commit is not in the clone (fetch it first).
    pub fn read_file(&self, commit: &str, path: &str) -> Result<Option<Vec<u8>>, GitError> {
        check_path(path)?;
        let mut slot = self.lock_slot()?;
        let (repo, _, damaged) = self.open_tracked(&mut slot)?;
        // The commit is here; its tree or blob missing is a damaged clone.
        let broken = |what: &str, e: git2::Error| self.broken(damaged, what, e);
        let tree = self
            .find_commit(repo, commit)?
            .tree()
            .map_err(|e| broken("cannot read a commit's tree", e))?;
        let entry = match tree.get_path(Path::new(path)) {
            Ok(entry) if is_file(entry.filemode()) => entry,
            Ok(_) => return Ok(None),
            Err(e) if e.code() == ErrorCode::NotFound => return Ok(None),
            Err(e) => return Err(broken("cannot read the tree", e)),
        };
        let (size, _) = repo
            .odb()
            .and_then(|odb| odb.read_header(entry.id()))
            .map_err(|e| broken("cannot read a blob", e))?;
        self.check_file_size(path, size as u64, &format!("in {commit}"))?;
        let blob = repo
            .find_blob(entry.id())
            .map_err(|e| broken("cannot read a blob", e))?;
        Ok(Some(blob.content().to_vec()))
    }

    /// The names of the files directly inside `dir` (`""` = root) in `commit`,
    /// relative to `dir`, sorted. Not recursive; a missing directory lists as empty.
    pub fn list_files(&self, commit: &str, dir: &str) -> Result<Vec<String>, GitError> {
        let dir = dir.strip_suffix('/').unwrap_or(dir);
        if !dir.is_empty() {
            check_path(dir)?;
        }
        let mut slot = self.lock_slot()?;
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
}
