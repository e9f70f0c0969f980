//! What the TFE API says of a workspace beyond its state: tags,
//! `terraform-version`, `created-at`.
//!
//! Kept in the backend's **storage**, through its guest, as the
//! workspace's metadata document (contract 0.3.0): `{"tfe": {...}}`, the
//! other keys left as they are for other host features. Every change is a
//! read-modify-write conditional on the version read ([`Expect`]), retried
//! a few times when another writer got there first, so replicas on one
//! storage agree with no shared data directory, and deleting a workspace
//! (the guest's `delete-workspace`) takes its metadata with it.
//!
//! A storage that keeps none ([`StorageError::NoMetadata`]: a guest built
//! for a contract before 0.3.0, or one that answers so) keeps using this
//! replica's `<data_dir>/tfe/workspaces.json` ([`file`]), warned once per
//! backend. That file is also where metadata written before 0.3.0 is
//! found: it is used while the storage has none for the workspace, and
//! moved to the storage by the workspace's next change.

mod file;

use super::jsonapi::TfeError;
use crate::backend::{Expect, MAX_METADATA_BYTES, Storage, StorageError};
use crate::protocol::ApiError;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// One workspace's metadata.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub struct WorkspaceMeta {
    /// Its tags (`workspaces { tags = [...] }` selects by them).
    #[serde(default)]
    pub tags: BTreeSet<String>,
    /// What PATCH set; `latest` when unset.
    #[serde(default, alias = "terraform_version")]
    pub terraform_version: Option<String>,
    /// When it was created through the TFE door.
    #[serde(default, alias = "created_at")]
    pub created_at: Option<String>,
}

/// At most this many tags per workspace (each up to 255 bytes): about
/// 13 KiB at most, well inside a metadata document's 64 KiB.
pub const MAX_TAGS: usize = 50;

/// The key of the TFE door's part of a workspace's metadata document.
const KEY: &str = "tfe";

/// Conditional writes tried before a change gives up (409): each failed
/// one means another writer changed the document in between.
const MAX_TRIES: usize = 8;

/// Where every workspace's TFE metadata is kept.
pub struct MetaStore {
    /// The per-replica file: for storages that keep none, and metadata
    /// written before 0.3.0.
    file: Arc<file::FileStore>,
    /// Backends whose storage answered that it keeps no metadata (each
    /// warned about once).
    without: Mutex<HashSet<String>>,
}

/// Where a workspace's metadata was found.
enum Found {
    /// In the storage (`None`: it keeps none for this workspace yet).
    Stored(Option<crate::backend::Metadata>),
    /// The storage keeps none at all: in the file.
    File,
}

impl MetaStore {
    /// The metadata store; `data_dir`: where the per-replica file is
    /// (`None`: in memory only, for tests).
    pub fn open(data_dir: Option<PathBuf>) -> Self {
        MetaStore {
            file: Arc::new(file::FileStore::open(data_dir)),
            without: Mutex::new(HashSet::new()),
        }
    }

    /// At start: warn, once per backend, about a backend whose guest was
    /// built for a contract that keeps no workspace metadata.
    pub fn check<S: Storage>(&self, backend: &str, storage: &S) {
        let Some(description) = storage.describe() else {
            return;
        };
        let mut parts = description.contract.split('.').map(|p| p.parse::<u32>());
        let (major, minor) = (parts.next(), parts.next());
        if let (Some(Ok(major)), Some(Ok(minor))) = (major, minor)
            && (major, minor) < (0, 3)
        {
            self.keeps_none(
                backend,
                &format!(
                    "its guest ({}) was built for contract {}",
                    description.guest, description.contract
                ),
            );
        }
    }

    /// Remember (and say, once) that `backend`'s storage keeps no metadata.
    fn keeps_none(&self, backend: &str, why: &str) {
        let mut without = self.without.lock().unwrap_or_else(|e| e.into_inner());
        if without.insert(backend.to_string()) {
            tracing::warn!(
                backend,
                "backend {backend:?} keeps no workspace metadata in its storage ({why}): its TFE \
                 tags and terraform-version stay in this replica's <data_dir>/tfe/workspaces.json, \
                 so replicas that share no data directory each see their own; rebuild or update \
                 the guest for contract 0.3.0 to keep them in the storage"
            );
        }
    }

    fn without(&self, backend: &str) -> bool {
        let without = self.without.lock().unwrap_or_else(|e| e.into_inner());
        without.contains(backend)
    }

    async fn find<S: Storage>(
        &self,
        storage: &S,
        backend: &str,
        workspace: &str,
    ) -> Result<Found, TfeError> {
        if self.without(backend) {
            return Ok(Found::File);
        }
        match storage.read_metadata(workspace).await {
            Ok(found) => Ok(Found::Stored(found)),
            Err(StorageError::NoMetadata(why)) => {
                self.keeps_none(backend, &why);
                Ok(Found::File)
            }
            Err(e) => Err(ApiError::from_storage(backend, e).into()),
        }
    }

    /// `backend`/`workspace`'s metadata (empty when none is kept).
    pub async fn get<S: Storage>(
        &self,
        storage: &S,
        backend: &str,
        workspace: &str,
    ) -> Result<WorkspaceMeta, TfeError> {
        Ok(match self.find(storage, backend, workspace).await? {
            Found::Stored(Some(stored)) => match document(&stored.content) {
                Ok(doc) => tfe_part(&doc),
                Err(e) => {
                    tracing::warn!(backend, workspace, "{e}; its TFE tags are shown empty");
                    WorkspaceMeta::default()
                }
            },
            // Not in the storage yet: what the file kept before 0.3.0.
            Found::Stored(None) | Found::File => self.file.get(backend, workspace),
        })
    }

    /// Change `backend`/`workspace`'s metadata with `change` (applied
    /// again to what is there when another writer changed it meanwhile);
    /// nothing changes when it would leave more than [`MAX_TAGS`] tags
    /// (422), or when saving fails.
    pub async fn update<S: Storage>(
        &self,
        storage: &S,
        backend: &str,
        workspace: &str,
        change: impl Fn(&mut WorkspaceMeta) + Send + 'static,
    ) -> Result<WorkspaceMeta, TfeError> {
        for attempt in 0..MAX_TRIES {
            let (mut doc, mut meta, expect, from_file) = match self
                .find(storage, backend, workspace)
                .await?
            {
                Found::File => {
                    let changed = self
                        .file
                        .update(backend, workspace, move |meta| change(meta))
                        .await;
                    return changed.map_err(file_error);
                }
                Found::Stored(Some(stored)) => {
                    let doc = document(&stored.content).map_err(|e| {
                        TfeError::new(
                            StatusCode::BAD_GATEWAY,
                            format!("{e}; nothing was changed (fix or remove it in the storage)"),
                        )
                    })?;
                    let meta = tfe_part(&doc);
                    (doc, meta, Expect::Version(stored.version), false)
                }
                // Gone since the last try, whose write it defeated: most
                // likely deleted. Looked at before writing afresh, as a
                // guest keeping metadata in the workspace's own directory
                // would make the workspace again with it.
                Found::Stored(None)
                    if attempt > 0 && !self.still_there(storage, workspace).await =>
                {
                    return Err(self.refuse_as_deleted(storage, backend, workspace).await);
                }
                Found::Stored(None) => {
                    let old = self.file.find(backend, workspace);
                    let from_file = old.is_some();
                    (
                        Map::new(),
                        old.unwrap_or_default(),
                        Expect::Absent,
                        from_file,
                    )
                }
            };
            change(&mut meta);
            check_count(&meta)?;
            doc.insert(
                KEY.into(),
                serde_json::to_value(&meta).expect("metadata serialises"),
            );
            let content = encode(&doc)?;
            let written = match storage
                .write_metadata(workspace, Some(content), expect)
                .await
            {
                Ok(written) => written,
                // A storage that found the workspace gone under its write
                // (the templates' "deleted meanwhile") stored nothing: the
                // same 404 as a retry that finds it gone, not a 503 whose
                // retry would answer it. Only the storage's own
                // unavailability: a key service's or an overload's is not
                // about the workspace.
                Err(StorageError::Unavailable(_))
                    if !self.still_there(storage, workspace).await =>
                {
                    return Err(self.refuse_as_deleted(storage, backend, workspace).await);
                }
                Err(e) => return Err(ApiError::from_storage(backend, e).into()),
            };
            if written {
                if from_file {
                    self.forget_file(backend, workspace).await;
                }
                // A delete (at either door, on any replica) may have come
                // between the caller's look at the workspace and this
                // write: its metadata must not outlive it, or a workspace
                // created again by that name (at the http door, by a state
                // push) would come back with these tags.
                if !self.still_there(storage, workspace).await {
                    return Err(self.refuse_as_deleted(storage, backend, workspace).await);
                }
                return Ok(meta);
            }
        }
        Err(TfeError::conflict(format!(
            "the metadata of workspace {backend}/{workspace} kept changing under this change \
             ({MAX_TRIES} tries); nothing was changed: try again"
        )))
    }

    /// A workspace just created through the TFE door gets `meta`, nothing
    /// of any earlier one: written only where the storage has none (its
    /// `delete-workspace` removed the last one's), so a delete racing this
    /// create on another replica cannot erase the fresh tags.
    pub async fn create<S: Storage>(
        &self,
        storage: &S,
        backend: &str,
        workspace: &str,
        meta: WorkspaceMeta,
    ) -> Result<WorkspaceMeta, TfeError> {
        check_count(&meta)?;
        if !self.without(backend) {
            let mut doc = Map::new();
            doc.insert(
                KEY.into(),
                serde_json::to_value(&meta).expect("metadata serialises"),
            );
            let content = encode(&doc)?;
            match storage
                .write_metadata(workspace, Some(content), Expect::Absent)
                .await
            {
                Ok(true) => {
                    self.forget_file(backend, workspace).await;
                    return Ok(meta);
                }
                // Left by a writer that lost a race with the delete: the
                // TFE part is replaced, other keys kept.
                Ok(false) => {}
                Err(StorageError::NoMetadata(why)) => self.keeps_none(backend, &why),
                Err(e) => return Err(ApiError::from_storage(backend, e).into()),
            }
        }
        // Replaced where it is kept: in the storage (what `update` moves
        // from the file), or in the file when the storage keeps none.
        let fresh = meta.clone();
        self.update(storage, backend, workspace, move |m| *m = fresh.clone())
            .await
    }

    /// After a workspace was deleted (at either door): its metadata goes.
    /// The storage's went with the workspace (the guest's
    /// `delete-workspace`); when a delete left the workspace gone but its
    /// metadata behind (`DELETE /states/...` where a workspace is its state,
    /// as on `s3-lockfile`), it is removed here, only if it is still the
    /// version read before the workspace was seen gone, so a create
    /// racing this keeps its fresh tags.
    pub async fn forget_if_gone<S: Storage>(&self, storage: &S, backend: &str, workspace: &str) {
        let stored = match self.find(storage, backend, workspace).await {
            Ok(Found::Stored(stored)) => stored,
            Ok(Found::File) => None,
            Err(_) => return,
        };
        let gone = storage
            .list_workspaces()
            .await
            .is_ok_and(|names| !names.iter().any(|n| n == workspace));
        if !gone {
            return;
        }
        if let Some(stored) = stored
            && let Err(e) = storage
                .write_metadata(workspace, None, Expect::Version(stored.version))
                .await
        {
            tracing::warn!(backend, workspace, error = %e, "workspace deleted; removing its TFE metadata failed");
        }
        self.forget_file(backend, workspace).await;
    }

    /// The answer to a change of a workspace found deleted meanwhile,
    /// after forgetting what this change or an earlier one left of it.
    async fn refuse_as_deleted<S: Storage>(
        &self,
        storage: &S,
        backend: &str,
        workspace: &str,
    ) -> TfeError {
        self.forget_if_gone(storage, backend, workspace).await;
        deleted_meanwhile(backend, workspace)
    }

    /// Whether `workspace` still exists (when the storage cannot say:
    /// taken as there, the caller saw it a moment ago).
    async fn still_there<S: Storage>(&self, storage: &S, workspace: &str) -> bool {
        storage
            .list_workspaces()
            .await
            .map_or(true, |names| names.iter().any(|n| n == workspace))
    }

    /// After a workspace was deleted through the TFE door: the file's
    /// entry goes (the storage's went with the workspace).
    pub async fn deleted(&self, backend: &str, workspace: &str) {
        self.forget_file(backend, workspace).await;
    }

    async fn forget_file(&self, backend: &str, workspace: &str) {
        if self.file.find(backend, workspace).is_some()
            && let Err(e) = self.file.remove(backend, workspace).await
        {
            tracing::warn!(backend, workspace, error = %e, "forgetting a workspace's TFE tags in the data directory failed");
        }
    }
}

/// A stored metadata document: a JSON object.
fn document(content: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str::<Value>(content) {
        Ok(Value::Object(doc)) => Ok(doc),
        _ => Err("the workspace's metadata in the storage is not a JSON object".into()),
    }
}

/// The TFE door's part of a document (empty when it has none or it is
/// not one).
fn tfe_part(doc: &Map<String, Value>) -> WorkspaceMeta {
    doc.get(KEY)
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default()
}

fn encode(doc: &Map<String, Value>) -> Result<String, TfeError> {
    let content = serde_json::to_string(doc).expect("metadata serialises");
    if content.len() > MAX_METADATA_BYTES {
        return Err(TfeError::invalid(format!(
            "the workspace's metadata would exceed {} KiB; remove some tags (nothing was changed)",
            MAX_METADATA_BYTES >> 10
        )));
    }
    Ok(content)
}

/// The answer to a change of a workspace deleted while it was made.
fn deleted_meanwhile(backend: &str, workspace: &str) -> TfeError {
    TfeError::not_found(format!(
        "workspace {backend}/{workspace} was deleted meanwhile; nothing of this change was kept"
    ))
}

fn check_count(meta: &WorkspaceMeta) -> Result<(), TfeError> {
    if meta.tags.len() > MAX_TAGS {
        return Err(TfeError::invalid(format!(
            "a workspace has at most {MAX_TAGS} tags; remove some first (nothing was changed)"
        )));
    }
    Ok(())
}

fn file_error(e: std::io::Error) -> TfeError {
    if e.kind() == std::io::ErrorKind::InvalidInput {
        return TfeError::invalid(e.to_string());
    }
    TfeError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("cannot save the workspace's tags in the data directory: {e}"),
    )
}

#[cfg(test)]
mod tests;
