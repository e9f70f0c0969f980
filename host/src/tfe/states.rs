//! State versions: the current one, create (upload mode with capability
//! URLs, or inline), the upload itself, read and download.
//!
//! Every write is the http door's write: [`crate::protocol::write_unless_stale`]
//! under the workspace's gate and its audit record, always under a lock.
//! As in TFE, a state version is created only by the caller holding the
//! workspace's TFE lock (409 otherwise), and is bound to that lock's id:
//! its write (inline, or the upload later) uses that id, so a lock
//! force-unlocked or taken over in between refuses it (409, the lock
//! left as it is), as the http door's `POST ?ID=` does.
//!
//! Only the current state has a version id here (`sv-…` names a
//! workspace and a serial); the history of earlier states is at the http
//! door (`GET /states/{backend}/{workspace}/versions`).
//!
//! The `outputs` role finds the current version and downloads the state
//! without its resources or sensitive outputs; it reads no version
//! document and creates none.

use super::jsonapi::{
    self, Incoming, Resource, Single, StateVersionAttributes, StateVersionInput, TfeError,
};
use super::locks::held_by;
use super::uploads::{Full, Kind};
use super::{Client, Tfe, UPLOAD_PATH, ids, principal, sees_all};
use crate::audit::{Facts, Operation, StateVersion};
use crate::auth::Role;
use crate::backend::Storage;
use crate::protocol::{ApiError, Caller, Held};
use crate::statefile;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use md5::{Digest, Md5};
use std::sync::Arc;

type Version = Resource<StateVersionAttributes>;

/// The current state of `org`/`name` at `serial`, as a document.
/// The download URL is relative (resolved against the discovered base,
/// and bearer-checked), so it is right behind any proxy.
fn finalized(org: &str, name: &str, serial: u64) -> Version {
    let id = ids::version(org, name, serial);
    Resource {
        attributes: StateVersionAttributes {
            serial: i64::try_from(serial).unwrap_or(i64::MAX),
            status: "finalized",
            hosted_state_download_url: Some(format!("/api/v2/state-versions/{id}/download")),
            hosted_state_upload_url: None,
            hosted_json_state_upload_url: None,
        },
        id,
        kind: "state-versions",
        relationships: None,
    }
}

/// `GET workspaces/{id}/current-state-version`: 404 while it has no state.
pub(super) async fn current<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path(id): Path<String>,
    client: Client,
    headers: HeaderMap,
) -> Result<Response, TfeError> {
    let caller = tfe.caller(&headers, client).await?;
    let (org, name) = tfe.by_id(&caller, &id).await?;
    let target = tfe.app.target(&org, &name)?;
    let version = crate::backend::stored_version(target.storage, &name)
        .await
        .map_err(|e| target.error(e))?;
    let Some((_, serial)) = version else {
        return Err(TfeError::not_found(format!(
            "workspace {org}/{name} has no state yet"
        )));
    };
    let doc = finalized(&org, &name, serial);
    Ok(jsonapi::json(&Single { data: doc }))
}

/// `POST workspaces/{id}/state-versions`. With `state` (inline) the write
/// happens now; without (upload mode) the answer carries two single-use
/// upload URLs and the write happens on the raw one's PUT.
pub(super) async fn create<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path(id): Path<String>,
    client: Client,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, TfeError> {
    let (caller, (org, name)) = tfe
        .permitted(&headers, client, &id, Role::Write, Operation::Write)
        .await?;
    let at = (org.as_str(), name.as_str());
    let (body, held) = tfe.app.read_body(body).await?;
    let input = jsonapi::parse::<Incoming<StateVersionInput>>(&body)?
        .data
        .attributes
        .unwrap_or_default();
    drop(body);
    let serial = input
        .serial
        .filter(|s| *s >= 0)
        .ok_or_else(|| TfeError::invalid("a state version needs its serial (attributes.serial)"))?;
    let md5 = input
        .md5
        .as_deref()
        .and_then(|m| hex::decode(m).ok())
        .and_then(|m| <[u8; 16]>::try_from(m).ok())
        .ok_or_else(|| {
            TfeError::invalid("a state version needs the hex MD5 of its state (attributes.md5)")
        })?;
    if let Some(state) = input.state {
        let state = base64::engine::general_purpose::STANDARD
            .decode(state.trim())
            .map_err(|e| TfeError::invalid(format!("attributes.state is not base64: {e}")))?;
        check_md5(&state, &md5)?;
        write(&tfe, caller, &org, &name, Bytes::from(state), held, None).await?;
        let doc = finalized(&org, &name, serial as u64);
        return Ok(jsonapi::json_with(
            StatusCode::CREATED,
            &Single { data: doc },
        ));
    }
    let announced = (serial, input.lineage.as_deref(), &md5);
    let lock_id = match precheck(&tfe, &caller, &org, &name, announced).await {
        Ok(lock_id) => lock_id,
        Err(e) => {
            // Refused as the guard would: recorded as the guard's refusals are.
            let facts = Facts {
                after: Some(StateVersion {
                    lineage: input.lineage.clone(),
                    serial: serial as u64,
                }),
                ..Facts::default()
            };
            let refused: Result<(), ApiError> = Err(e);
            tfe.app
                .record(&caller, at, Operation::Write, facts, &refused)
                .await;
            let Err(e) = refused else {
                unreachable!("refused above")
            };
            // The hint is for a stale state, not for a missing lock.
            let stale =
                matches!(&e, ApiError::Message(StatusCode::CONFLICT, m) if !m.contains(NOT_LOCKED));
            let e = TfeError::from(e);
            return Err(if stale {
                e.unlocked_hint(&org, &name)
            } else {
                e
            });
        }
    };
    let who = principal(&caller);
    let (pending, raw, json) = tfe
        .uploads
        .create((org.clone(), name.clone()), caller, serial, md5, lock_id)
        .map_err(|full| {
            TfeError::from(match full {
                Full::Server => ApiError::RetryAfter(
                    StatusCode::SERVICE_UNAVAILABLE,
                    5,
                    "too many state uploads are pending on this server; retry shortly".into(),
                ),
                Full::Workspace(wait) => ApiError::RetryAfter(
                    StatusCode::TOO_MANY_REQUESTS,
                    wait.as_secs().max(1),
                    format!(
                        "{} state versions of workspace {org}/{name} are waiting for their upload; upload one (PUT its hosted-state-upload-url) or wait {} s for the oldest to expire; nothing was created",
                        super::uploads::MAX_PENDING_PER_WORKSPACE,
                        wait.as_secs().max(1)
                    ),
                ),
                Full::Principal(wait) => ApiError::RetryAfter(
                    StatusCode::TOO_MANY_REQUESTS,
                    wait.as_secs().max(1),
                    format!(
                        "{} state versions created by {who} are waiting for their upload; upload one (PUT its hosted-state-upload-url) or wait {} s for the oldest to expire; nothing was created",
                        super::uploads::MAX_PENDING_PER_PRINCIPAL,
                        wait.as_secs().max(1)
                    ),
                ),
            })
        })?;
    let base = tfe.base(&headers);
    let doc: Version = Resource {
        id: pending.id,
        kind: "state-versions",
        attributes: StateVersionAttributes {
            serial,
            status: "pending",
            hosted_state_download_url: None,
            hosted_state_upload_url: Some(format!("{base}{UPLOAD_PATH}?capability={raw}")),
            hosted_json_state_upload_url: Some(format!("{base}{UPLOAD_PATH}?capability={json}")),
        },
        relationships: None,
    };
    Ok(jsonapi::json_with(
        StatusCode::CREATED,
        &Single { data: doc },
    ))
}

fn check_md5(state: &[u8], md5: &[u8; 16]) -> Result<(), TfeError> {
    if Md5::digest(state).as_slice() == md5 {
        Ok(())
    } else {
        Err(TfeError::invalid(
            "the state does not match the MD5 announced (damaged in transit?); nothing was written",
        ))
    }
}

/// Refuse at create time, with a message terraform shows, what the write
/// would surely be refused (an upload's refusal reaches the user only as
/// "error HTTP response: 409"): a workspace not locked by the caller, or a state
/// older than or unrelated to a stored one that is not new, or one with
/// the stored serial and other content (`state push -force` of an older
/// state: terraform sends it as the stored serial). The guard still
/// decides at the write itself. The id of the caller's lock, which the
/// upload's write must still find.
async fn precheck<S: Storage>(
    tfe: &Tfe<S>,
    caller: &Caller,
    org: &str,
    name: &str,
    (serial, lineage, md5): (i64, Option<&str>, &[u8; 16]),
) -> Result<String, ApiError> {
    let target = tfe.app.target(org, name)?;
    let held = target
        .storage
        .current_lock(name)
        .await
        .map_err(|e| target.error(e))?;
    let lock_id = callers_lock(held, &principal(caller), None, org, name)?;
    if tfe.app.switches.allows_force_push(org) {
        return Ok(lock_id);
    }
    let stored = crate::backend::stored_version(target.storage, name)
        .await
        .map_err(|e| target.error(e))?;
    let Some((stored_lineage, stored_serial)) = stored else {
        return Ok(lock_id);
    };
    let stale = match lineage {
        Some(lineage) if lineage != stored_lineage => stored_serial > 1,
        _ => serial < i64::try_from(stored_serial).unwrap_or(i64::MAX),
    };
    let same_serial = lineage.is_none_or(|l| l == stored_lineage)
        && u64::try_from(serial).is_ok_and(|s| s == stored_serial);
    if same_serial {
        let stored = target
            .storage
            .read(name)
            .await
            .map_err(|e| target.error(e))?;
        if stored.is_some_and(|s| Md5::digest(&s).as_slice() != md5) {
            return Err(ApiError::Message(
                StatusCode::CONFLICT,
                format!(
                    "the state has serial {serial} like the stored state, but different content: another writer got there first, or an older state is being pushed; nothing was written (`terraform state push -force` needs allow_force_push = true on backend {org:?})"
                ),
            ));
        }
    }
    if stale {
        return Err(ApiError::Message(
            StatusCode::CONFLICT,
            format!(
                "the state (serial {serial}, lineage {lineage:?}) is older than or unrelated to the stored one (serial {stored_serial}, lineage {stored_lineage:?}); nothing was written (`terraform state push -force` needs allow_force_push = true on backend {org:?})"
            ),
        ));
    }
    Ok(lock_id)
}

/// What a state version created without the caller's lock is told.
const NOT_LOCKED: &str = "is not locked by you";

/// The lock a state version is written under: `bound` (the id recorded
/// when an upload-mode version was created), which must still hold; or,
/// without one, the caller's own TFE lock. Not locked (`-lock=false`, or a
/// lock released or force-unlocked since) is 409; another's lock, 423.
fn callers_lock(
    held: Option<crate::backend::LockInfo>,
    who: &str,
    bound: Option<&str>,
    org: &str,
    name: &str,
) -> Result<String, ApiError> {
    match (held, bound) {
        (Some(h), Some(id)) if h.id == id => Ok(h.id),
        (_, Some(_)) => Err(ApiError::Message(
            StatusCode::CONFLICT,
            format!(
                "the lock on workspace {org}/{name} this state version was created under was released or taken over (force-unlock?); nothing was written: run the terraform command again"
            ),
        )),
        (Some(h), None) if held_by(&h, who) => Ok(h.id),
        (Some(h), None) => Err(ApiError::Holder(StatusCode::LOCKED, h)),
        (None, None) => Err(ApiError::Message(
            StatusCode::CONFLICT,
            format!(
                "workspace {org}/{name} {NOT_LOCKED}: a state version is created only under the caller's lock (terraform takes it unless run with -lock=false; POST .../actions/lock takes it by hand); nothing was written"
            ),
        )),
    }
}

/// Write `state` as `caller`, through the http door's guarded write, under
/// the lock `bound` (an upload's recorded lock) or the caller's own.
async fn write<S: Storage>(
    tfe: &Tfe<S>,
    caller: Caller,
    org: &str,
    name: &str,
    state: Bytes,
    held: Held,
    bound: Option<String>,
) -> Result<(), TfeError> {
    let who = principal(&caller);
    tfe.app
        .change(org, name, move |app, backend, workspace| async move {
            // The body stays charged to the server's budget until the end.
            let _held = held;
            let target = app.target(&backend, &workspace)?;
            let mut facts = Facts::default();
            let answer = async {
                let held = target
                    .storage
                    .current_lock(&workspace)
                    .await
                    .map_err(|e| target.error(e))?;
                let lock_id = callers_lock(held, &who, bound.as_deref(), &backend, &workspace)?;
                facts.lock_id = Some(lock_id.clone());
                crate::protocol::write_unless_stale(
                    &app,
                    &target,
                    Some(&lock_id),
                    state,
                    &mut facts,
                )
                .await
            }
            .await;
            let at = (backend.as_str(), workspace.as_str());
            app.record(&caller, at, Operation::Write, facts, &answer)
                .await;
            answer
        })
        .await
        .map_err(|e| {
            let conflict = e.status() == StatusCode::CONFLICT
                && !matches!(&e, ApiError::Message(_, m) if m.contains(NOT_LOCKED));
            let e = TfeError::from(e);
            if conflict {
                e.unlocked_hint(org, name)
            } else {
                e
            }
        })
}

/// An upload URL's query.
#[derive(serde::Deserialize)]
pub(super) struct Capability {
    capability: String,
}

/// `PUT /_tfe/upload?capability=…`: no bearer; the secret is the
/// capability.
pub(super) async fn upload<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Query(Capability { capability }): Query<Capability>,
    body: Body,
) -> Response {
    let Some((pending, kind)) = tfe.uploads.redeem(&capability) else {
        return TfeError::not_found(
            "this upload URL is unknown, used or expired; run the terraform command again",
        )
        .into_response();
    };
    // The request log names the workspace (the path names none).
    let (backend, workspace) = pending.at.clone();
    let mut answer = upload_to(&tfe, pending, kind, body)
        .await
        .unwrap_or_else(IntoResponse::into_response);
    answer
        .extensions_mut()
        .insert(crate::protocol::LoggedAt { backend, workspace });
    answer
}

async fn upload_to<S: Storage>(
    tfe: &Tfe<S>,
    pending: super::uploads::Pending,
    kind: Kind,
    body: Body,
) -> Result<Response, TfeError> {
    if kind == Kind::Json {
        // Terraform's JSON rendering of the state: read and not kept.
        tfe.app.read_body(body).await?;
        return Ok(StatusCode::OK.into_response());
    }
    let written = async {
        tfe.app.refuse_while_draining()?;
        let (state, held) = tfe.app.read_body(body).await?;
        check_md5(&state, &pending.md5)?;
        let (org, name) = &pending.at;
        let bound = Some(pending.lock_id.clone());
        write(tfe, pending.caller.clone(), org, name, state, held, bound).await
    }
    .await;
    tfe.uploads.settle(
        &pending.id,
        if written.is_ok() {
            "finalized"
        } else {
            "discarded"
        },
    );
    written.map(|()| StatusCode::OK.into_response())
}

/// `GET state-versions/{id}`: a version pending or just uploaded here, or
/// the current state while it is at the serial its id names.
pub(super) async fn read<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path(id): Path<String>,
    client: Client,
    headers: HeaderMap,
) -> Result<Response, TfeError> {
    let caller = tfe.caller(&headers, client).await?;
    if let Some(pending) = tfe.uploads.get(&id) {
        let (org, name) = &pending.at;
        tfe.existing(&caller, org, name).await?;
        caller.may(org, Some(name), Role::Read)?;
        let doc: Version = Resource {
            id: pending.id,
            kind: "state-versions",
            attributes: StateVersionAttributes {
                serial: pending.serial,
                status: pending.status,
                hosted_state_download_url: None,
                hosted_state_upload_url: None,
                hosted_json_state_upload_url: None,
            },
            relationships: None,
        };
        return Ok(jsonapi::json(&Single { data: doc }));
    }
    let ((org, name), serial) =
        ids::parse_version(&id).ok_or_else(|| TfeError::not_found("no such state version"))?;
    tfe.existing(&caller, &org, &name).await?;
    caller.may(&org, Some(&name), Role::Read)?;
    let target = tfe.app.target(&org, &name)?;
    let stored = crate::backend::stored_version(target.storage, &name)
        .await
        .map_err(|e| target.error(e))?;
    if stored.map(|(_, s)| s) != Some(serial) {
        return Err(superseded(&id));
    }
    let doc = finalized(&org, &name, serial);
    Ok(jsonapi::json(&Single { data: doc }))
}

fn superseded(id: &str) -> TfeError {
    TfeError::not_found(format!(
        "state version {id} is not the workspace's current state; read current-state-version again"
    ))
}

/// `GET state-versions/{id}/download`: the raw state (opened, checked for
/// rollbacks, as the http door's GET), while it is at the id's serial;
/// for the `outputs` role, the same state without resources or
/// sensitive outputs, as the http door's GET serves that role.
pub(super) async fn download<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path(id): Path<String>,
    client: Client,
    headers: HeaderMap,
) -> Result<Response, TfeError> {
    let caller = tfe.caller(&headers, client).await?;
    let ((org, name), serial) =
        ids::parse_version(&id).ok_or_else(|| TfeError::not_found("no such state version"))?;
    tfe.existing(&caller, &org, &name).await?;
    let target = tfe.app.target(&org, &name)?;
    let Some(state) = target
        .storage
        .read(&name)
        .await
        .map_err(|e| target.error(e))?
    else {
        return Err(superseded(&id));
    };
    let (state, found) = serial_of(&target, Bytes::from(state)).await?;
    if found != Some(serial) {
        return Err(superseded(&id));
    }
    let state = Vec::from(state);
    let state = if sees_all(&caller, &org, &name) {
        state
    } else {
        crate::protocol::shared_outputs(&target, state).await?
    };
    Ok(tfe.app.bodies.answer(state)?)
}

/// The state back, and its serial: from its first bytes, or parsed whole
/// as the backend's host work when it comes later.
async fn serial_of<S: Storage>(
    target: &crate::protocol::Target<'_, S>,
    state: Bytes,
) -> Result<(Bytes, Option<u64>), TfeError> {
    let prefix = &state[..state.len().min(statefile::PREFIX_BYTES)];
    if let Some((_, serial)) = statefile::version_in_prefix(prefix) {
        return Ok((state, Some(serial)));
    }
    let serial = target
        .storage
        .host_work()
        .run_over(state.clone(), |b| {
            statefile::read(b)
                .ok()
                .and_then(|h| h.version().map(|(_, s)| s))
        })
        .await
        .map_err(|e| target.error(e.into()))?;
    Ok((state, serial))
}
