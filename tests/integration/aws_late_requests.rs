//! Issue 47, data 5 and 6: requests of the AWS guests that storage
//! applies late, after a newer write was acknowledged. The fault proxy
//! holds one request until the test releases it, while another host (a
//! replica: one host serialises a workspace's changes) writes.
//!
//! - The dynamodb guest's digest update was unconditional: one applied
//!   after a newer write set the older state's digest and cleared the
//!   newer write's pending tag, and every read answered 503.
//! - State deletes were unconditional: one applied after a newer write
//!   removed the acknowledged state.

use crate::aws::{BUCKET, Locking, backend_config, start_moto};
use crate::common::*;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The object of workspace `ws`'s state.
const STATE_KEY: &str = "env:/ws/app/terraform.tfstate";

/// A host of backend `aws` on moto through `proxy`, with `extra` backend
/// keys.
fn host_via(data: &Path, proxy: &FaultProxy, locking: Locking, extra: &str) -> Server {
    Server::with_config(data, &backend_config(&proxy.url, locking, extra))
}

/// Whether the proxy's description of a request is S3's call on a state
/// object (not its lock file).
fn on_state_object(what: &str) -> bool {
    what.contains("terraform.tfstate?") || what.contains("terraform.tfstate ")
}

/// A rule holding the first table update after the next state PUT, once
/// armed (each arming holds one): a write's digest update, whatever the
/// reads around it do.
fn hold_digest_after_put(armed: Arc<AtomicBool>) -> Rule {
    let put_seen = AtomicBool::new(false);
    Box::new(move |what: &str| {
        if !armed.load(Ordering::SeqCst) {
            return None;
        }
        if what.starts_with("PUT ") && on_state_object(what) {
            put_seen.store(true, Ordering::SeqCst);
            return None;
        }
        let update = what.contains("DynamoDB_20120810.UpdateItem");
        (update && put_seen.swap(false, Ordering::SeqCst)).then(|| {
            armed.store(false, Ordering::SeqCst);
            Fault::Held
        })
    })
}

/// Every read of `url` serves `expected`.
fn reads_back(url: &str, expected: &[u8], when: &str) {
    for _ in 0..2 {
        let read = send("GET", url, None);
        assert_eq!(
            read.status,
            200,
            "{when}: the newer state is unreadable: {}",
            read.text()
        );
        assert_eq!(read.body, expected, "{when}");
    }
}

/// Data 5 as the issue found it: writer A (whose host gives up on it
/// after three seconds) lands its state, and its digest update is held;
/// writer B writes a newer state and records its digest; A's digest
/// update reaches the table only then. It used to set A's digest over
/// B's and clear B's pending tag: every read of B's state answered 503.
/// It is now conditional on A's tag still pending, which B's digest
/// cleared: it changes nothing.
#[test]
fn dynamodb_a_digest_update_applied_late_never_replaces_a_newer_writes() {
    let moto = start_moto(Locking::DynamoDb);
    let armed = Arc::new(AtomicBool::new(false));
    let proxy = FaultProxy::with_rule(&moto.url, hold_digest_after_put(armed.clone()));
    let dir = tempdir();
    let slow = host_via(
        &dir.path().join("a"),
        &proxy,
        Locking::DynamoDb,
        "timeout_ms = 3000\n",
    );
    let other = host_via(&dir.path().join("b"), &proxy, Locking::DynamoDb, "");
    let (url_a, url_b) = (slow.state_url("aws", "ws"), other.state_url("aws", "ws"));
    assert_eq!(send("POST", &url_b, Some(&state(1))).status, 200);

    armed.store(true, Ordering::SeqCst);
    let gave_up = send("POST", &url_a, Some(&state(2)));
    assert!(
        gave_up.status >= 500,
        "{} {}",
        gave_up.status,
        gave_up.text()
    );
    proxy.wait_for_faults(1, Duration::from_secs(30));

    let newer = send("POST", &url_b, Some(&state(3)));
    assert_eq!(newer.status, 200, "{}", newer.text());
    reads_back(&url_b, &state(3), "before the late digest");

    proxy.release();
    proxy.wait_for_faults(2, Duration::from_secs(30));
    reads_back(&url_b, &state(3), "after the late digest");
    // The table refused it: its condition (A's tag pending) no longer held.
    let answered = proxy.injected.lock().unwrap()[1].clone();
    assert!(answered.contains("answered 400"), "{answered}");
    reads_back(
        &url_a,
        &state(3),
        "after the late digest, on the other host",
    );
}

/// Data 5, the interleaving a fix that cleared every pending tag would
/// get wrong: A's digest update (A timed out: the host's lock for its
/// unlocked write is released) is applied after B's state landed but
/// before B's digest (itself held). It must leave B's tag pending, so a
/// read in between serves B's state (and repairs the digest), and B's
/// write still ends well. Before the fix, the read in between answered
/// 503: A's update cleared every pending tag, B's too.
#[test]
fn dynamodb_a_digest_applied_between_a_newer_writes_state_and_digest_keeps_it_readable() {
    let moto = start_moto(Locking::DynamoDb);
    let armed = Arc::new(AtomicBool::new(false));
    let proxy = FaultProxy::with_rule(&moto.url, hold_digest_after_put(armed.clone()));
    let dir = tempdir();
    let slow = host_via(
        &dir.path().join("a"),
        &proxy,
        Locking::DynamoDb,
        "timeout_ms = 3000\n",
    );
    let other = host_via(&dir.path().join("b"), &proxy, Locking::DynamoDb, "");
    let (url_a, url_b) = (slow.state_url("aws", "ws"), other.state_url("aws", "ws"));
    assert_eq!(send("POST", &url_b, Some(&state(1))).status, 200);

    armed.store(true, Ordering::SeqCst);
    let gave_up = send("POST", &url_a, Some(&state(2)));
    assert!(
        gave_up.status >= 500,
        "{} {}",
        gave_up.status,
        gave_up.text()
    );
    proxy.wait_for_faults(1, Duration::from_secs(30));
    armed.store(true, Ordering::SeqCst);
    let writing_b = {
        let url = url_b.clone();
        std::thread::spawn(move || send("POST", &url, Some(&state(3))))
    };
    proxy.wait_for_faults(2, Duration::from_secs(30));

    // The proxy releases held requests in the order they came: A's first.
    proxy.release();
    proxy.wait_for_faults(3, Duration::from_secs(30));
    reads_back(&url_b, &state(3), "between the two digests");

    proxy.release();
    proxy.wait_for_faults(4, Duration::from_secs(30));
    let answer_b = writing_b.join().unwrap();
    assert_eq!(answer_b.status, 200, "{}", answer_b.text());
    reads_back(&url_b, &state(3), "after both digests");
    let next = send("POST", &url_a, Some(&state(4)));
    assert_eq!(next.status, 200, "{}", next.text());
    reads_back(&url_b, &state(4), "after the next write");
}

/// Data 6: host A's DELETE of a state reaches S3 (held by the proxy) only
/// after host B wrote a newer state and was answered 200. S3 refuses it
/// now (`If-Match` the object A read before its lock check: 412), the
/// newer state stays, and A is answered a refusal naming what happened,
/// not a success. Before the fix the late delete removed the newer state.
fn a_state_delete_applied_late_leaves_the_newer_state(locking: Locking) {
    let moto = start_moto(locking);
    let armed = Arc::new(AtomicBool::new(false));
    let rule = {
        let armed = armed.clone();
        Box::new(move |what: &str| {
            let state_delete = what.starts_with("DELETE ") && on_state_object(what);
            (state_delete && armed.swap(false, Ordering::SeqCst)).then_some(Fault::Held)
        })
    };
    let proxy = FaultProxy::with_rule(&moto.url, rule);
    let dir = tempdir();
    let first = host_via(&dir.path().join("a"), &proxy, locking, "");
    let second = host_via(&dir.path().join("b"), &proxy, locking, "");
    let (url_a, url_b) = (first.state_url("aws", "ws"), second.state_url("aws", "ws"));
    assert_eq!(send("POST", &url_b, Some(&state(1))).status, 200);

    armed.store(true, Ordering::SeqCst);
    let deleting = {
        let url = url_a.clone();
        std::thread::spawn(move || send("DELETE", &url, None))
    };
    proxy.wait_for_faults(1, Duration::from_secs(30));
    let newer = send("POST", &url_b, Some(&state(2)));
    assert_eq!(newer.status, 200, "{}", newer.text());

    proxy.release();
    proxy.wait_for_faults(2, Duration::from_secs(30));
    let answered = proxy.injected.lock().unwrap()[1].clone();
    assert!(answered.contains("answered 412"), "{answered}");
    let refused = deleting.join().unwrap();
    assert_ne!(
        refused.status, 200,
        "the delete claims to have removed the newer state"
    );
    assert!(
        refused
            .text()
            .contains("changed while this delete was under way"),
        "{} {}",
        refused.status,
        refused.text()
    );
    reads_back(&url_b, &state(2), "after the late delete");
    reads_back(
        &url_a,
        &state(2),
        "after the late delete, on the other host",
    );
    // A delete of what is there now goes through.
    let delete = send("DELETE", &url_a, None);
    assert_eq!(delete.status, 200, "{}", delete.text());
    assert_eq!(send("GET", &url_b, None).status, 404);
}

#[test]
fn s3_lockfile_a_state_delete_applied_late_leaves_the_newer_state() {
    a_state_delete_applied_late_leaves_the_newer_state(Locking::LockFile);
}

#[test]
fn dynamodb_a_state_delete_applied_late_leaves_the_newer_state() {
    a_state_delete_applied_late_leaves_the_newer_state(Locking::DynamoDb);
}

/// Holds the first request `matches` accepts once armed.
fn hold_once(armed: Arc<AtomicBool>, matches: fn(&str) -> bool) -> Rule {
    Box::new(move |what: &str| {
        (matches(what) && armed.swap(false, Ordering::SeqCst)).then_some(Fault::Held)
    })
}

/// A state of `serial` over [`PART_BYTES`]: the guests send it as a
/// multipart upload.
fn multipart_state(serial: u64) -> Vec<u8> {
    let bulk = "x".repeat(9 << 20);
    format!(
        r#"{{"version":4,"terraform_version":"1.11.4","serial":{serial},"lineage":"test-lineage","outputs":{{"blob":{{"value":"{bulk}","type":"string"}}}},"resources":[]}}"#
    )
    .into_bytes()
}

/// Review of issue 47, F5: a write's digest update cleared the tags
/// announced before it, taking their PUTs for ones that can no longer
/// land. A PUT sent without its condition can: here A's state is a
/// multipart upload, whose completion moto applies whatever its
/// `If-Match`. A's completion is held while A's lock is force-unlocked
/// and B writes and records its
/// digest (clearing A's tag); it then lands over B's state, and A's
/// digest update, conditional on its tag, failed: every read answered
/// 503 for good. Now A, finding its tag cleared, reads the object: still
/// its own, so it records its digest (only over B's, as read), and the
/// workspace serves what S3 holds.
#[test]
fn dynamodb_an_unconditional_put_landing_after_a_newer_digest_stays_readable() {
    let moto = start_moto(Locking::DynamoDb);
    let armed = Arc::new(AtomicBool::new(false));
    let proxy = FaultProxy::with_rule(
        &moto.url,
        hold_once(armed.clone(), |w| {
            w.starts_with("POST ") && on_state_object(w) && w.contains("uploadId=")
        }),
    );
    let dir = tempdir();
    let a = host_via(
        &dir.path().join("a"),
        &proxy,
        Locking::DynamoDb,
        "timeout_ms = 120000\n",
    );
    let b = host_via(&dir.path().join("b"), &proxy, Locking::DynamoDb, "");
    let (url_a, url_b) = (a.state_url("aws", "ws"), b.state_url("aws", "ws"));
    assert_eq!(send("POST", &url_b, Some(&state(1))).status, 200);

    armed.store(true, Ordering::SeqCst);
    let big = multipart_state(2);
    let writing_a = {
        let (url, big) = (url_a.clone(), big.clone());
        std::thread::spawn(move || send("POST", &url, Some(&big)))
    };
    proxy.wait_for_faults(1, Duration::from_secs(60));
    // A's host holds the lock it took for A's unlocked write: B's
    // operator force-unlocks it, as one does for a writer that seems stuck.
    let forced = send("UNLOCK", &url_b, None);
    assert_eq!(forced.status, 200, "{}", forced.text());
    let newer = send("POST", &url_b, Some(&state(3)));
    assert_eq!(newer.status, 200, "{}", newer.text());
    reads_back(&url_b, &state(3), "before A's upload completes");

    proxy.release();
    let answer_a = writing_a.join().unwrap();
    // The premise: moto completed A's upload over B's state (an S3 that
    // honours the condition refuses it, and nothing is stuck either).
    assert_eq!(answer_a.status, 200, "{}", answer_a.text());
    reads_back(&url_b, &big, "after A's upload landed late");
    reads_back(&url_a, &big, "after A's upload landed late, on A");
    let next = send("POST", &url_b, Some(&state(4)));
    assert_eq!(next.status, 200, "{}", next.text());
    reads_back(&url_a, &state(4), "after the next write");
}

/// Review of issue 47, F4 (a limitation, documented in
/// docs/guarantees.md): S3 compares ETags, the MD5 of the bytes, so a
/// condition holds again once the same bytes are back. Writer A (whose
/// host gives up after three seconds) sends its PUT (`If-Match` state
/// 1's ETag), held. The state is deleted (its digest item, with A's
/// pending tag, goes too) and state 1 restored byte for byte and
/// answered 200. A's PUT then lands over the restored state, and no tag
/// of it is pending: every read answers 503 naming the digest to set,
/// until an operator sets it (or deletes the workspace).
#[test]
fn dynamodb_a_late_put_after_a_byte_identical_restore_is_applied() {
    let moto = start_moto(Locking::DynamoDb);
    let armed = Arc::new(AtomicBool::new(false));
    let proxy = FaultProxy::with_rule(
        &moto.url,
        hold_once(armed.clone(), |w| {
            w.starts_with("PUT ") && on_state_object(w)
        }),
    );
    let dir = tempdir();
    let a = host_via(
        &dir.path().join("a"),
        &proxy,
        Locking::DynamoDb,
        "timeout_ms = 3000\n",
    );
    let b = host_via(&dir.path().join("b"), &proxy, Locking::DynamoDb, "");
    let (url_a, url_b) = (a.state_url("aws", "ws"), b.state_url("aws", "ws"));
    assert_eq!(send("POST", &url_b, Some(&state(1))).status, 200);

    armed.store(true, Ordering::SeqCst);
    let answer_a = send("POST", &url_a, Some(&state(2)));
    assert!(answer_a.status >= 500, "{}", answer_a.text());
    proxy.wait_for_faults(1, Duration::from_secs(30));
    let deleted = send("DELETE", &url_b, None);
    assert_eq!(deleted.status, 200, "{}", deleted.text());
    let restored = send("POST", &url_b, Some(&state(1)));
    assert_eq!(restored.status, 200, "{}", restored.text());
    reads_back(&url_b, &state(1), "after the restore");

    proxy.release();
    proxy.wait_for_faults(2, Duration::from_secs(30));
    let landed = proxy.injected.lock().unwrap()[1].clone();
    assert!(landed.contains("answered 200"), "{landed}");
    assert_eq!(
        moto.object(BUCKET, STATE_KEY),
        Some(state(2)),
        "A's PUT, sent before the delete, replaced the restored state"
    );
    let read = send("GET", &url_b, None);
    assert_eq!(read.status, 503, "{}", read.text());
    assert!(read.text().contains("update the Digest"), "{}", read.text());
}

/// Review of issue 47, F3 (a limitation, documented in
/// docs/guarantees.md): host A's DELETE (`If-Match` state 1's ETag) is
/// held. Meanwhile the state is deleted through B and state 1 restored
/// byte for byte, answered 200. A's delete then lands: the ETag matches
/// again, and the restored state is gone.
#[test]
fn s3_lockfile_a_late_delete_after_a_byte_identical_restore_is_applied() {
    let moto = start_moto(Locking::LockFile);
    let armed = Arc::new(AtomicBool::new(false));
    let proxy = FaultProxy::with_rule(
        &moto.url,
        hold_once(armed.clone(), |w| {
            w.starts_with("DELETE ") && on_state_object(w)
        }),
    );
    let dir = tempdir();
    let a = host_via(
        &dir.path().join("a"),
        &proxy,
        Locking::LockFile,
        "timeout_ms = 120000\n",
    );
    let b = host_via(&dir.path().join("b"), &proxy, Locking::LockFile, "");
    let (url_a, url_b) = (a.state_url("aws", "ws"), b.state_url("aws", "ws"));
    assert_eq!(send("POST", &url_b, Some(&state(1))).status, 200);

    armed.store(true, Ordering::SeqCst);
    let deleting_a = {
        let url = url_a.clone();
        std::thread::spawn(move || send("DELETE", &url, None))
    };
    proxy.wait_for_faults(1, Duration::from_secs(30));
    let deleted = send("DELETE", &url_b, None);
    assert_eq!(deleted.status, 200, "{}", deleted.text());
    let restored = send("POST", &url_b, Some(&state(1)));
    assert_eq!(restored.status, 200, "{}", restored.text());

    proxy.release();
    let answer_a = deleting_a.join().unwrap();
    proxy.wait_for_faults(2, Duration::from_secs(30));
    let landed = proxy.injected.lock().unwrap()[1].clone();
    assert!(landed.contains("answered 204"), "{landed}");
    assert_eq!(answer_a.status, 200, "{}", answer_a.text());
    assert_eq!(moto.object(BUCKET, STATE_KEY), None);
    assert_eq!(send("GET", &url_b, None).status, 404);
}
