//! `/workspaces/{backend}[/{workspace}]`: workspace management, which
//! Terraform's http backend lacks. `default` always exists and cannot be
//! deleted, as in Terraform.

use super::error::ApiError;
use super::{Caller, Target};
use crate::auth::Role;
use crate::backend::Storage;
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// The workspace every backend has.
pub const DEFAULT_WORKSPACE: &str = "default";

/// `GET /workspaces/{backend}`: JSON list, `default` first, then sorted;
/// only the workspaces the caller may read (or read the outputs of).
pub async fn list<S: Storage>(
    backend: &str,
    storage: &S,
    caller: &Caller,
) -> Result<Response, ApiError> {
    let mut names = storage
        .list_workspaces()
        .await
        .map_err(|e| ApiError::from_storage(backend, e))?;
    names.retain(|n| n != DEFAULT_WORKSPACE && caller.allows(backend, Some(n), Role::Outputs));
    names.sort();
    names.dedup();
    if caller.allows(backend, Some(DEFAULT_WORKSPACE), Role::Outputs) {
        names.insert(0, DEFAULT_WORKSPACE.to_string());
    }
    Ok(Json(names).into_response())
}

/// `PUT /workspaces/{backend}/{workspace}`: 201 when created, 200 when it
/// already existed.
pub async fn create<S: Storage>(target: Target<'_, S>) -> Result<Response, ApiError> {
    let created = target
        .storage
        .create_workspace(target.workspace)
        .await
        .map_err(|e| target.error(e))?;
    Ok(if created {
        (
            StatusCode::CREATED,
            format!("created workspace {:?}\n", target.workspace),
        )
    } else {
        (
            StatusCode::OK,
            format!("workspace {:?} already exists\n", target.workspace),
        )
    }
    .into_response())
}

/// `DELETE /workspaces/{backend}/{workspace}`: refused while locked.
pub async fn delete<S: Storage>(target: Target<'_, S>) -> Result<Response, ApiError> {
    if target.workspace == DEFAULT_WORKSPACE {
        return Err(ApiError::bad_request(
            "the default workspace cannot be deleted (delete its state with DELETE /states/... instead)",
        ));
    }
    target
        .storage
        .delete_workspace(target.workspace)
        .await
        .map_err(|e| match e {
            crate::backend::StorageError::NotFound => {
                ApiError::not_found(format!("no workspace named {:?}", target.workspace))
            }
            other => target.error(other),
        })?;
    Ok((
        StatusCode::OK,
        format!("deleted workspace {:?}\n", target.workspace),
    )
        .into_response())
}
