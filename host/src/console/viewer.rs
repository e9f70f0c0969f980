//! The state viewer, `/ui/backends/{backend}/{workspace}/state`: what the
//! current state (or a kept version, `?version=<id>`) holds, a page of its
//! resources at a time (`?page=`), and who wrote it. Read through the
//! backend's store like every console read, so host-sealed states are
//! opened for readers of the workspace only; OpenTofu-encrypted ones are
//! shown as such. `/ui/api/…/state` serves the same as JSON.

use super::data::{storage_of, version_bytes};
use super::state_view::{StateView, summarise};
use super::{Answer, Shared, Visitor};
use crate::backend::Storage;
use crate::protocol::{ApiError, App, Caller};
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// States summarised at once in the whole server: each holds its bytes
/// (up to the largest state) while it is walked.
pub const VIEWS_AT_ONCE: usize = 2;
/// How long a view waits for a turn: then 503, retry.
const VIEW_WAIT: Duration = Duration::from_secs(10);

/// What the viewer was asked for.
#[derive(Deserialize, Default)]
pub(super) struct Wanted {
    version: Option<String>,
    pub(super) page: Option<usize>,
}

impl Wanted {
    /// The version asked for: `current` unless one is named.
    pub(super) fn version(&self) -> &str {
        self.version
            .as_deref()
            .filter(|v| !v.is_empty())
            .unwrap_or("current")
    }
}

/// One state as the viewer shows it.
#[derive(Debug, Serialize)]
pub struct Viewed {
    /// The backend.
    pub backend: String,
    /// The workspace.
    pub workspace: String,
    /// `current`, or the id of a kept version.
    pub version: String,
    /// Its size in bytes (as Terraform sent it, before any host sealing).
    pub bytes: u64,
    /// Who wrote it, as this replica's audit trail says.
    pub written_by: Option<String>,
    /// When it was written (Unix ms), when known.
    pub written_unix_ms: Option<u64>,
    /// What it holds.
    #[serde(flatten)]
    pub state: StateView,
}

/// What `version` (`current` or a kept version's id) of `workspace` holds,
/// with page `page` of its resources; for readers of the workspace.
pub async fn view<S: Storage>(
    app: &App<S>,
    caller: &Caller,
    backend: &str,
    workspace: &str,
    version: &str,
    page: usize,
) -> Result<Viewed, ApiError> {
    static VIEWS: std::sync::LazyLock<Arc<tokio::sync::Semaphore>> =
        std::sync::LazyLock::new(|| Arc::new(tokio::sync::Semaphore::new(VIEWS_AT_ONCE)));
    let storage = storage_of(app, caller, backend, Some(workspace))?;
    let turn = match tokio::time::timeout(VIEW_WAIT, VIEWS.clone().acquire_owned()).await {
        Ok(Ok(turn)) => turn,
        Ok(Err(_)) => return Err(ApiError::bad_request("the server is stopping")),
        Err(_) => {
            return Err(ApiError::RetryAfter(
                StatusCode::SERVICE_UNAVAILABLE,
                5,
                format!(
                    "the console is showing {VIEWS_AT_ONCE} other states: busy, retry in a few seconds"
                ),
            ));
        }
    };
    let bytes = version_bytes(storage, backend, workspace, version).await?;
    let size = bytes.len() as u64;
    // The turn goes with the walk: a browser that leaves drops this
    // future, not the walk, which holds the bytes to its end.
    let walked = storage
        .host_work()
        .run_over(bytes, move |bytes| {
            let walked = summarise(bytes, page);
            drop(turn);
            walked
        })
        .await
        .map_err(|e| ApiError::from_storage(backend, e.into()))?;
    let state = walked.map_err(|why| {
        ApiError::Message(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("cannot show version {version} of {backend}/{workspace}: {why}"),
        )
    })?;
    let (written_by, written_unix_ms) = writer(
        app,
        storage,
        (backend, workspace),
        version,
        state.head.serial,
    )
    .await;
    Ok(Viewed {
        backend: backend.to_string(),
        workspace: workspace.to_string(),
        version: version.to_string(),
        bytes: size,
        written_by,
        written_unix_ms,
        state,
    })
}

/// Who wrote `version` and when, as this replica's audit trail
/// remembers: for the current state, the newest acknowledged write of its
/// serial; for a kept version, the writer the versions page shows.
async fn writer<S: Storage>(
    app: &App<S>,
    storage: &S,
    (backend, workspace): (&str, &str),
    version: &str,
    serial: Option<u64>,
) -> (Option<String>, Option<u64>) {
    if version == "current" {
        let Some(serial) = serial else {
            return (None, None);
        };
        let write = app
            .audit
            .writes_of(backend, workspace)
            .into_iter()
            .filter(|w| w.serial == serial)
            .max_by_key(|w| w.unix_ms);
        return match write {
            Some(w) => (Some(w.caller), u64::try_from(w.unix_ms).ok()),
            None => (None, None),
        };
    }
    // Who wrote a version is only ever a label: a failed listing leaves it
    // unknown rather than failing the page.
    let Ok(mut versions) = storage.list_versions(workspace).await else {
        return (None, None);
    };
    versions.retain(|v| v.id == version);
    app.fill_writers(backend, workspace, &mut versions);
    match versions.pop() {
        Some(v) => (v.written_by, Some(v.created_unix_ms)),
        None => (None, None),
    }
}

pub(super) async fn state_json<S: Storage>(
    State(console): Shared<S>,
    Path((backend, workspace)): Path<(String, String)>,
    Query(wanted): Query<Wanted>,
    visitor: Visitor,
) -> Answer {
    let (app, caller) = (&console.app, visitor.caller());
    let page_no = wanted.page.unwrap_or(1);
    let viewed = view(
        app,
        &caller,
        &backend,
        &workspace,
        wanted.version(),
        page_no,
    )
    .await?;
    Ok(Json(viewed).into_response())
}
