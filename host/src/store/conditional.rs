//! Writes and heads through the host's layer: what is handed to storage
//! (sealed, checked for size), what a write leaves behind here (the
//! rollback mark, the host-kept version) once storage took it, and the
//! head the stale-write guard judges, which under encryption is the
//! opened state's, never the envelope's.

use super::Store;
use super::envelope::StateHeader;
use super::rollback::Stamp;
use crate::backend::{Head, HistorySource, Storage, StorageResult};
use crate::statefile::PREFIX_BYTES;
use bytes::Bytes;

impl<S: Storage> Store<S> {
    /// What to hand storage for `state`: its clear fields (read once, for
    /// the envelope and the history both), the bytes to store (sealed, with
    /// keys) and the copy the host's history keeps of them, if it keeps
    /// one (storage that keeps versions itself needs none).
    pub(super) async fn to_store(
        &self,
        workspace: &str,
        state: Bytes,
    ) -> StorageResult<(StateHeader, Bytes, Option<Bytes>)> {
        // The stored state's life goes on, or a new one begins: from what
        // the stale-write guard's read (or head) here found, no call of its
        // own.
        let stamp = match &self.sealer {
            Some(_) => self.marks.stamp(workspace, self.checks_rollbacks()),
            None => Stamp::none(),
        };
        let (header, stored) = self.seal_to_store(workspace, state, stamp).await?;
        let kept = (self.history_source() != HistorySource::Storage)
            .then(|| self.history.as_ref().map(|_| stored.clone()))
            .flatten();
        Ok((header, stored, kept))
    }

    /// Storage took `header`'s state: mark it (under encryption) and keep
    /// its version (`kept`). Only after a write that happened: a
    /// conditional write refused leaves nothing here.
    pub(super) async fn wrote(&self, workspace: &str, header: &StateHeader, kept: Option<Bytes>) {
        if self.sealer.is_some()
            && let Some(serial) = header.serial
        {
            let lineage = header.lineage.as_deref();
            self.marks.wrote(workspace, lineage, header.started, serial);
        }
        if let (Some(history), Some(kept)) = (&self.history, kept) {
            // The write was the request's last storage call: what it kept
            // goes back before the history's flush.
            crate::request::give_back();
            if let Err(e) = history.record(workspace, kept, header.serial).await {
                // The state itself is saved; failing the write now would
                // only make Terraform retry a write that already happened.
                tracing::error!(workspace, error = %e, "state saved, but keeping its version in the history failed");
            }
        }
    }

    /// The head of the stored state of `workspace` as the guard must see
    /// it. Plain, the guest's own. Sealed, the envelope's prefix is
    /// ciphertext and its clear `serial` comes after it, bound only once
    /// opened: the state is opened (through the rollback check, which also
    /// notes the life the next write carries forward), from the head's
    /// prefix when that holds the whole envelope (a small state: no read
    /// at all), else read whole, as before contract 0.3.0. The head keeps
    /// the storage's version; size and prefix are the opened state's, and
    /// the digest is dropped (it is the envelope's). Terraform's plain
    /// empty state, which counts as none under encryption, answers an empty
    /// head (no version in it, so any write passes the guard) that still
    /// carries its version, so the write expects what is there.
    pub(super) async fn head_opened(&self, workspace: &str) -> StorageResult<Option<Head>> {
        if self.sealer.is_none() {
            return self.inner.head(workspace).await;
        }
        let known = self.marks.knows(workspace);
        let start = self.marks.read_start();
        let Some(head) = self.inner.head(workspace).await? else {
            if self.checks_rollbacks() {
                self.marks.absent(workspace, start);
            }
            return Ok(None);
        };
        let state = if head.prefix.len() as u64 >= head.size {
            let stored = self.unless_plain_empty(head.prefix);
            match (self.checks_rollbacks(), stored) {
                (true, stored) => self.check_read(workspace, stored, known, start).await?,
                (false, Some(stored)) => Some(
                    self.open_current(&self.backend, workspace, stored, None)
                        .await?,
                ),
                (false, None) => None,
            }
        } else {
            // Read after the head: what it finds is at least as new, and a
            // write expecting the head's version is refused if it differs.
            self.read(workspace).await?
        };
        let Some(mut state) = state else {
            return Ok(Some(Head {
                version: head.version,
                size: 0,
                digest: None,
                prefix: Vec::new(),
            }));
        };
        let size = state.len() as u64;
        state.truncate(PREFIX_BYTES);
        state.shrink_to_fit();
        Ok(Some(Head {
            version: head.version,
            size,
            digest: None,
            prefix: state,
        }))
    }
}

#[cfg(test)]
#[path = "conditional_tests.rs"]
mod tests;
