//! Locks: `actions/lock`, `actions/unlock`, `actions/force-unlock`.
//!
//! A TFE lock has no ID on the wire: it belongs to the workspace and to
//! whoever took it. Here it is a storage lock like any other (taken by the
//! protocol layer's own lock step, so `lock_ttl`, metrics and the audit
//! trail apply), with a random ID, operation [`TFE_LOCK`] and the caller's
//! name as its holder. The http door sees it as held, and a lock taken
//! there makes this door answer 409, which terraform reports as
//! `workspace already locked (lock ID: "<org>/<workspace>")`.

use super::jsonapi::{self, Incoming, LockInput, Single, TfeError};
use super::workspaces::{SMALL_BODY, document};
use super::{Client, Tfe, principal};
use crate::audit::{Facts, Operation};
use crate::auth::Role;
use crate::backend::{LockInfo, Storage};
use crate::protocol::{ApiError, Caller};
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use std::sync::Arc;

/// The operation a lock taken through the TFE API names.
pub(super) const TFE_LOCK: &str = "tfe-api";

/// Whether `holder` is a TFE lock of `who`.
pub(super) fn held_by(holder: &LockInfo, who: &str) -> bool {
    holder.operation == TFE_LOCK && holder.who == who
}

/// `POST workspaces/{id}/actions/lock`: 200 and the workspace, or 409 while
/// anyone (the caller too, as in TFE) holds it.
pub(super) async fn lock<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path(id): Path<String>,
    client: Client,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, TfeError> {
    let (caller, (org, name)) = tfe
        .permitted(&headers, client, &id, Role::Write, Operation::Lock)
        .await?;
    let body = tfe.app.read_body_up_to(body, SMALL_BODY).await?;
    let reason = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        jsonapi::parse::<Incoming<LockInput>>(&body)?
            .data
            .attributes
            .and_then(|a| a.reason)
    };
    let info = crate::backend::own_lock(
        TFE_LOCK,
        reason.unwrap_or_else(|| "locked through the TFE API".into()),
        principal(&caller),
    );
    let holder = caller.clone();
    tfe.app
        .change(&org, &name, move |app, backend, workspace| async move {
            let target = app.target(&backend, &workspace)?;
            let mut facts = Facts::default();
            let info = Bytes::from(serde_json::to_vec(&info).expect("LockInfo serialises"));
            let answer = crate::protocol::lock_workspace(&app, &target, &holder, info, &mut facts)
                .await
                .map(|_| ());
            // As at the http door: a refused lock is not recorded
            // (`-lock-timeout` asks again and again).
            if !matches!(&answer, Err(e) if e.status() == StatusCode::LOCKED) {
                let at = (backend.as_str(), workspace.as_str());
                app.record(&holder, at, Operation::Lock, facts, &answer)
                    .await;
            }
            answer
        })
        .await?;
    answer(&tfe, &caller, &org, &name, true).await
}

/// `POST workspaces/{id}/actions/unlock`: release the caller's own lock;
/// 409 when unlocked or held by someone else.
pub(super) async fn unlock<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path(id): Path<String>,
    client: Client,
    headers: HeaderMap,
) -> Result<Response, TfeError> {
    let (caller, (org, name)) = tfe
        .permitted(&headers, client, &id, Role::Write, Operation::Unlock)
        .await?;
    let who = principal(&caller);
    let holder = caller.clone();
    tfe.app
        .change(&org, &name, move |app, backend, workspace| async move {
            let target = app.target(&backend, &workspace)?;
            let mut facts = Facts::default();
            let answer = async {
                let held = target
                    .storage
                    .current_lock(&workspace)
                    .await
                    .map_err(|e| target.error(e))?;
                match held {
                    None => Err(ApiError::Message(
                        StatusCode::CONFLICT,
                        "Workspace already unlocked".into(),
                    )),
                    Some(h) if held_by(&h, &who) => {
                        let id = LockInfo {
                            id: h.id,
                            ..LockInfo::default()
                        };
                        let id = Bytes::from(serde_json::to_vec(&id).expect("LockInfo serialises"));
                        crate::protocol::unlock_workspace(&app, &target, id, &mut facts)
                            .await
                            .map(|_| ())
                    }
                    Some(h) => {
                        facts.holder = Some(h.who.clone());
                        Err(ApiError::Message(
                            StatusCode::CONFLICT,
                            format!(
                                "Workspace is locked by User {} (operation {}); only its holder unlocks it, or an admin with `terraform force-unlock`",
                                h.who, h.operation
                            ),
                        ))
                    }
                }
            }
            .await;
            let at = (backend.as_str(), workspace.as_str());
            app.record(&holder, at, Operation::Unlock, facts, &answer)
                .await;
            answer
        })
        .await?;
    answer(&tfe, &caller, &org, &name, false).await
}

/// `POST workspaces/{id}/actions/force-unlock` (admin): release whoever
/// holds the lock, at either door; 409 when unlocked. Terraform sends it
/// for `terraform force-unlock <org>/<workspace>`.
pub(super) async fn force_unlock<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path(id): Path<String>,
    client: Client,
    headers: HeaderMap,
) -> Result<Response, TfeError> {
    let (caller, (org, name)) = tfe
        .permitted(&headers, client, &id, Role::Admin, Operation::ForceUnlock)
        .await?;
    let holder = caller.clone();
    tfe.app
        .change(&org, &name, move |app, backend, workspace| async move {
            let target = app.target(&backend, &workspace)?;
            let mut facts = Facts::default();
            let answer = match crate::protocol::force_unlock(&app, &target, &mut facts).await {
                Ok(Some(_)) => Ok(()),
                Ok(None) => Err(ApiError::Message(
                    StatusCode::CONFLICT,
                    "Workspace already unlocked".into(),
                )),
                Err(e) => Err(e),
            };
            let at = (backend.as_str(), workspace.as_str());
            app.record(&holder, at, Operation::ForceUnlock, facts, &answer)
                .await;
            answer
        })
        .await?;
    answer(&tfe, &caller, &org, &name, false).await
}

/// The workspace after a lock change. The lock changed whatever else
/// happens, so metadata that cannot be read now is answered empty (logged):
/// terraform reads no tags here.
async fn answer<S: Storage>(
    tfe: &Tfe<S>,
    caller: &Caller,
    org: &str,
    name: &str,
    locked: bool,
) -> Result<Response, TfeError> {
    let storage = tfe.organization(caller, org)?;
    let meta = match tfe.meta.get(storage, org, name).await {
        Ok(meta) => meta,
        Err(e) => {
            tracing::warn!(backend = org, workspace = name, error = ?e, "the workspace's TFE metadata cannot be read; answered without it");
            Default::default()
        }
    };
    let doc = document(caller, org, name, meta, Some(locked));
    Ok(jsonapi::json(&Single { data: doc }))
}
