//! `GET /audit/{backend}`: the audit trails of this data directory (this
//! replica's, and any sharing it) for a backend, newest
//! first, filtered by `?workspace=&operation=&caller=&since=&until=
//! &refused=&limit=`. Admins of the backend only (or of the workspace a
//! filter names). And who wrote each kept version, from the same trail.

use super::{ApiError, App};
use crate::audit::{Filter, Record};
use crate::auth::Role;
use crate::backend::Version;
use crate::listen::ClientAddr;
use axum::extract::{Extension, Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// What `GET /audit/{backend}` answers.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct AuditAnswer {
    /// The replica whose trail this is: each keeps its own.
    pub replica: String,
    /// The matching records, newest first.
    pub records: Vec<Record>,
}

pub(super) async fn route<S: crate::backend::Storage>(
    State(app): State<Arc<App<S>>>,
    Path(backend): Path<String>,
    client: Option<Extension<ClientAddr>>,
    headers: HeaderMap,
    query: Result<Query<Filter>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let caller = app.identify(&headers, client).await?;
    let Query(filter) =
        query.map_err(|e| ApiError::bad_request(format!("bad query string: {e}")))?;
    let answer = app.audit_of(&caller, &backend, filter).await?;
    Ok(axum::Json(answer).into_response())
}

impl<S> App<S> {
    /// `backend`'s records matching `filter`, for `caller` (an admin of it).
    pub async fn audit_of(
        &self,
        caller: &super::Caller,
        backend: &str,
        filter: Filter,
    ) -> Result<AuditAnswer, ApiError> {
        if !self.backends.contains_key(backend) {
            return Err(ApiError::not_found(format!("no backend named {backend:?}")));
        }
        let workspace = filter.workspace.as_deref().filter(|w| !w.is_empty());
        caller.may(backend, workspace, Role::Admin)?;
        let records = self.search(backend, filter).await?;
        Ok(AuditAnswer {
            replica: self.audit.replica().to_string(),
            records,
        })
    }

    async fn search(&self, backend: &str, filter: Filter) -> Result<Vec<Record>, ApiError> {
        use crate::audit::SearchError;
        self.audit
            .search(backend, filter)
            .await
            .map_err(|e| match e {
                SearchError::Bad(why) => ApiError::bad_request(why),
                SearchError::Busy => ApiError::RetryAfter(
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    1,
                    format!(
                        "{} other audit searches are under way; retry in a moment",
                        crate::audit::SEARCHES
                    ),
                ),
                SearchError::Failed(why) => {
                    ApiError::Message(axum::http::StatusCode::INTERNAL_SERVER_ERROR, why)
                }
            })
    }

    /// Fill in who wrote each of `versions` of `backend`/`workspace`, as
    /// far as this replica's trail knows: the write (or restore) it
    /// acknowledged with that serial, closest in time to the version
    /// (within [`WRITER_WINDOW_MS`]), among the newest writes of the
    /// workspace it remembers (never a search of the log). Versions written
    /// through another replica stay unknown.
    pub fn fill_writers(&self, backend: &str, workspace: &str, versions: &mut [Version]) {
        if versions.is_empty() {
            return;
        }
        let writes = self.audit.writes_of(backend, workspace);
        for version in versions.iter_mut() {
            let Some(serial) = version.serial else {
                continue;
            };
            let created = i128::from(version.created_unix_ms);
            let gap = |w: &&crate::audit::Write| (w.unix_ms - created).abs();
            version.written_by = writes
                .iter()
                .filter(|w| w.serial == serial && gap(w) <= WRITER_WINDOW_MS)
                .min_by_key(gap)
                .map(|w| w.caller.clone());
        }
    }
}

/// How far apart a version's time and its write's record may be: the
/// version is kept as the write ends, its record just after; a guest's
/// own history (a git commit's time) may lag a little more.
pub const WRITER_WINDOW_MS: i128 = 5 * 60 * 1000;
