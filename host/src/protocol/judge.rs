//! The stale-write guard's verdict: whether a state may replace the
//! stored one (same lineage, not older; a workspace created empty takes
//! any), and whether it is already stored (a retried POST), told from the
//! storage's head where it can. Used by both write paths: the host-locked
//! one (`guard`) and the conditional one (`conditional`).

use super::Target;
use super::error::ApiError;
use crate::audit::{Facts, StateVersion};
use crate::backend::{Head, Storage};
use crate::statefile;
use axum::body::Bytes;
use axum::http::StatusCode;

/// The guard's verdict on `incoming` over the stored state of version
/// `stored_version` (see `guard_stale_write` in the guard); `head`: what storage
/// answered of it (a contract 0.3.0 guest), so emptiness and a repeated
/// POST are told from it without reading the state where it can.
pub(super) async fn judge<S: Storage>(
    target: &Target<'_, S>,
    incoming: &statefile::Header,
    body: &Bytes,
    stored_version: Option<(String, u64)>,
    head: Option<&Head>,
    facts: &mut Facts,
) -> Result<bool, ApiError> {
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
        if stored_serial <= 1 && stored_is_empty(target, head).await? {
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
        // A retried POST sends the same bytes again: told from the head
        // where it can, else compared as storage streams them, never held
        // twice.
        if holds(target, body, head).await? {
            facts.unchanged = true;
            return Ok(true);
        }
        return refuse(format!(
            "the state has serial {serial} like the stored state, but different content: another writer got there first"
        ));
    }
    Ok(false)
}

/// Whether the stored state is exactly `body`: from `head` where it
/// tells (another size, the whole state in its prefix, a digest), else
/// compared as storage streams it.
pub(super) async fn holds<S: Storage>(
    target: &Target<'_, S>,
    body: &Bytes,
    head: Option<&Head>,
) -> Result<bool, ApiError> {
    if let Some(head) = head {
        if head.size != body.len() as u64 {
            return Ok(false);
        }
        if head.prefix.len() == body.len() {
            return Ok(head.prefix[..] == body[..]);
        }
        if let Some(digest) = head.digest.clone() {
            let said = target
                .storage
                .host_work()
                .run_over(body.clone(), move |body| {
                    crate::digest::digest_says(&digest, body)
                })
                .await
                .map_err(|e| target.error(e.into()))?;
            if let Some(same) = said {
                return Ok(same);
            }
        }
    }
    target
        .storage
        .holds(target.workspace, body)
        .await
        .map_err(|e| target.error(e))
}

/// Largest stored state read whole to see whether it is empty: an empty
/// one is a few hundred bytes.
const EMPTY_STATE_MAX_BYTES: usize = 64 << 10;

/// Whether the stored state is proven empty (see [`proven_empty`]). At
/// most [`EMPTY_STATE_MAX_BYTES`] are read: anything longer is not empty.
/// With its `head`, nothing is read where the head's prefix holds it all.
async fn stored_is_empty<S: Storage>(
    target: &Target<'_, S>,
    head: Option<&Head>,
) -> Result<bool, ApiError> {
    if let Some(head) = head {
        if head.size > EMPTY_STATE_MAX_BYTES as u64 {
            return Ok(false);
        }
        if head.prefix.len() as u64 >= head.size {
            return Ok(proven_empty(&head.prefix));
        }
    }
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
