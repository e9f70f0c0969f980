//! `/states/{backend}/{workspace}/versions[/{id}]`: previous versions of a
//! state, newest first, and one version's bytes. Reading needs the read
//! role; writing a version back is `wasmstate state restore` (a normal,
//! locked POST), so there is no write route here.

use super::Target;
use super::error::ApiError;
use crate::backend::Storage;
use axum::response::{IntoResponse, Response};

/// The response header that says who keeps the versions listed
/// (`storage`, `replica`, `none`): whether another replica lists the same.
pub const HISTORY_HEADER: &str = "wasmstate-history";

/// `GET …/versions`: a JSON list of `{id, serial, created_unix_ms, bytes,
/// written_by}` (`written_by` when this replica's audit trail knows it),
/// with [`HISTORY_HEADER`].
pub async fn list<S: Storage>(
    app: &super::App<S>,
    target: Target<'_, S>,
) -> Result<Response, ApiError> {
    let mut versions = target
        .storage
        .list_versions(target.workspace)
        .await
        .map_err(|e| target.error(e))?;
    app.fill_writers(target.backend, target.workspace, &mut versions);
    let source = target.storage.history_source().name();
    Ok(([(HISTORY_HEADER, source)], axum::Json(versions)).into_response())
}

/// `GET …/versions/{id}`: that version's state, 404 when it is not kept.
pub async fn read<S: Storage>(
    bodies: &super::BodyBudget,
    target: Target<'_, S>,
    id: &str,
) -> Result<Response, ApiError> {
    match target
        .storage
        .read_version(target.workspace, id)
        .await
        .map_err(|e| target.error(e))?
    {
        Some(state) => bodies.answer(state),
        None => Err(ApiError::not_found(format!(
            "no version {id:?} of {}/{}; list them at /states/{}/{}/versions",
            target.backend, target.workspace, target.backend, target.workspace
        ))),
    }
}
