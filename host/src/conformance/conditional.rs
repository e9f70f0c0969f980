//! Contract 0.3.0's cases: `head` agrees with `read`, a conditional write
//! is the storage's own compare-and-swap (a stale or absent expectation
//! answers `false` and changes nothing; of writers expecting one version
//! exactly one succeeds), and workspace metadata round-trips, is replaced
//! only as expected and goes with its workspace. A guest built for an
//! older contract skips them, saying why; one whose storage keeps no
//! metadata passes the metadata cases with a note.

use super::steps::{ensure, lock, state, step, unperiodic};
use crate::backend::{Expect, Storage, StorageError};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// `Ok(Some(note))`: passed, with something to say.
pub(super) type Checked = Result<Option<String>, String>;

type CaseFuture = Pin<Box<dyn Future<Output = Checked> + Send>>;

/// One named case of contract 0.3.0.
pub(super) struct Case<S> {
    /// What it checks.
    pub name: &'static str,
    /// The check.
    pub run: fn(Arc<S>, String) -> CaseFuture,
}

macro_rules! cases {
    ($($name:literal => $f:ident),* $(,)?) => {
        /// Every case of contract 0.3.0, in the order run.
        pub(super) fn all<S: Storage>() -> Vec<Case<S>> {
            vec![$(Case { name: $name, run: |s, ws| Box::pin($f(s, ws)) }),*]
        }
    };
}

cases! {
    "head agrees with read: size, first bytes, digest, a new version per write" => head_agrees,
    "a write expecting a stale version answers false and changes nothing" => stale_expectation,
    "a write expecting no state answers false over a state" => absent_expectation,
    "a second write with the expectation a successful write used fails" => used_expectation,
    "parallel conditional writers from one version: exactly one wins" => parallel_writers,
    "a conditional write still honours the lock" => conditional_write_under_lock,
    "workspace metadata round-trips and is replaced only as expected" => metadata_round_trip,
    "deleting a workspace removes its metadata" => metadata_goes_with_workspace,
}

/// Why a guest skips these cases.
pub(super) const SKIPPED: &str =
    "the guest is built for a contract before 0.3.0 (no head, conditional write or metadata)";

/// The stored version, from a head that must find a state.
async fn version<S: Storage>(s: &S, ws: &str, what: &str) -> Result<String, String> {
    match step(what, s.head(ws)).await? {
        Some(head) => Ok(head.version),
        None => Err(format!("{what}: head answered none after a write")),
    }
}

async fn read_is<S: Storage>(s: &S, ws: &str, bytes: &[u8], why: &str) -> Result<(), String> {
    let got = step("read", s.read(ws)).await?;
    ensure(got.as_deref() == Some(bytes), || why.to_string())
}

async fn head_agrees<S: Storage>(s: Arc<S>, ws: String) -> Checked {
    let none = step("head of a workspace without a state", s.head(&ws)).await?;
    ensure(none.is_none(), || {
        "head of a workspace without a state answered a head, not none".into()
    })?;
    // Past the prefix the host reads, so the prefix must stop early.
    let bytes = unperiodic(crate::statefile::PREFIX_BYTES * 3 / 2);
    step("write", s.write(&ws, bytes.clone(), None)).await?;
    let Some(head) = step("head", s.head(&ws)).await? else {
        return Err("head answered none for a workspace with a state".into());
    };
    ensure(head.size == bytes.len() as u64, || {
        format!(
            "head says {} bytes; the state written has {}",
            head.size,
            bytes.len()
        )
    })?;
    let least = bytes.len().min(MIN_PREFIX);
    ensure(
        head.prefix.len() >= least && bytes.starts_with(&head.prefix),
        || {
            format!(
                "head wrote {} bytes into its prefix that are not the state's first bytes (or \
                 fewer than {least}): write the state's beginning into the sink until it \
                 answers false",
                head.prefix.len()
            )
        },
    )?;
    if let Some(digest) = &head.digest {
        match crate::digest::digest_says(digest, &bytes) {
            Some(true) => {}
            Some(false) => {
                return Err(format!(
                    "head's digest {digest:?} is not the digest of the stored bytes"
                ));
            }
            None => {
                return Err(format!(
                    "head's digest {digest:?} is not md5:<hex>, sha256:<hex> or git-blob:<hex> \
                     (give none when the storage keeps none)"
                ));
            }
        }
    }
    read_is(&*s, &ws, &bytes, "read does not return what head describes").await?;
    let mut other = bytes.to_vec();
    other[0] ^= 1;
    step("second write", s.write(&ws, other.into(), None)).await?;
    let after = version(&*s, &ws, "head after the second write").await?;
    ensure(after != head.version, || {
        format!("head's version {after:?} did not change when other bytes were written over it")
    })?;
    Ok(None)
}

/// The least of a state's first bytes a head must give (when the state
/// has them): Terraform and OpenTofu put `serial` and `lineage` in the
/// first 120 or so, and the host reads whole what a short prefix leaves
/// out. Small, because a cloud guest's head bytes are read (and billed) on
/// top of Terraform's own read of the state in every apply.
const MIN_PREFIX: usize = 256;

async fn stale_expectation<S: Storage>(s: Arc<S>, ws: String) -> Checked {
    step("first write", s.write(&ws, state("first"), None)).await?;
    let stale = version(&*s, &ws, "head").await?;
    step("second write", s.write(&ws, state("second"), None)).await?;
    let written = step(
        "a write expecting the first write's version",
        s.write_if(&ws, state("late"), None, Expect::Version(stale)),
    )
    .await?;
    ensure(!written, || {
        "a write expecting a replaced version answered true".into()
    })?;
    read_is(
        &*s,
        &ws,
        &state("second"),
        "a write answered false changed the state",
    )
    .await?;
    Ok(None)
}

async fn absent_expectation<S: Storage>(s: Arc<S>, ws: String) -> Checked {
    let first = step(
        "a write expecting no state, onto none",
        s.write_if(&ws, state("first"), None, Expect::Absent),
    )
    .await?;
    ensure(first, || {
        "a write expecting no state answered false where there was none".into()
    })?;
    let again = step(
        "a write expecting no state, over one",
        s.write_if(&ws, state("second"), None, Expect::Absent),
    )
    .await?;
    ensure(!again, || {
        "a write expecting no state answered true over a state".into()
    })?;
    read_is(
        &*s,
        &ws,
        &state("first"),
        "a write answered false changed the state",
    )
    .await?;
    Ok(None)
}

async fn used_expectation<S: Storage>(s: Arc<S>, ws: String) -> Checked {
    step("write", s.write(&ws, state("base"), None)).await?;
    let base = version(&*s, &ws, "head").await?;
    let won = step(
        "a write expecting the head's version",
        s.write_if(&ws, state("winner"), None, Expect::Version(base.clone())),
    )
    .await?;
    ensure(won, || {
        "a write expecting the current version answered false".into()
    })?;
    let lost = step(
        "a second write with the same expectation",
        s.write_if(&ws, state("loser"), None, Expect::Version(base)),
    )
    .await?;
    ensure(!lost, || {
        "a second write expecting the version the first replaced answered true: two writers \
         from one version both succeeded"
            .into()
    })?;
    read_is(
        &*s,
        &ws,
        &state("winner"),
        "the losing write changed the state",
    )
    .await?;
    Ok(None)
}

const RACERS: usize = 6;
const RACES: usize = 3;

async fn parallel_writers<S: Storage>(s: Arc<S>, ws: String) -> Checked {
    step("write", s.write(&ws, state("base"), None)).await?;
    for race in 0..RACES {
        let from = version(&*s, &ws, "head").await?;
        let mut tasks = tokio::task::JoinSet::new();
        for racer in 0..RACERS {
            let (s, ws, from) = (s.clone(), ws.clone(), from.clone());
            let bytes = state(&format!("race {race} racer {racer}"));
            tasks.spawn(async move {
                let written = s.write_if(&ws, bytes.clone(), None, Expect::Version(from));
                (written.await, bytes)
            });
        }
        let mut winners = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            match joined.map_err(|e| e.to_string())? {
                (Ok(true), bytes) => winners.push(bytes),
                // A transient refusal writes nothing either.
                (Ok(false) | Err(StorageError::Unavailable(_)), _) => {}
                (Err(e), _) => return Err(format!("race {race}: write: {e}")),
            }
        }
        let [winner] = winners.as_slice() else {
            return Err(format!(
                "race {race}: {} of {RACERS} writers expecting one version succeeded",
                winners.len()
            ));
        };
        read_is(
            &*s,
            &ws,
            winner,
            "the stored state is not the one write that succeeded",
        )
        .await?;
    }
    Ok(None)
}

async fn conditional_write_under_lock<S: Storage>(s: Arc<S>, ws: String) -> Checked {
    step("write", s.write(&ws, state("base"), None)).await?;
    let base = version(&*s, &ws, "head").await?;
    step("lock", s.lock(&ws, lock("holder"))).await?;
    match s
        .write_if(&ws, state("intruder"), None, Expect::Version(base.clone()))
        .await
    {
        Err(StorageError::Locked(h)) if h.id == "holder" => {}
        other => {
            return Err(format!(
                "a conditional write without the holder's ID returned {other:?}, expected \
                 locked(holder)"
            ));
        }
    }
    let written = step(
        "a conditional write with the holder's ID",
        s.write_if(&ws, state("holder"), Some("holder"), Expect::Version(base)),
    )
    .await?;
    ensure(written, || {
        "the holder's write expecting the current version answered false".into()
    })?;
    read_is(
        &*s,
        &ws,
        &state("holder"),
        "the holder's write is not stored",
    )
    .await?;
    step("unlock", s.unlock(&ws, "holder")).await?;
    Ok(None)
}

/// A storage without metadata passes the metadata cases with this note.
fn no_metadata(why: &str) -> Checked {
    Ok(Some(format!(
        "this storage keeps no metadata ({why}); the host keeps it per replica"
    )))
}

async fn metadata_round_trip<S: Storage>(s: Arc<S>, ws: String) -> Checked {
    step("create", s.create_workspace(&ws)).await?;
    match s.read_metadata(&ws).await {
        Err(StorageError::NoMetadata(why)) => return no_metadata(&why),
        Err(e) => return Err(format!("read-metadata of a new workspace: {e}")),
        Ok(Some(m)) => {
            return Err(format!(
                "a new workspace has metadata {:?}; it must have none",
                m.content
            ));
        }
        Ok(None) => {}
    }
    let first = r#"{"tags":["ck"]}"#.to_string();
    let set = step(
        "write-metadata expecting none",
        s.write_metadata(&ws, Some(first.clone()), Expect::Absent),
    )
    .await?;
    ensure(set, || {
        "write-metadata expecting none answered false where there was none".into()
    })?;
    let Some(kept) = step("read-metadata", s.read_metadata(&ws)).await? else {
        return Err("read-metadata answered none after a write".into());
    };
    ensure(kept.content == first, || {
        format!("read-metadata returned {:?}, not {first:?}", kept.content)
    })?;
    let over = step(
        "write-metadata expecting none, over some",
        s.write_metadata(&ws, Some("{}".into()), Expect::Absent),
    )
    .await?;
    ensure(!over, || {
        "write-metadata expecting none answered true over metadata".into()
    })?;
    let second = r#"{"tags":["ck","second"]}"#.to_string();
    let replaced = step(
        "write-metadata expecting the read version",
        s.write_metadata(
            &ws,
            Some(second.clone()),
            Expect::Version(kept.version.clone()),
        ),
    )
    .await?;
    ensure(replaced, || {
        "write-metadata expecting the current version answered false".into()
    })?;
    let stale = step(
        "write-metadata expecting the replaced version",
        s.write_metadata(&ws, Some("{}".into()), Expect::Version(kept.version)),
    )
    .await?;
    ensure(!stale, || {
        "write-metadata expecting a replaced version answered true".into()
    })?;
    let now = step("read-metadata", s.read_metadata(&ws)).await?;
    ensure(now.as_ref().map(|m| &m.content) == Some(&second), || {
        format!(
            "metadata is {:?} after a refused write; expected {second:?}",
            now.as_ref().map(|m| &m.content)
        )
    })?;
    let removed = step("remove metadata", s.write_metadata(&ws, None, Expect::Any)).await?;
    ensure(removed, || "removing metadata answered false".into())?;
    let gone = step("read-metadata after removal", s.read_metadata(&ws)).await?;
    ensure(gone.is_none(), || {
        "metadata is still there after removal".into()
    })?;
    let again = step(
        "remove metadata that is not there",
        s.write_metadata(&ws, None, Expect::Any),
    )
    .await?;
    ensure(again, || {
        "removing metadata that is not there answered false; it must succeed".into()
    })?;
    Ok(None)
}

async fn metadata_goes_with_workspace<S: Storage>(s: Arc<S>, ws: String) -> Checked {
    step("create", s.create_workspace(&ws)).await?;
    match s
        .write_metadata(&ws, Some(r#"{"doomed":true}"#.into()), Expect::Any)
        .await
    {
        Err(StorageError::NoMetadata(why)) => return no_metadata(&why),
        Err(e) => return Err(format!("write-metadata: {e}")),
        Ok(written) => ensure(written, || {
            "write-metadata expecting any answered false".into()
        })?,
    }
    step("delete the workspace", s.delete_workspace(&ws)).await?;
    let left = step("read-metadata after the delete", s.read_metadata(&ws)).await?;
    ensure(left.is_none(), || {
        "the metadata survived its workspace's deletion".into()
    })?;
    Ok(None)
}
