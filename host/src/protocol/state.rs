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
use crate::auth::Role;
use crate::backend::{LockInfo, Storage};
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
    // A change that arrives once the server is stopping never starts; one
    // already past this point completes.
    if method != Method::GET {
        app.refuse_while_draining()?;
    }
    let (body, held) = match method.as_str() {
        "POST" | "PUT" | "LOCK" | "UNLOCK" => {
            // Writers must at least write before the server reads a body.
            caller.may(target.backend, Some(target.workspace), Role::Write)?;
            match method.as_str() {
                // A lock's details are small, and never wait on the body
                // budget: readers filling it must not strand a lock.
                "LOCK" | "UNLOCK" => (
                    app.read_body_up_to(body, LOCK_BODY_BYTES).await?,
                    Held::default(),
                ),
                _ => app.read_body(body).await?,
            }
        }
        _ => (Bytes::new(), Held::default()),
    };
    // Force-unlock (UNLOCK without a body) and deletes need admin.
    let force = method.as_str() == "UNLOCK" && body.iter().all(u8::is_ascii_whitespace);
    let role = match method.as_str() {
        "GET" => Role::Read,
        "DELETE" => Role::Admin,
        "UNLOCK" if force => Role::Admin,
        _ => Role::Write,
    };
    caller.may(target.backend, Some(target.workspace), role)?;
    if method == Method::GET {
        return read(&app.bodies, target).await;
    }
    if matches!(method.as_str(), "POST" | "PUT") {
        verify_md5(&headers, &body)?;
    }
    // Every change runs alone on its workspace here (reads never wait), so
    // the guard's check and its write are one step on this host, and runs
    // to its end even if the client hangs up.
    let lock_id = lock_id.map(str::to_string);
    let (backend, workspace) = (target.backend, target.workspace);
    app.change(
        backend,
        workspace,
        move |app, backend, workspace| async move {
            // The body stays charged to the server's budget until the change ends.
            let _held = held;
            let target = app.target(&backend, &workspace)?;
            let lock_id = lock_id.as_deref();
            match method.as_str() {
                "POST" | "PUT" => {
                    super::guard::write_unless_stale(&app, &target, lock_id, body).await?;
                    Ok(StatusCode::OK.into_response())
                }
                "DELETE" => {
                    target
                        .storage
                        .delete(target.workspace, lock_id)
                        .await
                        .map_err(|e| target.error(e))?;
                    Ok(StatusCode::OK.into_response())
                }
                "LOCK" => lock(&app, target, body).await,
                "UNLOCK" => unlock(&app, target, body).await,
                _ => Ok((
                    StatusCode::METHOD_NOT_ALLOWED,
                    [(header::ALLOW, ALLOWED)],
                    format!("method {method} is not supported here; use one of {ALLOWED}\n"),
                )
                    .into_response()),
            }
        },
    )
    .await
}

/// The largest LOCK or UNLOCK body (Terraform's lock details are a few
/// hundred bytes; the lock fields a guest keeps are cut to 4 KiB).
const LOCK_BODY_BYTES: usize = 1 << 20;

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

fn parse_lock_info(body: &[u8]) -> Result<LockInfo, ApiError> {
    let info: LockInfo = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not LockInfo JSON: {e}")))?;
    if info.id.trim().is_empty() {
        return Err(ApiError::bad_request("LockInfo has an empty \"ID\""));
    }
    Ok(info)
}

async fn lock<S: Storage>(
    app: &App<S>,
    target: Target<'_, S>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let info = parse_lock_info(&body)?;
    match target.storage.lock(target.workspace, info.clone()).await {
        Ok(()) => app
            .metrics
            .lock_granted(target.backend, target.workspace, &info.id),
        Err(e) => {
            if matches!(e, crate::backend::StorageError::Locked(_)) {
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

async fn unlock<S: Storage>(
    app: &App<S>,
    target: Target<'_, S>,
    body: Bytes,
) -> Result<Response, ApiError> {
    // `terraform force-unlock` sends no body at all: release whoever holds it.
    // (OpenTofu's force-unlock sends LockInfo with only the ID: the normal
    // path below, which releases the lock when that ID holds it.)
    if body.iter().all(u8::is_ascii_whitespace) {
        let released = target
            .storage
            .force_unlock(target.workspace)
            .await
            .map_err(|e| target.error(e))?;
        app.metrics.lock_released(target.backend, target.workspace);
        if let Some(holder) = released {
            tracing::warn!(
                backend = target.backend,
                workspace = target.workspace,
                "force-unlocked: lock {} of {} removed",
                holder.id,
                holder.who
            );
        }
        return Ok(StatusCode::OK.into_response());
    }
    let info = parse_lock_info(&body)?;
    target
        .storage
        .unlock(target.workspace, &info.id)
        .await
        .map_err(|e| target.error(e))?;
    app.metrics.lock_released(target.backend, target.workspace);
    Ok(StatusCode::OK.into_response())
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

    #[test]
    fn lock_info_needs_an_id() {
        assert!(parse_lock_info(br#"{"ID":"x","Operation":"OperationTypeApply"}"#).is_ok());
        assert!(parse_lock_info(br#"{"ID":"","Operation":"x"}"#).is_err());
        assert!(parse_lock_info(b"{not json").is_err());
    }
}
