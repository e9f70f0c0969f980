//! Workspace deletes: plain and safe (refused while locked or while its
//! state may manage resources), as the http door's `DELETE /workspaces/…`.

use super::super::jsonapi::TfeError;
use super::super::{Client, Tfe};
use crate::audit::{Facts, Operation};
use crate::auth::Role;
use crate::backend::{Storage, StorageError};
use crate::protocol::{ApiError, Caller};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// `DELETE organizations/{org}/workspaces/{name}`.
pub(in crate::tfe) async fn delete_by_name<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path((org, name)): Path<(String, String)>,
    client: Client,
    headers: HeaderMap,
) -> Result<Response, TfeError> {
    let caller = tfe.caller(&headers, client).await?;
    tfe.existing(&caller, &org, &name).await?;
    delete(&tfe, caller, org, name, false).await
}

/// `DELETE workspaces/{id}`.
pub(in crate::tfe) async fn delete_by_id<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path(id): Path<String>,
    client: Client,
    headers: HeaderMap,
) -> Result<Response, TfeError> {
    let caller = tfe.caller(&headers, client).await?;
    let (org, name) = tfe.by_id(&caller, &id).await?;
    delete(&tfe, caller, org, name, false).await
}

/// `POST organizations/{org}/workspaces/{name}/actions/safe-delete`.
pub(in crate::tfe) async fn safe_delete_by_name<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path((org, name)): Path<(String, String)>,
    client: Client,
    headers: HeaderMap,
) -> Result<Response, TfeError> {
    let caller = tfe.caller(&headers, client).await?;
    tfe.existing(&caller, &org, &name).await?;
    delete(&tfe, caller, org, name, true).await
}

/// `POST workspaces/{id}/actions/safe-delete`.
pub(in crate::tfe) async fn safe_delete_by_id<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path(id): Path<String>,
    client: Client,
    headers: HeaderMap,
) -> Result<Response, TfeError> {
    let caller = tfe.caller(&headers, client).await?;
    let (org, name) = tfe.by_id(&caller, &id).await?;
    delete(&tfe, caller, org, name, true).await
}

/// Delete a workspace and its state (admin), as the http door's
/// `DELETE /workspaces/…` does. `safe`: refused (409) while it is locked
/// or its state may still manage resources.
async fn delete<S: Storage>(
    tfe: &Tfe<S>,
    caller: Caller,
    org: String,
    name: String,
    safe: bool,
) -> Result<Response, TfeError> {
    let at = (org.as_str(), name.as_str());
    tfe.app
        .permit(&caller, at, Role::Admin, Operation::WorkspaceDelete)
        .await?;
    if name == crate::protocol::DEFAULT_WORKSPACE {
        return Err(TfeError::invalid(
            "the default workspace cannot be deleted (as at the http door)",
        ));
    }
    tfe.app.refuse_while_draining()?;
    let deleted = tfe
        .app
        .change(&org, &name, move |app, backend, workspace| async move {
            let target = app.target(&backend, &workspace)?;
            let answer = async {
                if safe {
                    refuse_unsafe_delete(&target).await?;
                }
                match target.storage.delete_workspace(&workspace).await {
                    Ok(()) => Ok(()),
                    Err(StorageError::NotFound) => Err(ApiError::not_found(format!(
                        "workspace {backend}/{workspace} not found"
                    ))),
                    Err(e) => Err(target.error(e)),
                }
            }
            .await;
            let at = (backend.as_str(), workspace.as_str());
            app.record(
                &caller,
                at,
                Operation::WorkspaceDelete,
                Facts::default(),
                &answer,
            )
            .await;
            answer
        })
        .await;
    deleted?;
    // The storage's metadata went with the workspace (the guest's
    // delete-workspace); this replica's file may still have some.
    tfe.meta.deleted(&org, &name).await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn refuse_unsafe_delete<S: Storage>(
    target: &crate::protocol::Target<'_, S>,
) -> Result<(), ApiError> {
    let conflict = |why: &str| Err(ApiError::Message(StatusCode::CONFLICT, why.to_string()));
    if target
        .storage
        .current_lock(target.workspace)
        .await
        .map_err(|e| target.error(e))?
        .is_some()
    {
        return conflict("the workspace is locked; unlock it first");
    }
    let state = target
        .storage
        .read(target.workspace)
        .await
        .map_err(|e| target.error(e))?;
    if state.as_deref().is_some_and(may_manage_resources) {
        return conflict(
            "the workspace's state still manages resources; destroy them first, or delete with -force",
        );
    }
    Ok(())
}

/// Whether a state may hold resources: anything but a plain state whose
/// `resources` is there and empty (an encrypted one cannot be seen into).
fn may_manage_resources(state: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Resources {
        resources: Option<Vec<serde::de::IgnoredAny>>,
    }
    !matches!(
        serde_json::from_slice::<Resources>(state),
        Ok(Resources { resources: Some(r) }) if r.is_empty()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_state_seen_empty_is_safe_to_delete() {
        assert!(!may_manage_resources(
            br#"{"version":4,"serial":1,"resources":[]}"#
        ));
        assert!(may_manage_resources(
            br#"{"version":4,"resources":[{"type":"x"}]}"#
        ));
        assert!(may_manage_resources(br#"{"encrypted_data":"AAAA"}"#));
        assert!(may_manage_resources(b"not json"));
    }
}
