//! An acknowledged state is never lost, stuck or replaced by an older one:
//! one test per way a review found to break that promise, each failing on
//! the code before its fix (commit b0cb279).

use crate::common::*;
use crate::console::ConsoleSession;
use crate::marketplace::reload;
use std::path::Path;

/// A state of `bytes` bytes (padded in an output) with `lineage` and `serial`.
fn padded_state(lineage: &str, serial: u64, bytes: usize) -> Vec<u8> {
    let head = format!(
        r#"{{"version":4,"terraform_version":"1.11.4","serial":{serial},"lineage":"{lineage}","outputs":{{"pad":{{"type":"string","value":""#
    );
    let tail = r#""}},"resources":[]}"#;
    let mut state = head.into_bytes();
    state.resize(bytes - tail.len(), b'x');
    state.extend_from_slice(tail.as_bytes());
    state
}

fn sealed_config(store: &Path, key: &Path, extra: &str) -> String {
    format!(
        "max_body_mib = 8\n[backends.default]\nguest = \"local\"\ndir = {store:?}\nhistory = 3\n\
         encryption = {{ keys = [{{ id = \"k1\", file = {key:?} }}] }}\n{extra}"
    )
}

/// Finding 1: sealed, a state grows by a third. One just under the body
/// limit was answered 200 and then unreadable (500 on every GET, and the
/// next POST failed too), until the operator raised the limit.
#[test]
fn a_sealed_state_near_the_body_limit_reads_back_and_takes_the_next_write() {
    let data = tempdir();
    let key = key_file(data.path());
    let server = Server::with_config(
        data.path(),
        &sealed_config(&data.path().join("store"), &key, ""),
    );
    let url = server.state_url("default", "big");
    // 7.5 MiB of an 8 MiB limit: 10 MiB sealed, past the 9 MiB reads allowed.
    let near_limit = (15 << 20) / 2;
    let first = padded_state("big", 1, near_limit);
    let answer = send("POST", &url, Some(&first));
    assert_eq!(answer.status, 200, "{}", answer.text());
    let read = send("GET", &url, None);
    assert_eq!(read.status, 200, "{}", read.text());
    assert!(
        read.body == first,
        "the state read back is not the one written"
    );
    let second = padded_state("big", 2, near_limit);
    let answer = send("POST", &url, Some(&second));
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(send("GET", &url, None).body == second);
}

/// Finding 2: the rollback check remembered serials without their lineage,
/// per host, and read the host's history after a restart. A workspace
/// deleted through another replica and started again (new lineage, serial
/// one) answered 500 "refused as a rollback" on the first replica, even
/// after it restarted.
#[test]
fn a_state_started_again_through_another_replica_is_not_a_rollback() {
    let dir = tempdir();
    let store = dir.path().join("store");
    let key = key_file(dir.path());
    let config = sealed_config(&store, &key, "");
    let (first_data, second_data) = (dir.path().join("a"), dir.path().join("b"));
    let first = Server::with_config(&first_data, &config);
    let second = Server::with_config(&second_data, &config);
    let (url_a, url_b) = (
        first.state_url("default", "ws"),
        second.state_url("default", "ws"),
    );
    for serial in 38..=40 {
        let answer = send("POST", &url_a, Some(&padded_state("old", serial, 512)));
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    assert_eq!(send("GET", &url_a, None).status, 200);
    // terraform workspace delete + new, through the other replica.
    let workspace_b = format!("{}/workspaces/default/ws", second.url);
    assert_eq!(send("DELETE", &workspace_b, None).status, 200);
    let fresh = padded_state("new", 1, 512);
    assert_eq!(send("POST", &url_b, Some(&fresh)).status, 200);
    let read = send("GET", &url_a, None);
    assert_eq!(read.status, 200, "{}", read.text());
    assert!(read.body == fresh);
    // After a restart the first replica's history still holds serial 40 of
    // the old lineage: not a reason to refuse the new one.
    drop(first);
    let first = Server::with_config(&first_data, &config);
    let read = send("GET", &first.state_url("default", "ws"), None);
    assert_eq!(read.status, 200, "{}", read.text());
    assert!(read.body == fresh);
    // A real rollback (an older envelope of the same lineage) is still caught.
    let state_file = store.join("ws/terraform.tfstate");
    let sealed_one = std::fs::read(&state_file).unwrap();
    assert_eq!(
        send("POST", &url_b, Some(&padded_state("new", 2, 512))).status,
        200
    );
    assert_eq!(
        send("GET", &first.state_url("default", "ws"), None).status,
        200
    );
    std::fs::write(&state_file, &sealed_one).unwrap();
    let refused = send("GET", &first.state_url("default", "ws"), None);
    assert_eq!(refused.status, 500, "{}", refused.text());
    assert!(refused.text().contains("rollback"), "{}", refused.text());
}

/// Issue 47, data 4: with storage that keeps no history of its own (the
/// `local` guest on a shared directory), replica B served lineage L at
/// serial 40; through replica A the state was deleted and a backup of L at
/// serial 5 pushed. B answered 500 "older than serial 40" to every GET and
/// POST until it restarted. The pushed state began a new life, stamped in
/// its envelope: both replicas serve it, and the serial-40 envelope put
/// back by hand (an old life replayed) is refused by both.
#[test]
fn a_backup_pushed_again_after_a_delete_through_another_replica_is_served_by_every_replica() {
    let dir = tempdir();
    let store = dir.path().join("store");
    let key = key_file(dir.path());
    let config = sealed_config(&store, &key, "");
    let a = Server::with_config(&dir.path().join("a"), &config);
    let b = Server::with_config(&dir.path().join("b"), &config);
    let (url_a, url_b) = (a.state_url("default", "ws"), b.state_url("default", "ws"));
    for serial in 38..=40 {
        let answer = send("POST", &url_b, Some(&padded_state("L", serial, 512)));
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    assert_eq!(send("GET", &url_b, None).status, 200);
    let state_file = store.join("ws/terraform.tfstate");
    let at_40 = std::fs::read(&state_file).unwrap();
    // Through A: delete, then push the backup at serial 5 (accepted there).
    assert_eq!(send("DELETE", &url_a, None).status, 200);
    let backup = padded_state("L", 5, 512);
    let pushed = send("POST", &url_a, Some(&backup));
    assert_eq!(pushed.status, 200, "{}", pushed.text());
    // B reaches A's verdict: it serves the pushed state and writes on.
    let read = send("GET", &url_b, None);
    assert_eq!(read.status, 200, "{}", read.text());
    assert!(
        read.body == backup,
        "B serves another state than the one pushed"
    );
    let next = padded_state("L", 6, 512);
    let written = send("POST", &url_b, Some(&next));
    assert_eq!(written.status, 200, "{}", written.text());
    let read = send("GET", &url_a, None);
    assert_eq!(read.status, 200, "{}", read.text());
    assert!(read.body == next);
    // Storage handing back the serial-40 envelope of the earlier life is
    // a rollback, on both replicas, whatever its higher serial.
    std::fs::write(&state_file, &at_40).unwrap();
    for url in [&url_a, &url_b] {
        let refused = send("GET", url, None);
        assert_eq!(refused.status, 500, "{}", refused.text());
        assert!(refused.text().contains("rollback"), "{}", refused.text());
        assert!(
            refused.text().contains("earlier life"),
            "{}",
            refused.text()
        );
    }
}

/// Finding 5: the stale-write guard checked, then wrote. Two `-lock=false`
/// writers from the same serial could both get 200, the first write lost.
/// On one host every round must acknowledge exactly one of them.
#[test]
fn two_unlocked_writers_from_the_same_serial_are_never_both_acknowledged() {
    let data = tempdir();
    let server = Server::start(&data.path().join("data"));
    let url = server.state_url("default", "race");
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);
    for serial in 2..=25u64 {
        let writers: Vec<_> = ["left", "right"]
            .into_iter()
            .map(|who| {
                let url = url.clone();
                let body =
                    padded_state(&format!("test-lineage\",\"who\":\"{who}"), serial, 64 << 10);
                std::thread::spawn(move || (send("POST", &url, Some(&body)).status, body))
            })
            .collect();
        let answers: Vec<(u16, Vec<u8>)> = writers.into_iter().map(|w| w.join().unwrap()).collect();
        let acknowledged: Vec<&Vec<u8>> = answers
            .iter()
            .filter(|(status, _)| *status == 200)
            .map(|(_, body)| body)
            .collect();
        let statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
        assert_eq!(
            acknowledged.len(),
            1,
            "round {serial}: answers {statuses:?}"
        );
        assert!(
            statuses.contains(&409),
            "round {serial}: answers {statuses:?}"
        );
        assert!(
            send("GET", &url, None).body == *acknowledged[0],
            "round {serial}: the stored state is not the acknowledged one"
        );
    }
}

/// Issue 47, item 8: across replicas the loser of two unlocked writers
/// from one serial could get 423 (the winner's host-taken lock) instead of
/// the 409 the guarantee names. Each round sends one writer to each host.
#[test]
fn two_unlocked_writers_on_two_replicas_get_one_200_and_one_409() {
    let dir = tempdir();
    let config = format!(
        "[backends.default]\nguest = \"local\"\ndir = {:?}\n",
        dir.path().join("store")
    );
    let first = Server::with_config(&dir.path().join("a"), &config);
    let second = Server::with_config(&dir.path().join("b"), &config);
    let urls = [
        first.state_url("default", "race"),
        second.state_url("default", "race"),
    ];
    assert_eq!(send("POST", &urls[0], Some(&state(1))).status, 200);
    for serial in 2..=16u64 {
        let writers: Vec<_> = urls
            .iter()
            .enumerate()
            .map(|(who, url)| {
                let url = url.clone();
                let body =
                    padded_state(&format!("test-lineage\",\"who\":\"{who}"), serial, 64 << 10);
                std::thread::spawn(move || (send("POST", &url, Some(&body)).status, body))
            })
            .collect();
        let answers: Vec<(u16, Vec<u8>)> = writers.into_iter().map(|w| w.join().unwrap()).collect();
        let mut statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
        statuses.sort();
        assert_eq!(statuses, [200, 409], "round {serial}");
        let acknowledged = &answers.iter().find(|(s, _)| *s == 200).unwrap().1;
        assert!(
            send("GET", &urls[serial as usize % 2], None).body == *acknowledged,
            "round {serial}: the stored state is not the acknowledged one"
        );
    }
}

/// Finding 7: allow_force_push was read once at start; a SIGHUP that turned
/// it on (or off) changed nothing.
#[test]
fn a_reload_turns_allow_force_push_on_and_off() {
    let data = tempdir();
    let config = |force: bool| {
        format!("[backends.default]\nguest = \"local\"\nallow_force_push = {force}\n")
    };
    let server = Server::with_config(data.path(), &config(false));
    let url = server.state_url("default", "force");
    assert_eq!(send("POST", &url, Some(&state(5))).status, 200);
    assert_eq!(send("POST", &url, Some(&state(3))).status, 409);
    std::fs::write(data.path().join("wasmstate.toml"), config(true)).unwrap();
    reload(&server, 1);
    let forced = send("POST", &url, Some(&state(3)));
    assert_eq!(forced.status, 200, "{}", forced.text());
    std::fs::write(data.path().join("wasmstate.toml"), config(false)).unwrap();
    reload(&server, 2);
    assert_eq!(send("POST", &url, Some(&state(2))).status, 409);
}

/// Findings 8 and 13: a restore re-encoded the state (keys sorted, so
/// `serial` landed after everything else), and the console's restore
/// skipped the lineage check when the old version had no lineage.
#[test]
fn restores_keep_the_document_and_pass_the_stale_write_guard() {
    let data = tempdir();
    let server = Server::with_config(
        data.path(),
        "[backends.default]\nguest = \"local\"\nhistory = 5\n",
    );
    let url = server.state_url("default", "restore");
    let unlineaged = br#"{"version":4,"serial":1,"zeta":1,"big":123456789012345678901234567890}"#;
    assert_eq!(send("POST", &url, Some(unlineaged)).status, 200);
    let lineaged = br#"{"version":4,"serial":2,"lineage":"l","zeta":2,"outputs":{}}"#;
    assert_eq!(send("POST", &url, Some(lineaged)).status, 200);
    let (versions, serials) = versions(&url);
    assert_eq!(serials, [2, 1]);
    let (newest, oldest) = (
        versions[0]["id"].as_str().unwrap().to_string(),
        versions[1]["id"].as_str().unwrap().to_string(),
    );

    // The console may not put a state without lineage over one with it.
    let console = ConsoleSession::open(&server).for_workspace("restore");
    let refused = console.restore(&oldest);
    assert_eq!(refused.0, 409, "{}", refused.1);
    assert!(refused.1.contains("no lineage"), "{}", refused.1);
    assert_eq!(send("GET", &url, None).body, lineaged.to_vec());

    // The CLI's restore renumbers in place: key order and numbers kept.
    let (ok, out) = wasmstate(&[
        "state",
        "restore",
        "restore",
        &newest,
        "--server",
        &server.url,
    ]);
    assert!(ok && out.contains("as serial 3"), "{out}");
    let restored = String::from_utf8(send("GET", &url, None).body).unwrap();
    let at = |key: &str| {
        restored
            .find(key)
            .unwrap_or_else(|| panic!("{key} in {restored}"))
    };
    assert!(
        at("\"serial\": 3") < at("\"lineage\"") && at("\"lineage\"") < at("\"zeta\""),
        "{restored}"
    );
    // And the console's the same way.
    let answer = console.restore(&newest);
    assert_eq!(answer.0, 200, "{}", answer.1);
    let restored = String::from_utf8(send("GET", &url, None).body).unwrap();
    assert!(
        restored.find("\"serial\": 4").unwrap() < restored.find("\"zeta\"").unwrap(),
        "{restored}"
    );
    // The restore's lock is gone.
    assert_eq!(
        send("LOCK", &url, Some(&lock_info("after", "ops"))).status,
        200
    );
}

/// Issue 47, data 1: a legacy format-3 state keeps its resources under
/// `modules`, with no top-level `resources` or `outputs`, and was taken for
/// an empty one that any lineage may replace. Refused (409) now, and the
/// stored state stays.
#[test]
fn another_lineage_cannot_replace_a_format_3_state() {
    let dir = tempdir();
    let server = Server::with_config(
        &dir.path().join("data"),
        &format!(
            "[backends.default]\nguest = \"local\"\ndir = {:?}\n",
            dir.path().join("store")
        ),
    );
    let url = server.state_url("default", "legacy");
    let legacy = br#"{"version":3,"terraform_version":"0.11.14","serial":1,"lineage":"legacy-lineage","modules":[{"path":["root"],"outputs":{},"resources":{"null_resource.kept":{"type":"null_resource","depends_on":[],"primary":{"id":"1","attributes":{"id":"1"}}}},"depends_on":[]}]}"#;
    let sent = send("POST", &url, Some(legacy));
    assert_eq!(sent.status, 200, "{}", sent.text());
    let other = String::from_utf8(state(1))
        .unwrap()
        .replace("test-lineage", "another-lineage");
    let answer = send("POST", &url, Some(other.as_bytes()));
    assert_eq!(answer.status, 409, "{}", answer.text());
    assert!(answer.text().contains("lineage"), "{}", answer.text());
    assert_eq!(send("GET", &url, None).body, legacy.to_vec());
}
