//! The cases. Each takes the storage and a workspace of its own, and returns
//! `Err` with a one-line reason when the storage misbehaves.

use super::history::kept_versions;
use super::rules::{created_workspace_is_empty, repeated_write, write_creates_workspace};
use super::steps::{ensure, expect_round_trip, lock, state, step, unperiodic};
use crate::backend::{Storage, StorageError};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

type CaseFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// One named case.
pub struct Case<S> {
    /// What it checks.
    pub name: &'static str,
    /// The check.
    pub run: fn(Arc<S>, String) -> CaseFuture,
}

macro_rules! cases {
    ($($name:literal => $f:ident),* $(,)?) => {
        /// Every case, in the order run.
        pub fn all<S: Storage>() -> Vec<Case<S>> {
            vec![$(Case { name: $name, run: |s, ws| Box::pin($f(s, ws)) }),*]
        }
    };
}

cases! {
    "read of a missing workspace returns no state" => read_missing,
    "write then read returns the same bytes" => round_trip,
    "binary, non-UTF-8 state round-trips byte for byte" => binary_round_trip,
    "a 10 MiB state round-trips" => large_round_trip,
    "a read the host stops early ends cleanly" => stopped_read,
    "overwrite replaces the state" => overwrite,
    "delete removes the state; deleting again succeeds" => delete,
    "a second lock is refused and names the holder" => lock_exclusive,
    "locking again with the holder's ID succeeds (safe retry)" => lock_retry,
    "unlock with a wrong ID is refused and names the holder" => unlock_wrong_id,
    "unlocking an unlocked workspace succeeds (safe retry)" => unlock_unlocked,
    "force-unlock releases any holder and returns it" => force_unlock,
    "the holder reads and writes while keeping the lock" => holder_keeps_lock,
    "writes and deletes without the holder's ID are refused while locked" => foreign_writes_refused,
    "a write with a lock ID when nothing is locked is refused" => write_after_lock_lost,
    "workspaces are created, listed and deleted" => workspace_lifecycle,
    "a locked workspace cannot be deleted" => locked_workspace_delete,
    "parallel lockers: exactly one wins each round" => parallel_lockers,
    "parallel increments lose no update" => parallel_increments,
    "kept versions list each write newest first and read back" => kept_versions,
    "a write creates its workspace, which is then listed" => write_creates_workspace,
    "a created workspace holds no state, or an empty one" => created_workspace_is_empty,
    "a write repeated under the same lock succeeds (safe retry)" => repeated_write,
}

fn holder_of(result: Result<(), StorageError>, expected: &str, what: &str) -> Result<(), String> {
    match result {
        Err(StorageError::Locked(h)) | Err(StorageError::LockMismatch(Some(h)))
            if h.id == expected =>
        {
            Ok(())
        }
        Err(StorageError::Locked(h)) | Err(StorageError::LockMismatch(Some(h))) => Err(format!(
            "{what}: refused, but names holder {:?} instead of {expected:?}",
            h.id
        )),
        Ok(()) => Err(format!("{what}: succeeded; it must be refused")),
        Err(e) => Err(format!("{what}: refused with the wrong error: {e}")),
    }
}

async fn read_missing<S: Storage>(s: Arc<S>, ws: String) -> Result<(), String> {
    let got = step("read", s.read(&ws)).await?;
    ensure(got.is_none(), || {
        format!("read returned {} bytes", got.map_or(0, |g| g.len()))
    })
}

async fn round_trip<S: Storage>(s: Arc<S>, ws: String) -> Result<(), String> {
    expect_round_trip(&*s, &ws, state("hello")).await
}

async fn binary_round_trip<S: Storage>(s: Arc<S>, ws: String) -> Result<(), String> {
    let bytes: Vec<u8> = (0..=255u8)
        .cycle()
        .take(70_000)
        .chain([0xff, 0xfe, 0x00, 0xc3])
        .collect();
    expect_round_trip(&*s, &ws, bytes.into()).await
}

async fn large_round_trip<S: Storage>(s: Arc<S>, ws: String) -> Result<(), String> {
    expect_round_trip(&*s, &ws, unperiodic(10 << 20)).await
}

/// The host reads only the beginning of a state to check its serial, and
/// compares a retried write with the stored state as it streams: a guest
/// must stop writing when the host says so, and still succeed.
async fn stopped_read<S: Storage>(s: Arc<S>, ws: String) -> Result<(), String> {
    let bytes = unperiodic(3 << 20);
    step("write", s.write(&ws, bytes.clone(), None)).await?;
    let prefix = step("read of the first 1000 bytes", s.read_prefix(&ws, 1000)).await?;
    ensure(prefix.as_deref() == Some(&bytes[..1000]), || {
        format!(
            "a read stopped after 1000 bytes returned {} bytes, not the state's first 1000",
            prefix.as_ref().map_or(0, Vec::len)
        )
    })?;
    let same = step("comparing with the same bytes", s.holds(&ws, &bytes)).await?;
    ensure(same, || {
        "the stored state did not compare equal to the bytes written".into()
    })?;
    let mut other = bytes.to_vec();
    other[2 << 20] ^= 1;
    let differs = step("comparing with other bytes", s.holds(&ws, &other.into())).await?;
    ensure(!differs, || {
        "the stored state compared equal to bytes differing at one byte".into()
    })
}

async fn overwrite<S: Storage>(s: Arc<S>, ws: String) -> Result<(), String> {
    step("first write", s.write(&ws, state("first"), None)).await?;
    expect_round_trip(&*s, &ws, state("second, longer than the first")).await?;
    expect_round_trip(&*s, &ws, state("3")).await
}

async fn delete<S: Storage>(s: Arc<S>, ws: String) -> Result<(), String> {
    step("write", s.write(&ws, state("doomed"), None)).await?;
    step("delete", s.delete(&ws, None)).await?;
    let got = step("read after delete", s.read(&ws)).await?;
    ensure(got.is_none(), || {
        "the state is still there after delete".into()
    })?;
    step("second delete", s.delete(&ws, None)).await
}

async fn lock_exclusive<S: Storage>(s: Arc<S>, ws: String) -> Result<(), String> {
    step("first lock", s.lock(&ws, lock("first"))).await?;
    holder_of(s.lock(&ws, lock("second")).await, "first", "second lock")?;
    let current = step("current lock", s.current_lock(&ws)).await?;
    ensure(current.as_ref().is_some_and(|h| h.id == "first"), || {
        format!("current lock is {current:?}, expected the first holder")
    })
}

async fn lock_retry<S: Storage>(s: Arc<S>, ws: String) -> Result<(), String> {
    step("lock", s.lock(&ws, lock("retry"))).await?;
    step("the same lock again", s.lock(&ws, lock("retry"))).await?;
    holder_of(s.lock(&ws, lock("other")).await, "retry", "another lock")
}

async fn unlock_wrong_id<S: Storage>(s: Arc<S>, ws: String) -> Result<(), String> {
    step("lock", s.lock(&ws, lock("owner"))).await?;
    holder_of(
        s.unlock(&ws, "intruder").await,
        "owner",
        "unlock with a wrong ID",
    )?;
    holder_of(
        s.lock(&ws, lock("intruder")).await,
        "owner",
        "lock after the refused unlock",
    )?;
    step("unlock with the right ID", s.unlock(&ws, "owner")).await
}

async fn unlock_unlocked<S: Storage>(s: Arc<S>, ws: String) -> Result<(), String> {
    step("lock", s.lock(&ws, lock("once"))).await?;
    step("unlock", s.unlock(&ws, "once")).await?;
    step("unlock again", s.unlock(&ws, "once")).await?;
    step("lock by someone else afterwards", s.lock(&ws, lock("next"))).await
}

async fn force_unlock<S: Storage>(s: Arc<S>, ws: String) -> Result<(), String> {
    step("lock", s.lock(&ws, lock("stale"))).await?;
    let released = step("force-unlock", s.force_unlock(&ws)).await?;
    ensure(released.as_ref().is_some_and(|h| h.id == "stale"), || {
        format!("force-unlock returned {released:?}, expected the holder")
    })?;
    step("lock after force-unlock", s.lock(&ws, lock("fresh"))).await
}

async fn holder_keeps_lock<S: Storage>(s: Arc<S>, ws: String) -> Result<(), String> {
    step("lock", s.lock(&ws, lock("holder"))).await?;
    step(
        "write with the holder's ID",
        s.write(&ws, state("mine"), Some("holder")),
    )
    .await?;
    let got = step("read", s.read(&ws)).await?;
    ensure(got.as_deref() == Some(&state("mine")[..]), || {
        "read did not return the holder's write".into()
    })?;
    step(
        "second write with the holder's ID",
        s.write(&ws, state("mine again"), Some("holder")),
    )
    .await?;
    holder_of(
        s.lock(&ws, lock("other")).await,
        "holder",
        "lock by another after the writes",
    )
}

async fn foreign_writes_refused<S: Storage>(s: Arc<S>, ws: String) -> Result<(), String> {
    step("write", s.write(&ws, state("original"), None)).await?;
    step("lock", s.lock(&ws, lock("holder"))).await?;
    holder_of(
        s.write(&ws, state("no id"), None).await,
        "holder",
        "write without an ID",
    )?;
    holder_of(
        s.write(&ws, state("wrong id"), Some("other")).await,
        "holder",
        "write with a wrong ID",
    )?;
    holder_of(s.delete(&ws, None).await, "holder", "delete without an ID")?;
    let got = step("read", s.read(&ws)).await?;
    ensure(got.as_deref() == Some(&state("original")[..]), || {
        "a refused write changed the state".into()
    })
}

async fn write_after_lock_lost<S: Storage>(s: Arc<S>, ws: String) -> Result<(), String> {
    step("write", s.write(&ws, state("original"), None)).await?;
    match s.write(&ws, state("late"), Some("gone")).await {
        Err(StorageError::LockMismatch(None)) => {}
        Ok(()) => return Err("write with a stale lock ID succeeded".into()),
        Err(e) => {
            return Err(format!(
                "refused with the wrong error: {e} (expected lock-mismatch(none))"
            ));
        }
    }
    let got = step("read", s.read(&ws)).await?;
    ensure(got.as_deref() == Some(&state("original")[..]), || {
        "the refused write changed the state".into()
    })
}

async fn workspace_lifecycle<S: Storage>(s: Arc<S>, ws: String) -> Result<(), String> {
    let created = step("create", s.create_workspace(&ws)).await?;
    ensure(created, || {
        "create of a new workspace returned false".into()
    })?;
    let again = step("create again", s.create_workspace(&ws)).await?;
    ensure(!again, || {
        "create of an existing workspace returned true".into()
    })?;
    let listed = step("list", s.list_workspaces()).await?;
    ensure(listed.contains(&ws), || {
        format!("list {listed:?} lacks {ws:?}")
    })?;
    step("write", s.write(&ws, state("in workspace"), None)).await?;
    step("delete", s.delete_workspace(&ws)).await?;
    let listed = step("list after delete", s.list_workspaces()).await?;
    ensure(!listed.contains(&ws), || {
        format!("list {listed:?} still has {ws:?}")
    })?;
    let got = step("read after delete", s.read(&ws)).await?;
    ensure(got.is_none(), || {
        "the state survived its workspace's deletion".into()
    })?;
    match s.delete_workspace(&ws).await {
        Err(StorageError::NotFound) => Ok(()),
        other => Err(format!(
            "deleting a missing workspace returned {other:?}, expected not-found"
        )),
    }
}

async fn locked_workspace_delete<S: Storage>(s: Arc<S>, ws: String) -> Result<(), String> {
    step("create", s.create_workspace(&ws)).await?;
    step("write", s.write(&ws, state("keep"), None)).await?;
    step("lock", s.lock(&ws, lock("holder"))).await?;
    match s.delete_workspace(&ws).await {
        Err(StorageError::Locked(h)) if h.id == "holder" => {}
        other => {
            return Err(format!(
                "delete of a locked workspace returned {other:?}, expected locked(holder)"
            ));
        }
    }
    let got = step("read", s.read(&ws)).await?;
    ensure(got.as_deref() == Some(&state("keep")[..]), || {
        "the refused delete lost the state".into()
    })
}

const ROUNDS: usize = 5;
const LOCKERS: usize = 8;

async fn parallel_lockers<S: Storage>(s: Arc<S>, ws: String) -> Result<(), String> {
    for round in 0..ROUNDS {
        let mut tasks = tokio::task::JoinSet::new();
        for locker in 0..LOCKERS {
            let (s, ws) = (s.clone(), ws.clone());
            let id = format!("r{round}-l{locker}");
            tasks.spawn(async move { (s.lock(&ws, lock(&id)).await, id) });
        }
        let mut winners = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            match joined.map_err(|e| e.to_string())? {
                (Ok(()), id) => winners.push(id),
                // Unavailable is a transient refusal a client retries.
                (Err(StorageError::Locked(_) | StorageError::Unavailable(_)), _) => {}
                (Err(e), id) => return Err(format!("round {round}: lock {id}: {e}")),
            }
        }
        let [winner] = winners.as_slice() else {
            return Err(format!(
                "round {round}: {} lockers won: {winners:?}",
                winners.len()
            ));
        };
        step("unlock by the winner", s.unlock(&ws, winner)).await?;
    }
    Ok(())
}

const WORKERS: usize = 4;
const INCREMENTS: usize = 5;

async fn increment<S: Storage>(s: &S, ws: &str, id: &str) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match s.lock(ws, lock(id)).await {
            Ok(()) => break,
            Err(StorageError::Locked(_) | StorageError::Unavailable(_))
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::task::yield_now().await;
            }
            Err(e) => return Err(format!("lock {id}: {e}")),
        }
    }
    let current = match step("read", s.read(ws)).await? {
        None => 0,
        Some(bytes) => String::from_utf8_lossy(&bytes)
            .trim()
            .parse::<u64>()
            .map_err(|e| format!("counter is not a number: {e}"))?,
    };
    step(
        "write",
        s.write(ws, (current + 1).to_string().into(), Some(id)),
    )
    .await?;
    step("unlock", s.unlock(ws, id)).await
}

async fn parallel_increments<S: Storage>(s: Arc<S>, ws: String) -> Result<(), String> {
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..WORKERS {
        let (s, ws) = (s.clone(), ws.clone());
        tasks.spawn(async move {
            for i in 0..INCREMENTS {
                increment(&*s, &ws, &format!("w{worker}-{i}")).await?;
            }
            Ok::<(), String>(())
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| e.to_string())??;
    }
    let got = step("final read", s.read(&ws)).await?.unwrap_or_default();
    let expected = (WORKERS * INCREMENTS).to_string();
    ensure(got == expected.as_bytes(), || {
        format!(
            "counter is {:?} after {expected} increments",
            String::from_utf8_lossy(&got)
        )
    })
}
