//! The write path on storage with conditional writes, against storage in
//! memory that counts its calls: what each POST costs, and that racers
//! from one serial get one write and one 409 without a lock.

use super::write_if_unchanged;
use crate::audit::Facts;
use crate::backend::{Expect, Storage};
use crate::protocol::{ApiError, Target};
use crate::store::memory::Memory;
use axum::body::Bytes;
use axum::http::StatusCode;

fn state(lineage: &str, serial: u64, note: &str) -> Bytes {
    format!(
        r#"{{"version":4,"serial":{serial},"lineage":"{lineage}","outputs":{{}},"resources":[],"note":"{note}"}}"#
    )
    .into()
}

/// A state past the head's prefix, `serial` and `lineage` first.
fn big(serial: u64, note: &str) -> Bytes {
    let pad = note.repeat((70 << 10) / note.len().max(1));
    format!(r#"{{"version":4,"serial":{serial},"lineage":"l","resources":[],"pad":"{pad}"}}"#)
        .into()
}

async fn post(
    storage: &Memory,
    lock_id: Option<&str>,
    body: &Bytes,
    force: bool,
) -> (Result<(), ApiError>, Facts) {
    let target = Target {
        backend: "b",
        workspace: "default",
        storage,
    };
    let incoming = crate::statefile::read(body).unwrap();
    let mut facts = Facts::default();
    let written =
        write_if_unchanged(&target, lock_id, &incoming, body.clone(), force, &mut facts).await;
    (written, facts)
}

fn status(result: &Result<(), ApiError>) -> StatusCode {
    match result {
        Ok(()) => StatusCode::OK,
        Err(e) => e.status(),
    }
}

#[tokio::test]
async fn an_unlocked_write_is_a_head_and_a_conditional_write_and_takes_no_lock() {
    let storage = Memory::holding(&state("l", 1, "first"));
    let next = state("l", 2, "second");
    let (written, facts) = post(&storage, None, &next, false).await;
    assert!(written.is_ok(), "{written:?}");
    assert_eq!(storage.take_calls(), ["head", "write_if"]);
    assert_eq!(
        *storage.expected.lock().unwrap(),
        [(Expect::Version("1".into()), None)]
    );
    assert_eq!(storage.stored().as_deref(), Some(&next[..]));
    assert_eq!(facts.before.map(|v| v.serial), Some(1));
    // Onto no state: it expects none.
    let storage = Memory::default();
    let (written, _) = post(&storage, None, &next, false).await;
    assert!(written.is_ok());
    assert_eq!(storage.expected.lock().unwrap()[0].0, Expect::Absent);
}

#[tokio::test]
async fn a_write_under_a_lock_expects_the_judged_version_and_reads_nothing() {
    let storage = Memory::holding(&big(4, "a"));
    storage
        .lock(
            "default",
            crate::backend::own_lock("apply", String::new(), "me".into()),
        )
        .await
        .unwrap();
    let id = storage.current_lock("default").await.unwrap().unwrap().id;
    storage.take_calls();
    let (written, _) = post(&storage, Some(&id), &big(5, "b"), false).await;
    assert!(written.is_ok(), "{written:?}");
    // A state past the prefix is judged by its head alone.
    assert_eq!(storage.take_calls(), ["head", "write_if"]);
    assert_eq!(
        storage.expected.lock().unwrap()[0],
        (Expect::Version("1".into()), Some(id.clone()))
    );
    // Without the lock's ID, the guest's lock check answers: 423, nothing written.
    let (refused, _) = post(&storage, None, &big(6, "c"), false).await;
    assert_eq!(status(&refused), StatusCode::LOCKED);
    assert_eq!(storage.stored().as_deref(), Some(&big(5, "b")[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_racers_from_one_serial_get_one_write_and_one_409() {
    for _ in 0..20 {
        let mut storage = Memory::holding(&state("l", 1, "base"));
        storage.racers = 2;
        let (a, b) = (state("l", 2, "racer a"), state("l", 2, "racer b"));
        let ((first, _), (second, _)) = tokio::join!(
            post(&storage, None, &a, false),
            post(&storage, None, &b, false)
        );
        let mut statuses = [status(&first), status(&second)];
        statuses.sort();
        assert_eq!(statuses, [StatusCode::OK, StatusCode::CONFLICT]);
        let winner = if first.is_ok() { &a } else { &b };
        assert_eq!(storage.stored().as_deref(), Some(&winner[..]));
        // Both judged, both tried; the loser judged again what the winner
        // wrote and never wrote; no lock anywhere.
        let calls = storage.take_calls();
        assert_eq!(calls.iter().filter(|c| **c == "write_if").count(), 2);
        assert_eq!(calls.iter().filter(|c| **c == "head").count(), 3);
        assert!(!calls.contains(&"lock"), "{calls:?}");
    }
}

#[tokio::test]
async fn a_repeated_post_is_told_from_the_head_without_a_read() {
    // Small: the whole state is in the head's prefix.
    let small = state("l", 2, "same");
    let storage = Memory::holding(&small);
    let (written, facts) = post(&storage, None, &small, false).await;
    assert!(written.is_ok() && facts.unchanged);
    assert_eq!(storage.take_calls(), ["head"]);
    // Past the prefix, with a digest: nothing more.
    let large = big(3, "x");
    let mut storage = Memory::holding(&large);
    storage.digest = true;
    let (written, facts) = post(&storage, None, &large, false).await;
    assert!(written.is_ok() && facts.unchanged);
    assert_eq!(storage.take_calls(), ["head"]);
    // The same size and serial, other bytes: the digest says so.
    let (refused, _) = post(&storage, None, &big(3, "y"), false).await;
    assert_eq!(status(&refused), StatusCode::CONFLICT);
    assert_eq!(storage.take_calls(), ["head"]);
    // Without a digest, only an equal size asks storage to compare.
    let storage = Memory::holding(&large);
    let (written, _) = post(&storage, None, &large, false).await;
    assert!(written.is_ok());
    assert_eq!(storage.take_calls(), ["head", "holds"]);
    let (refused, _) = post(&storage, None, &big(3, "yyy"), false).await;
    assert_eq!(status(&refused), StatusCode::CONFLICT);
    assert_eq!(storage.take_calls(), ["head"]);
}

#[tokio::test]
async fn stale_states_are_refused_from_the_head_alone() {
    let storage = Memory::holding(&state("l", 5, "stored"));
    for body in [state("l", 4, "older"), state("other", 9, "unrelated")] {
        let (refused, facts) = post(&storage, None, &body, false).await;
        assert_eq!(status(&refused), StatusCode::CONFLICT);
        assert_eq!(facts.before.map(|v| v.serial), Some(5));
    }
    assert_eq!(storage.take_calls(), ["head", "head"]);
    assert_eq!(
        storage.stored().as_deref(),
        Some(&state("l", 5, "stored")[..])
    );
}

#[tokio::test]
async fn another_lineage_replaces_an_empty_workspace_judged_from_its_head() {
    let empty = br#"{"version":4,"serial":1,"lineage":"pg","outputs":{},"resources":[]}"#;
    let storage = Memory::holding(empty);
    let (written, _) = post(&storage, None, &state("mine", 1, "first"), false).await;
    assert!(written.is_ok(), "{written:?}");
    assert_eq!(storage.take_calls(), ["head", "write_if"]);
    // An encrypted OpenTofu state at serial 1 is not empty: refused.
    let opaque =
        br#"{"serial":1,"lineage":"tofu","encrypted_data":"AAAA","encryption_version":"v0"}"#;
    let storage = Memory::holding(opaque);
    let (refused, _) = post(&storage, None, &state("mine", 1, "first"), false).await;
    assert_eq!(status(&refused), StatusCode::CONFLICT);
}

#[tokio::test]
async fn serial_and_lineage_past_the_prefix_are_read_whole() {
    let pad = "p".repeat(70 << 10);
    let late = format!(r#"{{"version":4,"pad":"{pad}","serial":3,"lineage":"l"}}"#);
    let storage = Memory::holding(late.as_bytes());
    let (refused, _) = post(&storage, None, &state("l", 2, "older"), false).await;
    assert_eq!(status(&refused), StatusCode::CONFLICT);
    assert_eq!(storage.take_calls(), ["head", "read"]);
    let (written, _) = post(&storage, None, &state("l", 4, "newer"), false).await;
    assert!(written.is_ok());
    assert_eq!(storage.take_calls(), ["head", "read", "write_if"]);
}

/// A retried POST whose first try lands between its head and the read
/// that finds a serial past the prefix is already stored (200), judged by
/// the bytes read, never by the older head (which took it for another
/// writer's state: 409, and Terraform fails a write that happened).
#[tokio::test]
async fn a_retry_whose_first_try_lands_before_the_read_is_already_stored() {
    let late = |serial: u64, pad: usize| {
        let pad = "p".repeat(pad);
        Bytes::from(format!(
            r#"{{"version":4,"pad":"{pad}","serial":{serial},"lineage":"l"}}"#
        ))
    };
    // Serial and lineage past the head's prefix: judged after a read.
    let storage = Memory::holding(&late(3, 70 << 10));
    let retried = late(4, 71 << 10);
    *storage.before_read.lock().unwrap() = Some(retried.to_vec());
    let (written, facts) = post(&storage, None, &retried, false).await;
    assert!(written.is_ok(), "{written:?}");
    assert!(facts.unchanged);
    // The read found other bytes than the head's: head and read again.
    assert_eq!(storage.take_calls(), ["head", "read", "head", "read"]);
    assert_eq!(storage.stored().as_deref(), Some(&retried[..]));
    // Another writer's state of that serial found by the read: 409.
    let storage = Memory::holding(&late(3, 70 << 10));
    *storage.before_read.lock().unwrap() = Some(late(4, (71 << 10) + 1).to_vec());
    let (refused, _) = post(&storage, None, &retried, false).await;
    assert_eq!(status(&refused), StatusCode::CONFLICT);
}

#[tokio::test]
async fn a_state_that_keeps_changing_gets_a_clear_503_and_nothing_written() {
    let mut storage = Memory::holding(&state("l", 1, "base"));
    storage.always_changed = true;
    let (refused, _) = post(&storage, None, &state("l", 2, "next"), false).await;
    assert_eq!(status(&refused), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        format!("{refused:?}").contains("send it again"),
        "{refused:?}"
    );
    assert_eq!(storage.take_calls().len(), 2 * super::ATTEMPTS);
    assert_eq!(
        storage.stored().as_deref(),
        Some(&state("l", 1, "base")[..])
    );
}

#[tokio::test]
async fn allow_force_push_writes_expecting_nothing() {
    let storage = Memory::holding(&state("l", 5, "stored"));
    let older = state("l", 1, "pushed back on purpose");
    let (written, _) = post(&storage, None, &older, true).await;
    assert!(written.is_ok());
    assert_eq!(storage.take_calls(), ["write_if"]);
    assert_eq!(storage.expected.lock().unwrap()[0].0, Expect::Any);
    assert_eq!(storage.stored().as_deref(), Some(&older[..]));
}
