//! `wasmstate state reseal`, one workspace at a time, on the server that
//! holds the keys: the current state and every version this host keeps
//! are opened and sealed again under the sealing key (and for this
//! backend's name, after a rename), so an older key can be removed.
//!
//! Online: the workspace's lock is taken in storage first, as Terraform
//! takes it, so no write can come between the read and the re-sealed
//! write; a workspace whose lock is held is skipped and reported, never
//! waited for or broken. The state read goes through the same rollback
//! check as a request's, so an older state handed back by storage is
//! refused, not sealed again as the newest. The state keeps its serial
//! and lineage; it is the same state under a new seal.
//!
//! Versions kept by the storage itself (S3 object versions, git commits,
//! GCS generations) cannot be rewritten: they are reported with the key
//! they still need.

use super::Store;
use super::history::History;
use crate::backend::{Storage, StorageError, StorageResult, own_lock};
use crate::resealing::{Outcome, ResealReport, ResealRequest, VersionOutcome};
use bytes::Bytes;
use sha2::{Digest, Sha256};

/// Why a state that changed under the reseal was left as it was.
const CHANGED_WHILE_RESEALING: &str = "the state changed while it was being re-sealed (a write \
     under a lock that was forced open); left as written: run the re-seal again";

/// What a stored state is: which backend name it opens under, and what
/// it would be sealed again from (`None`: current).
struct Standing {
    bound_to: String,
    stale: Option<String>,
}

impl<S: Storage> Store<S> {
    /// Re-seal `workspace` as `request` says; see the module.
    pub async fn reseal_workspace(
        &self,
        workspace: &str,
        request: &ResealRequest,
    ) -> StorageResult<ResealReport> {
        let Some(sealer) = &self.sealer else {
            return Err(StorageError::InvalidInput(
                "encryption is off for this backend: nothing to re-seal (add encryption.keys first)"
                    .into(),
            ));
        };
        let mut report = ResealReport {
            workspace: workspace.to_string(),
            sealing_key: sealer.sealing_key().to_string(),
            state: Outcome::Absent,
            versions: Vec::new(),
            versions_kept_by: self.history_source().name().to_string(),
        };
        let lock_id = if request.dry_run {
            if let Some(holder) = self.inner.current_lock(workspace).await? {
                report.state = Outcome::Skipped {
                    reason: held(&holder),
                };
                return Ok(report);
            }
            None
        } else {
            let info = own_lock(
                "wasmstate-state-reseal",
                "re-sealing under the newest key".into(),
                request.who.clone(),
            );
            let id = info.id.clone();
            match self.inner.lock(workspace, info).await {
                Ok(()) => Some(id),
                Err(StorageError::Locked(holder)) => {
                    report.state = Outcome::Skipped {
                        reason: held(&holder),
                    };
                    return Ok(report);
                }
                Err(e) => {
                    // The lock may have been taken all the same (a lost
                    // answer): do not leave it behind, and name it, for a
                    // lock storage applies later still appears.
                    let left = match self.release(workspace, &id).await {
                        Ok(()) => format!(
                            "if a lock {id} held by wasmstate-state-reseal appears, release it with \
                             `terraform force-unlock {id}`"
                        ),
                        Err(left) => left,
                    };
                    return Err(StorageError::Unavailable(format!(
                        "taking the lock failed ({e}); {left}"
                    )));
                }
            }
        };
        let done = self
            .reseal_locked(workspace, request, lock_id.as_deref(), &mut report)
            .await;
        let Some(id) = &lock_id else {
            return done.map(|()| report);
        };
        // Whatever was re-sealed stays re-sealed; a lock left behind is
        // always named, with what to do.
        match (done, self.release(workspace, id).await) {
            (Ok(()), Ok(())) => Ok(report),
            (Err(e), Ok(())) => Err(e),
            (Ok(()), Err(left)) => Err(StorageError::Unavailable(format!("re-sealed, but {left}"))),
            (Err(e), Err(left)) => Err(StorageError::Unavailable(format!("{e}; {left}"))),
        }
    }

    /// Release the reseal's own lock `id`, trying a few times; `Err` says
    /// it may still be held and how to release it.
    async fn release(&self, workspace: &str, id: &str) -> Result<(), String> {
        let mut last = None;
        for _ in 0..3 {
            match self.inner.unlock(workspace, id).await {
                Ok(()) => return Ok(()),
                // Someone else holds it now (a force-unlock came first).
                Err(StorageError::LockMismatch(_)) => return Ok(()),
                Err(e) => last = Some(e),
            }
        }
        Err(format!(
            "releasing the reseal's lock {id} of {workspace:?} failed ({}); if it is still held by \
             wasmstate-state-reseal, release it with `terraform force-unlock {id}`",
            last.map(|e| e.to_string()).unwrap_or_default()
        ))
    }

    async fn reseal_locked(
        &self,
        workspace: &str,
        request: &ResealRequest,
        lock_id: Option<&str>,
        report: &mut ResealReport,
    ) -> StorageResult<()> {
        let old = request
            .from_backend
            .as_deref()
            .filter(|old| **old != *self.backend);
        // After a rename, the versions kept under the old name come first:
        // the rollback check below seeds from them (this name's marks and
        // history are empty), so an older state storage hands back is
        // refused here as it would have been under the old name.
        if let (Some(old), Some(history)) = (old, &self.history) {
            let mut left_behind = self
                .adopt_versions(workspace, &history.sibling(old), history, request)
                .await?;
            report.versions.append(&mut left_behind);
            // A read of the new name before now left a fresh start, which
            // would never consult what was just moved in: raise it.
            if !request.dry_run
                && let Some((lineage, started, serial)) = history.newest_version(workspace).await
            {
                let lineage = lineage.as_deref();
                self.marks.adopt(workspace, lineage, started, serial);
            }
        }
        // Read through the rollback check, as a request would; a dry run
        // leaves the marks alone.
        let start = match request.dry_run {
            true => None,
            false => self.read_start(workspace).await,
        };
        if let Some(stored) = self.read_stored(workspace).await? {
            report.state = match self.standing(workspace, &stored, old).await? {
                Err(reason) => Outcome::Failed { reason },
                // After a rename, another replica may have re-bound it
                // against its own history: this one's must agree.
                Ok(Standing { stale: None, .. }) if old.is_some() && !request.dry_run => match self
                    .open_current(&self.backend, workspace, stored, start)
                    .await
                {
                    Ok(_) => Outcome::Current,
                    Err(e) => Outcome::Failed {
                        reason: e.to_string(),
                    },
                },
                Ok(Standing { stale: None, .. }) => Outcome::Current,
                Ok(Standing {
                    stale: Some(from), ..
                }) if request.dry_run => Outcome::WouldReseal { from },
                Ok(Standing {
                    bound_to,
                    stale: Some(from),
                }) => {
                    let read = Sha256::digest(&stored);
                    // Its life goes on (opened below, so its stamp is checked).
                    let started = super::envelope::label(&stored).map_or(0, |l| l.started);
                    let state = self
                        .open_current(&bound_to, workspace, stored, start)
                        .await?;
                    match self
                        .write_resealed(workspace, Bytes::from(state), started, &read, lock_id)
                        .await?
                    {
                        true => Outcome::Resealed { from },
                        false => Outcome::Skipped {
                            reason: CHANGED_WHILE_RESEALING.into(),
                        },
                    }
                }
            };
        }
        let listed = self.inner.list_versions(workspace).await;
        self.learned(&listed);
        report.versions_kept_by = self.history_source().name().to_string();
        match listed {
            Ok(versions) => {
                for version in versions.into_iter().filter(|v| v.bytes > 0) {
                    let outcome = self.storage_version(workspace, &version.id, old).await?;
                    report.versions.push(VersionOutcome {
                        id: version.id,
                        outcome,
                    });
                }
            }
            Err(StorageError::NoHistory) => {
                if let Some(history) = &self.history {
                    for version in history
                        .list(workspace)
                        .await
                        .map_err(super::history_error)?
                    {
                        let outcome = self
                            .host_version(workspace, history, &version.id, old, request.dry_run)
                            .await?;
                        report.versions.push(VersionOutcome {
                            id: version.id,
                            outcome,
                        });
                    }
                }
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Which name `stored` opens under (this backend's, else `old`), and
    /// what it would be sealed again from. `Ok(Err)`: it opens under
    /// neither. Opening costs a key service call when the key is one.
    async fn standing(
        &self,
        workspace: &str,
        stored: &[u8],
        old: Option<&str>,
    ) -> StorageResult<Result<Standing, String>> {
        let sealer = self
            .sealer
            .as_ref()
            .expect("reseal checks encryption is on");
        let stale = sealer.stale_key(stored);
        if stale.as_deref() == Some("plain") && sealer.accepts_plain() {
            return Ok(Ok(Standing {
                bound_to: self.backend.to_string(),
                stale,
            }));
        }
        let here = self
            .open_as(&self.backend, workspace, stored.to_vec())
            .await?;
        let refusal = match here {
            Ok(_) => {
                return Ok(Ok(Standing {
                    bound_to: self.backend.to_string(),
                    stale,
                }));
            }
            Err(refusal) => refusal,
        };
        let Some(old) = old else {
            return Ok(Err(refusal));
        };
        Ok(match self.open_as(old, workspace, stored.to_vec()).await? {
            Ok(_) => Ok(Standing {
                bound_to: old.to_string(),
                stale: Some(stale.unwrap_or_else(|| format!("bound to backend {old:?}"))),
            }),
            Err(refusal) => Err(format!(
                "opens neither as {:?} nor as {old:?}: {refusal}",
                &*self.backend
            )),
        })
    }

    /// Seal `state` again and write it under the reseal's lock, unless
    /// the stored state is no longer the one `read` (its digest) it came
    /// from: `false` then, and nothing is written. It keeps its serial, so
    /// the rollback marks stay as they are.
    async fn write_resealed(
        &self,
        workspace: &str,
        state: Bytes,
        started: u64,
        read: &[u8],
        lock_id: Option<&str>,
    ) -> StorageResult<bool> {
        let stamp = super::rollback::Stamp::keep(started);
        let (header, sealed) = self.seal_to_store(workspace, state, stamp).await?;
        // Read again once sealed (a key service call may have taken a
        // while), just before writing back: a write under a lock that was
        // forced open may have landed since the first read, and the older
        // state written back would replace it. What stays open is this
        // read to the guest's own lock check, as with any writer.
        //
        // On storage with conditional writes an unlocked write takes no
        // lock: it can pass the guest's lock check before this reseal's
        // lock and land after the read below. So the write back expects
        // the version a head saw *before* that read: if the bytes read
        // are still stored under it, nothing landed between; if anything
        // landed since, the version moved and the write is refused.
        let expect = if self.inner.conditional_writes() {
            match self.inner.head(workspace).await? {
                Some(head) => Some(crate::backend::Expect::Version(head.version)),
                None => return Ok(false),
            }
        } else {
            None
        };
        let now = self.read_stored(workspace).await?;
        if now.map(Sha256::digest).as_deref() != Some(read) {
            return Ok(false);
        }
        match expect {
            Some(expect) => {
                if !self
                    .inner
                    .write_if(workspace, sealed, lock_id, expect)
                    .await?
                {
                    return Ok(false);
                }
            }
            None => self.inner.write(workspace, sealed, lock_id).await?,
        }
        if let Some(serial) = header.serial {
            let lineage = header.lineage.as_deref();
            self.marks.wrote(workspace, lineage, header.started, serial);
        }
        Ok(true)
    }

    /// A version the storage keeps: it cannot be rewritten, so say which
    /// key (or name) it still needs. Read from its label, without a key
    /// service call, unless a rename asks which name it is bound to.
    async fn storage_version(
        &self,
        workspace: &str,
        id: &str,
        old: Option<&str>,
    ) -> StorageResult<Outcome> {
        let Some(stored) = self.inner.read_version(workspace, id).await? else {
            return Ok(Outcome::Absent);
        };
        let sealer = self
            .sealer
            .as_ref()
            .expect("reseal checks encryption is on");
        let still = match (sealer.stale_key(&stored), old) {
            (Some(key), _) => key,
            (None, None) => return Ok(Outcome::Current),
            (None, Some(old)) => match self.standing(workspace, &stored, Some(old)).await? {
                Ok(Standing { stale: None, .. }) => return Ok(Outcome::Current),
                Ok(Standing { .. }) => format!(
                    "the backend name {old:?}: such versions open only under that name, not this one"
                ),
                Err(reason) => return Ok(Outcome::Failed { reason }),
            },
        };
        Ok(Outcome::KeptByStorage { still })
    }

    /// A version this host keeps: sealed again in place.
    async fn host_version(
        &self,
        workspace: &str,
        history: &History,
        id: &str,
        old: Option<&str>,
        dry_run: bool,
    ) -> StorageResult<Outcome> {
        let Some(stored) = history
            .read(workspace, id)
            .await
            .map_err(super::history_error)?
        else {
            return Ok(Outcome::Absent);
        };
        let (bound_to, from) = match self.standing(workspace, &stored, old).await? {
            Err(reason) => return Ok(Outcome::Failed { reason }),
            Ok(Standing { stale: None, .. }) => return Ok(Outcome::Current),
            Ok(Standing {
                bound_to,
                stale: Some(from),
            }) => (bound_to, from),
        };
        if dry_run {
            return Ok(Outcome::WouldReseal { from });
        }
        let resealed = self.reseal_bytes(&bound_to, workspace, stored).await?;
        let resealed = match resealed {
            Ok(bytes) => bytes,
            Err(reason) => return Ok(Outcome::Failed { reason }),
        };
        match history
            .put(workspace, id, resealed, false)
            .await
            .map_err(super::history_error)?
        {
            true => Ok(Outcome::Resealed { from }),
            // Pruned meanwhile: nothing left that needs the old key. (A
            // prune by another replica between the check and the rename
            // can bring a pruned version back; the next prune takes it.)
            false => Ok(Outcome::Absent),
        }
    }

    /// Open `stored` as `bound_to`'s and seal it again for this backend
    /// (no rollback check: a version is old by design).
    async fn reseal_bytes(
        &self,
        bound_to: &str,
        workspace: &str,
        stored: Vec<u8>,
    ) -> StorageResult<Result<Vec<u8>, String>> {
        let (state, header) = match self.open_as(bound_to, workspace, stored).await? {
            Ok(opened) => opened,
            Err(reason) => return Ok(Err(reason)),
        };
        // A kept version keeps the life it was written in.
        let stamp = super::rollback::Stamp::keep(header.started);
        let (_, sealed) = self.seal(workspace, Bytes::from(state), stamp).await?;
        Ok(Ok(sealed.to_vec()))
    }

    /// After a rename: move the versions kept under the old name into
    /// this backend's history, sealed again for the new name, each
    /// removed from the old place once its copy is written. What is not
    /// moved (a dry run, a version that does not open) is reported here;
    /// what is moved is reported with this backend's versions.
    async fn adopt_versions(
        &self,
        workspace: &str,
        from: &History,
        into: &History,
        request: &ResealRequest,
    ) -> StorageResult<Vec<VersionOutcome>> {
        let old = request.from_backend.as_deref().unwrap_or_default();
        let mut left = Vec::new();
        for version in from.list(workspace).await.map_err(super::history_error)? {
            let outcome = if request.dry_run {
                Outcome::WouldReseal {
                    from: format!("kept under backend {old:?}"),
                }
            } else {
                let Some(stored) = from
                    .read(workspace, &version.id)
                    .await
                    .map_err(super::history_error)?
                else {
                    continue;
                };
                match self.reseal_bytes(old, workspace, stored).await? {
                    Ok(resealed) => {
                        into.put(workspace, &version.id, resealed, true)
                            .await
                            .map_err(super::history_error)?;
                        from.remove(workspace, &version.id)
                            .await
                            .map_err(super::history_error)?;
                        continue;
                    }
                    // It stays in the old folder for a later run.
                    Err(reason) => Outcome::Failed {
                        reason: format!("kept under backend {old:?}: {reason}"),
                    },
                }
            };
            left.push(VersionOutcome {
                id: version.id,
                outcome,
            });
        }
        Ok(left)
    }
}

fn held(holder: &crate::backend::LockInfo) -> String {
    format!(
        "locked by {} ({}, since {}); run again once it is released",
        if holder.who.is_empty() {
            "someone"
        } else {
            &holder.who
        },
        if holder.operation.is_empty() {
            "no operation given"
        } else {
            &holder.operation
        },
        holder.created
    )
}

#[cfg(test)]
#[path = "reseal_tests.rs"]
mod tests;
