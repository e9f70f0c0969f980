//! `LOCK` and `UNLOCK` on a state URL, and the opt-in takeover of a lock
//! older than its backend's `lock_ttl`.
//!
//! Takeover is off by default. Terraform's maintainers call automatic lock
//! expiry a foot-gun: a lock is old because its run is long as often as
//! because its run is dead, and a run whose lock was taken over can no
//! longer save its state (it is refused, and Terraform leaves
//! `errored.tfstate` behind). Where an operator opts in, the lock's age is
//! the `Created` time its client wrote (that client's clock), the holder
//! is released by its own ID (so of two replicas taking over at once, one
//! wins and the other finds the new, young lock), and the takeover is
//! recorded in the audit trail with the holder it displaced.

use super::error::ApiError;
use super::{App, Caller, Target};
use crate::audit::{Facts, Operation};
use crate::backend::{LockInfo, Storage, StorageError};
use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::time::Duration;

pub(super) fn parse_lock_info(body: &[u8]) -> Result<LockInfo, ApiError> {
    let info: LockInfo = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not LockInfo JSON: {e}")))?;
    if info.id.trim().is_empty() {
        return Err(ApiError::bad_request("LockInfo has an empty \"ID\""));
    }
    Ok(info)
}

/// Take the lock for the LockInfo in `body`; with a `lock_ttl`, release
/// first a holder older than it. Both doors lock through here.
pub(crate) async fn lock<S: Storage>(
    app: &App<S>,
    target: &Target<'_, S>,
    caller: &Caller,
    body: Bytes,
    facts: &mut Facts,
) -> Result<Response, ApiError> {
    let info = parse_lock_info(&body)?;
    facts.lock_id = Some(info.id.clone());
    let mut taken = target.storage.lock(target.workspace, info.clone()).await;
    if let Err(StorageError::Locked(holder)) = &taken
        && let Some(ttl) = app.switches.lock_ttl(target.backend)
        && older_than(holder, ttl)
    {
        let holder = holder.clone();
        // Released by its ID: if another released or took it meanwhile,
        // this releases nothing, and the lock below meets the new holder.
        if target
            .storage
            .unlock(target.workspace, &holder.id)
            .await
            .is_ok()
        {
            app.metrics.lock_released(target.backend, target.workspace);
            taken = target.storage.lock(target.workspace, info.clone()).await;
            // Recorded whenever the release went through (it may have
            // released nothing, the holder having gone meanwhile: the
            // storage cannot tell), saying whether this caller got the lock.
            took_over(app, target, caller, &holder, ttl, taken.is_ok()).await;
        }
    }
    match taken {
        Ok(()) => app
            .metrics
            .lock_granted(target.backend, target.workspace, &info.id),
        Err(e) => {
            if matches!(e, StorageError::Locked(_)) {
                app.metrics.lock_conflict(target.backend);
            }
            return Err(target.error(e));
        }
    }
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(&info).expect("LockInfo serialises"),
    )
        .into_response())
}

/// Whether `holder` took its lock more than `ttl` ago, by its own word; a
/// lock whose time does not parse is never taken over.
fn older_than(holder: &LockInfo, ttl: Duration) -> bool {
    let age = crate::backend::lock_age(holder, time::OffsetDateTime::now_utc());
    !holder.id.is_empty() && age.is_some_and(|age| age > ttl)
}

/// Record and log that `caller` released `holder`'s expired lock (and
/// whether it then got the lock).
async fn took_over<S: Storage>(
    app: &App<S>,
    target: &Target<'_, S>,
    caller: &Caller,
    holder: &LockInfo,
    ttl: Duration,
    relocked: bool,
) {
    let facts = Facts {
        lock_id: Some(holder.id.clone()),
        holder: Some(holder.who.clone()),
        note: (!relocked).then(|| "released, but another took the lock first".to_string()),
        ..Facts::default()
    };
    let at = (target.backend, target.workspace);
    app.record(
        caller,
        at,
        Operation::LockTakeover,
        facts,
        &Ok::<(), ApiError>(()),
    )
    .await;
    tracing::warn!(
        backend = target.backend,
        workspace = target.workspace,
        holder = %holder.who,
        since = %holder.created,
        lock_ttl = %humantime::format_duration(ttl),
        "lock taken over: held longer than the backend's lock_ttl"
    );
}

/// Release the lock: the one whose ID `body` names, or with no body
/// (`terraform force-unlock`) whoever holds it. Both doors unlock through
/// here.
pub(crate) async fn unlock<S: Storage>(
    app: &App<S>,
    target: &Target<'_, S>,
    body: Bytes,
    facts: &mut Facts,
) -> Result<Response, ApiError> {
    // `terraform force-unlock` sends no body at all: release whoever holds it.
    // (OpenTofu's force-unlock sends LockInfo with only the ID: the normal
    // path below, which releases the lock when that ID holds it.)
    if body.iter().all(u8::is_ascii_whitespace) {
        force_unlock(app, target, facts).await?;
        return Ok(StatusCode::OK.into_response());
    }
    let info = parse_lock_info(&body)?;
    facts.lock_id = Some(info.id.clone());
    target
        .storage
        .unlock(target.workspace, &info.id)
        .await
        .map_err(|e| target.error(e))?;
    app.metrics.lock_released(target.backend, target.workspace);
    Ok(StatusCode::OK.into_response())
}

/// Release the lock of `target` whoever holds it (`terraform
/// force-unlock`, the console): the holder removed, also told to `facts`.
pub(crate) async fn force_unlock<S: Storage>(
    app: &App<S>,
    target: &Target<'_, S>,
    facts: &mut Facts,
) -> Result<Option<LockInfo>, ApiError> {
    let released = target
        .storage
        .force_unlock(target.workspace)
        .await
        .map_err(|e| target.error(e))?;
    app.metrics.lock_released(target.backend, target.workspace);
    if let Some(holder) = &released {
        tracing::warn!(
            backend = target.backend,
            workspace = target.workspace,
            "force-unlocked: lock {} of {} removed",
            holder.id,
            holder.who
        );
        facts.lock_id = Some(holder.id.clone());
        facts.holder = Some(holder.who.clone());
    }
    Ok(released)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_info_needs_an_id() {
        assert!(parse_lock_info(br#"{"ID":"x","Operation":"OperationTypeApply"}"#).is_ok());
        assert!(parse_lock_info(br#"{"ID":"","Operation":"x"}"#).is_err());
        assert!(parse_lock_info(b"{not json").is_err());
    }

    #[test]
    fn only_a_lock_older_than_the_ttl_with_a_readable_time_is_taken_over() {
        let at = |created: &str| LockInfo {
            id: "id-1".into(),
            created: created.into(),
            ..LockInfo::default()
        };
        let hour = Duration::from_secs(3600);
        assert!(older_than(&at("2020-01-01T00:00:00Z"), hour));
        let now = time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap();
        assert!(!older_than(&at(&now), hour));
        assert!(!older_than(&at("last tuesday"), hour));
        let no_id = LockInfo {
            id: String::new(),
            ..at("2020-01-01T00:00:00Z")
        };
        assert!(!older_than(&no_id, hour));
    }
}
