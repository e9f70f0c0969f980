//! What the console's pages show, as plain data: each page renders one of
//! these, and `/ui/api/…` serves the same as JSON. Every function checks
//! the caller's role first; states are read through the backend's store,
//! so host-encrypted states are opened only for callers allowed to read.

use super::diff::{StateDiff, Summary, diff, summary};
use crate::audit::{Facts, Operation};
use crate::auth::Role;
use crate::backend::{Description, LockInfo, Storage, StorageError, Version};
use crate::protocol::{ApiError, App, Caller};
use crate::statefile::PREFIX_BYTES;
use serde::Serialize;
use std::sync::Arc;

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

/// One workspace on a backend's page.
#[derive(Debug, Serialize)]
pub struct WorkspaceView {
    /// Its name.
    pub name: String,
    /// Size of its state in bytes (`None`: no state, or a state over
    /// 64 KiB with no version kept to tell).
    pub size: Option<u64>,
    /// What the state says of itself.
    pub summary: Summary,
    /// When the state was last written (Unix ms), when a history knows.
    pub last_write_unix_ms: Option<u64>,
    /// The lock holder, if locked.
    pub lock: Option<crate::backend::HeldLock>,
    /// Whether the caller may force-unlock and restore here.
    pub admin: bool,
    /// Why the row is incomplete, when storage failed for it.
    pub error: Option<String>,
}

/// The backends the caller may read; what they are made of (paths,
/// repository URLs, grants) only for their admins.
pub fn backends<S: Storage>(app: &App<S>, caller: &Caller) -> Vec<BackendView> {
    app.backends
        .iter()
        .filter(|(name, _)| caller.allows(name, None, Role::Read))
        .map(|(name, storage)| BackendView {
            name: name.clone(),
            description: caller
                .allows(name, None, Role::Admin)
                .then(|| storage.describe())
                .flatten(),
        })
        .collect()
}

/// Guests installed in the data directory (`wasmstate guest install`),
/// serving a backend or not: for admins of any backend, empty for others.
pub fn installed<S: Storage>(
    app: &App<S>,
    caller: &Caller,
    data_dir: &std::path::Path,
) -> Result<Vec<crate::marketplace::store::Installed>, ApiError> {
    if !app
        .backends
        .keys()
        .any(|name| caller.allows(name, None, Role::Admin))
    {
        return Ok(Vec::new());
    }
    crate::marketplace::store::GuestStore::new(data_dir)
        .list()
        .map_err(|e| {
            ApiError::Message(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot list the installed guests: {e}"),
            )
        })
}

pub(super) fn storage_of<'a, S: Storage>(
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
    let names = readable_workspaces(storage, caller, backend).await?;
    let page = paginate(names, page);
    let mut items = Vec::with_capacity(page.items.len());
    for name in page.items {
        items.push(workspace(storage, caller, backend, name).await);
    }
    Ok(Page {
        items,
        page: page.page,
        pages: page.pages,
    })
}

/// The workspaces of `backend` the caller may read, sorted, each once.
pub(super) async fn readable_workspaces<S: Storage>(
    storage: &S,
    caller: &Caller,
    backend: &str,
) -> Result<Vec<String>, ApiError> {
    let mut names = storage
        .list_workspaces()
        .await
        .map_err(storage_error(backend))?;
    // Names come from the guest: only well-formed ones reach storage.
    names.retain(|n| {
        crate::names::check_name("workspace", n).is_ok()
            && caller.allows(backend, Some(n), Role::Read)
    });
    names.sort();
    names.dedup();
    Ok(names)
}

/// One row: serial and lineage from the state's first 64 KiB, its size
/// and last write from the newest version, so a page never reads whole
/// states. Under encryption the state is not read at all: serial and size
/// come from the newest version, and the lineage is left out. A workspace
/// that cannot be read shows why in its row.
async fn workspace<S: Storage>(
    storage: &S,
    caller: &Caller,
    backend: &str,
    name: String,
) -> WorkspaceView {
    let admin = caller.is_admin(backend, &name);
    let mut row = WorkspaceView {
        name,
        size: None,
        summary: Summary::default(),
        last_write_unix_ms: None,
        lock: None,
        admin,
        error: None,
    };
    let name = row.name.clone();
    // Sealed, a prefix costs opening the whole state: 20 rows could be
    // gigabytes for any reader. The row shows what the history knows.
    let sealed = storage.opens_whole();
    let looked = async {
        let prefix = if sealed {
            None
        } else {
            storage.read_prefix(&name, PREFIX_BYTES).await?
        };
        let newest = match storage.list_versions(&name).await {
            Ok(versions) => versions.into_iter().next(),
            Err(StorageError::NoHistory) => None,
            Err(e) => return Err(e),
        };
        let holder = storage.current_lock(&name).await?;
        Ok((prefix, newest, holder))
    };
    match looked.await {
        Ok((prefix, newest, holder)) => {
            if let Some(prefix) = &prefix {
                row.summary = summary(prefix);
                row.size = if prefix.len() < PREFIX_BYTES {
                    Some(prefix.len() as u64)
                } else {
                    newest.as_ref().map(|v| v.bytes)
                };
            }
            if sealed && let Some(newest) = &newest {
                row.summary.serial = newest.serial;
                row.size = Some(newest.bytes);
            }
            row.last_write_unix_ms = newest.map(|v| v.created_unix_ms);
            let now = time::OffsetDateTime::now_utc();
            row.lock = holder
                .map(|h: LockInfo| crate::backend::HeldLock::of(row.name.clone(), h, admin, now));
        }
        Err(e) => row.error = Some(ApiError::from_storage(backend, e).message()),
    }
    row
}

/// The most workspaces one listing of locks asks about: past it, the
/// answer says it looked at the first of them only (by name).
pub const MAX_LOCK_CHECKS: usize = 1000;
/// `current-lock` calls under way at once for listings of locks, in the
/// whole server: a listing costs storage calls, and any reader may ask.
pub const LOCK_CHECKS_AT_ONCE: usize = 8;

/// Every lock held on `backend` that the caller may see, oldest first:
/// one `current-lock` call per readable workspace, for at most
/// [`MAX_LOCK_CHECKS`] of them ([`LOCK_CHECKS_AT_ONCE`] at a time in the
/// whole server). With the locks, how many readable workspaces there were
/// when some were not looked at.
pub async fn held_locks<S: Storage>(
    app: &App<S>,
    caller: &Caller,
    backend: &str,
) -> Result<(Vec<crate::backend::HeldLock>, Option<usize>), ApiError> {
    static CHECKS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(LOCK_CHECKS_AT_ONCE);
    let storage = storage_of(app, caller, backend, None)?;
    let names = readable_workspaces(storage, caller, backend).await?;
    let now = time::OffsetDateTime::now_utc();
    let (locks, cut) = gather_locks(names, &CHECKS, |name| async move {
        storage.current_lock(&name).await.map(|lock| (name, lock))
    })
    .await;
    let mut held = Vec::new();
    for (name, lock) in locks.map_err(|e| ApiError::from_storage(backend, e))? {
        let admin = caller.is_admin(backend, &name);
        held.push(crate::backend::HeldLock::of(name, lock, admin, now));
    }
    held.sort_by_key(|h| std::cmp::Reverse(h.age_seconds));
    Ok((held, cut))
}

/// Ask `current_lock` about the first [`MAX_LOCK_CHECKS`] of `names`,
/// each call waiting for one of `checks`' permits. The locks found, and
/// the number of names when some were left out.
async fn gather_locks<F, Fut>(
    names: Vec<String>,
    checks: &tokio::sync::Semaphore,
    current_lock: F,
) -> (Result<Vec<(String, LockInfo)>, StorageError>, Option<usize>)
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<(String, Option<LockInfo>), StorageError>>,
{
    use futures_util::StreamExt;
    let total = names.len();
    let cut = (total > MAX_LOCK_CHECKS).then_some(total);
    let asked = names.into_iter().take(MAX_LOCK_CHECKS).map(|name| {
        let call = current_lock(name);
        async move {
            let _turn = checks.acquire().await;
            call.await
        }
    });
    let mut answers = futures_util::stream::iter(asked).buffer_unordered(LOCK_CHECKS_AT_ONCE);
    let mut found = Vec::new();
    while let Some(answer) = answers.next().await {
        match answer {
            Ok((name, Some(lock))) => found.push((name, lock)),
            Ok((_, None)) => {}
            Err(e) => return (Err(e), cut),
        }
    }
    (Ok(found), cut)
}

/// One page of a workspace's versions, and who keeps them.
#[derive(Debug, Serialize)]
pub struct Versions {
    /// The versions of this page, newest first.
    #[serde(flatten)]
    pub page: Page<Version>,
    /// Who keeps them: whether another replica lists the same.
    pub history: crate::backend::HistorySource,
}

/// One page of a workspace's versions, newest first.
pub async fn versions<S: Storage>(
    app: &App<S>,
    caller: &Caller,
    backend: &str,
    workspace: &str,
    page: usize,
) -> Result<Versions, ApiError> {
    let storage = storage_of(app, caller, backend, Some(workspace))?;
    let mut versions = match storage.list_versions(workspace).await {
        Ok(versions) => versions,
        Err(StorageError::NoHistory) => Vec::new(),
        Err(e) => return Err(storage_error(backend)(e)),
    };
    app.fill_writers(backend, workspace, &mut versions);
    Ok(Versions {
        page: paginate(versions, page),
        history: storage.history_source(),
    })
}

/// `id`'s bytes, or the current state's for `current`.
pub(super) async fn version_bytes<S: Storage>(
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
    // One diff at a time in the whole server, off the async workers, of
    // states up to DIFF_MAX_BYTES: parsing is CPU and memory any reader
    // can ask for.
    static ONE_AT_A_TIME: std::sync::LazyLock<Arc<tokio::sync::Semaphore>> =
        std::sync::LazyLock::new(|| Arc::new(tokio::sync::Semaphore::new(1)));
    let turn = diff_turn(&ONE_AT_A_TIME, DIFF_WAIT).await?;
    let older = version_bytes(storage, backend, workspace, from).await?;
    let newer = version_bytes(storage, backend, workspace, to).await?;
    if older.len().max(newer.len()) > DIFF_MAX_BYTES {
        return Err(ApiError::Message(
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "these versions are too large to compare here (over {} MiB); compare them with \
                 `terraform show -json` locally",
                DIFF_MAX_BYTES >> 20
            ),
        ));
    }
    // The turn goes with the work: a caller who disconnects drops this
    // future, not the comparison, which holds the slot to its end.
    let compared = tokio::task::spawn_blocking(move || {
        let compared = diff(&older, &newer);
        drop(turn);
        compared
    })
    .await
    .map_err(|e| {
        ApiError::Message(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("the comparison failed: {e}"),
        )
    })?;
    compared.map_err(|e| {
        ApiError::Message(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            format!("cannot compare these versions: {e}"),
        )
    })
}

/// Largest state the console compares.
const DIFF_MAX_BYTES: usize = 32 << 20;
/// How long a comparison waits for the one under way: then 503, retry.
const DIFF_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The one comparison's turn, waited for at most `wait`: past it, 503
/// with `Retry-After` (a slow comparison, or many readers asking, must not
/// pile up requests that wait without end).
async fn diff_turn(
    slot: &Arc<tokio::sync::Semaphore>,
    wait: std::time::Duration,
) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    match tokio::time::timeout(wait, slot.clone().acquire_owned()).await {
        Ok(Ok(turn)) => Ok(turn),
        Ok(Err(_)) => Err(ApiError::bad_request("the server is stopping")),
        Err(_) => Err(ApiError::RetryAfter(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            5,
            format!(
                "the console is comparing other versions (one comparison at a time): busy, retry in a few seconds (waited {} s)",
                wait.as_secs()
            ),
        )),
    }
}

/// Release the lock of `workspace` whoever holds it (admins only);
/// returns the holder removed.
pub async fn force_unlock<S: Storage>(
    app: &Arc<App<S>>,
    caller: &Caller,
    backend: &str,
    workspace: &str,
) -> Result<Option<LockInfo>, ApiError> {
    storage_of(app, caller, backend, Some(workspace))?;
    app.permit(
        caller,
        (backend, workspace),
        Role::Admin,
        Operation::ForceUnlock,
    )
    .await?;
    app.refuse_while_draining()?;
    let caller = caller.clone();
    app.change(
        backend,
        workspace,
        move |app, backend, workspace| async move {
            let target = app.target(&backend, &workspace)?;
            let mut facts = Facts::default();
            let released = crate::protocol::force_unlock(&app, &target, &mut facts).await;
            let at = (backend.as_str(), workspace.as_str());
            app.record(&caller, at, Operation::ForceUnlock, facts, &released)
                .await;
            released
        },
    )
    .await
}

/// Write version `id` back as the current state, with the next serial,
/// under a lock of its own (admins only): refused while someone holds the
/// lock, and judged by the same stale-write guard as a POST (another
/// lineage, or none where the current state has one, needs
/// allow_force_push). Returns the serial it was given.
pub async fn restore<S: Storage>(
    app: &Arc<App<S>>,
    caller: &Caller,
    backend: &str,
    workspace: &str,
    id: &str,
    who: &str,
) -> Result<u64, ApiError> {
    let storage = storage_of(app, caller, backend, Some(workspace))?;
    app.permit(
        caller,
        (backend, workspace),
        Role::Admin,
        Operation::Restore,
    )
    .await?;
    app.refuse_while_draining()?;
    let old: std::sync::Arc<[u8]> = version_bytes(storage, backend, workspace, id).await?.into();
    // Parsing and renumbering a big state is the backend's host work.
    let work = storage.host_work();
    let header = work
        .run_over(old.clone(), crate::statefile::read)
        .await
        .map_err(|e| ApiError::from_storage(backend, e.into()))?
        .map_err(|e| ApiError::bad_request(format!("version {id}: {e}; nothing was changed")))?;
    if header.kind == crate::statefile::Kind::OpenTofuEncrypted {
        return Err(ApiError::bad_request(
            "an OpenTofu-encrypted state cannot be given a new serial without OpenTofu's key; \
             restore it with `tofu state push -force`",
        ));
    }
    // A random id: nobody else (not a second admin restoring the same
    // version) can present it.
    let lock = crate::backend::own_lock(
        "wasmstate-console-restore",
        format!("restoring version {id}"),
        format!("{who}@wasmstate-console"),
    );
    let max_body = app.max_body_bytes;
    let id = id.to_string();
    let caller = caller.clone();
    app.change(backend, workspace, move |app, backend, workspace| async move {
        let target = app.target(&backend, &workspace)?;
        let mut facts = Facts {
            lock_id: Some(lock.id.clone()),
            ..Facts::default()
        };
        let restored = async {
        target
            .storage
            .lock(&workspace, lock.clone())
            .await
            .map_err(|e| target.error(e))?;
        let written = async {
            let current = crate::backend::stored_version(target.storage, &workspace)
                .await
                .map_err(|e| target.error(e))?;
            let serial = current.map_or(1, |(_, s)| s + 1);
            let renumbered = work
                .run_over(old.clone(), move |old| crate::statefile::with_serial(old, serial))
                .await
                .map_err(|e| target.error(e.into()))?
                .map_err(|e| {
                    ApiError::bad_request(format!("version {id}: {e}; nothing was changed"))
                })?;
            // What Terraform could not POST, a restore does not write either.
            if renumbered.len() > max_body {
                return Err(ApiError::Message(
                    axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "version {id} is larger than this server accepts (max_body_mib); nothing was changed"
                    ),
                ));
            }
            let facts = &mut facts;
            crate::protocol::write_unless_stale(&app, &target, Some(&lock.id), renumbered.into(), facts)
                .await
                .map(|()| serial)
        }
        .await;
        let unlocked = target.storage.unlock(&workspace, &lock.id).await;
        let serial = written?;
        unlocked.map_err(|e| target.error(e))?;
        Ok(serial)
        }
        .await;
        let at = (backend.as_str(), workspace.as_str());
        app.record(&caller, at, Operation::Restore, facts, &restored)
            .await;
        restored
    })
    .await
}

#[cfg(test)]
mod tests;
