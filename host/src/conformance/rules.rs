//! The contract's rules that are not about one operation alone, as the
//! WIT (`wit/backend.wit`) and the guide state them, each checked: a write
//! creates its workspace, a created workspace holds no state (or an empty
//! one, as Terraform's `pg` writes), a write
//! repeated after a lost answer succeeds, and a state larger than the
//! guest's memory cap moves both ways (it must stream).

use super::steps::{ensure, expect_round_trip, lock, state, step, unperiodic};
use crate::backend::Storage;
use std::sync::Arc;

/// A `write` to a workspace nobody created succeeds and creates it
/// (Terraform never creates workspaces: its first write does).
pub(super) async fn write_creates_workspace<S: Storage>(
    s: Arc<S>,
    ws: String,
) -> Result<(), String> {
    step(
        "write to a workspace never created",
        s.write(&ws, state("first"), None),
    )
    .await?;
    let listed = step("list", s.list_workspaces()).await?;
    ensure(listed.contains(&ws), || {
        format!("list-workspaces {listed:?} lacks {ws:?}, whose state was just written")
    })?;
    let bad: Vec<&String> = listed
        .iter()
        .filter(|n| wasmstate_types::names::check_name("workspace", n).is_err())
        .collect();
    ensure(bad.is_empty(), || {
        format!("list-workspaces returned names that are no workspace names: {bad:?}")
    })?;
    let created = step("create after the write", s.create_workspace(&ws)).await?;
    ensure(!created, || {
        "create-workspace answered true (created) for a workspace a write had created".into()
    })
}

/// A created workspace holds no state until something is written, or an
/// empty one (no resources): Terraform's own `pg` backend writes one when
/// it creates a workspace, and a guest sharing its layout does the same.
pub(super) async fn created_workspace_is_empty<S: Storage>(
    s: Arc<S>,
    ws: String,
) -> Result<(), String> {
    step("create", s.create_workspace(&ws)).await?;
    let Some(got) = step("read", s.read(&ws)).await? else {
        return Ok(());
    };
    let state: serde_json::Value = serde_json::from_slice(&got).map_err(|e| {
        format!(
            "a new workspace read as {} bytes that are no state ({e})",
            got.len()
        )
    })?;
    let resources = state.get("resources").and_then(|r| r.as_array());
    ensure(resources.is_none_or(|r| r.is_empty()), || {
        "a new workspace read as a state with resources".into()
    })
}

/// Any call may be repeated after a success whose answer was lost (the
/// client retries a 5xx or a dropped connection): a write under the same
/// lock, twice, succeeds twice and leaves that state.
pub(super) async fn repeated_write<S: Storage>(s: Arc<S>, ws: String) -> Result<(), String> {
    step("lock", s.lock(&ws, lock("retrier"))).await?;
    let bytes = state("written twice");
    step("write", s.write(&ws, bytes.clone(), Some("retrier"))).await?;
    step(
        "the same write again",
        s.write(&ws, bytes.clone(), Some("retrier")),
    )
    .await?;
    let got = step("read", s.read(&ws)).await?;
    ensure(got.as_deref() == Some(&bytes[..]), || {
        "the repeated write left another state".into()
    })?;
    step("unlock", s.unlock(&ws, "retrier")).await
}

/// A state `memory_bytes` plus 1 MiB long, written and read back
/// byte-exact: a guest that holds a whole state cannot pass it. Refused
/// with a reason when that is more than `max_body` (what the host takes).
pub(super) async fn bigger_than_memory<S: Storage>(
    s: &S,
    ws: &str,
    memory_bytes: u64,
    max_body: usize,
) -> Result<(), String> {
    let len = memory_bytes
        .checked_add(1 << 20)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&len| len <= max_body)
        .ok_or_else(|| {
            format!(
                "a memory cap of {} MiB leaves no state larger than it below the largest the host takes ({} MiB, max_body_mib); run with a smaller --memory-mib",
                memory_bytes >> 20,
                max_body >> 20
            )
        })?;
    expect_round_trip(s, ws, unperiodic(len)).await
}
