//! A template's own write lock (operation `wasmstate-guest-write`), left
//! behind by a write the server stopped between taking and releasing it:
//! taken over once it is older than any request runs, never before.

use crate::common::*;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// A guest-write lock file's content, created at `created`.
fn write_lock(id: &str, created: SystemTime) -> String {
    serde_json::json!({
        "ID": id,
        "Operation": "wasmstate-guest-write",
        "Info": "a write sent without a lock",
        "Who": "wasmstate",
        "Version": "",
        "Created": humantime::format_rfc3339_seconds(created).to_string(),
        "Path": "",
    })
    .to_string()
}

fn state(serial: u64) -> Vec<u8> {
    format!(
        r#"{{"version":4,"terraform_version":"1.11.4","serial":{serial},"lineage":"stale","outputs":{{}},"resources":[]}}"#
    )
    .into_bytes()
}

/// A fresh guest-write lock keeps a lock taker out (it may be a write
/// under way); one three hours old (its write was stopped: a request runs
/// an hour at most) no longer blocks an unlocked write or a lock, and is
/// removed by exactly that writer (its marker stays).
pub(super) fn a_stopped_writes_lock_is_taken_over_only_when_stale(wasm: &Path) {
    let root = tempdir();
    let store = root.path().join("store");
    let server = Server::with_config(
        &root.path().join("data"),
        &format!("[backends.stale]\nguest = {wasm:?}\ndir = {store:?}\n"),
    );
    let url = server.state_url("stale", "ws");
    let first = send("POST", &url, Some(&state(1)));
    assert_eq!(first.status, 200, "{}", first.text());
    let lock_file = store.join("ws/terraform.tfstate.lock");

    std::fs::write(&lock_file, write_lock("fresh", SystemTime::now())).unwrap();
    let refused = send("LOCK", &url, Some(&lock_info("tf-1", "ci")));
    assert_eq!(refused.status, 423, "{}", refused.text());
    assert!(
        refused.text().contains("wasmstate-guest-write"),
        "{}",
        refused.text()
    );
    assert!(
        lock_file.is_file(),
        "a fresh guest-write lock is not removed"
    );

    let old = SystemTime::now() - Duration::from_secs(3 * 3600);
    std::fs::write(&lock_file, write_lock("stopped", old)).unwrap();
    let written = send("POST", &url, Some(&state(2)));
    assert_eq!(written.status, 200, "{}", written.text());
    assert_eq!(send("GET", &url, None).body, state(2));
    assert!(!lock_file.exists(), "the stale lock is gone");
    assert!(
        store.join("ws/.stale-stopped").is_file(),
        "the writer that removed it left its marker"
    );

    std::fs::write(&lock_file, write_lock("stopped-again", old)).unwrap();
    let locked = send("LOCK", &url, Some(&lock_info("tf-2", "ci")));
    assert_eq!(locked.status, 200, "{}", locked.text());
    let unlocked = send("UNLOCK", &url, Some(&lock_info("tf-2", "ci")));
    assert_eq!(unlocked.status, 200, "{}", unlocked.text());
}
