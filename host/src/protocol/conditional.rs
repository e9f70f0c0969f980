//! The write path on storage with conditional writes (a contract 0.3.0
//! guest): head, the stale-write guard on what the head says, then a write
//! that replaces only the version judged. Two writers from one serial, on
//! any replicas, cannot both pass: the storage's compare-and-swap lets one
//! through and answers `false` to the other, which judges again what the
//! first wrote (409). So a write sent without a lock takes none, and no
//! write reads the whole stored state unless its serial and lineage lie
//! past the head's prefix.

use super::Target;
use super::error::ApiError;
use crate::audit::Facts;
use crate::backend::{Expect, Head, Storage, StorageError};
use crate::statefile;
use axum::body::Bytes;
use axum::http::StatusCode;

/// How many times a write judges again after the stored state changed
/// between its head and its write (another writer got there in between).
/// One is enough for two racers: the second finds the first's state and is
/// refused or written over it. More are only for a crowd of writers with
/// rising serials.
const ATTEMPTS: usize = 8;

/// Write `body` (parsed as `incoming`) over the stored state of `target`
/// unless the guard refuses it (409) or it is already stored (a retried
/// POST). `lock_id`: the client's lock, which the guest checks; without
/// one no lock is taken. `force` (`allow_force_push`): the guard is off
/// and the write expects nothing.
///
/// Its storage calls may run as one request's
/// ([`crate::request::as_one_request`], as the guard runs it): with a
/// guest, the head and the write then run in one instance. Between them
/// the host judges; what waits on more than that (a queue for the host's
/// work, a key service, the history on disk) gives the instance back first.
pub(super) async fn write_if_unchanged<S: Storage>(
    target: &Target<'_, S>,
    lock_id: Option<&str>,
    incoming: &statefile::Header,
    body: Bytes,
    force: bool,
    facts: &mut Facts,
) -> Result<(), ApiError> {
    let storage = target.storage;
    if force {
        return match storage
            .write_if(target.workspace, body, lock_id, Expect::Any)
            .await
        {
            Ok(true) => Ok(()),
            Ok(false) => Err(target.error(StorageError::Internal(
                "the storage refused a write that expected nothing of the stored state (a guest \
                 answering false to expect any breaks the contract)"
                    .into(),
            ))),
            Err(e) => Err(target.error(e)),
        };
    }
    for _ in 0..ATTEMPTS {
        let head = storage
            .head(target.workspace)
            .await
            .map_err(|e| target.error(e))?;
        let expect = Expect::of(head.as_ref());
        let Some((stored_version, judged)) = head_version(storage, target.workspace, head)
            .await
            .map_err(|e| target.error(e))?
        else {
            // Changed between the head and the read: head again.
            continue;
        };
        if super::judge::judge(
            target,
            incoming,
            &body,
            stored_version,
            judged.as_ref(),
            facts,
        )
        .await?
        {
            return Ok(());
        }
        if storage
            .write_if(target.workspace, body.clone(), lock_id, expect)
            .await
            .map_err(|e| target.error(e))?
        {
            return Ok(());
        }
        // Another writer changed the state since the head: judge again
        // what it wrote.
    }
    Err(ApiError::Message(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "the stored state of {}/{} changed {ATTEMPTS} times while this write was judged \
             (other writers); nothing was written; send it again",
            target.backend, target.workspace
        ),
    ))
}

/// [`crate::backend::stored_version`] from a [`Head`] already asked for
/// (`None`: no state): its prefix, or, when `lineage` and `serial` come
/// after it, the whole state read again. That read is at least as new as
/// the head, so a write expecting the head's version is refused if it
/// found something else. Also the head to judge by: `head` itself, or
/// after a read one whose prefix is the whole state read (its version
/// still the head's), so that emptiness and a repeated POST are told from
/// the same bytes as the serial. Judged by the older head, a retried POST
/// whose first try landed between the head and the read would be taken
/// for another writer's (409) instead of already stored (200). `None`:
/// the read found other bytes than the head's (changed since): head again.
async fn head_version<S: Storage>(
    storage: &S,
    workspace: &str,
    head: Option<Head>,
) -> Result<Option<(Option<(String, u64)>, Option<Head>)>, StorageError> {
    let Some(head) = head else {
        return Ok(Some((None, None)));
    };
    if let Some(version) = statefile::version_in_prefix(&head.prefix) {
        return Ok(Some((Some(version), Some(head))));
    }
    // The whole state was in the prefix, and it has no version.
    if head.prefix.len() as u64 >= head.size {
        return Ok(Some((None, Some(head))));
    }
    let Some(stored) = storage.read(workspace).await? else {
        // Gone since the head.
        return Ok(None);
    };
    let stored = Bytes::from(stored);
    // Judge the bytes read only if they are the head's: a storage naming
    // versions by content (Azure's MD5, a git blob id) gives the head's
    // version back after A → B → A, so a write judged on B would replace
    // A. Bytes that are not the head's mean it changed since: head again.
    let digest = head.digest.clone();
    let prefix_matches = stored.len() as u64 == head.size && stored.starts_with(&head.prefix);
    let (header, same) = storage
        .host_work()
        .run_over(stored.clone(), move |stored| {
            let same = prefix_matches
                && digest
                    .as_deref()
                    .is_none_or(|d| crate::digest::digest_says(d, stored) == Some(true));
            (same.then(|| statefile::read(stored).ok()).flatten(), same)
        })
        .await?;
    if !same {
        return Ok(None);
    }
    let version = header.and_then(|h| h.version().map(|(l, s)| (l.to_string(), s)));
    let read = Head {
        version: head.version,
        size: stored.len() as u64,
        digest: None,
        // No copy: the only other handle went with the host work.
        prefix: Vec::from(stored),
    };
    Ok(Some((version, Some(read))))
}

#[cfg(test)]
#[path = "conditional_tests.rs"]
mod path_tests;
