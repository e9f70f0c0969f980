//! The audit trail: every change and every refused write is one record,
//! checked field by field; the trail survives a restart, is printed to
//! stdout when asked, answers `wasmstate audit`, names who wrote each
//! kept version, and is each replica's own. And the opt-in `lock_ttl`
//! takeover, recorded there.

use crate::common::*;
use crate::console::{ConsoleSession, basic};
use serde_json::Value;
use std::time::Duration;

const ALICE: (&str, &str) = ("alice", "alice's console password");

/// The first 16 hex digits of the SHA-256 of a lock ID: what records keep.
fn digest(id: &str) -> String {
    use sha2::Digest;
    hex::encode(&sha2::Sha256::digest(id.as_bytes())[..8])
}

/// `GET /audit/default?{query}` on `server`, signed in with `auth`.
fn audit(server: &Server, query: &str, auth: &str) -> Answer {
    let url = format!("{}/audit/default?{query}", server.url);
    send_with("GET", &url, None, &[("Authorization", auth)])
}

/// Backend `default`'s records on `server`, oldest first, as `auth` may
/// see them.
fn records(server: &Server, auth: &str) -> Vec<Value> {
    let answer = audit(server, "limit=1000", auth);
    assert_eq!(answer.status, 200, "{}", answer.text());
    let mut records = answer.json()["records"].as_array().unwrap().clone();
    records.reverse();
    records
}

/// A record's `(operation, caller, workspace, status)`.
fn summary_of(record: &Value) -> (String, String, String, u64) {
    (
        record["operation"].as_str().unwrap().to_string(),
        record["caller"].as_str().unwrap().to_string(),
        record["workspace"].as_str().unwrap().to_string(),
        record["status"].as_u64().unwrap(),
    )
}

fn version(serial: u64) -> Value {
    serde_json::json!({ "lineage": "test-lineage", "serial": serial })
}

#[test]
fn every_change_is_recorded_field_by_field_and_survives_a_restart() {
    let dir = tempdir();
    let data = dir.path().join("data");
    let (ci, ci_sha) = generate_token();
    let (reader, reader_sha) = generate_token();
    let (ops, ops_sha) = generate_token();
    let config = format!(
        "[backends.default]\nguest = \"local\"\n\
         [audit]\nstdout = true\nreplica = \"replica-a\"\n\
         [[users]]\nname = \"alice\"\npassword_hash = \"{}\"\ngrants = [\"*:*:admin\"]\n\
         [[tokens]]\nname = \"ci\"\nsha256 = \"{ci_sha}\"\ngrants = [\"default:*:write\"]\n\
         [[tokens]]\nname = \"reader\"\nsha256 = \"{reader_sha}\"\ngrants = [\"default:*:read\"]\n\
         [[tokens]]\nname = \"ops\"\nsha256 = \"{ops_sha}\"\ngrants = [\"default:*:admin\"]\n",
        crate::auth::hash(ALICE.1)
    );
    let server = Server::with_config(&data, &config);
    let (alice, ci, reader) = (
        basic(ALICE),
        format!("Bearer {ci}"),
        format!("Bearer {reader}"),
    );
    let url = server.state_url("default", "w");
    let call = |method: &str, url: &str, body: Option<&[u8]>, auth: &str, expect: u16| {
        let answer = send_with(method, url, body, &[("Authorization", auth)]);
        assert_eq!(answer.status, expect, "{method} {url}: {}", answer.text());
    };
    let workspace = format!("{}/workspaces/default/w", server.url);
    call("PUT", &workspace, None, &alice, 201);
    call(
        "LOCK",
        &url,
        Some(&lock_info("lock-1", "ci@runner")),
        &ci,
        200,
    );
    call(
        "POST",
        &format!("{url}?ID=lock-1"),
        Some(&state(1)),
        &ci,
        200,
    );
    // Unlocked, while ci holds the lock: refused with the holder named.
    call("POST", &url, Some(&state(2)), &alice, 423);
    call(
        "UNLOCK",
        &url,
        Some(&lock_info("lock-1", "ci@runner")),
        &ci,
        200,
    );
    // Older than the stored state: refused by the stale-write guard.
    call("POST", &url, Some(&state(0)), &ci, 409);
    // Readers may not write.
    call("POST", &url, Some(&state(3)), &reader, 403);
    call(
        "LOCK",
        &url,
        Some(&lock_info("lock-2", "ci@runner")),
        &ci,
        200,
    );
    call(
        "POST",
        &format!("{url}?ID=lock-2"),
        Some(&state(2)),
        &ci,
        200,
    );
    // `terraform force-unlock`: an UNLOCK without a body.
    call("UNLOCK", &url, None, &alice, 200);
    call(
        "LOCK",
        &url,
        Some(&lock_info("lock-3", "ci@runner")),
        &ci,
        200,
    );
    let console = ConsoleSession::sign_in(&server, ALICE.0, ALICE.1).for_workspace("w");
    assert_eq!(console.force_unlock(), 200);
    // Who wrote each kept version, from the trail.
    let listed = send_with(
        "GET",
        &format!("{url}/versions"),
        None,
        &[("Authorization", &alice)],
    )
    .json();
    let written_by: Vec<(u64, &str)> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["serial"].as_u64().unwrap(),
                v["written_by"].as_str().unwrap_or("?"),
            )
        })
        .collect();
    assert_eq!(written_by, [(2, "ci"), (1, "ci")], "{listed}");
    let first = listed.as_array().unwrap()[1]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, page) = console.restore(&first);
    assert_eq!(status, 200, "{page}");
    let gone = format!("{}/workspaces/default/gone", server.url);
    call("PUT", &gone, None, &alice, 201);
    call("DELETE", &gone, None, &alice, 200);
    // The trail is for admins.
    let refused = audit(&server, "", &ci);
    assert_eq!(refused.status, 403, "{}", refused.text());

    let seen = records(&server, &alice);
    let summaries: Vec<_> = seen.iter().map(summary_of).collect();
    let expected = [
        ("workspace-create", "alice", "w", 201),
        ("lock", "ci", "w", 200),
        ("write", "ci", "w", 200),
        ("write", "alice", "w", 423),
        ("unlock", "ci", "w", 200),
        ("write", "ci", "w", 409),
        ("write", "reader", "w", 403),
        ("lock", "ci", "w", 200),
        ("write", "ci", "w", 200),
        ("force-unlock", "alice", "w", 200),
        ("lock", "ci", "w", 200),
        ("force-unlock", "alice", "w", 200),
        ("restore", "alice", "w", 200),
        ("workspace-create", "alice", "gone", 201),
        ("workspace-delete", "alice", "gone", 200),
    ];
    let expected: Vec<_> = expected
        .iter()
        .map(|(o, c, w, s)| (o.to_string(), c.to_string(), w.to_string(), *s))
        .collect();
    assert_eq!(summaries, expected, "{seen:#?}");
    for record in &seen {
        assert_eq!(record["replica"], "replica-a");
        assert_eq!(record["backend"], "default");
        let time = record["time"].as_str().unwrap();
        assert!(
            time::OffsetDateTime::parse(time, &time::format_description::well_known::Rfc3339)
                .is_ok(),
            "{time}"
        );
        // Lock IDs never appear, only their digests.
        assert!(!record.to_string().contains("lock-1"), "{record}");
    }
    let field = |i: usize, name: &str| seen[i].get(name).cloned().unwrap_or(Value::Null);
    assert_eq!(field(1, "lock"), digest("lock-1"));
    assert_eq!(field(2, "before"), Value::Null);
    assert_eq!(field(2, "after"), version(1));
    assert_eq!(field(2, "lock"), digest("lock-1"));
    assert_eq!(field(2, "result"), "ok");
    assert_eq!(field(3, "before"), version(1));
    assert_eq!(field(3, "after"), version(2));
    assert_eq!(field(3, "holder"), "ci@runner");
    assert_eq!(field(5, "before"), version(1));
    assert_eq!(field(5, "after"), version(0));
    assert!(field(5, "result").as_str().unwrap().contains("older"));
    assert!(field(6, "result").as_str().unwrap().contains("may not"));
    assert_eq!(field(8, "before"), version(1));
    assert_eq!(field(8, "after"), version(2));
    assert_eq!(field(9, "holder"), "ci@runner");
    assert_eq!(field(9, "lock"), digest("lock-2"));
    assert_eq!(field(11, "holder"), "ci@runner");
    assert_eq!(field(11, "lock"), digest("lock-3"));
    assert_eq!(field(12, "before"), version(2));
    assert_eq!(field(12, "after"), version(3));

    // Filters: one workspace, one operation, refused only, a time range.
    let filtered = |query: &str| {
        let answer = audit(&server, query, &alice);
        assert_eq!(answer.status, 200, "{}", answer.text());
        answer.json()["records"].as_array().unwrap().len()
    };
    assert_eq!(filtered("workspace=gone"), 2);
    assert_eq!(filtered("operation=force-unlock"), 2);
    assert_eq!(filtered("refused=true"), 3);
    assert_eq!(filtered("since=2000-01-01&until=2000-01-02"), 0);
    let bad = audit(&server, "operation=drop", &alice);
    assert_eq!(bad.status, 400, "{}", bad.text());

    // One command answers "who force-unlocked it".
    let (ok, out) = wasmstate(&[
        "audit",
        "--server",
        &server.url,
        "--token",
        &ops,
        "--operation",
        "force-unlock",
    ]);
    assert!(ok, "{out}");
    let rows: Vec<&str> = out.lines().filter(|l| l.contains("force-unlock")).collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(
        rows.iter()
            .all(|r| r.contains("alice") && r.contains("holder ci@runner")),
        "{out}"
    );

    // The console's page shows the same.
    let page = console
        .client
        .get(format!("{}/ui/audit/default?operation=restore", server.url))
        .header("cookie", &console.cookie)
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert_eq!(
        page.matches("data-operation=\"restore\"").count(),
        1,
        "{page}"
    );

    // Printed to stdout as JSON lines, the same records.
    // (After the banner's lines, which are not JSON.)
    let printed = || -> Vec<Value> {
        std::fs::read_to_string(&server.stdout)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    wait_until("the records on stdout", Duration::from_secs(30), || {
        printed().len() >= seen.len()
    });
    let printed = printed();
    assert_eq!(printed, seen);

    // The log is the owner's alone.
    use std::os::unix::fs::PermissionsExt;
    let file = data.join("audit/replica-a/backends/default/changes.jsonl");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "{mode:o}");

    // After a restart the trail is all there, and grows.
    assert!(server.terminate(Duration::from_secs(30)).success());
    let server = Server::with_config(&data, &config);
    let url = server.state_url("default", "w");
    call("POST", &url, Some(&state(4)), &ci, 200);
    let after = records(&server, &alice);
    assert_eq!(after.len(), seen.len() + 1);
    assert_eq!(after[..seen.len()], seen[..]);
    let newest = &after[seen.len()];
    assert_eq!(
        summary_of(newest),
        ("write".into(), "ci".into(), "w".into(), 200)
    );
    assert_eq!(newest["before"], version(3));
    assert_eq!(newest["after"], version(4));
}

#[test]
fn each_replica_keeps_its_own_trail() {
    let dir = tempdir();
    let shared = dir.path().join("shared");
    let config = |replica: &str| {
        format!(
            "[backends.default]\nguest = \"local\"\ndir = \"{}\"\n[audit]\nreplica = \"{replica}\"\n",
            shared.display()
        )
    };
    let a = Server::with_config(&dir.path().join("a"), &config("a"));
    let b = Server::with_config(&dir.path().join("b"), &config("b"));
    assert_eq!(
        send("POST", &a.state_url("default", "w"), Some(&state(1))).status,
        200
    );
    assert_eq!(
        send("POST", &b.state_url("default", "w"), Some(&state(2))).status,
        200
    );
    for (server, name, serial) in [(&a, "a", 1), (&b, "b", 2)] {
        let answer = send("GET", &format!("{}/audit/default", server.url), None).json();
        assert_eq!(answer["replica"], name);
        let records = answer["records"].as_array().unwrap();
        assert_eq!(records.len(), 1, "{answer}");
        assert_eq!(records[0]["replica"], name);
        assert_eq!(records[0]["caller"], "anyone");
        assert_eq!(records[0]["after"]["serial"], serial);
    }
    // Both wrote the one state; each replica knows its own write.
    assert_eq!(
        send("GET", &a.state_url("default", "w"), None).json()["serial"],
        2
    );
}

#[test]
fn lock_ttl_takes_over_only_locks_older_than_it_and_says_so() {
    let dir = tempdir();
    // The git guest: its unlock by ID is a compare-and-swap of the lock's
    // ref (the local guest refuses lock_ttl).
    let (ttl, strict) = (
        bare_repo(dir.path(), "ttl"),
        bare_repo(dir.path(), "strict"),
    );
    let server = Server::with_config(
        &dir.path().join("data"),
        &format!(
            "[backends.default]\nguest = \"git\"\nlock_ttl = \"1h\"\n\
             [backends.default.config]\nrepository = {:?}\n\
             [backends.strict]\nguest = \"git\"\n[backends.strict.config]\nrepository = {:?}\n",
            ttl.display().to_string(),
            strict.display().to_string()
        ),
    );
    let now = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let young = |id: &str| {
        let mut info: Value = serde_json::from_slice(&lock_info(id, "young@ci")).unwrap();
        info["Created"] = Value::String(now.clone());
        serde_json::to_vec(&info).unwrap()
    };
    // `lock_info` locks were created in January: older than an hour.
    let url = server.state_url("default", "w");
    assert_eq!(
        send("LOCK", &url, Some(&lock_info("old", "gone@laptop"))).status,
        200
    );
    let taken = send("LOCK", &url, Some(&young("new")));
    assert_eq!(taken.status, 200, "{}", taken.text());
    // The displaced holder can no longer write under its lock.
    let late = send("POST", &format!("{url}?ID=old"), Some(&state(1)));
    assert!(matches!(late.status, 409 | 423), "{}", late.text());
    // A young lock is not taken over.
    assert_eq!(send("LOCK", &url, Some(&young("third"))).status, 423);
    assert!(server.log_text().contains("lock taken over"));
    let records = send("GET", &format!("{}/audit/default", server.url), None).json()["records"]
        .as_array()
        .unwrap()
        .clone();
    let ops: Vec<&str> = records
        .iter()
        .rev()
        .map(|r| r["operation"].as_str().unwrap())
        .collect();
    assert_eq!(
        ops,
        ["lock", "lock-takeover", "lock", "write"],
        "{records:#?}"
    );
    let takeover = &records[2];
    assert_eq!(takeover["holder"], "gone@laptop");
    assert_eq!(takeover["lock"], digest("old"));
    // Without lock_ttl, an old lock stays.
    let strict = server.state_url("strict", "w");
    assert_eq!(
        send("LOCK", &strict, Some(&lock_info("old", "gone@laptop"))).status,
        200
    );
    assert_eq!(send("LOCK", &strict, Some(&young("new"))).status, 423);
}

#[test]
fn a_flood_of_refusals_or_a_huge_holder_cannot_push_the_history_out() {
    let dir = tempdir();
    let data = dir.path().join("data");
    let (writer, writer_sha) = generate_token();
    let (reader, reader_sha) = generate_token();
    let server = Server::with_config(
        &data,
        &format!(
            "[backends.default]\nguest = \"local\"\n[audit]\nreplica = \"r\"\n\
             [[tokens]]\nname = \"writer\"\nsha256 = \"{writer_sha}\"\ngrants = [\"default:*:write\"]\n\
             [[tokens]]\nname = \"reader\"\nsha256 = \"{reader_sha}\"\ngrants = [\"default:*:read\"]\n"
        ),
    );
    let url = server.state_url("default", "w");
    let (writer, reader) = (format!("Bearer {writer}"), format!("Bearer {reader}"));
    // Lock details of 100 KiB are refused (they are held outside the
    // memory budgets while they arrive): 413, saying the bound, nothing
    // locked. A holder's name of 12 KiB is taken, and cut in the record.
    let huge = lock_info("big", &"x".repeat(100 << 10));
    let refused = send_with("LOCK", &url, Some(&huge), &[("Authorization", &writer)]);
    assert_eq!(refused.status, 413, "{}", refused.text());
    assert!(
        refused.text().contains("at most 16 KiB"),
        "{}",
        refused.text()
    );
    let big = lock_info("big", &"x".repeat(12 << 10));
    let locked = send_with("LOCK", &url, Some(&big), &[("Authorization", &writer)]);
    assert_eq!(locked.status, 200, "{}", locked.text());
    let started = std::time::Instant::now();
    for _ in 0..300 {
        let refused = send_with("POST", &url, Some(&state(1)), &[("Authorization", &reader)]);
        assert_eq!(refused.status, 403);
    }
    for _ in 0..30 {
        let blocked = send_with("POST", &url, Some(&state(1)), &[("Authorization", &writer)]);
        assert_eq!(blocked.status, 423);
    }
    // The lock (the backend's records other than changes), then the
    // refusals (a sequence of their own).
    let trail = std::fs::read_to_string(data.join("audit/r/backends/default/requests.jsonl"))
        .unwrap()
        + &std::fs::read_to_string(data.join("audit/r/refusals.jsonl")).unwrap();
    let records: Vec<Value> = trail
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let by = |caller: &str| records.iter().filter(|r| r["caller"] == caller).count();
    // The lock, then each caller's refusals at a bounded rate (a burst of
    // 20, then one per 3 s of the run, however slow the machine).
    assert_eq!(records[0]["operation"], "lock");
    let allowed = 20 + started.elapsed().as_secs() as usize / 3 + 1;
    assert!(
        by("reader") <= allowed,
        "{} refusals of reader recorded, {allowed} allowed",
        by("reader")
    );
    // What a change answers once it ran is always recorded (and the
    // refused lock, within the caller's burst).
    assert_eq!(by("writer"), 1 + 1 + 30);
    for record in &records {
        let holder = record["holder"].as_str().unwrap_or("");
        assert!(holder.chars().count() <= 201, "{}", holder.len());
    }
    assert!(trail.len() < 64 << 10, "{} bytes", trail.len());
}

/// Whoever may write to backend `a` floods it with LOCK/UNLOCK: the trail
/// stays within its bound, `a`'s flood rotates out only `a`'s oldest lock
/// records, and `b`'s write and `a`'s own earlier write are still found by
/// `wasmstate audit`.
#[test]
fn a_lock_flood_on_one_backend_rotates_out_only_its_own_lock_records() {
    let dir = tempdir();
    let data = dir.path().join("data");
    let server = Server::with_config(
        &data,
        "[backends.a]\nguest = \"local\"\n[backends.b]\nguest = \"local\"\n\
         [audit]\nreplica = \"r\"\nmax_mib = 1\nfiles = 2\n",
    );
    assert_eq!(
        send("POST", &server.state_url("b", "w"), Some(&state(1))).status,
        200
    );
    assert_eq!(
        send("POST", &server.state_url("a", "w"), Some(&state(1))).status,
        200
    );
    // 2,000 LOCK/UNLOCK pairs: some 1.3 MB of records, more than the
    // whole trail's 1 MiB, on one keep-alive connection.
    let client = reqwest::blocking::Client::new();
    let url = server.state_url("a", "w");
    let lock = lock_info("flood", "mallory@laptop");
    for _ in 0..2000 {
        for method in ["LOCK", "UNLOCK"] {
            let answer = client
                .request(
                    reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
                    &url,
                )
                .header("Content-Type", "application/json")
                .body(lock.clone())
                .send()
                .unwrap();
            assert_eq!(answer.status(), 200, "{method}");
        }
    }
    // The sizes: a unit is 1 MiB / (3 x 2 backends + 1); a's locks and
    // unlocks have one unit, over two files.
    let unit = (1u64 << 20) / 7;
    // A file's size, or all a folder's files'.
    let size = |path: &std::path::Path| -> u64 {
        match std::fs::metadata(path) {
            Ok(m) if m.is_file() => m.len(),
            _ => walk(path).iter().map(|f| f.metadata().unwrap().len()).sum(),
        }
    };
    let trail = data.join("audit/r");
    assert!(size(&trail) <= 1 << 20, "{} bytes", size(&trail));
    let a_requests: u64 = ["requests.jsonl", "requests.1.jsonl"]
        .iter()
        .map(|f| size(&trail.join("backends/a").join(f)))
        .sum();
    assert!(
        a_requests <= unit && a_requests >= unit / 3,
        "a's locks and unlocks hold {a_requests} bytes of their {unit}"
    );
    // One record each: the flood wrote none there.
    for backend in ["a", "b"] {
        let changes =
            std::fs::read_to_string(trail.join(format!("backends/{backend}/changes.jsonl")));
        assert_eq!(changes.unwrap().lines().count(), 1, "{backend}");
    }
    let search = |args: &[&str]| -> Vec<Value> {
        let mut all = vec![
            "audit",
            "--server",
            &server.url,
            "--json",
            "--limit",
            "1000",
        ];
        all.extend(args);
        let (ok, out) = wasmstate(&all);
        assert!(ok, "{out}");
        out.lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let b = search(&["-b", "b"]);
    assert_eq!(b.len(), 1, "{b:?}");
    assert_eq!(
        (b[0]["operation"].as_str(), b[0]["status"].as_u64()),
        (Some("write"), Some(200))
    );
    let a_writes = search(&["-b", "a", "--operation", "write"]);
    assert_eq!(a_writes.len(), 1, "{a_writes:?}");
    // The flood did rotate: a's oldest locks are gone, its newest kept.
    let a_locks = search(&["-b", "a", "--operation", "lock"]);
    assert!(
        !a_locks.is_empty() && a_locks.len() < 2000,
        "{} of a's 2000 locks kept",
        a_locks.len()
    );
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::fs::DirEntry> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files = Vec::new();
    for entry in entries.map(Result::unwrap) {
        if entry.file_type().unwrap().is_dir() {
            files.extend(walk(&entry.path()));
        } else {
            files.push(entry);
        }
    }
    files
}
