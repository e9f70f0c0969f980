//! One error type for every handler: a status and a one-line reason, or the
//! lock holder's LockInfo JSON where Terraform expects it.

use crate::backend::{LockInfo, StorageError};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// What a 503 for a busy shared resource tells the client to wait: about a
/// guest deadline, when the requests holding it have finished.
const OVERLOADED_RETRY_AFTER_SECS: u64 = 2;

/// An HTTP error answer.
#[derive(Debug)]
pub enum ApiError {
    /// A plain-text, one-line reason.
    Message(StatusCode, String),
    /// 401: no or wrong credentials; asks for HTTP Basic.
    Unauthorized(String),
    /// The lock holder's LockInfo as JSON (Terraform parses it to report who
    /// holds the lock, and since 1.15 to decide whether to retry).
    Holder(StatusCode, LockInfo),
    /// 503 or 429 with `Retry-After` (seconds) and a one-line reason.
    RetryAfter(StatusCode, u64, String),
}

impl ApiError {
    /// The status it answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Message(status, _)
            | ApiError::Holder(status, _)
            | ApiError::RetryAfter(status, _, _) => *status,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
        }
    }

    /// Its one-line reason, for a page to show.
    pub fn message(&self) -> String {
        match self {
            ApiError::Message(_, reason)
            | ApiError::Unauthorized(reason)
            | ApiError::RetryAfter(_, _, reason) => reason.clone(),
            ApiError::Holder(_, holder) => format!("locked by {}", holder.who),
        }
    }

    /// 400 with `reason`.
    pub fn bad_request(reason: impl Into<String>) -> Self {
        ApiError::Message(StatusCode::BAD_REQUEST, reason.into())
    }

    /// 404 with `reason`.
    pub fn not_found(reason: impl Into<String>) -> Self {
        ApiError::Message(StatusCode::NOT_FOUND, reason.into())
    }

    /// Map a storage failure. `backend` names the guest in 5xx messages.
    pub fn from_storage(backend: &str, error: StorageError) -> Self {
        use StorageError::*;
        let status = match &error {
            NotFound => StatusCode::NOT_FOUND,
            Locked(holder) => return ApiError::Holder(StatusCode::LOCKED, holder.clone()),
            LockMismatch(Some(holder)) => {
                return ApiError::Holder(StatusCode::CONFLICT, holder.clone());
            }
            LockMismatch(None) => {
                return ApiError::Message(
                    StatusCode::CONFLICT,
                    "the lock ID sent is not held: the workspace is not locked (was it force-unlocked?)"
                        .into(),
                );
            }
            InvalidInput(_) => StatusCode::BAD_REQUEST,
            Unavailable(_) | KeyUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Overloaded(_) => {
                return ApiError::RetryAfter(
                    StatusCode::SERVICE_UNAVAILABLE,
                    OVERLOADED_RETRY_AFTER_SECS,
                    format!("backend {backend:?}: {error}"),
                );
            }
            NoSpace(_) => StatusCode::INSUFFICIENT_STORAGE,
            TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            GuestTimedOut(_) => StatusCode::GATEWAY_TIMEOUT,
            NoHistory => StatusCode::NOT_FOUND,
            InvalidConfig(_)
            | Internal(_)
            | GuestTrapped { .. }
            | GuestOutOfMemory(_)
            | Encryption(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let message = if status.is_server_error() {
            format!("backend {backend:?}: {error}")
        } else {
            error.to_string()
        };
        ApiError::Message(status, message)
    }
}

impl ApiError {
    /// Unless `show_id`, replace a lock holder's ID with a stand-in: the
    /// ID lets whoever knows it unlock, so only administrators see it.
    /// The stand-in is not empty (Terraform retries `-lock-timeout` only
    /// for a holder with an ID) and the same for the same ID.
    pub fn hide_holder_id(self, show_id: bool) -> Self {
        match self {
            ApiError::Holder(status, mut holder) if !show_id => {
                use sha2::Digest;
                let digest = hex::encode(sha2::Sha256::digest(holder.id.as_bytes()));
                holder.id = format!("hidden-{}", &digest[..16]);
                ApiError::Holder(status, holder)
            }
            other => other,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::Message(status, reason) => {
                if status.is_server_error() {
                    tracing::error!(status = status.as_u16(), "{reason}");
                }
                // One line, whatever the guest put in its message.
                let line = reason.replace(['\r', '\n'], " ");
                (
                    status,
                    [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                    line + "\n",
                )
                    .into_response()
            }
            ApiError::Unauthorized(reason) => (
                StatusCode::UNAUTHORIZED,
                [
                    (
                        header::WWW_AUTHENTICATE,
                        "Basic realm=\"wasmstate\", charset=\"UTF-8\"",
                    ),
                    (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
                ],
                reason + "\n",
            )
                .into_response(),
            ApiError::RetryAfter(status, seconds, reason) => {
                tracing::warn!(status = status.as_u16(), "{reason}");
                (
                    status,
                    [
                        (header::RETRY_AFTER, seconds.to_string()),
                        (
                            header::CONTENT_TYPE,
                            "text/plain; charset=utf-8".to_string(),
                        ),
                    ],
                    reason.replace(['\r', '\n'], " ") + "\n",
                )
                    .into_response()
            }
            ApiError::Holder(status, holder) => (
                status,
                [(header::CONTENT_TYPE, "application/json")],
                serde_json::to_vec(&holder).expect("LockInfo serialises"),
            )
                .into_response(),
        }
    }
}

impl From<axum::extract::rejection::BytesRejection> for ApiError {
    fn from(rejection: axum::extract::rejection::BytesRejection) -> Self {
        let status = rejection.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::Message(
                status,
                "the body is larger than this server accepts (raise max_body_mib in its config); nothing was written"
                    .into(),
            )
        } else {
            ApiError::Message(
                status,
                format!("could not read the request body: {rejection}"),
            )
        }
    }
}
