//! Terraform's HTTP backend protocol, status code by status code, over real
//! HTTP against a running `wasmstate` process on the embedded local guest.

use crate::common::*;
use base64::Engine as _;
use md5::{Digest, Md5};

fn holder_id(answer: &Answer) -> String {
    answer.json()["ID"].as_str().unwrap_or_default().to_string()
}

#[test]
fn read_write_round_trip_and_missing_state() {
    let dir = tempdir();
    let server = Server::start(dir.path());
    let url = server.state_url("default", "roundtrip");

    let missing = send("GET", &url, None);
    assert_eq!(missing.status, 404, "{}", missing.text());

    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);
    let read = send("GET", &url, None);
    assert_eq!(read.status, 200);
    assert_eq!(read.body, state(1), "state must come back byte for byte");

    // PUT is accepted as an update method too.
    assert_eq!(send("PUT", &url, Some(&state(2))).status, 200);
    assert_eq!(send("GET", &url, None).body, state(2));

    assert_eq!(send("DELETE", &url, None).status, 200);
    assert_eq!(send("GET", &url, None).status, 404);

    // The state is a plain file in the backend's own folder.
    let file = dir
        .path()
        .join("backends/default/roundtrip/terraform.tfstate");
    assert!(!file.exists());
}

#[test]
fn lock_conflicts_return_the_holder_and_writes_need_its_id() {
    let dir = tempdir();
    let server = Server::start(dir.path());
    let url = server.state_url("default", "locking");
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);

    assert_eq!(
        send("LOCK", &url, Some(&lock_info("lock-a", "alice@host"))).status,
        200
    );
    // A retried LOCK from the holder itself succeeds (Terraform retries 5xx).
    assert_eq!(
        send("LOCK", &url, Some(&lock_info("lock-a", "alice@host"))).status,
        200
    );

    let conflict = send("LOCK", &url, Some(&lock_info("lock-b", "bob@host")));
    assert_eq!(conflict.status, 423);
    assert_eq!(holder_id(&conflict), "lock-a");
    assert_eq!(conflict.json()["Who"], "alice@host");

    // Writes without the holder's ID, or with a wrong one, are refused and change nothing.
    let no_id = send("POST", &url, Some(&state(2)));
    assert_eq!(no_id.status, 423);
    assert_eq!(holder_id(&no_id), "lock-a");
    let wrong_id = send("POST", &format!("{url}?ID=lock-b"), Some(&state(2)));
    assert_eq!(wrong_id.status, 423);
    assert_eq!(send("DELETE", &url, None).status, 423);
    assert_eq!(send("GET", &url, None).body, state(1));

    assert_eq!(
        send("POST", &format!("{url}?ID=lock-a"), Some(&state(2))).status,
        200
    );
    assert_eq!(send("GET", &url, None).body, state(2));

    let mismatch = send("UNLOCK", &url, Some(&lock_info("lock-b", "bob@host")));
    assert_eq!(mismatch.status, 409);
    assert_eq!(holder_id(&mismatch), "lock-a");

    assert_eq!(
        send("UNLOCK", &url, Some(&lock_info("lock-a", "alice@host"))).status,
        200
    );
    // A retried UNLOCK is harmless.
    assert_eq!(
        send("UNLOCK", &url, Some(&lock_info("lock-a", "alice@host"))).status,
        200
    );
    assert_eq!(
        send("LOCK", &url, Some(&lock_info("lock-b", "bob@host"))).status,
        200
    );
}

#[test]
fn write_with_a_lock_id_after_losing_the_lock_is_refused() {
    let dir = tempdir();
    let server = Server::start(dir.path());
    let url = server.state_url("default", "lost");
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);
    let answer = send("POST", &format!("{url}?ID=gone"), Some(&state(9)));
    assert_eq!(answer.status, 409, "{}", answer.text());
    assert_eq!(send("GET", &url, None).body, state(1));
}

#[test]
fn terraform_force_unlock_sends_an_empty_body() {
    let dir = tempdir();
    let server = Server::start(dir.path());
    let url = server.state_url("default", "force");
    assert_eq!(
        send("LOCK", &url, Some(&lock_info("stale", "crashed@host"))).status,
        200
    );
    assert_eq!(send("UNLOCK", &url, None).status, 200);
    assert_eq!(
        send("LOCK", &url, Some(&lock_info("fresh", "me@host"))).status,
        200
    );
}

#[test]
fn opentofu_force_unlock_sends_only_the_id() {
    let dir = tempdir();
    let server = Server::start(dir.path());
    let url = server.state_url("default", "tofu");
    assert_eq!(
        send("LOCK", &url, Some(&lock_info("stale", "crashed@host"))).status,
        200
    );
    let tofu_body = br#"{"ID":"stale","Operation":"","Info":"","Who":"","Version":"","Created":"0001-01-01T00:00:00Z","Path":""}"#;
    // The wrong ID typed by the operator is refused with the holder...
    let wrong = send("UNLOCK", &url, Some(&tofu_body.replace_id("typo")));
    assert_eq!(wrong.status, 409);
    assert_eq!(holder_id(&wrong), "stale");
    // ...the right one releases it.
    assert_eq!(send("UNLOCK", &url, Some(tofu_body)).status, 200);
    assert_eq!(
        send("LOCK", &url, Some(&lock_info("fresh", "me@host"))).status,
        200
    );
}

trait ReplaceId {
    fn replace_id(&self, id: &str) -> Vec<u8>;
}

impl ReplaceId for [u8] {
    fn replace_id(&self, id: &str) -> Vec<u8> {
        String::from_utf8_lossy(self)
            .replace("\"stale\"", &format!("\"{id}\""))
            .into_bytes()
    }
}

#[test]
fn content_md5_is_verified() {
    let dir = tempdir();
    let server = Server::start(dir.path());
    let url = server.state_url("default", "md5");
    let body = state(1);
    let good = base64::engine::general_purpose::STANDARD.encode(Md5::digest(&body));
    let ok = send_with("POST", &url, Some(&body), &[("Content-MD5", &good)]);
    assert_eq!(ok.status, 200);

    let damaged = send_with("POST", &url, Some(&state(2)), &[("Content-MD5", &good)]);
    assert_eq!(damaged.status, 400);
    assert!(damaged.text().contains("Content-MD5"), "{}", damaged.text());
    assert_eq!(
        send("GET", &url, None).body,
        body,
        "a refused write changes nothing"
    );
}

#[test]
fn bad_input_gets_a_one_line_4xx_and_changes_nothing() {
    let dir = tempdir();
    let server = Server::with_config(
        dir.path(),
        "max_body_mib = 1\n[backends.default]\nguest = \"local\"\n",
    );
    let url = server.state_url("default", "bad");
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);

    let cases: Vec<(&str, String, Option<Vec<u8>>, u16)> = vec![
        ("POST", url.clone(), Some(b"{not json".to_vec()), 400),
        ("POST", url.clone(), Some(b"[1,2,3]".to_vec()), 400),
        ("POST", url.clone(), Some(vec![b' '; 2 << 20]), 413),
        ("LOCK", url.clone(), Some(b"{\"ID\":".to_vec()), 400),
        ("LOCK", url.clone(), Some(b"{\"ID\":\"\"}".to_vec()), 400),
        ("UNLOCK", url.clone(), Some(b"nope".to_vec()), 400),
        ("PATCH", url.clone(), Some(state(5)), 405),
        ("GET", server.state_url("nosuch", "default"), None, 404),
        ("GET", server.state_url("default", ".hidden"), None, 400),
        ("GET", server.state_url("default", "a%2Fb"), None, 400),
        ("GET", server.state_url("default", "a%0Ab"), None, 400),
        ("GET", server.state_url("default", "a%00b"), None, 400),
        (
            "POST",
            server.state_url("default", &"x".repeat(91)),
            Some(state(1)),
            400,
        ),
        ("GET", format!("{}/nowhere", server.url), None, 404),
    ];
    for (method, url, body, want) in cases {
        let answer = send(method, &url, body.as_deref());
        assert_eq!(answer.status, want, "{method} {url}: {}", answer.text());
        let text = answer.text();
        assert!(
            text.ends_with('\n') && text.trim_end().lines().count() == 1,
            "{method} {url}: reason must be one line: {text:?}"
        );
    }
    // An unknown backend is named, but the configured ones are not listed
    // to whoever asks.
    let unknown = send("GET", &server.state_url("nosuch", "default"), None);
    assert!(
        unknown.text().contains("no backend named \"nosuch\"")
            && !unknown.text().contains("default"),
        "{}",
        unknown.text()
    );
    assert_eq!(
        send("PATCH", &url, None).headers["allow"],
        "GET, POST, PUT, DELETE, LOCK, UNLOCK"
    );
    assert_eq!(
        send("GET", &url, None).body,
        state(1),
        "bad input must change nothing"
    );
    assert!(!dir.path().join("backends/default/.hidden").exists());
}

#[test]
fn dot_dot_workspace_is_refused() {
    // HTTP clients normalise `..` away, so speak HTTP/1.1 by hand.
    use std::io::{Read, Write};
    let dir = tempdir();
    let server = Server::start(dir.path());
    let addr = server.url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET /states/default/.. HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 400"), "{response}");
}

#[test]
fn workspace_api_and_cli() {
    let dir = tempdir();
    let server = Server::start(dir.path());
    let ws = |name: &str| format!("{}/workspaces/default/{name}", server.url);
    let list = || send("GET", &format!("{}/workspaces/default", server.url), None).json();

    assert_eq!(list(), serde_json::json!(["default"]));
    assert_eq!(send("PUT", &ws("staging"), None).status, 201);
    assert_eq!(
        send("PUT", &ws("staging"), None).status,
        200,
        "create is idempotent"
    );
    assert_eq!(
        send(
            "POST",
            &server.state_url("default", "prod"),
            Some(&state(1))
        )
        .status,
        200
    );
    assert_eq!(list(), serde_json::json!(["default", "prod", "staging"]));

    // Refused while locked, with the holder.
    let prod = server.state_url("default", "prod");
    assert_eq!(
        send("LOCK", &prod, Some(&lock_info("l1", "ci@host"))).status,
        200
    );
    let refused = send("DELETE", &ws("prod"), None);
    assert_eq!(refused.status, 423);
    assert_eq!(refused.json()["ID"], "l1");
    assert_eq!(
        send("GET", &prod, None).status,
        200,
        "refused delete keeps the state"
    );
    assert_eq!(
        send("UNLOCK", &prod, Some(&lock_info("l1", "ci@host"))).status,
        200
    );

    assert_eq!(send("DELETE", &ws("prod"), None).status, 200);
    assert_eq!(send("GET", &prod, None).status, 404);
    assert_eq!(send("DELETE", &ws("prod"), None).status, 404);
    assert_eq!(send("DELETE", &ws("default"), None).status, 400);

    // The CLI drives the same API.
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(BIN)
            .arg("workspace")
            .args(args)
            .args(["--server", &server.url])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, out) = cli(&["create", "qa"]);
    assert!(ok && out.contains("created workspace \"qa\""), "{out}");
    let (ok, out) = cli(&["list"]);
    assert!(ok, "{out}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["default", "qa", "staging"]
    );
    let (ok, out) = cli(&["delete", "qa"]);
    assert!(ok && out.contains("deleted"), "{out}");
    let (ok, out) = cli(&["delete", "qa"]);
    assert!(
        !ok && out.contains("404") && out.contains("no workspace named"),
        "{out}"
    );
}

#[test]
fn health_endpoint_answers() {
    let dir = tempdir();
    let server = Server::start(dir.path());
    let answer = send("GET", &format!("{}/healthz", server.url), None);
    assert_eq!(answer.status, 200);
    assert_eq!(answer.text(), "ok\n");
}

#[test]
fn every_request_is_logged_on_one_line() {
    let dir = tempdir();
    let server = Server::start(dir.path());
    send("GET", &server.state_url("default", "logged"), None);
    wait_until(
        "the request log line",
        std::time::Duration::from_secs(10),
        || {
            server.log_text().lines().any(|l| {
                l.contains("method=GET")
                    && l.contains("backend=\"default\"")
                    && l.contains("workspace=\"logged\"")
                    && l.contains("status=404")
                    && l.contains("ms=")
            })
        },
    );
}

#[test]
fn a_bad_config_file_stops_startup_with_file_key_and_reason() {
    let dir = tempdir();
    let config = dir.path().join("bad.toml");
    std::fs::write(
        &config,
        "[backends.default]\nguest = \"local\"\nmemory_mib = 0\n",
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bad.toml")
            && stderr.contains("backends.default.memory_mib = 0: must be between"),
        "{stderr}"
    );
}

#[test]
fn sigterm_stops_the_server_cleanly() {
    let dir = tempdir();
    let server = Server::start(dir.path());
    assert_eq!(
        send("POST", &server.state_url("default", "t"), Some(&state(1))).status,
        200
    );
    let status = server.terminate(std::time::Duration::from_secs(10));
    assert!(status.success(), "exit status {status}");
}

fn lineage_state(lineage: &str, serial: u64, note: &str) -> Vec<u8> {
    format!(r#"{{"version":4,"serial":{serial},"lineage":"{lineage}","note":"{note}"}}"#)
        .into_bytes()
}

#[test]
fn stale_or_unrelated_states_are_refused() {
    let dir = tempdir();
    let server = Server::with_config(
        dir.path(),
        "[backends.default]\nguest = \"local\"\n[backends.forceable]\nguest = \"local\"\nallow_force_push = true\n",
    );
    let url = server.state_url("default", "guarded");
    assert_eq!(
        send("POST", &url, Some(&lineage_state("L1", 5, "five"))).status,
        200
    );

    let older = send("POST", &url, Some(&lineage_state("L1", 4, "four")));
    assert_eq!(older.status, 409, "{}", older.text());
    assert!(
        older
            .text()
            .contains("serial 4 is older than the stored state's 5"),
        "{}",
        older.text()
    );

    let unrelated = send("POST", &url, Some(&lineage_state("L2", 9, "other")));
    assert_eq!(unrelated.status, 409);
    assert!(
        unrelated
            .text()
            .contains("\"L2\" differs from the stored state's \"L1\""),
        "{}",
        unrelated.text()
    );

    let rival = send(
        "POST",
        &url,
        Some(&lineage_state("L1", 5, "someone else's five")),
    );
    assert_eq!(
        rival.status,
        409,
        "same serial, other content: {}",
        rival.text()
    );

    // A retried POST of what is stored succeeds; a newer serial is written.
    assert_eq!(
        send("POST", &url, Some(&lineage_state("L1", 5, "five"))).status,
        200
    );
    assert_eq!(
        send("POST", &url, Some(&lineage_state("L1", 6, "six"))).status,
        200
    );
    assert_eq!(send("GET", &url, None).body, lineage_state("L1", 6, "six"));

    // The operator can allow `state push -force` per backend.
    let forced = server.state_url("forceable", "ws");
    assert_eq!(
        send("POST", &forced, Some(&lineage_state("L1", 5, "a"))).status,
        200
    );
    assert_eq!(
        send("POST", &forced, Some(&lineage_state("L2", 1, "b"))).status,
        200
    );
    assert_eq!(send("GET", &forced, None).body, lineage_state("L2", 1, "b"));
}
