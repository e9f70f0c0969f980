//! Review of issue 44's TFE door (host/src/tfe): attacks as a network
//! client. `fixed_*` tests assert a finding's fix; each `known_gap_*` test
//! asserts a gap still open (docs/cloud-block.md names it), so it fails
//! the day the gap closes: invert its key assertion then. `sound_*` tests
//! pin what was checked and held.

mod followups;

use crate::common::*;
use base64::Engine as _;

/// A server with backend `acme`; token `ci` administers it, token `runner`
/// writes it (a CI token shared by several pipelines).
struct Fixture {
    server: Server,
    ci: String,
    runner: String,
    data: tempfile::TempDir,
}

fn config(ci_sha: &str, runner_sha: &str) -> String {
    format!(
        r#"
        [backends.acme]
        guest = "local"

        [[tokens]]
        name = "ci"
        sha256 = "{ci_sha}"
        grants = ["acme:*:admin"]
        [[tokens]]
        name = "runner"
        sha256 = "{runner_sha}"
        grants = ["acme:*:write"]
        "#
    )
}

fn fixture() -> Fixture {
    let data = tempdir();
    let (ci, ci_sha) = generate_token();
    let (runner, runner_sha) = generate_token();
    let server = Server::with_config(data.path(), &config(&ci_sha, &runner_sha));
    Fixture {
        server,
        ci,
        runner,
        data,
    }
}

fn md5_hex(b: &[u8]) -> String {
    use md5::Digest;
    hex::encode(md5::Md5::digest(b))
}

fn api_at(url: &str, method: &str, path: &str, token: &str, body: Option<&str>) -> Answer {
    let auth = format!("Bearer {token}");
    send_with(
        method,
        &format!("{url}/api/v2/{path}"),
        body.map(str::as_bytes),
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/vnd.api+json"),
        ],
    )
}

impl Fixture {
    fn api(&self, method: &str, path: &str, token: &str, body: Option<&str>) -> Answer {
        api_at(&self.server.url, method, path, token, body)
    }

    fn http(&self, method: &str, path: &str, token: &str, body: Option<&[u8]>) -> Answer {
        let auth = format!("Bearer {token}");
        send_with(
            method,
            &format!("{}{path}", self.server.url),
            body,
            &[("Authorization", &auth)],
        )
    }

    /// Create `name` through the TFE door (as `ci`), with `tags`: its id.
    fn create(&self, name: &str, tags: &[&str]) -> String {
        let tags: Vec<String> = tags
            .iter()
            .map(|t| format!(r#"{{"type":"tags","attributes":{{"name":"{t}"}}}}"#))
            .collect();
        let body = format!(
            r#"{{"data":{{"type":"workspaces","attributes":{{"name":"{name}"}},"relationships":{{"tags":{{"data":[{}]}}}}}}}}"#,
            tags.join(",")
        );
        let created = self.api(
            "POST",
            "organizations/acme/workspaces",
            &self.ci,
            Some(&body),
        );
        assert_eq!(created.status, 201, "{}", created.text());
        created.json()["data"]["id"].as_str().unwrap().to_string()
    }

    /// Upload-mode state version of `state` as `token`: the raw upload URL.
    fn pending(&self, id: &str, token: &str, state: &[u8], serial: u64) -> String {
        let version = self.api(
            "POST",
            &format!("workspaces/{id}/state-versions"),
            token,
            Some(&format!(
                r#"{{"data":{{"type":"state-versions","attributes":{{"serial":{serial},"md5":"{}","lineage":"test-lineage"}}}}}}"#,
                md5_hex(state)
            )),
        );
        assert_eq!(version.status, 201, "{}", version.text());
        version.json()["data"]["attributes"]["hosted-state-upload-url"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

fn lock_info(id: &str) -> Vec<u8> {
    format!(
        r#"{{"ID":"{id}","Operation":"OperationTypeApply","Info":"","Who":"runner@ci","Version":"1.11.4","Created":"2026-01-01T00:00:00Z","Path":""}}"#
    )
    .into_bytes()
}

const OCTETS: [(&str, &str); 1] = [("Content-Type", "application/octet-stream")];

/// Fixed (F1): a state version is bound to the TFE lock its creator held:
/// its upload after an admin force-unlocked that lock is refused (409), as
/// the http door refuses a write whose lock is gone; one created without
/// the lock is refused at once; and a lock taken over in between stays.
#[test]
fn fixed_an_upload_fails_after_its_lock_was_force_unlocked() {
    let f = fixture();
    let id = f.create("w", &[]);
    assert_eq!(
        f.http("POST", "/states/acme/w", &f.ci, Some(&state(1)))
            .status,
        200
    );

    // The http door: a write under a force-unlocked lock is refused.
    assert_eq!(
        f.http("LOCK", "/states/acme/w", &f.runner, Some(&lock_info("L1")))
            .status,
        200
    );
    assert_eq!(f.http("UNLOCK", "/states/acme/w", &f.ci, None).status, 200);
    let late = f.http("POST", "/states/acme/w?ID=L1", &f.runner, Some(&state(2)));
    assert!(late.status >= 400, "{} {}", late.status, late.text());
    assert_eq!(f.http("GET", "/states/acme/w", &f.ci, None).body, state(1));

    // The TFE door: lock, create a version, force-unlock, upload.
    let unlocked_create = f.api(
        "POST",
        &format!("workspaces/{id}/state-versions"),
        &f.runner,
        Some(&format!(
            r#"{{"data":{{"type":"state-versions","attributes":{{"serial":2,"md5":"{}","lineage":"test-lineage"}}}}}}"#,
            md5_hex(&state(2))
        )),
    );
    assert_eq!(unlocked_create.status, 409, "{}", unlocked_create.text());
    let lock = |token: &str| {
        let locked = f.api(
            "POST",
            &format!("workspaces/{id}/actions/lock"),
            token,
            None,
        );
        assert_eq!(locked.status, 200, "{}", locked.text());
    };
    let force_unlock = || {
        let forced = f.api(
            "POST",
            &format!("workspaces/{id}/actions/force-unlock"),
            &f.ci,
            None,
        );
        assert_eq!(forced.status, 200, "{}", forced.text());
    };
    lock(&f.runner);
    let url = f.pending(&id, &f.runner, &state(2), 2);
    force_unlock();
    let put = send_with("PUT", &url, Some(&state(2)), &OCTETS);
    // Fixed: 409, the write whose lock was taken away does not land.
    assert_eq!(put.status, 409, "{}", put.text());
    assert_eq!(f.http("GET", "/states/acme/w", &f.ci, None).body, state(1));

    // Taken over by the same name in between (a second run of the same
    // token): the first run's upload fails and the new lock stays.
    lock(&f.runner);
    let url = f.pending(&id, &f.runner, &state(2), 2);
    force_unlock();
    lock(&f.runner);
    let put = send_with("PUT", &url, Some(&state(2)), &OCTETS);
    assert_eq!(put.status, 409, "{}", put.text());
    assert_eq!(f.http("GET", "/states/acme/w", &f.ci, None).body, state(1));
    let doc = f.api("GET", &format!("workspaces/{id}"), &f.ci, None);
    assert_eq!(doc.json()["data"]["attributes"]["locked"], true);

    // Under a lock that still holds, the upload lands; the state's
    // download URL is relative (right behind any proxy).
    let url = f.pending(&id, &f.runner, &state(2), 2);
    let put = send_with("PUT", &url, Some(&state(2)), &OCTETS);
    assert_eq!(put.status, 200, "{}", put.text());
    assert_eq!(f.http("GET", "/states/acme/w", &f.ci, None).body, state(2));
    let current = f.api(
        "GET",
        &format!("workspaces/{id}/current-state-version"),
        &f.runner,
        None,
    );
    let download = current.json()["data"]["attributes"]["hosted-state-download-url"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        download.starts_with("/api/v2/state-versions/"),
        "{download}"
    );
}

/// Fixed (F7, defence in depth): the TFE door's lock, force-unlock and
/// safe-delete are bodyless POSTs, the shape of a browser's `no-cors`
/// simple request (no preflight): every non-GET under `/api/v2` now needs
/// the JSON:API content type (which forces a preflight), 415 otherwise.
#[test]
fn fixed_bodyless_simple_posts_are_refused() {
    let f = fixture();
    let id = f.create("victim", &[]);
    let simple = |path: &str, extra: &[(&str, &str)]| {
        let auth = format!("Bearer {}", f.ci);
        let mut headers = vec![("Authorization", auth.as_str())];
        headers.extend_from_slice(extra);
        send_with(
            "POST",
            &format!("{}/api/v2/{path}", f.server.url),
            None,
            &headers,
        )
    };
    // A page's request carries Origin: refused, as the guard means to.
    let from_page = simple(
        &format!("workspaces/{id}/actions/lock"),
        &[
            ("Origin", "https://evil.example"),
            ("Sec-Fetch-Site", "cross-site"),
        ],
    );
    assert_eq!(from_page.status, 403, "{}", from_page.text());
    // The same request without those headers (an old browser, a plugin):
    // fixed: refused for want of the JSON:API content type.
    let lock = simple(&format!("workspaces/{id}/actions/lock"), &[]);
    assert_eq!(lock.status, 415, "{}", lock.text());
    let delete = simple(
        &format!("workspaces/{id}/actions/safe-delete"),
        &[("Content-Type", "text/plain")],
    );
    assert_eq!(delete.status, 415, "{}", delete.text());
    let doc = f.api("GET", &format!("workspaces/{id}"), &f.ci, None);
    assert_eq!(doc.status, 200, "{}", doc.text());
    assert_eq!(doc.json()["data"]["attributes"]["locked"], false);
    // With it (as terraform sends), the same calls work.
    let lock = simple(
        &format!("workspaces/{id}/actions/lock"),
        &[("Content-Type", "application/vnd.api+json")],
    );
    assert_eq!(lock.status, 200, "{}", lock.text());
}

/// Fixed (F8): `[[tokens]]` tokens sign in as the Basic password at the
/// API, but the console's login form (which builds a Basic header) refuses
/// a CI token with any user name, as it refuses OIDC tokens: no 8-hour
/// browser session with its grants.
#[test]
fn fixed_a_ci_token_does_not_sign_in_to_the_console() {
    let f = fixture();
    let client = reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let answer = client
        .post(format!("{}/ui/login", f.server.url))
        .form(&[("user", "nobody-at-all"), ("password", f.runner.as_str())])
        .send()
        .unwrap();
    assert_eq!(answer.status().as_u16(), 403);
    assert!(answer.headers().get("set-cookie").is_none());
    // At the API, the token still signs in as a Basic password.
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("x:{}", f.runner));
    let api = send_with(
        "GET",
        &f.server.state_url("acme", "nothing"),
        None,
        &[("Authorization", &format!("Basic {basic}"))],
    );
    assert!(![401, 403].contains(&api.status), "{}", api.text());
}

/// Fixed (F3): two servers on one data directory (supported: the audit
/// trail gives each its own) keep each other's tag changes. Since
/// contract 0.3.0 the tags are the storage's (a conditional
/// read-modify-write), not the data directory's file.
#[test]
fn fixed_replicas_sharing_a_data_dir_keep_each_others_tags() {
    let f = fixture();
    // The second replica starts first, as replicas do: it loads the file
    // before the first one's next change.
    let config = f.data.path().join("wasmstate.toml");
    let second = Server::with_config_file(f.data.path(), &config);
    let id = f.create("shared", &["alpha"]);
    let tag = |url: &str, name: &str| {
        let answer = api_at(
            url,
            "POST",
            &format!("workspaces/{id}/relationships/tags"),
            &f.ci,
            Some(&format!(
                r#"{{"data":[{{"type":"tags","attributes":{{"name":"{name}"}}}}]}}"#
            )),
        );
        assert_eq!(answer.status, 204, "{}", answer.text());
    };
    tag(&second.url, "beta");
    drop(second);
    // Fixed: the first replica's `alpha` is still there, beside `beta`.
    let doc = f.api("GET", &format!("workspaces/{id}"), &f.ci, None);
    assert_eq!(
        doc.json()["data"]["attributes"]["tag-names"],
        serde_json::json!(["alpha", "beta"])
    );
    assert!(!f.data.path().join("tfe").join("workspaces.json").exists());
}

/// Fixed (F4): tags were unbounded in number: one writer grew the
/// replica's metadata (rewritten whole on every change) without limit.
/// Now at most 50 per workspace (each up to 255 bytes), well inside a
/// metadata document's 64 KiB.
#[test]
fn fixed_tags_are_bounded() {
    let f = fixture();
    let id = f.create("big", &[]);
    let add = |round: usize, count: usize| {
        let tags: Vec<String> = (0..count)
            .map(|i| {
                format!(
                    r#"{{"type":"tags","attributes":{{"name":"r{round}-{i}-{}"}}}}"#,
                    "x".repeat(240)
                )
            })
            .collect();
        f.api(
            "POST",
            &format!("workspaces/{id}/relationships/tags"),
            &f.runner,
            Some(&format!(r#"{{"data":[{}]}}"#, tags.join(","))),
        )
    };
    let many = add(0, 200);
    assert_eq!(many.status, 422, "{}", many.text());
    let some = add(1, 30);
    assert_eq!(some.status, 204, "{}", some.text());
    let past = add(2, 30);
    assert_eq!(past.status, 422, "{}", past.text());
    let doc = f.api("GET", &format!("workspaces/{id}"), &f.runner, None);
    assert_eq!(
        doc.json()["data"]["attributes"]["tag-names"]
            .as_array()
            .unwrap()
            .len(),
        30
    );
}

/// Sound: bad input never reaches a 5xx, foreign and forged ids name
/// nothing, and a read-only or foreign caller cannot act.
#[test]
fn sound_bad_input_and_foreign_callers_get_4xx() {
    let data = tempdir();
    let (ci, ci_sha) = generate_token();
    let (runner, runner_sha) = generate_token();
    let (reader, reader_sha) = generate_token();
    let (foreign, foreign_sha) = generate_token();
    let server = Server::with_config(
        data.path(),
        &format!(
            r#"{}
            [backends.other]
            guest = "local"
            [[tokens]]
            name = "reader"
            sha256 = "{reader_sha}"
            grants = ["acme:*:read"]
            [[tokens]]
            name = "foreign"
            sha256 = "{foreign_sha}"
            grants = ["other:*:admin"]
            "#,
            config(&ci_sha, &runner_sha)
        ),
    );
    let f = Fixture {
        server,
        ci,
        runner,
        data,
    };
    let id = f.create("w", &[]);
    // A state version is created under its creator's lock (kept here).
    let locked = f.api(
        "POST",
        &format!("workspaces/{id}/actions/lock"),
        &f.runner,
        None,
    );
    assert_eq!(locked.status, 200, "{}", locked.text());
    let url = f.pending(&id, &f.runner, &state(1), 1);
    let sv = {
        assert_eq!(send_with("PUT", &url, Some(&state(1)), &OCTETS).status, 200);
        let current = f.api(
            "GET",
            &format!("workspaces/{id}/current-state-version"),
            &f.ci,
            None,
        );
        current.json()["data"]["id"].as_str().unwrap().to_string()
    };
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    // A foreign token: the same 404 as for nothing, everywhere.
    for (method, path) in [
        ("GET", format!("workspaces/{id}")),
        ("GET", "organizations/acme/workspaces".to_string()),
        ("GET", "organizations/acme/workspaces/w".to_string()),
        ("GET", "organizations/acme/entitlement-set".to_string()),
        ("POST", format!("workspaces/{id}/actions/lock")),
        ("POST", format!("workspaces/{id}/actions/force-unlock")),
        ("GET", format!("state-versions/{sv}/download")),
        (
            "GET",
            format!("workspaces/{id}/current-state-version-outputs"),
        ),
        ("DELETE", format!("workspaces/{id}")),
    ] {
        let answer = f.api(method, &path, &foreign, Some("{}"));
        assert_eq!(answer.status, 404, "{method} {path}: {}", answer.text());
    }
    // A reader: reads, never changes.
    assert_eq!(
        f.api(
            "GET",
            &format!("state-versions/{sv}/download"),
            &reader,
            None
        )
        .status,
        200
    );
    for (method, path) in [
        ("POST", format!("workspaces/{id}/actions/lock")),
        ("POST", format!("workspaces/{id}/actions/force-unlock")),
        ("POST", format!("workspaces/{id}/state-versions")),
        ("POST", format!("workspaces/{id}/relationships/tags")),
        ("PATCH", format!("workspaces/{id}")),
        ("DELETE", format!("workspaces/{id}")),
    ] {
        let answer = f.api(method, &path, &reader, Some(r#"{"data":{}}"#));
        assert_eq!(answer.status, 403, "{method} {path}: {}", answer.text());
    }
    // Forged and malformed ids, odd pages, bad documents: 4xx, never 5xx.
    let bad = [
        ("GET", format!("workspaces/ws-{}", b64("acme/../w")), None),
        ("GET", format!("workspaces/ws-{}", b64("other/w")), None),
        ("GET", "workspaces/ws-!!!".to_string(), None),
        (
            "GET",
            "organizations/acme/workspaces/..%2Fw".to_string(),
            None,
        ),
        (
            "GET",
            "organizations/acme/workspaces/a%2Fb".to_string(),
            None,
        ),
        (
            "GET",
            "organizations/acme/workspaces?page%5Bsize%5D=0".to_string(),
            None,
        ),
        (
            "GET",
            format!(
                "state-versions/sv-{}.99999999999999999999999",
                b64("acme/w")
            ),
            None,
        ),
        (
            "GET",
            format!("state-versions/sv-{}.7/download", b64("acme/w")),
            None,
        ),
        (
            "GET",
            "state-version-outputs/wsout-a.b.c.d".to_string(),
            None,
        ),
        (
            "POST",
            format!("workspaces/{id}/actions/lock"),
            Some("{not json"),
        ),
        (
            "POST",
            format!("workspaces/{id}/state-versions"),
            Some(r#"{"data":{"attributes":{"serial":-1,"md5":"00"}}}"#),
        ),
        (
            "POST",
            format!("workspaces/{id}/state-versions"),
            Some(
                r#"{"data":{"attributes":{"serial":2,"md5":"d41d8cd98f00b204e9800998ecf8427e","state":""}}}"#,
            ),
        ),
        (
            "POST",
            format!("workspaces/{id}/relationships/tags"),
            Some(r#"{"data":[{"type":"tags"}]}"#),
        ),
        (
            "PATCH",
            format!("workspaces/{id}"),
            Some(r#"{"data":{"attributes":{"name":"renamed"}}}"#),
        ),
        (
            "POST",
            "organizations/acme/workspaces".to_string(),
            Some(r#"{"data":{"attributes":{"name":"../x"}}}"#),
        ),
        ("PUT", format!("workspaces/{id}"), Some("{}")),
        ("GET", "runs/run-1".to_string(), None),
    ];
    for (method, path, body) in bad {
        let answer = f.api(method, &path, &f.ci, body);
        assert!(
            (400..500).contains(&answer.status),
            "{method} {path}: {} {}",
            answer.status,
            answer.text()
        );
    }
    // A page far past the end: an empty page, no overflow.
    let far = f.api(
        "GET",
        "organizations/acme/workspaces?page%5Bnumber%5D=18446744073709551615&page%5Bsize%5D=100000",
        &f.ci,
        None,
    );
    assert_eq!(far.status, 200, "{}", far.text());
    assert_eq!(far.json()["data"].as_array().unwrap().len(), 0);
    // An upload that is not a state: refused, and the capability is spent.
    let not_state = b"not a state".to_vec();
    let url = f.pending(&id, &f.runner, &not_state, 2);
    let put = send_with("PUT", &url, Some(&not_state), &OCTETS);
    assert_eq!(put.status, 400, "{}", put.text());
    assert_eq!(send_with("PUT", &url, Some(&state(2)), &OCTETS).status, 404);
    let none = send_with(
        "PUT",
        &format!("{}/_tfe/upload", f.server.url),
        Some(b"x"),
        &OCTETS,
    );
    assert!((400..500).contains(&none.status), "{}", none.status);
    assert_eq!(f.http("GET", "/states/acme/w", &f.ci, None).body, state(1));
}
