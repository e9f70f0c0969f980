//! What the console's pages show, as plain data: each page renders one of
//! these, and `/ui/api/…` serves the same as JSON. Every function checks
//! the caller's role first; states are read through the backend's store,
//! so host-encrypted states are opened only for callers allowed to read.

use super::diff::{StateDiff, Summary, diff, summary};
use crate::auth::Role;
use crate::backend::{Description, LockInfo, Storage, StorageError, Version};
use crate::protocol::{ApiError, App, Caller};
use serde::Serialize;

/// Rows per page of a long list.
pub const PAGE_SIZE: usize = 20;

/// One backend on the backends page.
#[derive(Debug, Serialize)]
pub struct BackendView {
    /// Its name.
    pub name: String,
    /// Its guest, grants and limits, when served by a guest.
    pub description: Option<Description>,
}

/// One page of a list.
#[derive(Debug, Serialize)]
pub struct Page<T> {
    /// The rows of this page.
    pub items: Vec<T>,
    /// This page's number, from 1.
    pub page: usize,
    /// How many pages there are.
    pub pages: usize,
}

fn paginate<T>(all: Vec<T>, page: usize) -> Page<T> {
    let pages = all.len().div_ceil(PAGE_SIZE).max(1);
    let page = page.clamp(1, pages);
    let items = all
        .into_iter()
        .skip((page - 1) * PAGE_SIZE)
        .take(PAGE_SIZE)
        .collect();
    Page { items, page, pages }
}

/// Who holds a lock, as the console shows it.
#[derive(Debug, Serialize)]
pub struct LockView {
    /// `user@host` of the holder.
    pub who: String,
    /// What it is doing (`OperationTypeApply`…).
    pub operation: String,
    /// Since when (RFC 3339, as the client sent it).
    pub created: String,
    /// The lock ID: admins only (whoever knows it can unlock).
    pub id: Option<String>,
}

/// One workspace on a backend's page.
#[derive(Debug, Serialize)]
pub struct WorkspaceView {
    /// Its name.
    pub name: String,
    /// Size of its state in bytes (`None`: no state).
    pub size: Option<u64>,
    /// What the state says of itself.
    pub summary: Summary,
    /// When the state was last written (Unix ms), when a history knows.
    pub last_write_unix_ms: Option<u64>,
    /// The lock holder, if locked.
    pub lock: Option<LockView>,
    /// Whether the caller may force-unlock and restore here.
    pub admin: bool,
}

/// The backends the caller may read.
pub fn backends<S: Storage>(app: &App<S>, caller: &Caller) -> Vec<BackendView> {
    app.backends
        .iter()
        .filter(|(name, _)| caller.allows(name, None, Role::Read))
        .map(|(name, storage)| BackendView {
            name: name.clone(),
            description: storage.describe(),
        })
        .collect()
}

fn storage_of<'a, S: Storage>(
    app: &'a App<S>,
    caller: &Caller,
    backend: &str,
    workspace: Option<&str>,
) -> Result<&'a S, ApiError> {
    let storage = app
        .backends
        .get(backend)
        .ok_or_else(|| ApiError::not_found(format!("no backend named {backend:?}")))?;
    if let Some(ws) = workspace {
        crate::names::check_name("workspace", ws).map_err(ApiError::bad_request)?;
    }
    caller.may(backend, workspace, Role::Read)?;
    Ok(storage)
}

fn storage_error(backend: &str) -> impl Fn(StorageError) -> ApiError + '_ {
    move |e| ApiError::from_storage(backend, e)
}

/// One page of a backend's workspaces, with their states' vital signs.
pub async fn workspaces<S: Storage>(
    app: &App<S>,
    caller: &Caller,
    backend: &str,
    page: usize,
) -> Result<Page<WorkspaceView>, ApiError> {
    let storage = storage_of(app, caller, backend, None)?;
    let mut names = storage
        .list_workspaces()
        .await
        .map_err(storage_error(backend))?;
    names.retain(|n| caller.allows(backend, Some(n), Role::Read));
    names.sort();
    names.dedup();
    let page = paginate(names, page);
    let mut items = Vec::with_capacity(page.items.len());
    for name in page.items {
        items.push(workspace(storage, caller, backend, name).await?);
    }
    Ok(Page {
        items,
        page: page.page,
        pages: page.pages,
    })
}

async fn workspace<S: Storage>(
    storage: &S,
    caller: &Caller,
    backend: &str,
    name: String,
) -> Result<WorkspaceView, ApiError> {
    let state = storage.read(&name).await.map_err(storage_error(backend))?;
    let newest = match storage.list_versions(&name).await {
        Ok(versions) => versions.first().map(|v| v.created_unix_ms),
        Err(StorageError::NoHistory) => None,
        Err(e) => return Err(storage_error(backend)(e)),
    };
    let holder = storage
        .current_lock(&name)
        .await
        .map_err(storage_error(backend))?;
    let admin = caller.is_admin(backend, &name);
    Ok(WorkspaceView {
        size: state.as_ref().map(|s| s.len() as u64),
        summary: state.as_deref().map(summary).unwrap_or_default(),
        last_write_unix_ms: newest,
        lock: holder.map(|h: LockInfo| LockView {
            who: h.who,
            operation: h.operation,
            created: h.created,
            id: admin.then_some(h.id),
        }),
        admin,
        name,
    })
}

/// One page of a workspace's versions, newest first.
pub async fn versions<S: Storage>(
    app: &App<S>,
    caller: &Caller,
    backend: &str,
    workspace: &str,
    page: usize,
) -> Result<Page<Version>, ApiError> {
    let storage = storage_of(app, caller, backend, Some(workspace))?;
    let versions = match storage.list_versions(workspace).await {
        Ok(versions) => versions,
        Err(StorageError::NoHistory) => Vec::new(),
        Err(e) => return Err(storage_error(backend)(e)),
    };
    Ok(paginate(versions, page))
}

/// `id`'s bytes, or the current state's for `current`.
async fn version_bytes<S: Storage>(
    storage: &S,
    backend: &str,
    workspace: &str,
    id: &str,
) -> Result<Vec<u8>, ApiError> {
    let bytes = if id == "current" {
        storage.read(workspace).await
    } else {
        storage.read_version(workspace, id).await
    };
    bytes
        .map_err(storage_error(backend))?
        .ok_or_else(|| ApiError::not_found(format!("no version {id:?} of {backend}/{workspace}")))
}

/// What changed from version `from` to version `to` (`current`: the
/// state as it is now).
pub async fn version_diff<S: Storage>(
    app: &App<S>,
    caller: &Caller,
    backend: &str,
    workspace: &str,
    from: &str,
    to: &str,
) -> Result<StateDiff, ApiError> {
    let storage = storage_of(app, caller, backend, Some(workspace))?;
    let older = version_bytes(storage, backend, workspace, from).await?;
    let newer = version_bytes(storage, backend, workspace, to).await?;
    diff(&older, &newer).map_err(|e| {
        ApiError::Message(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            format!("cannot compare these versions: {e}"),
        )
    })
}

/// Release the lock of `workspace` whoever holds it (admins only);
/// returns the holder removed.
pub async fn force_unlock<S: Storage>(
    app: &App<S>,
    caller: &Caller,
    backend: &str,
    workspace: &str,
) -> Result<Option<LockInfo>, ApiError> {
    let storage = storage_of(app, caller, backend, Some(workspace))?;
    caller.may(backend, Some(workspace), Role::Admin)?;
    storage
        .force_unlock(workspace)
        .await
        .map_err(storage_error(backend))
}

/// Write version `id` back as the current state, with the next serial,
/// under a lock of its own (admins only): refused while someone holds the
/// lock. Returns the serial it was given.
pub async fn restore<S: Storage>(
    app: &App<S>,
    caller: &Caller,
    backend: &str,
    workspace: &str,
    id: &str,
    who: &str,
) -> Result<u64, ApiError> {
    let storage = storage_of(app, caller, backend, Some(workspace))?;
    caller.may(backend, Some(workspace), Role::Admin)?;
    let old = version_bytes(storage, backend, workspace, id).await?;
    let mut state: serde_json::Value = serde_json::from_slice(&old)
        .map_err(|e| ApiError::bad_request(format!("version {id} is not a JSON state: {e}")))?;
    if state.get("encryption_version").is_some() {
        return Err(ApiError::bad_request(
            "an OpenTofu-encrypted state cannot be given a new serial without OpenTofu's key; \
             restore it with `tofu state push -force`",
        ));
    }
    let lock = LockInfo {
        id: format!(
            "console-restore-{}",
            crate::digest::sha256_hex(id.as_bytes())
        ),
        operation: "wasmstate-console-restore".into(),
        info: format!("restoring version {id}"),
        who: format!("{who}@wasmstate-console"),
        version: env!("CARGO_PKG_VERSION").into(),
        created: time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        path: String::new(),
    };
    let error = storage_error(backend);
    storage
        .lock(workspace, lock.clone())
        .await
        .map_err(&error)?;
    let written = async {
        let current = storage.read(workspace).await?;
        let serial = current
            .as_deref()
            .and_then(|c| crate::statefile::read(c).ok())
            .and_then(|h| h.serial)
            .map_or(1, |s| s + 1);
        state["serial"] = serial.into();
        let bytes = serde_json::to_vec_pretty(&state).expect("a JSON value serialises");
        storage
            .write(workspace, bytes.into(), Some(&lock.id))
            .await
            .map(|()| serial)
    }
    .await;
    let unlocked = storage.unlock(workspace, &lock.id).await;
    let serial = written.map_err(&error)?;
    unlocked.map_err(&error)?;
    Ok(serial)
}
