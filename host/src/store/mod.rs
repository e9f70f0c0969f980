//! What the host adds around a guest's storage, whatever the guest:
//! encryption at rest ([`sealer`], with keys from [`keys`], in the form
//! [`envelope`] writes), a version history ([`history`]), and re-sealing
//! stored states under the newest key ([`reseal`]).
//!
//! [`Store`] wraps any [`Storage`] and is itself a [`Storage`], so the
//! protocol layer serves it like a bare guest. Order matters: states are
//! sealed before the guest and the history see them, so both hold only
//! ciphertext when encryption is on.

mod checked;
mod conditional;
pub mod envelope;
pub mod history;
pub mod keys;
#[cfg(test)]
pub(crate) mod memory;
pub mod reseal;
pub mod rollback;
pub mod sealer;
pub mod seed;

use crate::backend::{HistorySource, LockInfo, Storage, StorageError, StorageResult, Version};
use bytes::Bytes;
use envelope::StateHeader;
use history::History;
use keys::EncryptionSpec;
use rollback::{ReadStart, RollbackMarks, Stamp};
use sealer::{Opened, Sealer};
use seed::Seed;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

/// A backend's storage with the host's encryption and history around it.
pub struct Store<S> {
    inner: S,
    backend: Arc<str>,
    /// Shared with the host work that seals and opens off the workers.
    sealer: Option<Arc<Sealer>>,
    history: Option<History>,
    /// With encryption on: the newest state of each workspace this host has
    /// written or read, so storage handing back an older envelope (a
    /// rollback, which the seal alone cannot tell) is caught. Kept by the
    /// server across reloads.
    marks: Arc<RollbackMarks>,
    /// The most bytes storage may be handed for one state: what a read
    /// may bring back.
    max_stored_bytes: usize,
    /// `allow_force_push`: older states are written on purpose, and a
    /// replica cannot tell one written that way elsewhere from storage
    /// rolling back, so rollbacks are not refused.
    older_states_allowed: bool,
    /// Who keeps the versions, as the guest's last listing said
    /// ([`HistorySource`] as a number, so every request can read it).
    history_source: AtomicU8,
}

const SOURCES: [HistorySource; 4] = [
    HistorySource::Unknown,
    HistorySource::Storage,
    HistorySource::Replica,
    HistorySource::None,
];

impl<S: Storage> Store<S> {
    /// Wrap `inner`, the storage of `backend`. With `encryption`, states
    /// are sealed with its first key; with a `history`, every write is
    /// kept there too.
    /// `marks` outlive the store (a reload builds a new one). Nothing
    /// larger than `max_stored_bytes` is handed to storage.
    pub fn new(
        inner: S,
        backend: &str,
        encryption: Option<&EncryptionSpec>,
        history: Option<History>,
        marks: Arc<RollbackMarks>,
        max_stored_bytes: usize,
    ) -> Self {
        Store {
            max_stored_bytes,
            older_states_allowed: false,
            sealer: encryption.and_then(Sealer::new).map(Arc::new),
            inner,
            backend: Arc::from(backend),
            history,
            marks,
            history_source: AtomicU8::new(0),
        }
    }

    /// Note who keeps the versions, from what the guest's listing said.
    fn learned(&self, listed: &StorageResult<Vec<Version>>) {
        let source = match (listed, &self.history) {
            (Ok(_), _) => HistorySource::Storage,
            (Err(StorageError::NoHistory), Some(_)) => HistorySource::Replica,
            (Err(StorageError::NoHistory), None) => HistorySource::None,
            // Unreachable storage says nothing about who keeps versions.
            (Err(_), _) => return,
        };
        let index = SOURCES.iter().position(|s| *s == source).unwrap_or(0);
        self.history_source.store(index as u8, Ordering::Relaxed);
    }

    /// Ask the guest once who keeps the versions (a listing of `default`),
    /// and say it in the log: at start, where an operator looks first.
    pub async fn probe_history(&self) -> HistorySource {
        let listed = self.inner.list_versions("default").await;
        self.learned(&listed);
        let source = self.history_source();
        if let Err(e) = &listed
            && !matches!(e, StorageError::NoHistory)
        {
            tracing::warn!(backend = %self.backend, error = %e, "cannot tell yet who keeps the version history");
        }
        // An info line: keeping versions here is what a single host of the
        // default guest wants; a guest whose storage could keep them (a
        // bucket with versioning off) warns in its own words.
        if source != HistorySource::Unknown {
            tracing::info!(backend = %self.backend, "version history {}", source.describe());
        }
        source
    }

    /// With `allowed` (the backend's `allow_force_push`), an older state
    /// read back is served, not refused as a rollback.
    pub fn allowing_older_states(mut self, allowed: bool) -> Self {
        self.older_states_allowed = allowed;
        self
    }

    /// Count this backend's key service calls in `calls` (the metrics).
    pub fn counting_key_calls(mut self, calls: crate::metrics::KeyCalls) -> Self {
        self.sealer = self
            .sealer
            .take()
            .map(|sealer| match Arc::try_unwrap(sealer) {
                Ok(sealer) => Arc::new(sealer.counting(calls)),
                Err(shared) => shared,
            });
        self
    }

    /// The wrapped storage.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Open what storage returned for `workspace` of `backend` (this
    /// backend's name, or the one it had before a rename). Without keys a
    /// plain state passes and a sealed one says which key it needs,
    /// instead of reaching Terraform as ciphertext. A big state is opened
    /// as the backend's host work, off the async workers.
    async fn open_as(
        &self,
        backend: &str,
        workspace: &str,
        stored: Vec<u8>,
    ) -> StorageResult<Opened> {
        match &self.sealer {
            Some(sealer) => {
                let work = self.inner.host_work();
                sealer.open(&work, backend, workspace, stored).await
            }
            None => Ok(sealer::open_unkeyed(stored)),
        }
    }

    async fn open(&self, workspace: &str, stored: Vec<u8>) -> StorageResult<Opened> {
        self.open_as(&self.backend, workspace, stored).await
    }

    /// What storage holds as the current state of `workspace`, where
    /// Terraform's plain empty state counts as none under encryption
    /// ([`sealer::is_plain_empty_state`]): the `postgres` guest writes it
    /// when a workspace is created, and it is neither served nor judged
    /// (storage could plant one to reset the rollback marks, or one with
    /// outputs hidden behind duplicate keys), so the workspace reads as
    /// empty and its first write is sealed.
    pub(super) async fn read_stored(&self, workspace: &str) -> StorageResult<Option<Vec<u8>>> {
        let stored = self.inner.read(workspace).await?;
        Ok(stored.and_then(|stored| self.unless_plain_empty(stored)))
    }

    /// `stored`, unless it is Terraform's plain empty state under
    /// encryption, which counts as none (see [`Self::read_stored`]).
    pub(super) fn unless_plain_empty(&self, stored: Vec<u8>) -> Option<Vec<u8>> {
        match &self.sealer {
            Some(sealer)
                if !sealer.accepts_plain()
                    && !envelope::is_sealed(&stored)
                    && sealer::is_plain_empty_state(&stored) =>
            {
                None
            }
            _ => Some(stored),
        }
    }

    /// The clear fields of a state to write and what to store for it
    /// (sealed, with keys, its life's `started` from `stamp`), computed as
    /// the backend's host work.
    async fn seal(
        &self,
        workspace: &str,
        state: Bytes,
        stamp: Stamp,
    ) -> StorageResult<(StateHeader, Bytes)> {
        match &self.sealer {
            Some(sealer) => {
                let work = self.inner.host_work();
                let restarts = self.older_states_allowed;
                sealer
                    .seal(&work, &self.backend, workspace, state, restarts, stamp)
                    .await
            }
            None if self.history.is_none() => Ok((StateHeader::default(), state)),
            None => {
                let work = self.inner.host_work();
                let read = state.clone();
                let header = work.run(read.len(), move || StateHeader::of(&read)).await?;
                Ok((header, state))
            }
        }
    }

    /// [`Self::seal`], refusing what storage could not hand back: stored,
    /// a state larger than a read brings back would leave the workspace
    /// stuck until the operator raised the limit.
    async fn seal_to_store(
        &self,
        workspace: &str,
        state: Bytes,
        stamp: Stamp,
    ) -> StorageResult<(StateHeader, Bytes)> {
        let (header, stored) = self.seal(workspace, state, stamp).await?;
        if stored.len() > self.max_stored_bytes {
            return Err(StorageError::TooLarge(format!(
                "the state is {} bytes as stored (sealed), more than the {} this server reads back \
                 (raise max_body_mib, which sizes both)",
                stored.len(),
                self.max_stored_bytes
            )));
        }
        Ok((header, stored))
    }

    /// A state was deleted: a new one may start its serials afresh.
    fn forget(&self, workspace: &str) {
        if self.sealer.is_some() {
            self.marks.forget(workspace);
        }
    }

    /// Whether reads are checked for rollbacks: with encryption on, unless
    /// older states are written on purpose (`allow_force_push`).
    fn checks_rollbacks(&self) -> bool {
        self.sealer.is_some() && !self.older_states_allowed
    }

    /// Before reading `workspace` under encryption: a workspace this host
    /// has not seen yet starts from the newest version its history kept
    /// (after a restart), then the read's start is noted. (A reseal's
    /// read; a request's starts in [`Self::read_checked`].)
    async fn read_start(&self, workspace: &str) -> Option<ReadStart> {
        if !self.checks_rollbacks() {
            return None;
        }
        if !self.marks.knows(workspace) {
            match self.newest_kept(workspace).await.0 {
                Seed::At(lineage, started, serial) => {
                    self.marks
                        .seed(workspace, lineage.as_deref(), started, serial)
                }
                // Nothing kept of this life: whatever comes starts over, and
                // the history is not asked again at every read.
                Seed::Fresh => self.marks.start_fresh(workspace),
                Seed::Unknown => {}
            }
        }
        Some(self.marks.read_start())
    }

    /// The newest state of `workspace` any history holds: the storage's,
    /// which every replica shares ([`seed`]), else this replica's own;
    /// `true` when it is the storage's.
    async fn newest_kept(&self, workspace: &str) -> (Seed, bool) {
        if let Some(seed) = self.newest_in_storage(workspace).await {
            return (seed, true);
        }
        let seed = match self.history_source() {
            // The storage's history cannot be read now: this replica's own
            // is still something to start from.
            HistorySource::Storage | HistorySource::Unknown => {
                match self.newest_in_replica(workspace).await {
                    Seed::Fresh => Seed::Unknown,
                    seeded => seeded,
                }
            }
            _ => self.newest_in_replica(workspace).await,
        };
        (seed, false)
    }

    /// This replica's own newest version; fresh where it keeps none (the
    /// next state read becomes the mark, as it would without a seed, and
    /// the guest is not asked again at every read of an absent workspace).
    async fn newest_in_replica(&self, workspace: &str) -> Seed {
        let Some(history) = &self.history else {
            return Seed::Fresh;
        };
        // Read from this replica's disk: what the request kept for its
        // next storage call goes back first.
        crate::request::give_back();
        match history.newest_version(workspace).await {
            Some((lineage, started, serial)) => Seed::At(lineage, started, serial),
            None => Seed::Fresh,
        }
    }

    /// Open what storage returned as the current state of `workspace`
    /// (bound to backend `bound_to`: this one, or its name before a
    /// rename), refusing an envelope older than one of its lineage seen here before
    /// the read began (`start`).
    async fn open_current(
        &self,
        bound_to: &str,
        workspace: &str,
        stored: Vec<u8>,
        start: Option<ReadStart>,
    ) -> StorageResult<Vec<u8>> {
        let (state, header) = self
            .open_as(bound_to, workspace, stored)
            .await?
            .map_err(|e| StorageError::Encryption(format!("state of {workspace:?}: {e}")))?;
        let (Some(start), Some(serial)) = (start, header.serial) else {
            return Ok(state);
        };
        let lineage = header.lineage.as_deref();
        self.marks
            .read(workspace, lineage, header.started, serial, start)
            .map_err(|seen| checked::rollback_refused(workspace, serial, &seen))?;
        Ok(state)
    }
}

impl<S: Storage> Storage for Store<S> {
    fn describe(&self) -> Option<crate::backend::Description> {
        let mut description = self.inner.describe()?;
        if let Some(sealer) = &self.sealer {
            description
                .limits
                .push(("encryption at rest".into(), sealer.describe()));
        }
        let source = self.history_source();
        let kept = match (source, &self.history) {
            (HistorySource::Replica | HistorySource::Unknown, Some(history)) => {
                format!("{}; {}", source.describe(), history.describe())
            }
            _ => source.describe().to_string(),
        };
        description.limits.push(("version history".into(), kept));
        Some(description)
    }

    fn opens_whole(&self) -> bool {
        self.sealer.is_some() || self.inner.opens_whole()
    }

    fn history_source(&self) -> HistorySource {
        SOURCES[usize::from(self.history_source.load(Ordering::Relaxed)) % SOURCES.len()]
    }

    fn host_work(&self) -> crate::work::HostWork {
        self.inner.host_work()
    }

    async fn read(&self, workspace: &str) -> StorageResult<Option<Vec<u8>>> {
        if self.checks_rollbacks() {
            return self.read_checked(workspace).await;
        }
        match self.read_stored(workspace).await? {
            Some(stored) => self
                .open_current(&self.backend, workspace, stored, None)
                .await
                .map(Some),
            None => Ok(None),
        }
    }

    async fn read_prefix(&self, workspace: &str, max: usize) -> StorageResult<Option<Vec<u8>>> {
        if self.sealer.is_some() {
            // Sealed, the serial sits after the ciphertext: open it whole.
            let mut state = self.read(workspace).await?;
            if let Some(bytes) = &mut state {
                bytes.truncate(max);
            }
            return Ok(state);
        }
        self.inner.read_prefix(workspace, max).await
    }

    async fn holds(&self, workspace: &str, state: &Bytes) -> StorageResult<bool> {
        if self.sealer.is_some() {
            return Ok(self.read(workspace).await?.as_deref() == Some(&state[..]));
        }
        self.inner.holds(workspace, state).await
    }

    async fn write(
        &self,
        workspace: &str,
        state: Bytes,
        lock_id: Option<&str>,
    ) -> StorageResult<()> {
        let (header, stored, kept) = self.to_store(workspace, state).await?;
        self.inner.write(workspace, stored, lock_id).await?;
        self.wrote(workspace, &header, kept).await;
        Ok(())
    }

    fn conditional_writes(&self) -> bool {
        self.inner.conditional_writes()
    }

    async fn head(&self, workspace: &str) -> StorageResult<Option<crate::backend::Head>> {
        self.head_opened(workspace).await
    }

    async fn write_if(
        &self,
        workspace: &str,
        state: Bytes,
        lock_id: Option<&str>,
        expect: crate::backend::Expect,
    ) -> StorageResult<bool> {
        let (header, stored, kept) = self.to_store(workspace, state).await?;
        // Refused: nothing was written, so nothing is marked or kept.
        if !self
            .inner
            .write_if(workspace, stored, lock_id, expect)
            .await?
        {
            return Ok(false);
        }
        self.wrote(workspace, &header, kept).await;
        Ok(true)
    }

    async fn read_metadata(
        &self,
        workspace: &str,
    ) -> StorageResult<Option<crate::backend::Metadata>> {
        self.inner.read_metadata(workspace).await
    }

    async fn write_metadata(
        &self,
        workspace: &str,
        content: Option<String>,
        expect: crate::backend::Expect,
    ) -> StorageResult<bool> {
        self.inner.write_metadata(workspace, content, expect).await
    }

    async fn delete(&self, workspace: &str, lock_id: Option<&str>) -> StorageResult<()> {
        self.inner.delete(workspace, lock_id).await?;
        self.forget(workspace);
        Ok(())
    }

    async fn lock(&self, workspace: &str, info: LockInfo) -> StorageResult<()> {
        self.inner.lock(workspace, info).await
    }

    async fn unlock(&self, workspace: &str, id: &str) -> StorageResult<()> {
        self.inner.unlock(workspace, id).await
    }

    async fn current_lock(&self, workspace: &str) -> StorageResult<Option<LockInfo>> {
        self.inner.current_lock(workspace).await
    }

    async fn force_unlock(&self, workspace: &str) -> StorageResult<Option<LockInfo>> {
        self.inner.force_unlock(workspace).await
    }

    async fn list_workspaces(&self) -> StorageResult<Vec<String>> {
        self.inner.list_workspaces().await
    }

    async fn create_workspace(&self, name: &str) -> StorageResult<bool> {
        self.inner.create_workspace(name).await
    }

    async fn delete_workspace(&self, name: &str) -> StorageResult<()> {
        self.inner.delete_workspace(name).await?;
        self.forget(name);
        Ok(())
    }

    /// The guest's own history when its storage keeps one (git commits…),
    /// else the host's.
    async fn list_versions(&self, workspace: &str) -> StorageResult<Vec<Version>> {
        let listed = self.inner.list_versions(workspace).await;
        self.learned(&listed);
        match (listed, &self.history) {
            (Err(StorageError::NoHistory), Some(history)) => {
                history.list(workspace).await.map_err(history_error)
            }
            // 0 bytes marks a moment without a state (a delete): nothing
            // to read or restore.
            (Ok(versions), _) => Ok(versions.into_iter().filter(|v| v.bytes > 0).collect()),
            (listed, _) => listed,
        }
    }

    async fn reseal(
        &self,
        workspace: &str,
        request: &crate::resealing::ResealRequest,
    ) -> StorageResult<crate::resealing::ResealReport> {
        self.reseal_workspace(workspace, request).await
    }

    async fn read_version(&self, workspace: &str, id: &str) -> StorageResult<Option<Vec<u8>>> {
        let stored = match (self.inner.read_version(workspace, id).await, &self.history) {
            (Ok(None) | Err(StorageError::NoHistory), Some(history)) => {
                history.read(workspace, id).await.map_err(history_error)?
            }
            (read, _) => read?,
        };
        let Some(stored) = stored else {
            return Ok(None);
        };
        match self.open(workspace, stored).await? {
            Ok((state, _)) => Ok(Some(state)),
            Err(e) => Err(StorageError::Encryption(format!(
                "version {id} of {workspace:?}: {e}"
            ))),
        }
    }
}

fn history_error(e: std::io::Error) -> StorageError {
    StorageError::Internal(format!("version history: {e}"))
}
