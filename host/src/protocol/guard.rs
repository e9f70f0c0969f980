//! The stale-write guard and the write it allows, as one step.
//!
//! On one host the workspace's gate makes check and write one step. Across
//! hosts, storage with conditional writes (a contract 0.3.0 guest) does:
//! the guard judges the stored state's head and the write replaces only
//! the version it judged ([`super::conditional`]), so no lock is taken for
//! a write sent without one. For older guests the guest's own lock does: a
//! write that came without a lock (`-lock=false`, a script) runs under a
//! lock the host takes for it, so two unlocked writers on two replicas
//! cannot both pass the guard on the same stored state. Writes under a
//! client's lock need nothing more there: the guest refuses them unless
//! that lock still holds.

use super::error::ApiError;
use super::{App, Target};
use crate::audit::{Facts, StateVersion};
use crate::backend::{Storage, StorageError};
use crate::statefile;
use axum::body::Bytes;

/// Write `body` as the state of `target` unless the stale-write guard
/// refuses it (409), or it is already stored (a retried POST: nothing to
/// do). The caller holds the workspace's gate. `lock_id`: the client's
/// lock; without one, the host takes the lock for the write (423 while
/// another holds it, as the guest would answer). `facts` learns, for the
/// audit trail, the stored and incoming versions as far as they were read.
pub(crate) async fn write_unless_stale<S: Storage>(
    app: &App<S>,
    target: &Target<'_, S>,
    lock_id: Option<&str>,
    body: Bytes,
    facts: &mut Facts,
) -> Result<(), ApiError> {
    // Parsing a big state whole is the backend's host work, off the workers.
    let incoming = target
        .storage
        .host_work()
        .run_over(body.clone(), statefile::read)
        .await
        .map_err(|e| target.error(e.into()))?
        .map_err(|e| ApiError::bad_request(format!("{e}; nothing was written")))?;
    facts.after = incoming.version().map(|(lineage, serial)| StateVersion {
        lineage: Some(lineage.to_string()),
        serial,
    });
    let force = app.switches.allows_force_push(target.backend);
    if target.storage.conditional_writes() {
        // One request's calls: the head's instance serves the write.
        return crate::request::as_one_request(super::conditional::write_if_unchanged(
            target, lock_id, &incoming, body, force, facts,
        ))
        .await;
    }
    if force {
        // The guard is off: nothing to make one step with the write.
        return write(target, body, lock_id).await;
    }
    if let Some(id) = lock_id {
        return guarded_write(target, &incoming, body, id, facts).await;
    }
    // A stale or repeated state is answered before any lock is taken, so
    // it never holds the workspace from others; the guard runs again
    // under the lock.
    if guard_stale_write(target, &incoming, &body, facts).await? {
        return Ok(());
    }
    let own = crate::backend::own_lock(
        UNLOCKED_WRITE,
        "a write sent without a lock (-lock=false), locked by the server for its duration".into(),
        "wasmstate".into(),
    );
    if let Err(e) = lock_for_unlocked_write(target, &own).await {
        if !matches!(e, StorageError::Locked(_)) {
            // The lock may have been taken all the same (an answer lost on
            // the way back): do not leave it behind.
            release(target, &own.id).await;
        }
        return Err(target.error(e));
    }
    let written = guarded_write(target, &incoming, body, &own.id, facts).await;
    release(target, &own.id).await;
    written
}

/// The operation named in the lock the host takes for an unlocked write.
const UNLOCKED_WRITE: &str = "wasmstate-unlocked-write";

/// How long an unlocked write waits for another unlocked write's lock
/// (held for one guarded write, on another replica) before answering 423.
const UNLOCKED_WRITE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Take `own` for an unlocked write. Another replica's unlocked write
/// holds its lock only while it writes: wait for it, so two unlocked
/// racers from one serial get one 200 and one 409 (the guard's verdict on
/// what the first wrote) wherever they land, as on one host, not a 423
/// that depends on timing. A client's lock is answered at once (423).
async fn lock_for_unlocked_write<S: Storage>(
    target: &Target<'_, S>,
    own: &crate::backend::LockInfo,
) -> Result<(), StorageError> {
    let deadline = tokio::time::Instant::now() + UNLOCKED_WRITE_WAIT;
    let mut pause = std::time::Duration::from_millis(5);
    loop {
        match target.storage.lock(target.workspace, own.clone()).await {
            Err(StorageError::Locked(holder))
                if holder.operation == UNLOCKED_WRITE
                    && tokio::time::Instant::now() + pause < deadline =>
            {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// Release the host's own lock `id`, trying a few times; what still fails
/// is logged with what to do.
async fn release<S: Storage>(target: &Target<'_, S>, id: &str) {
    let mut last = None;
    for _ in 0..3 {
        match target.storage.unlock(target.workspace, id).await {
            Ok(()) => return,
            // Someone else holds it now (a force-unlock came first): not ours.
            Err(StorageError::LockMismatch(_)) => return,
            Err(e) => last = Some(e),
        }
    }
    if let Some(e) = last {
        tracing::error!(
            backend = target.backend,
            workspace = target.workspace,
            lock = id,
            error = %e,
            "the lock taken for an unlocked write was not released; if it is still held by \
             operation {UNLOCKED_WRITE} with this id, force-unlock it"
        );
    }
}

async fn guarded_write<S: Storage>(
    target: &Target<'_, S>,
    incoming: &statefile::Header,
    body: Bytes,
    lock_id: &str,
    facts: &mut Facts,
) -> Result<(), ApiError> {
    if guard_stale_write(target, incoming, &body, facts).await? {
        return Ok(());
    }
    write(target, body, Some(lock_id)).await
}

async fn write<S: Storage>(
    target: &Target<'_, S>,
    body: Bytes,
    lock_id: Option<&str>,
) -> Result<(), ApiError> {
    target
        .storage
        .write(target.workspace, body, lock_id)
        .await
        .map_err(|e: StorageError| target.error(e))
}

/// Refuse a write that would replace the stored state with an unrelated
/// (other lineage) or older (lower serial) one, as `terraform state push`
/// does without `-force`. `Ok(true)`: the same serial with the same bytes
/// is already stored, so there is nothing to write (a retried POST).
///
/// OpenTofu's encrypted states carry `serial` and `lineage` in the clear
/// and are judged like plain ones, so moving between plain and encrypted
/// (OpenTofu's fallback migration: same lineage, next serial) passes. A
/// body without both (a state that never had them, or an envelope from
/// OpenTofu 1.7.0-alpha1) is accepted only where the stored state has
/// neither: it must not replace a state whose history it cannot show.
async fn guard_stale_write<S: Storage>(
    target: &Target<'_, S>,
    incoming: &statefile::Header,
    body: &Bytes,
    facts: &mut Facts,
) -> Result<bool, ApiError> {
    let stored_version = crate::backend::stored_version(target.storage, target.workspace)
        .await
        .map_err(|e| target.error(e))?;
    super::judge::judge(target, incoming, body, stored_version, None, facts).await
}
