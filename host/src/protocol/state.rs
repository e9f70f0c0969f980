//! `/states/{backend}/{workspace}`: Terraform's `backend "http"` protocol.
//!
//! | method      | success | notable answers                                   |
//! |-------------|---------|---------------------------------------------------|
//! | GET         | 200     | 404 no state                                      |
//! | POST, PUT   | 200     | 423 + holder when locked by another; 400 bad MD5  |
//! | DELETE      | 200     | 423 + holder when locked by another               |
//! | LOCK        | 200     | 423 + holder when held                            |
//! | UNLOCK      | 200     | 409 + holder on ID mismatch; empty body = force   |

use super::error::ApiError;
use super::{App, BodyBudget, Caller, Held, Target};
use crate::audit::{Facts, Operation};
use crate::auth::Role;
use crate::backend::Storage;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use md5::{Digest, Md5};
use std::collections::HashMap;
use std::sync::Arc;

/// Methods served on a state URL (for 405 answers).
pub const ALLOWED: &str = "GET, POST, PUT, DELETE, LOCK, UNLOCK";

/// Dispatch one request on a state URL. The caller is known (401 comes
/// before anything is read); the body is read only when the method takes
/// one, and only then is the role checked, since an UNLOCK without a body
/// (force-unlock) needs more than one with.
pub async fn handle<S: Storage>(
    app: &Arc<App<S>>,
    target: Target<'_, S>,
    caller: &Caller,
    method: Method,
    query: HashMap<String, String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let admin = caller.is_admin(target.backend, target.workspace);
    dispatch(app, target, caller, method, query, headers, body)
        .await
        .map_err(|e| e.hide_holder_id(admin))
}

async fn dispatch<S: Storage>(
    app: &Arc<App<S>>,
    target: Target<'_, S>,
    caller: &Caller,
    method: Method,
    query: HashMap<String, String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    // Terraform sends `?ID=<lock id>` on writes while it holds the lock.
    let lock_id = query
        .get("ID")
        .map(String::as_str)
        .filter(|id| !id.is_empty());
    let at = (target.backend, target.workspace);
    let mut operation = match method.as_str() {
        "POST" | "PUT" => Some(Operation::Write),
        "DELETE" => Some(Operation::Delete),
        "LOCK" => Some(Operation::Lock),
        "UNLOCK" => Some(Operation::Unlock),
        _ => None,
    };
    // A change that arrives once the server is stopping never starts; one
    // already past this point completes.
    if method != Method::GET {
        app.refuse_while_draining()?;
    }
    // A refused change is recorded, its body unread or unusable.
    let refuse = async |operation: Option<Operation>, e: ApiError| match operation {
        Some(op) => app.refused(caller, at, op, e).await,
        None => e,
    };
    let may = |role: Role| caller.may(target.backend, Some(target.workspace), role);
    let (body, held) = match method.as_str() {
        "POST" | "PUT" | "LOCK" | "UNLOCK" => {
            // Writers must at least write before the server reads a body.
            if let Err(e) = may(Role::Write) {
                return Err(refuse(operation, e).await);
            }
            let read = match method.as_str() {
                // A lock's details are small, and never wait on the body
                // budget: readers filling it must not strand a lock.
                "LOCK" | "UNLOCK" => app
                    .read_body_up_to(body, LOCK_BODY_BYTES)
                    .await
                    .map(|body| (body, Held::default()))
                    .map_err(|e| match e.status() {
                        StatusCode::PAYLOAD_TOO_LARGE => ApiError::Message(
                            StatusCode::PAYLOAD_TOO_LARGE,
                            format!(
                                "a lock's details may be at most {} KiB (Terraform sends a few hundred bytes); nothing was locked or unlocked",
                                LOCK_BODY_BYTES >> 10
                            ),
                        ),
                        _ => e,
                    }),
                _ => app.read_body(body).await,
            };
            match read {
                Ok(read) => read,
                Err(e) => return Err(refuse(operation, e).await),
            }
        }
        _ => (Bytes::new(), Held::default()),
    };
    // Force-unlock (UNLOCK without a body) and deletes need admin.
    let force = method.as_str() == "UNLOCK" && body.iter().all(u8::is_ascii_whitespace);
    if force {
        operation = Some(Operation::ForceUnlock);
    }
    let role = match method.as_str() {
        "GET" => Role::Read,
        "DELETE" => Role::Admin,
        "UNLOCK" if force => Role::Admin,
        _ => Role::Write,
    };
    // The outputs role reads a state without its resources.
    let outputs_only = method == Method::GET
        && !caller.allows(target.backend, Some(target.workspace), Role::Read)
        && caller.allows(target.backend, Some(target.workspace), Role::Outputs);
    if !outputs_only && let Err(e) = may(role) {
        return Err(refuse(operation, e).await);
    }
    if outputs_only {
        return read_outputs(&app.bodies, target).await;
    }
    if method == Method::GET {
        return read(&app.bodies, target).await;
    }
    let Some(operation) = operation else {
        return Ok((
            StatusCode::METHOD_NOT_ALLOWED,
            [(header::ALLOW, ALLOWED)],
            format!("method {method} is not supported here; use one of {ALLOWED}\n"),
        )
            .into_response());
    };
    if operation == Operation::Write
        && let Err(e) = verify_md5(&headers, &body)
    {
        return Err(refuse(Some(operation), e).await);
    }
    // Every change runs alone on its workspace here (reads never wait), so
    // the guard's check and its write are one step on this host, and runs
    // to its end (its record written) even if the client hangs up.
    let lock_id = lock_id.map(str::to_string);
    let caller = caller.clone();
    let (backend, workspace) = at;
    app.change(
        backend,
        workspace,
        move |app, backend, workspace| async move {
            // The body stays charged to the server's budget until the change ends.
            let _held = held;
            let target = app.target(&backend, &workspace)?;
            let mut facts = Facts {
                lock_id: lock_id.clone(),
                ..Facts::default()
            };
            let lock_id = lock_id.as_deref();
            let answer = match operation {
                Operation::Write => {
                    super::guard::write_unless_stale(&app, &target, lock_id, body, &mut facts)
                        .await
                        .map(|()| StatusCode::OK.into_response())
                }
                Operation::Delete => target
                    .storage
                    .delete(target.workspace, lock_id)
                    .await
                    .map(|()| StatusCode::OK.into_response())
                    .map_err(|e| target.error(e)),
                Operation::Lock => {
                    super::locks::lock(&app, &target, &caller, body, &mut facts).await
                }
                _ => super::locks::unlock(&app, &target, body, &mut facts).await,
            };
            // A lock refused because another holds it is not recorded:
            // `-lock-timeout` asks again every few seconds.
            let conflict = operation == Operation::Lock
                && matches!(&answer, Err(e) if e.status() == StatusCode::LOCKED);
            if !conflict {
                app.record(&caller, (&backend, &workspace), operation, facts, &answer)
                    .await;
            }
            answer
        },
    )
    .await
}

/// The largest LOCK or UNLOCK body (Terraform's lock details are a few
/// hundred bytes; the lock fields a guest keeps are cut to 4 KiB). Not
/// charged to the body budget (readers filling it must not strand a lock),
/// so small: every connection allowed could hold one while it arrives.
const LOCK_BODY_BYTES: usize = 16 << 10;

async fn read<S: Storage>(
    bodies: &BodyBudget,
    target: Target<'_, S>,
) -> Result<Response, ApiError> {
    match target.storage.read(target.workspace).await {
        Ok(Some(state)) => bodies.answer(state),
        Ok(None) => Err(ApiError::not_found(format!(
            "workspace {:?} has no state yet",
            target.workspace
        ))),
        Err(e) => Err(target.error(e)),
    }
}

/// The outputs role's GET: the state as [`shared_outputs`] leaves it.
async fn read_outputs<S: Storage>(
    bodies: &BodyBudget,
    target: Target<'_, S>,
) -> Result<Response, ApiError> {
    let Some(state) = target
        .storage
        .read(target.workspace)
        .await
        .map_err(|e| target.error(e))?
    else {
        return Err(ApiError::not_found(format!(
            "workspace {:?} has no state yet",
            target.workspace
        )));
    };
    bodies.answer(shared_outputs(&target, state).await?)
}

/// `state` of `target` reduced to what the outputs role sees
/// ([`crate::statefile::outputs_only`]), parsed as the backend's host work
/// (off the async workers); 403 when its outputs cannot be told apart.
pub(crate) async fn shared_outputs<S: Storage>(
    target: &Target<'_, S>,
    state: Vec<u8>,
) -> Result<Vec<u8>, ApiError> {
    let shared = target
        .storage
        .host_work()
        .run_over(state, crate::statefile::outputs_only)
        .await
        .map_err(|e| target.error(e.into()))?;
    shared.map_err(|why| {
        ApiError::Message(
            StatusCode::FORBIDDEN,
            format!(
                "this caller may see only the outputs of {}/{}, and {why}: reading it needs the read role",
                target.backend, target.workspace
            ),
        )
    })
}

/// Terraform sends `Content-MD5: base64(md5(body))` with every write; a
/// mismatch means the body was damaged in transit.
fn verify_md5(headers: &HeaderMap, body: &[u8]) -> Result<(), ApiError> {
    let Some(value) = headers.get("content-md5") else {
        return Ok(());
    };
    let sent = value
        .to_str()
        .ok()
        .and_then(|v| {
            base64::engine::general_purpose::STANDARD
                .decode(v.trim())
                .ok()
        })
        .filter(|d| d.len() == 16)
        .ok_or_else(|| {
            ApiError::bad_request(
                "Content-MD5 is not a base64-encoded MD5 digest; nothing was written",
            )
        })?;
    if sent.as_slice() != Md5::digest(body).as_slice() {
        return Err(ApiError::bad_request(
            "Content-MD5 does not match the body (damaged in transit?); nothing was written",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_is_checked_only_when_sent() {
        let body = b"{\"version\":4}";
        assert!(verify_md5(&HeaderMap::new(), body).is_ok());

        let mut headers = HeaderMap::new();
        let good = base64::engine::general_purpose::STANDARD.encode(Md5::digest(body));
        headers.insert("content-md5", good.parse().unwrap());
        assert!(verify_md5(&headers, body).is_ok());
        assert!(verify_md5(&headers, b"{\"version\":5}").is_err());

        headers.insert("content-md5", "not base64!".parse().unwrap());
        assert!(verify_md5(&headers, body).is_err());
    }
}
