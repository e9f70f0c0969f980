//! The JSON:API documents the cloud block reads and sends (go-tfe's
//! structs, hashicorp/jsonapi's rules): typed, serialised with serde.
//! `data.type` must be exactly what go-tfe expects, times must end in `Z`,
//! and what is not modelled is left out (a wrong JSON type fails the
//! client's whole decode, a missing one reads as zero).

use crate::protocol::ApiError;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

/// JSON:API's media type, on every answer.
pub const MEDIA_TYPE: &str = "application/vnd.api+json";

/// `{"data": …}`.
#[derive(Debug, Serialize)]
pub struct Single<T> {
    /// The resource.
    pub data: T,
}

/// `{"data": […], "meta": {"pagination": …}}`.
#[derive(Debug, Serialize)]
pub struct List<T> {
    /// One page of resources.
    pub data: Vec<T>,
    /// Where the page sits.
    pub meta: ListMeta,
}

/// A list's `meta`.
#[derive(Debug, Serialize)]
pub struct ListMeta {
    /// go-tfe's `Pagination`.
    pub pagination: Pagination,
}

/// go-tfe's `Pagination`: terraform pages while `current-page < total-pages`.
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub struct Pagination {
    /// 1-based.
    pub current_page: usize,
    /// `null` on the first page.
    pub prev_page: Option<usize>,
    /// `null` on the last page.
    pub next_page: Option<usize>,
    /// At least 1.
    pub total_pages: usize,
    /// Items in all pages.
    pub total_count: usize,
}

/// The page `number` (1-based) of `items`, `size` a page.
pub fn page<T>(items: Vec<T>, number: usize, size: usize) -> List<T> {
    let size = size.max(1);
    let total_count = items.len();
    let total_pages = total_count.div_ceil(size).max(1);
    let number = number.max(1);
    let data = items
        .into_iter()
        .skip((number - 1).saturating_mul(size))
        .take(size)
        .collect();
    List {
        data,
        meta: ListMeta {
            pagination: Pagination {
                current_page: number,
                prev_page: (number > 1).then(|| number - 1),
                next_page: (number < total_pages).then(|| number + 1),
                total_pages,
                total_count,
            },
        },
    }
}

/// A resource object.
#[derive(Debug, Serialize)]
pub struct Resource<A, R = NoRelationships> {
    /// Its id.
    pub id: String,
    /// Its JSON:API type (`workspaces`, `state-versions`…).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Its attributes.
    pub attributes: A,
    /// Related resources, when there are any to give.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relationships: Option<R>,
}

/// For resources without relationships.
#[derive(Debug, Serialize)]
pub struct NoRelationships {}

/// A to-one relationship: `{"data": {"id", "type"}}`.
#[derive(Debug, Serialize)]
pub struct Related {
    /// The related resource's identifier.
    pub data: Identifier,
}

/// `{"id", "type"}`.
#[derive(Debug, Serialize)]
pub struct Identifier {
    /// Its id.
    pub id: String,
    /// Its type.
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// What go-tfe's `Workspace` reads.
#[derive(Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct WorkspaceAttributes {
    /// The workspace's name.
    pub name: String,
    /// Always `local`: plan and apply run on the caller's machine.
    pub execution_mode: &'static str,
    /// Always false: no remote runs.
    pub operations: bool,
    /// `latest` unless set by PATCH.
    pub terraform_version: String,
    /// Its tags.
    pub tag_names: Vec<String>,
    /// Whether someone holds its lock (left out of lists).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locked: Option<bool>,
    /// When it was created through this door, as far as this replica knows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// What the caller may do to it (no `can-force-delete`: its presence
    /// would switch terraform's `workspace delete` to safe-delete).
    pub permissions: Permissions,
    /// `is-destroyable`.
    pub actions: Actions,
}

/// A workspace's `permissions`, from the caller's grants.
#[derive(Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Permissions {
    /// Delete it (admin).
    pub can_destroy: bool,
    /// Force-unlock (admin).
    pub can_force_unlock: bool,
    /// Lock (write).
    pub can_lock: bool,
    /// Unlock its own lock (write).
    pub can_unlock: bool,
    /// Update tags, terraform-version (write).
    pub can_update: bool,
    /// Read its settings (read).
    pub can_read_settings: bool,
    /// Remote runs: never.
    pub can_queue_run: bool,
}

/// A workspace's `actions`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Actions {
    /// Whether a destroy plan may run (always: runs are local).
    pub is_destroyable: bool,
}

/// A workspace's relationships: its organization.
#[derive(Debug, Serialize)]
pub struct WorkspaceRelationships {
    /// The organization (backend) it belongs to.
    pub organization: Related,
}

/// `entitlement-sets`: what the organization offers.
#[derive(Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Entitlements {
    /// False: every operation runs locally.
    pub operations: bool,
    /// True: states are kept here.
    pub state_storage: bool,
}

/// `users`: who the token is.
#[derive(Debug, Serialize)]
pub struct UserAttributes {
    /// The user or token name.
    pub username: String,
}

/// What go-tfe's `StateVersion` reads.
#[derive(Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct StateVersionAttributes {
    /// The state's serial.
    pub serial: i64,
    /// `pending` (waiting for its upload), `finalized` or `discarded`.
    pub status: &'static str,
    /// Where the raw state is read (bearer-authenticated).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hosted_state_download_url: Option<String>,
    /// Where the raw state is uploaded (a capability: no bearer is sent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hosted_state_upload_url: Option<String>,
    /// Where terraform's JSON rendering of the state is uploaded (accepted
    /// and not kept).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hosted_json_state_upload_url: Option<String>,
}

/// What go-tfe's `StateVersionOutput` reads.
#[derive(Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct OutputAttributes {
    /// The output's name.
    pub name: String,
    /// Whether it is sensitive.
    pub sensitive: bool,
    /// The legacy coarse type (`string`, `array`…), unread by terraform.
    #[serde(rename = "type")]
    pub coarse_type: String,
    /// Its value; `null` for a sensitive one in a list.
    pub value: serde_json::Value,
    /// Its cty type as terraform wrote it in the state.
    pub detailed_type: serde_json::Value,
}

/// An incoming single-resource document.
#[derive(Debug, Deserialize)]
pub struct Incoming<A> {
    /// The resource sent.
    pub data: IncomingData<A>,
}

/// The resource of an [`Incoming`] document.
#[derive(Debug, Deserialize)]
pub struct IncomingData<A> {
    /// Its attributes.
    pub attributes: Option<A>,
    /// Its relationships (only `tags` is read).
    #[serde(default)]
    pub relationships: IncomingRelationships,
}

/// The relationships a create may carry.
#[derive(Debug, Default, Deserialize)]
pub struct IncomingRelationships {
    /// Tags, sent inline with their names.
    pub tags: Option<Tags>,
    /// Key/value tags: not supported (refused, never ignored).
    #[serde(rename = "tag-bindings")]
    pub tag_bindings: Option<serde_json::Value>,
}

/// `{"data": [{"type": "tags", "attributes": {"name": …}}]}`.
#[derive(Debug, Default, Deserialize)]
pub struct Tags {
    /// The tags.
    #[serde(default)]
    pub data: Vec<Tag>,
}

/// One tag as go-tfe sends it (inline, by name).
#[derive(Debug, Deserialize)]
pub struct Tag {
    /// `{"name": …}`.
    pub attributes: Option<TagName>,
}

/// A tag's attributes.
#[derive(Debug, Deserialize)]
pub struct TagName {
    /// The tag.
    pub name: String,
}

/// A workspace's attributes on create or update.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct WorkspaceInput {
    /// Its name (create; on update only the same name is accepted).
    pub name: Option<String>,
    /// `latest` or a version.
    pub terraform_version: Option<String>,
}

/// A lock's attributes.
#[derive(Debug, Default, Deserialize)]
pub struct LockInput {
    /// Why (`Locked by Terraform`).
    pub reason: Option<String>,
}

/// A state version's attributes on create. `force` (`state push -force`)
/// is not read: the stale-write guard decides as at the http door, by the
/// backend's `allow_force_push`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct StateVersionInput {
    /// The state's serial.
    pub serial: Option<i64>,
    /// Hex MD5 of the raw state.
    pub md5: Option<String>,
    /// Its lineage.
    pub lineage: Option<String>,
    /// The raw state, base64 (inline mode).
    pub state: Option<String>,
}

/// An error answer: `{"errors": [{"status", "title", "detail"}]}`.
#[derive(Debug)]
pub struct TfeError {
    status: StatusCode,
    detail: String,
    retry_after: Option<u64>,
}

#[derive(Serialize)]
struct Errors<'a> {
    errors: [ErrorObject<'a>; 1],
}

#[derive(Serialize)]
struct ErrorObject<'a> {
    status: String,
    title: &'a str,
    detail: &'a str,
}

impl TfeError {
    /// Its HTTP status.
    #[cfg(test)]
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// `status` with `detail`.
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        TfeError {
            status,
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// 404: what terraform reads as "does not exist"; also what a caller
    /// who may not read a thing learns of it.
    pub fn not_found(detail: impl Into<String>) -> Self {
        TfeError::new(StatusCode::NOT_FOUND, detail)
    }

    /// 422: a document that cannot be used.
    pub fn invalid(detail: impl Into<String>) -> Self {
        TfeError::new(StatusCode::UNPROCESSABLE_ENTITY, detail)
    }

    /// 409: a lock or write conflict.
    pub fn conflict(detail: impl Into<String>) -> Self {
        TfeError::new(StatusCode::CONFLICT, detail)
    }

    /// Say what terraform leaves behind after a refused write: its lock,
    /// on purpose, which its user releases once they have looked.
    pub fn unlocked_hint(mut self, org: &str, name: &str) -> Self {
        self.detail.push_str(&format!(
            ". Terraform keeps the workspace locked after a refused write: once you have checked, run `terraform force-unlock {org}/{name}`"
        ));
        self
    }
}

impl From<ApiError> for TfeError {
    fn from(e: ApiError) -> Self {
        match e {
            // The TFE API answers lock conflicts with 409 (go-tfe maps it
            // per endpoint); the holder's ID is never shown here.
            ApiError::Holder(_, holder) => TfeError::conflict(format!(
                "the workspace is locked by {} (operation {}, since {}); wait for it, or an admin runs `terraform force-unlock <organization>/<workspace>`",
                holder.who, holder.operation, holder.created
            )),
            ApiError::RetryAfter(status, seconds, reason) => TfeError {
                status,
                detail: reason,
                retry_after: Some(seconds),
            },
            other => TfeError::new(other.status(), other.message()),
        }
    }
}

impl IntoResponse for TfeError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(status = self.status.as_u16(), "{}", self.detail);
        }
        let detail = self.detail.replace(['\r', '\n'], " ");
        let body = Errors {
            errors: [ErrorObject {
                status: self.status.as_u16().to_string(),
                title: self.status.canonical_reason().unwrap_or("error"),
                detail: &detail,
            }],
        };
        let mut response = (self.status, json(&body)).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// `value` as a JSON:API body.
pub fn json<T: Serialize>(value: &T) -> Response {
    (
        [(header::CONTENT_TYPE, MEDIA_TYPE)],
        serde_json::to_vec(value).expect("documents serialise"),
    )
        .into_response()
}

/// `value` as a JSON:API body with `status`.
pub fn json_with<T: Serialize>(status: StatusCode, value: &T) -> Response {
    (status, json(value)).into_response()
}

/// Parse a request body as `T` (422 naming what is wrong).
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, TfeError> {
    serde_json::from_slice(body).map_err(|e| {
        TfeError::invalid(format!(
            "the body is not the JSON:API document expected: {e}"
        ))
    })
}

/// Now, as go-tfe's `iso8601` wants it (UTC, ending in `Z`).
pub fn now() -> String {
    time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .unwrap_or_else(|_| time::OffsetDateTime::now_utc())
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_count_from_one_and_link_their_neighbours() {
        let list = page((1..=45).collect::<Vec<_>>(), 2, 20);
        assert_eq!(list.data, (21..=40).collect::<Vec<_>>());
        assert_eq!(
            list.meta.pagination,
            Pagination {
                current_page: 2,
                prev_page: Some(1),
                next_page: Some(3),
                total_pages: 3,
                total_count: 45
            }
        );
        let empty = page(Vec::<u8>::new(), 1, 20);
        assert_eq!(empty.meta.pagination.total_pages, 1);
        assert_eq!(empty.meta.pagination.next_page, None);
    }

    #[test]
    fn times_end_in_z() {
        let t = now();
        assert!(t.ends_with('Z') && !t.contains('.'), "{t}");
    }

    #[test]
    fn errors_are_json_api_documents() {
        let response = TfeError::conflict("held").into_response();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[header::CONTENT_TYPE], MEDIA_TYPE);
    }
}
