//! The stale-write guard and the write it allows, as one step.
//!
//! On one host the workspace's gate makes check and write one step. Across
//! hosts the guest's own lock does: a write that came without a lock
//! (`-lock=false`, a script) runs under a lock the host takes for it, so
//! two unlocked writers on two replicas cannot both pass the guard on the
//! same stored state. Writes under a client's lock need nothing more: the
//! guest refuses them unless that lock still holds.

use super::error::ApiError;
use super::{App, Target};
use crate::audit::{Facts, StateVersion};
use crate::backend::{Storage, StorageError};
use crate::statefile;
use axum::body::Bytes;
use axum::http::StatusCode;

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
    if app.switches.allows_force_push(target.backend) {
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
    if let Err(e) = target.storage.lock(target.workspace, own.clone()).await {
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
/// Largest stored state read whole to see whether it is empty: an empty
/// one is a few hundred bytes.
const EMPTY_STATE_MAX_BYTES: usize = 64 << 10;

/// Whether the stored state has no resources and no outputs. At most
/// [`EMPTY_STATE_MAX_BYTES`] are read: anything longer is not empty.
async fn stored_is_empty<S: Storage>(target: &Target<'_, S>) -> Result<bool, ApiError> {
    let Some(stored) = target
        .storage
        .read_prefix(target.workspace, EMPTY_STATE_MAX_BYTES + 1)
        .await
        .map_err(|e| target.error(e))?
    else {
        return Ok(true);
    };
    if stored.len() > EMPTY_STATE_MAX_BYTES {
        return Ok(false);
    }
    let Ok(state) = serde_json::from_slice::<serde_json::Value>(&stored) else {
        return Ok(false);
    };
    let empty = |key: &str| match &state[key] {
        serde_json::Value::Null => true,
        serde_json::Value::Array(items) => items.is_empty(),
        serde_json::Value::Object(items) => items.is_empty(),
        _ => false,
    };
    Ok(empty("resources") && empty("outputs"))
}

async fn guard_stale_write<S: Storage>(
    target: &Target<'_, S>,
    incoming: &statefile::Header,
    body: &Bytes,
    facts: &mut Facts,
) -> Result<bool, ApiError> {
    let stored_version = crate::backend::stored_version(target.storage, target.workspace)
        .await
        .map_err(|e| target.error(e))?;
    facts.before = stored_version.clone().map(StateVersion::of);
    let Some((stored_lineage, stored_serial)) = stored_version else {
        return Ok(false);
    };
    let refuse = |why: String| {
        Err(ApiError::Message(
            StatusCode::CONFLICT,
            format!(
                "{why}; nothing was written (`terraform state push -force` needs allow_force_push = true on backend {:?})",
                target.backend
            ),
        ))
    };
    let Some((lineage, serial)) = incoming.version() else {
        return refuse(format!(
            "the state has no lineage and serial, and the stored state has lineage {stored_lineage:?} and serial {stored_serial}"
        ));
    };
    if lineage != stored_lineage {
        // A workspace created empty (serial 1, nothing in it, as
        // Terraform's pg backend creates one) takes a state of any
        // lineage, as Terraform's own push check allows: nothing is lost.
        if stored_serial <= 1 && stored_is_empty(target).await? {
            return Ok(false);
        }
        return refuse(format!(
            "the state's lineage {lineage:?} differs from the stored state's {stored_lineage:?}"
        ));
    }
    if serial < stored_serial {
        return refuse(format!(
            "the state's serial {serial} is older than the stored state's {stored_serial}"
        ));
    }
    if serial == stored_serial {
        // A retried POST sends the same bytes again: compared as storage
        // streams them, never held twice.
        if target
            .storage
            .holds(target.workspace, body)
            .await
            .map_err(|e| target.error(e))?
        {
            facts.unchanged = true;
            return Ok(true);
        }
        return refuse(format!(
            "the state has serial {serial} like the stored state, but different content: another writer got there first"
        ));
    }
    Ok(false)
}
