//! Workspace updates: `terraform-version` (PATCH) and tags, each
//! recorded in the audit trail (and each refusal, as the http door's are).

use super::super::jsonapi::{self, Incoming, Single, Tags, TfeError, WorkspaceInput};
use super::super::{Client, Tfe};
use super::{SMALL_BODY, check_version, current, tag_names};
use crate::audit::{Facts, Operation};
use crate::auth::Role;
use crate::backend::Storage;
use crate::protocol::{ApiError, Caller};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// `PATCH organizations/{org}/workspaces/{name}`.
pub(in crate::tfe) async fn update_by_name<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path((org, name)): Path<(String, String)>,
    client: Client,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, TfeError> {
    let caller = tfe.caller(&headers, client).await?;
    tfe.existing(&caller, &org, &name).await?;
    update(&tfe, &caller, &org, &name, body).await
}

/// `PATCH workspaces/{id}`.
pub(in crate::tfe) async fn update_by_id<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path(id): Path<String>,
    client: Client,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, TfeError> {
    let caller = tfe.caller(&headers, client).await?;
    let (org, name) = tfe.by_id(&caller, &id).await?;
    update(&tfe, &caller, &org, &name, body).await
}

/// Set terraform-version (the cloud block sends its own right after a
/// create); a rename is refused, other attributes are not kept.
async fn update<S: Storage>(
    tfe: &Tfe<S>,
    caller: &Caller,
    org: &str,
    name: &str,
    body: Body,
) -> Result<Response, TfeError> {
    tfe.app
        .permit(caller, (org, name), Role::Write, Operation::WorkspaceUpdate)
        .await?;
    let body = tfe.app.read_body_up_to(body, SMALL_BODY).await?;
    let doc: Incoming<WorkspaceInput> = jsonapi::parse(&body)?;
    let input = doc.data.attributes.unwrap_or_default();
    if input.name.as_deref().is_some_and(|n| n != name) {
        return Err(TfeError::invalid(
            "workspaces cannot be renamed here; create a new one and `terraform state push` into it",
        ));
    }
    if let Some(version) = input.terraform_version {
        check_version(&version)?;
        let note = format!("terraform-version {version}");
        let storage = tfe.organization(caller, org)?;
        tfe.meta
            .update(storage, org, name, move |meta| {
                meta.terraform_version = Some(version.clone());
            })
            .await?;
        updated(tfe, caller, (org, name), note).await;
    }
    let doc = current(tfe, caller, org, name).await?;
    Ok(jsonapi::json(&Single { data: doc }))
}

/// `POST workspaces/{id}/relationships/tags`: add tags.
pub(in crate::tfe) async fn add_tags<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path(id): Path<String>,
    client: Client,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, TfeError> {
    change_tags(&tfe, &id, client, &headers, body, true).await
}

/// `DELETE workspaces/{id}/relationships/tags`: remove tags.
pub(in crate::tfe) async fn remove_tags<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path(id): Path<String>,
    client: Client,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, TfeError> {
    change_tags(&tfe, &id, client, &headers, body, false).await
}

async fn change_tags<S: Storage>(
    tfe: &Tfe<S>,
    id: &str,
    client: Client,
    headers: &HeaderMap,
    body: Body,
    add: bool,
) -> Result<Response, TfeError> {
    let (caller, (org, name)) = tfe
        .permitted(headers, client, id, Role::Write, Operation::WorkspaceUpdate)
        .await?;
    let body = tfe.app.read_body_up_to(body, SMALL_BODY).await?;
    let tags = tag_names(&jsonapi::parse::<Tags>(&body)?)?;
    let listed: Vec<&str> = tags.iter().map(String::as_str).collect();
    let note = format!(
        "tags {} {}",
        if add { "added:" } else { "removed:" },
        listed.join(", ")
    );
    let storage = tfe.organization(&caller, &org)?;
    tfe.meta
        .update(storage, &org, &name, move |meta| {
            if add {
                meta.tags.extend(tags.iter().cloned());
            } else {
                meta.tags.retain(|t| !tags.contains(t));
            }
        })
        .await?;
    updated(tfe, &caller, (&org, &name), note).await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Record a change of a workspace's metadata (it changes no state, but
/// tags decide which workspaces cloud blocks select).
async fn updated<S: Storage>(tfe: &Tfe<S>, caller: &Caller, at: (&str, &str), note: String) {
    let facts = Facts {
        note: Some(note),
        ..Facts::default()
    };
    let done: Result<(), ApiError> = Ok(());
    tfe.app
        .record(caller, at, Operation::WorkspaceUpdate, facts, &done)
        .await;
}
