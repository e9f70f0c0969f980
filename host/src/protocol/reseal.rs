//! `POST /states/{backend}/{workspace}/reseal[?dry_run=true][&from_backend=OLD]`:
//! seal one workspace's state and kept versions again under the backend's
//! sealing key (what `wasmstate state reseal` calls for each workspace).
//! Administrators only: it rewrites every version. The answer is the
//! workspace's [`ResealReport`] as JSON; a workspace whose lock is held is
//! reported as skipped, with a 200, so one busy workspace does not stop a
//! run over all of them.

use super::error::ApiError;
use super::{App, Caller};
use crate::audit::{Facts, Operation};
use crate::auth::Role;
use crate::backend::Storage;
use crate::resealing::{ResealReport, ResealRequest};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::sync::Arc;

/// The query string.
#[derive(Debug, Deserialize)]
pub struct ResealQuery {
    /// Change nothing; say what would be done.
    #[serde(default)]
    dry_run: bool,
    /// The backend's name before a rename.
    from_backend: Option<String>,
}

/// Re-seal `workspace` of `backend` for `caller`.
pub async fn reseal<S: Storage>(
    app: &Arc<App<S>>,
    caller: Caller,
    (backend, workspace): (&str, &str),
    query: ResealQuery,
) -> Result<Response, ApiError> {
    app.target(backend, workspace)?;
    if let Some(old) = &query.from_backend {
        crate::names::check_name("backend", old).map_err(ApiError::bad_request)?;
        // Only a former name: re-binding a live backend's states to this
        // one would hand its states to this backend's callers.
        if old != backend && app.target(old, workspace).is_ok() {
            return Err(ApiError::bad_request(format!(
                "backend {old:?} is served here: --from-backend takes the name a backend had before a rename"
            )));
        }
        // Its states and kept versions become this backend's: the caller
        // must be an admin of the old name too (a grant that still names
        // it, or one for every backend), not of this one alone.
        app.permit(&caller, (old, workspace), Role::Admin, Operation::Reseal)
            .await?;
    }
    app.permit(
        &caller,
        (backend, workspace),
        Role::Admin,
        Operation::Reseal,
    )
    .await?;
    app.refuse_while_draining()?;
    let who = caller
        .identity()
        .map_or_else(|| "wasmstate state reseal".to_string(), |i| i.name.clone());
    let request = ResealRequest {
        from_backend: query.from_backend,
        dry_run: query.dry_run,
        who,
    };
    app.change(
        backend,
        workspace,
        move |app, backend, workspace| async move {
            let target = app.target(&backend, &workspace)?;
            let answer: Result<ResealReport, ApiError> = target
                .storage
                .reseal(&workspace, &request)
                .await
                .map_err(|e| target.error(e));
            let answer = answer.map(|report| {
                let note = report.line().lines().next().unwrap_or_default().to_string();
                (note, axum::Json(report).into_response())
            });
            let (note, answer) = match answer {
                Ok((note, response)) => (Some(note), Ok(response)),
                Err(e) => (None, Err(e)),
            };
            if !request.dry_run {
                let facts = Facts {
                    note,
                    ..Default::default()
                };
                let at = (backend.as_str(), workspace.as_str());
                app.record(&caller, at, Operation::Reseal, facts, &answer)
                    .await;
            }
            answer
        },
    )
    .await
}
