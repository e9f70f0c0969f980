//! A request's read under encryption, through the rollback check
//! ([`rollback`](super::rollback)): what it costs, when it consults the
//! history, and when it refuses.

use super::Store;
use super::envelope::StateHeader;
use super::rollback::{ReadStart, Rollback};
use super::seed::{self, Seed};
use crate::backend::{HistorySource, Storage, StorageError, StorageResult};

impl<S: Storage> Store<S> {
    /// The newest state of `workspace` in the history the storage keeps,
    /// `None` where it keeps none or it cannot be read now.
    pub(super) async fn newest_in_storage(&self, workspace: &str) -> Option<Seed> {
        let listed = self.inner.list_versions(workspace).await;
        self.learned(&listed);
        let versions = listed.ok()?;
        let read = |id: String| async move {
            self.inner.read_version(workspace, &id).await.ok().flatten()
        };
        Some(seed::newest_of_life(&versions, read).await)
    }

    /// Read `workspace` through the rollback check. A name with no state
    /// costs one read and leaves nothing behind (no mark, no listing); a
    /// workspace this host has not seen starts from its history, as after
    /// a restart. A state older than the mark is refused only once the
    /// storage's history, where it keeps one, agrees (see
    /// [`Self::reconsider`]).
    pub(super) async fn read_checked(&self, workspace: &str) -> StorageResult<Option<Vec<u8>>> {
        let known = self.marks.knows(workspace);
        let start = self.marks.read_start();
        let stored = self.read_stored(workspace).await?;
        self.check_read(workspace, stored, known, start).await
    }

    /// [`Self::read_checked`] of what storage returned (`stored`, after
    /// [`Self::unless_plain_empty`]) to a read begun at `start`, when this
    /// host `known` the workspace before it began.
    pub(super) async fn check_read(
        &self,
        workspace: &str,
        stored: Option<Vec<u8>>,
        known: bool,
        start: ReadStart,
    ) -> StorageResult<Option<Vec<u8>>> {
        let Some(stored) = stored else {
            // A write next starts a new life (a mark, if any, notes it).
            self.marks.absent(workspace, start);
            return Ok(None);
        };
        let (state, header) = self.open_to_judge(workspace, stored).await?;
        let Some(serial) = header.serial else {
            let lineage = header.lineage.as_deref();
            self.marks
                .saw_unjudged(workspace, lineage, header.started, start);
            return Ok(Some(state));
        };
        let mut from_storage = false;
        if !known {
            let (seed, storage) = self.newest_kept(workspace).await;
            from_storage = storage;
            self.marks.reseed(workspace, &seed, start);
        }
        let lineage = header.lineage.as_deref();
        match self
            .marks
            .read(workspace, lineage, header.started, serial, start)
        {
            Ok(()) => Ok(Some(state)),
            Err(seen) => {
                let read = (lineage.map(str::to_string), header.started, serial);
                self.reconsider(workspace, state, read, seen, start, from_storage)
                    .await
            }
        }
    }

    /// A read (begun at `start`) of `workspace` found `state`, of lineage
    /// `read.0`, `started` `read.1` and serial `read.2`, older than `seen`
    /// of its lineage.
    /// Before refusing it, do what a restart would: start again from the
    /// history the storage keeps, which every replica shares (a state
    /// deleted and pushed again through another replica began a new life
    /// there), and judge again; `listed`: this read already did. What that
    /// still refuses is read once more (the history may hold a write that
    /// landed after the first read), and refused if it is still older.
    /// Where the storage keeps no history there is nothing shared to ask:
    /// refused. Only a refusal pays for this, never a read that passes.
    async fn reconsider(
        &self,
        workspace: &str,
        state: Vec<u8>,
        read: (Option<String>, u64, u64),
        seen: Rollback,
        start: ReadStart,
        listed: bool,
    ) -> StorageResult<Option<Vec<u8>>> {
        // Storage known to keep no history is not asked again.
        let kept_elsewhere = matches!(
            self.history_source(),
            HistorySource::Storage | HistorySource::Unknown
        );
        if !listed {
            if !kept_elsewhere {
                return Err(rollback_refused(workspace, read.2, &seen));
            }
            let Some(seed) = self.newest_in_storage(workspace).await else {
                return Err(rollback_refused(workspace, read.2, &seen));
            };
            if self.marks.reseed(workspace, &seed, start)
                && self
                    .marks
                    .read(workspace, read.0.as_deref(), read.1, read.2, start)
                    .is_ok()
            {
                return Ok(Some(state));
            }
        }
        drop(state);
        let start = self.marks.read_start();
        let Some(stored) = self.read_stored(workspace).await? else {
            self.marks.absent(workspace, start);
            return Ok(None);
        };
        let (state, header) = self.open_to_judge(workspace, stored).await?;
        let lineage = header.lineage.as_deref();
        let Some(serial) = header.serial else {
            self.marks
                .saw_unjudged(workspace, lineage, header.started, start);
            return Ok(Some(state));
        };
        match self
            .marks
            .read(workspace, lineage, header.started, serial, start)
        {
            Ok(()) => Ok(Some(state)),
            Err(seen) => Err(rollback_refused(workspace, serial, &seen)),
        }
    }

    /// Open what storage returned as the current state of `workspace`,
    /// with the clear fields the rollback check judges.
    async fn open_to_judge(
        &self,
        workspace: &str,
        stored: Vec<u8>,
    ) -> StorageResult<(Vec<u8>, StateHeader)> {
        self.open(workspace, stored)
            .await?
            .map_err(|e| StorageError::Encryption(format!("state of {workspace:?}: {e}")))
    }
}

/// The refusal of a state read older than one seen before.
pub(super) fn rollback_refused(workspace: &str, serial: u64, seen: &Rollback) -> StorageError {
    if seen.earlier_life {
        return StorageError::Encryption(format!(
            "state of {workspace:?}: storage returned serial {serial} from an earlier life of its \
             lineage than the state (serial {newest}) written or read here before, which began \
             after it was deleted and pushed again; refused as a rollback (restore a version on \
             purpose with `wasmstate state restore`; if that state was pushed again through a \
             replica whose clock is behind this one's, delete it and push it again through this \
             replica)",
            newest = seen.newest
        ));
    }
    StorageError::Encryption(format!(
        "state of {workspace:?}: storage returned serial {serial}, older than serial {newest} of \
         the same lineage written or read here before; refused as a rollback (restore a version on \
         purpose with `wasmstate state restore`; a state deleted and pushed again where the \
         storage keeps no history: push it once more with a serial above {newest})",
        newest = seen.newest
    ))
}
