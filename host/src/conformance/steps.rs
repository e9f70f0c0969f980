//! The pieces every kit case is made of: a step that names what failed
//! (a crashed guest's stderr below it), a check with a reason, a lock and
//! states to write, and a round trip that says how a read went wrong.

use crate::backend::{LockInfo, Storage, StorageError};
use std::future::Future;

pub(super) fn ensure(condition: bool, reason: impl FnOnce() -> String) -> Result<(), String> {
    if condition { Ok(()) } else { Err(reason()) }
}

pub(super) fn lock(id: &str) -> LockInfo {
    LockInfo {
        id: id.to_string(),
        operation: "OperationTypeApply".into(),
        who: format!("{id}@conformance"),
        version: "1.11.4".into(),
        created: "2026-01-02T15:04:05Z".into(),
        ..LockInfo::default()
    }
}

pub(super) fn state(text: &str) -> bytes::Bytes {
    format!(r#"{{"version":4,"serial":1,"lineage":"ck","note":"{text}"}}"#).into()
}

/// Run `op`, describing a failure as `what: error` (and, for a crash,
/// what the guest wrote to stderr: its traceback or stack).
pub(super) async fn step<T>(
    what: &str,
    op: impl Future<Output = Result<T, StorageError>>,
) -> Result<T, String> {
    op.await.map_err(|e| describe(what, &e))
}

/// `what: error`, with a crashed guest's stderr indented below.
fn describe(what: &str, e: &StorageError) -> String {
    match e {
        StorageError::GuestTrapped {
            detail: Some(detail),
            ..
        } => {
            let indented: Vec<String> = detail.lines().map(|l| format!("      | {l}")).collect();
            format!("{what}: {e}\n{}", indented.join("\n"))
        }
        _ => format!("{what}: {e}"),
    }
}

pub(super) async fn expect_round_trip<S: Storage>(
    s: &S,
    ws: &str,
    bytes: bytes::Bytes,
) -> Result<(), String> {
    step("write", s.write(ws, bytes.clone(), None)).await?;
    let got = step("read", s.read(ws)).await?;
    match got {
        None => Err("read returned no state after a write".into()),
        Some(got) if got == bytes => Ok(()),
        // The usual bug in a new language: one read call, which may return
        // fewer bytes than the file holds.
        Some(got) if got.len() < bytes.len() && bytes.starts_with(&got) => Err(format!(
            "read stopped after {} of the {} bytes written (the rest is missing; read until end of file, a single read may return fewer bytes)",
            got.len(),
            bytes.len()
        )),
        Some(got) => Err(format!(
            "read returned {} bytes differing from the {} written (first difference at byte {})",
            got.len(),
            bytes.len(),
            got.iter()
                .zip(&bytes)
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(bytes.len()))
        )),
    }
}

/// `len` bytes of a pattern that is not periodic at any chunk size a
/// guest might use.
pub(super) fn unperiodic(len: usize) -> bytes::Bytes {
    let mut x: u32 = 0x9e37_79b9;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}
