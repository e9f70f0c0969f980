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

/// Largest stored state read whole to see whether it is empty: an empty
/// one is a few hundred bytes.
const EMPTY_STATE_MAX_BYTES: usize = 64 << 10;

/// Whether the stored state is proven empty (see [`proven_empty`]). At
/// most [`EMPTY_STATE_MAX_BYTES`] are read: anything longer is not empty.
async fn stored_is_empty<S: Storage>(target: &Target<'_, S>) -> Result<bool, ApiError> {
    let Some(stored) = target
        .storage
        .read_prefix(target.workspace, EMPTY_STATE_MAX_BYTES + 1)
        .await
        .map_err(|e| target.error(e))?
    else {
        return Ok(true);
    };
    Ok(stored.len() <= EMPTY_STATE_MAX_BYTES && proven_empty(&stored))
}

/// Whether `stored` is a state that provably holds nothing: a plain state
/// (format 4 or later) whose `resources` is there and empty and whose
/// `outputs` are empty. What cannot be seen into is not empty: an
/// OpenTofu-encrypted state (its resources are ciphertext), a legacy
/// format-3 state (its resources sit under `modules`), a state without
/// `resources`, or bytes that are not JSON. Replacing any of those with
/// another lineage could lose resources.
fn proven_empty(stored: &[u8]) -> bool {
    let Ok(serde_json::Value::Object(state)) = serde_json::from_slice(stored) else {
        return false;
    };
    let plain = state
        .get("encryption_version")
        .is_none_or(|v| v.is_null() || v.as_str() == Some(""));
    let format = state.get("version").and_then(|v| v.as_u64());
    let no_resources =
        matches!(state.get("resources"), Some(serde_json::Value::Array(r)) if r.is_empty());
    let no_outputs = match state.get("outputs") {
        None | Some(serde_json::Value::Null) => true,
        Some(serde_json::Value::Object(outputs)) => outputs.is_empty(),
        Some(_) => false,
    };
    plain
        && format.is_some_and(|v| v >= 4)
        && no_resources
        && no_outputs
        && !state.contains_key("modules")
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

#[cfg(test)]
mod tests {
    use super::proven_empty;

    /// Terraform's pg backend creates a workspace with this state: any
    /// lineage may replace it.
    #[test]
    fn terraforms_empty_workspace_is_empty() {
        let created = br#"{"version":4,"terraform_version":"1.11.4","serial":1,"lineage":"x","outputs":{},"resources":[],"check_results":null}"#;
        assert!(proven_empty(created));
        assert!(proven_empty(
            br#"{"version":4,"serial":0,"lineage":"x","resources":[]}"#
        ));
    }

    /// Issue 47, data 1: what cannot be seen into is never taken for empty.
    #[test]
    fn opaque_legacy_or_unparsable_states_are_not_empty() {
        let not_empty: [&[u8]; 9] = [
            // OpenTofu client-side encrypted: no top-level resources/outputs.
            br#"{"serial":1,"lineage":"la","meta":{"key_provider.pbkdf2.p":"bWV0YQ=="},"encrypted_data":"AAAA","encryption_version":"v0"}"#,
            // Even with an empty `resources` beside the ciphertext.
            br#"{"serial":1,"lineage":"la","resources":[],"encrypted_data":"AAAA","encryption_version":"v0"}"#,
            // Legacy format 3: resources under `modules`.
            br#"{"version":3,"serial":1,"lineage":"la","modules":[{"path":["root"],"outputs":{},"resources":{"null_resource.a":{"type":"null_resource"}}}]}"#,
            br#"{"version":3,"serial":1,"lineage":"la","modules":[],"resources":[]}"#,
            // No `resources` at all, or resources, or outputs.
            br#"{"version":4,"serial":1,"lineage":"la"}"#,
            br#"{"version":4,"serial":1,"lineage":"la","resources":[{"type":"x"}]}"#,
            br#"{"version":4,"serial":1,"lineage":"la","resources":[],"outputs":{"o":{"value":1}}}"#,
            // Not JSON, or not an object.
            b"\x00\x01 sealed bytes",
            b"[]",
        ];
        for stored in not_empty {
            assert!(!proven_empty(stored), "{}", String::from_utf8_lossy(stored));
        }
    }
}
