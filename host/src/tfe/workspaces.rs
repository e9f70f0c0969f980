//! Workspaces: list (by name and tags, paged), create, read by name or
//! id; update (tags, terraform-version) in [`update`], delete and
//! safe-delete in [`delete`].
//!
//! Which workspaces exist is what the backend's storage lists, and their
//! tags and terraform-version are its workspace metadata
//! ([`super::meta`]), so every replica agrees.

use super::jsonapi::{
    self, Actions, Identifier, Incoming, Permissions, Related, Resource, Single, Tags, TfeError,
    WorkspaceAttributes, WorkspaceInput, WorkspaceRelationships,
};
use super::meta::WorkspaceMeta;
use super::{Client, Tfe, ids};
use crate::audit::{Facts, Operation};
use crate::auth::Role;
use crate::backend::Storage;
use crate::protocol::{ApiError, Caller};
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

mod delete;
mod update;

pub(super) use delete::{delete_by_id, delete_by_name, safe_delete_by_id, safe_delete_by_name};
pub(super) use update::{add_tags, remove_tags, update_by_id, update_by_name};

/// A workspace document.
pub(super) type Workspace = Resource<WorkspaceAttributes, WorkspaceRelationships>;

/// Largest workspace, tag or lock document read (a few hundred bytes sent).
pub(super) const SMALL_BODY: usize = 64 << 10;

/// TFE's default and largest page sizes.
const PAGE_SIZE: usize = 20;
const MAX_PAGE_SIZE: usize = 100;

/// Workspaces whose metadata one tag search reads at most: each is one
/// guest call (a small read of the storage), [`READ_AT_ONCE`] at a time.
const MAX_TAG_SEARCH: usize = 1000;

/// Metadata reads a list makes at once.
const READ_AT_ONCE: usize = 8;

/// `org`/`name` with `meta` as a document for `caller`.
pub(super) fn document(
    caller: &Caller,
    org: &str,
    name: &str,
    meta: WorkspaceMeta,
    locked: Option<bool>,
) -> Workspace {
    let may = |role| caller.allows(org, Some(name), role);
    Resource {
        id: ids::workspace(org, name),
        kind: "workspaces",
        attributes: WorkspaceAttributes {
            name: name.to_string(),
            execution_mode: "local",
            operations: false,
            terraform_version: meta.terraform_version.unwrap_or_else(|| "latest".into()),
            // Tags say how workspaces are grouped (`prod`, `team:net`):
            // not for a caller who may see only the outputs.
            tag_names: if may(Role::Read) {
                meta.tags.into_iter().collect()
            } else {
                Vec::new()
            },
            locked,
            created_at: meta.created_at,
            permissions: Permissions {
                can_destroy: may(Role::Admin),
                can_force_unlock: may(Role::Admin),
                can_lock: may(Role::Write),
                can_unlock: may(Role::Write),
                can_update: may(Role::Write),
                can_read_settings: true,
                can_queue_run: false,
            },
            actions: Actions {
                is_destroyable: true,
            },
        },
        relationships: Some(WorkspaceRelationships {
            organization: Related {
                data: Identifier {
                    id: org.to_string(),
                    kind: "organizations",
                },
            },
        }),
    }
}

/// `org`/`name` as a document, with whether it is locked now.
pub(super) async fn current<S: Storage>(
    tfe: &Tfe<S>,
    caller: &Caller,
    org: &str,
    name: &str,
) -> Result<Workspace, TfeError> {
    let target = tfe.app.target(org, name)?;
    let locked = target
        .storage
        .current_lock(name)
        .await
        .map_err(|e| target.error(e))?
        .is_some();
    let meta = tfe.meta.get(target.storage, org, name).await?;
    Ok(document(caller, org, name, meta, Some(locked)))
}

/// `GET organizations/{org}/workspaces`: `search[name]` (part of the
/// name), `search[tags]` (comma-separated, all required), `page[number]`,
/// `page[size]`; only the workspaces the caller may read (or read the
/// outputs of).
pub(super) async fn list<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path(org): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    client: Client,
    headers: HeaderMap,
) -> Result<Response, TfeError> {
    let caller = tfe.caller(&headers, client).await?;
    let storage = tfe.organization(&caller, &org)?;
    if query.keys().any(|k| k.starts_with("filter[tagged]")) {
        return Err(TfeError::invalid(
            "key/value tags are not supported here; use tags = [\"a\", \"b\"] in the cloud block",
        ));
    }
    if query.keys().any(|k| k.starts_with("filter[project]")) {
        return Err(TfeError::invalid(
            "projects are not supported here; remove `project` from the cloud block",
        ));
    }
    let search = query.get("search[name]").map(String::as_str).unwrap_or("");
    // Kept lower-case ([`check_tags`]), so matched so: the cloud block
    // sends `tags = ["App"]` as it is written.
    let tags: BTreeSet<String> = query
        .get("search[tags]")
        .map(|t| {
            t.split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_ascii_lowercase)
                .collect()
        })
        .unwrap_or_default();
    let number = page_number(&query, "page[number]", 1)?;
    let size = page_number(&query, "page[size]", PAGE_SIZE)?.min(MAX_PAGE_SIZE);
    let mut names = storage
        .list_workspaces()
        .await
        .map_err(|e| ApiError::from_storage(&org, e))?;
    names.sort();
    names.dedup();
    names.retain(|n| caller.allows(&org, Some(n), Role::Outputs) && n.contains(search));
    let with_meta = |names: Vec<String>| {
        use futures_util::{StreamExt as _, TryStreamExt as _};
        let tfe = &tfe;
        let org = &org;
        futures_util::stream::iter(names)
            .map(move |name| async move {
                let meta = tfe.meta.get(storage, org, &name).await?;
                Ok::<_, TfeError>((name, meta))
            })
            .buffered(READ_AT_ONCE)
            .try_collect::<Vec<_>>()
    };
    let to_document =
        |(name, meta): (String, WorkspaceMeta)| document(&caller, &org, &name, meta, None);
    if tags.is_empty() {
        // Only the page's metadata is read.
        let page = jsonapi::page(names, number, size);
        let data = with_meta(page.data).await?;
        let data = data.into_iter().map(to_document).collect();
        let page = jsonapi::List {
            data,
            meta: page.meta,
        };
        return Ok(jsonapi::json(&page));
    }
    // Selecting by tags would tell an outputs-only caller the tags it
    // may not see.
    names.retain(|n| caller.allows(&org, Some(n), Role::Read));
    if names.len() > MAX_TAG_SEARCH {
        return Err(TfeError::invalid(format!(
            "a tag search reads each workspace's tags, and {org} has more than {MAX_TAG_SEARCH} to \
             search: narrow it with search[name] (a `prefix` in backend \"remote\") or select by \
             `name`"
        )));
    }
    let found: Vec<Workspace> = with_meta(names)
        .await?
        .into_iter()
        .filter(|(_, meta)| tags.iter().all(|t| meta.tags.contains(t)))
        .map(to_document)
        .collect();
    Ok(jsonapi::json(&jsonapi::page(found, number, size)))
}

fn page_number(
    query: &HashMap<String, String>,
    key: &str,
    default: usize,
) -> Result<usize, TfeError> {
    match query.get(key) {
        None => Ok(default),
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| TfeError::invalid(format!("{key} must be a positive number"))),
    }
}

/// Tags as TFE allows them: letters, digits, `-`, `_`, `:`, `.`.
fn check_tags<'a>(tags: impl IntoIterator<Item = &'a str>) -> Result<BTreeSet<String>, TfeError> {
    let mut checked = BTreeSet::new();
    for tag in tags {
        let ok = !tag.is_empty()
            && tag.len() <= 255
            && tag
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | ':' | '.'));
        if !ok {
            return Err(TfeError::invalid(format!(
                "tag {tag:?} is not valid: use 1 to 255 letters, digits, '-', '_', ':' or '.'"
            )));
        }
        checked.insert(tag.to_ascii_lowercase());
    }
    Ok(checked)
}

fn tag_names(tags: &Tags) -> Result<BTreeSet<String>, TfeError> {
    if tags.data.len() > super::meta::MAX_TAGS {
        return Err(TfeError::invalid(format!(
            "a workspace has at most {} tags; nothing was changed",
            super::meta::MAX_TAGS
        )));
    }
    let names: Option<Vec<&str>> = tags
        .data
        .iter()
        .map(|t| t.attributes.as_ref().map(|a| a.name.as_str()))
        .collect();
    check_tags(names.ok_or_else(|| {
        TfeError::invalid("each tag must be sent with its name (attributes.name)")
    })?)
}

fn check_version(version: &str) -> Result<(), TfeError> {
    let ok = !version.is_empty()
        && version.len() <= 64
        && version.chars().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+' | '~' | '<' | '>' | '=' | ' ')
        });
    if ok {
        Ok(())
    } else {
        Err(TfeError::invalid(format!(
            "terraform-version {version:?} is not a version: use \"latest\" or a version such as \"1.11.4\""
        )))
    }
}

/// `POST organizations/{org}/workspaces`: 201, or 422 when the name is taken.
pub(super) async fn create<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path(org): Path<String>,
    client: Client,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, TfeError> {
    let caller = tfe.caller(&headers, client).await?;
    tfe.organization(&caller, &org)?;
    let body = tfe.app.read_body_up_to(body, SMALL_BODY).await?;
    let doc: Incoming<WorkspaceInput> = jsonapi::parse(&body)?;
    let input = doc.data.attributes.unwrap_or_default();
    let name = input
        .name
        .ok_or_else(|| TfeError::invalid("a workspace needs a name (attributes.name)"))?;
    crate::names::check_name("workspace", &name).map_err(TfeError::invalid)?;
    if doc.data.relationships.tag_bindings.is_some() {
        return Err(TfeError::invalid(
            "key/value tags are not supported here; use tags = [\"a\", \"b\"] in the cloud block",
        ));
    }
    let tags = match &doc.data.relationships.tags {
        Some(tags) => tag_names(tags)?,
        None => BTreeSet::new(),
    };
    if let Some(version) = &input.terraform_version {
        check_version(version)?;
    }
    let at = (org.as_str(), name.as_str());
    tfe.app
        .permit(&caller, at, Role::Write, Operation::WorkspaceCreate)
        .await?;
    tfe.app.refuse_while_draining()?;
    let recorded = caller.clone();
    // Created again after a delete: nothing of the old metadata stays.
    let meta = WorkspaceMeta {
        tags,
        terraform_version: input.terraform_version,
        created_at: Some(jsonapi::now()),
    };
    let store = tfe.meta.clone();
    let created = tfe
        .app
        .change(&org, &name, move |app, backend, workspace| async move {
            let target = app.target(&backend, &workspace)?;
            let answer = target
                .storage
                .create_workspace(&workspace)
                .await
                .map_err(|e| target.error(e))
                .and_then(|created| {
                    if created {
                        Ok(())
                    } else {
                        Err(ApiError::Message(
                            StatusCode::UNPROCESSABLE_ENTITY,
                            format!("Name has already been taken: workspace {workspace:?} exists"),
                        ))
                    }
                });
            let at = (backend.as_str(), workspace.as_str());
            app.record(
                &recorded,
                at,
                Operation::WorkspaceCreate,
                Facts::default(),
                &answer,
            )
            .await;
            answer?;
            // Under the workspace's gate, so a delete through this replica
            // comes before or after both steps.
            Ok(store
                .create(target.storage, &backend, &workspace, meta)
                .await)
        })
        .await;
    let meta = created??;
    let doc = document(&caller, &org, &name, meta, Some(false));
    Ok(jsonapi::json_with(
        StatusCode::CREATED,
        &Single { data: doc },
    ))
}

/// `GET organizations/{org}/workspaces/{name}`.
pub(super) async fn read_by_name<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path((org, name)): Path<(String, String)>,
    client: Client,
    headers: HeaderMap,
) -> Result<Response, TfeError> {
    let caller = tfe.caller(&headers, client).await?;
    tfe.existing(&caller, &org, &name).await?;
    let doc = current(&tfe, &caller, &org, &name).await?;
    Ok(jsonapi::json(&Single { data: doc }))
}

/// `GET workspaces/{id}`.
pub(super) async fn read_by_id<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path(id): Path<String>,
    client: Client,
    headers: HeaderMap,
) -> Result<Response, TfeError> {
    let caller = tfe.caller(&headers, client).await?;
    let (org, name) = tfe.by_id(&caller, &id).await?;
    let doc = current(&tfe, &caller, &org, &name).await?;
    Ok(jsonapi::json(&Single { data: doc }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_checked_and_lowercased() {
        let tags = check_tags(["App", "team:net"]).unwrap();
        assert_eq!(tags.into_iter().collect::<Vec<_>>(), ["app", "team:net"]);
        assert!(check_tags(["a b"]).is_err());
        assert!(check_tags([""]).is_err());
        assert!(check_version("1.11.4").is_ok());
        assert!(check_version("x\"y").is_err());
    }
}
