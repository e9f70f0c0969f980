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
            | NoMetadata(_)
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
    /// for a holder with an ID) and the same for the same ID. A holder that
    /// records no ID (a native pg client) has none to hide: its body says
    /// who it is instead ([`readable_by_terraform`]).
    pub fn hide_holder_id(self, show_id: bool) -> Self {
        match self {
            ApiError::Holder(status, mut holder) if !show_id && !holder.id.trim().is_empty() => {
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
                serde_json::to_vec(&readable_by_terraform(holder)).expect("LockInfo serialises"),
            )
                .into_response(),
        }
    }
}

/// What a holder body says for `Created` when the holder's own time is
/// unknown: Go's zero time, which Terraform parses (and prints as
/// `0001-01-01 00:00:00 +0000 UTC`).
const UNKNOWN_TIME: &str = "0001-01-01T00:00:00Z";

/// `holder` as Terraform's Go `json.Unmarshal` reads a LockInfo: its
/// `Created` is a `time.Time`, which takes only an RFC 3339 time; anything
/// else (the empty string a native pg holder has, a guest's own format)
/// fails the whole body, and Terraform then says "failed to unmarshal
/// body" instead of who holds the lock. A time that parses is written
/// again in RFC 3339 (Go's parser is stricter than ours about case and
/// form); one that does not becomes [`UNKNOWN_TIME`], and `Info` says so.
///
/// A holder that records no ID (a native pg client's advisory lock) gets
/// one that says who holds the lock: Terraform 1.11 prints only the
/// holder's ID ("already locked: ID=…"), and Terraform retries
/// `-lock-timeout` only for a holder with an ID.
pub(crate) fn readable_by_terraform(mut holder: LockInfo) -> LockInfo {
    use time::format_description::well_known::Rfc3339;
    if holder.id.trim().is_empty() {
        holder.id = if holder.info.is_empty() {
            format!("none recorded; held by {}", holder.who)
        } else {
            format!("none recorded; {}", holder.info)
        };
    }
    let parsed = time::OffsetDateTime::parse(&holder.created, &Rfc3339)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok());
    match parsed {
        Some(created) => holder.created = created,
        None => {
            holder.created = UNKNOWN_TIME.into();
            let note = "the lock's creation time is unknown (Created is a placeholder)";
            holder.info = if holder.info.is_empty() {
                note.into()
            } else {
                format!("{}; {note}", holder.info)
            };
        }
    }
    holder
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::to_bytes;

    async fn body_of(error: ApiError) -> (StatusCode, serde_json::Value) {
        let response = error.into_response();
        let status = response.status();
        let bytes = to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    /// What Go's `time.Time.UnmarshalJSON` takes (RFC 3339 with an
    /// upper-case `T` and a `Z` or a numeric offset): checked by the same
    /// strict pattern, not by the parser the host uses.
    fn go_parses(created: &str) -> bool {
        let b = created.as_bytes();
        let digits =
            |r: std::ops::Range<usize>| b.get(r).is_some_and(|s| s.iter().all(u8::is_ascii_digit));
        let zone = &created[19.min(created.len())..];
        let zone = zone
            .strip_prefix('.')
            .map_or(zone, |z| z.trim_start_matches(|c: char| c.is_ascii_digit()));
        b.len() >= 20
            && digits(0..4)
            && b[4] == b'-'
            && digits(5..7)
            && b[7] == b'-'
            && digits(8..10)
            && b[10] == b'T'
            && digits(11..13)
            && b[13] == b':'
            && digits(14..16)
            && b[16] == b':'
            && digits(17..19)
            && (zone == "Z"
                || (zone.len() == 6
                    && matches!(&zone[..1], "+" | "-")
                    && zone.as_bytes()[3] == b':'))
    }

    /// Every holder body is a LockInfo whose `Created` Terraform parses:
    /// a native pg holder's empty time becomes a fixed one, said in
    /// `Info`; a readable time stays that time.
    #[tokio::test]
    async fn every_holder_body_has_a_time_terraform_parses() {
        let native = LockInfo {
            info: "locked by a Terraform pg backend client (database session 42)".into(),
            who: "a terraform client using backend \"pg\"".into(),
            ..LockInfo::default()
        };
        for (status, holder) in [
            (StatusCode::LOCKED, native.clone()),
            (StatusCode::CONFLICT, native.clone()),
            (
                StatusCode::LOCKED,
                LockInfo {
                    created: "last tuesday".into(),
                    ..native.clone()
                },
            ),
        ] {
            let (answered, body) = body_of(ApiError::Holder(status, holder)).await;
            assert_eq!(answered, status);
            let created = body["Created"].as_str().unwrap();
            assert!(go_parses(created), "{created}");
            assert_eq!(created, UNKNOWN_TIME);
            let info = body["Info"].as_str().unwrap();
            assert!(
                info.starts_with("locked by a Terraform pg backend client"),
                "{info}"
            );
            assert!(info.contains("creation time is unknown"), "{info}");
            assert_eq!(body["Who"], "a terraform client using backend \"pg\"");
            assert_eq!(
                body["ID"],
                "none recorded; locked by a Terraform pg backend client (database session 42)"
            );
        }
        // Not hidden from a caller who may not see lock IDs: it has none.
        let hidden = ApiError::Holder(StatusCode::LOCKED, native.clone()).hide_holder_id(false);
        let (_, body) = body_of(hidden).await;
        assert!(
            body["ID"]
                .as_str()
                .unwrap()
                .starts_with("none recorded; locked by")
        );
        let hidden = ApiError::Holder(
            StatusCode::LOCKED,
            LockInfo {
                id: "secret".into(),
                ..native.clone()
            },
        );
        let (_, body) = body_of(hidden.hide_holder_id(false)).await;
        assert!(body["ID"].as_str().unwrap().starts_with("hidden-"));
        let empty_info = readable_by_terraform(LockInfo::default());
        assert!(empty_info.info.contains("creation time is unknown"));
        assert_eq!(empty_info.id, "none recorded; held by ");
        for (written, served) in [
            (
                "2026-01-02T15:04:05.123456789Z",
                "2026-01-02T15:04:05.123456789Z",
            ),
            ("2026-01-02T15:04:05+02:00", "2026-01-02T15:04:05+02:00"),
            ("2026-01-02t15:04:05z", "2026-01-02T15:04:05Z"),
        ] {
            let holder = LockInfo {
                id: "id-1".into(),
                created: written.into(),
                info: "apply".into(),
                ..LockInfo::default()
            };
            let (_, body) = body_of(ApiError::Holder(StatusCode::LOCKED, holder)).await;
            assert_eq!(body["Created"], served, "{written}");
            assert!(go_parses(served));
            assert_eq!(body["Info"], "apply", "a known time is not remarked on");
            assert_eq!(body["ID"], "id-1");
        }
    }
}
