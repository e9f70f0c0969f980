//! Discovery, ping, entitlements and the token's account: what terraform
//! asks before anything else.

use super::jsonapi::{self, Entitlements, Resource, Single, TfeError, UserAttributes};
use super::{API_PATH, Client, Tfe};
use crate::backend::Storage;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use std::sync::Arc;

/// `/.well-known/terraform.json`: the services terraform looks for. Open
/// to anyone (terraform may send no token here).
#[derive(Serialize)]
struct Services {
    #[serde(rename = "tfe.v2")]
    tfe_v2: &'static str,
    #[serde(rename = "tfe.v2.1")]
    tfe_v2_1: &'static str,
    #[serde(rename = "tfe.v2.2")]
    tfe_v2_2: &'static str,
    #[serde(rename = "state.v2")]
    state_v2: &'static str,
}

pub(super) async fn services() -> Response {
    // Media type exactly `application/json`: terraform checks it.
    axum::Json(Services {
        tfe_v2: API_PATH,
        tfe_v2_1: API_PATH,
        tfe_v2_2: API_PATH,
        state_v2: API_PATH,
    })
    .into_response()
}

/// `GET ping`: only its `TFP-API-Version` header matters.
pub(super) async fn ping() -> StatusCode {
    StatusCode::NO_CONTENT
}

/// `GET account/details`: who the token is (`terraform login` checks it).
pub(super) async fn account<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    client: Client,
    headers: HeaderMap,
) -> Result<Response, TfeError> {
    let caller = tfe.caller(&headers, client).await?;
    let username = super::principal(&caller);
    let user: Resource<UserAttributes> = Resource {
        id: format!("user-{username}"),
        kind: "users",
        attributes: UserAttributes { username },
        relationships: None,
    };
    Ok(jsonapi::json(&Single { data: user }))
}

/// `GET organizations/{org}/entitlement-set`: no remote operations, so
/// terraform plans and applies locally.
pub(super) async fn entitlements<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path(org): Path<String>,
    client: Client,
    headers: HeaderMap,
) -> Result<Response, TfeError> {
    let caller = tfe.caller(&headers, client).await?;
    tfe.organization(&caller, &org)?;
    let entitlements: Resource<Entitlements> = Resource {
        id: org,
        kind: "entitlement-sets",
        attributes: Entitlements {
            operations: false,
            state_storage: true,
        },
        relationships: None,
    };
    Ok(jsonapi::json(&Single { data: entitlements }))
}

/// `GET organizations/{org}/projects`: there are none (an empty page, not
/// a 404: terraform dereferences the list it gets). A cloud block naming a
/// `project` then fails when terraform tries to create it (404).
pub(super) async fn projects<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path(org): Path<String>,
    client: Client,
    headers: HeaderMap,
) -> Result<Response, TfeError> {
    let caller = tfe.caller(&headers, client).await?;
    tfe.organization(&caller, &org)?;
    let none: Vec<jsonapi::Identifier> = Vec::new();
    Ok(jsonapi::json(&jsonapi::page(none, 1, 1)))
}
