//! Follow-ups of the TFE door's review (F2, F6, F9, F10): each test fails
//! if its fix is taken away.

use super::{fixture, lock_info, md5_hex};
use crate::common::*;
use base64::Engine as _;
use std::time::Duration;

/// Decided (F2): a TFE lock belongs to the principal who took it, as in
/// TFE (the wire carries no lock id): another principal's `unlock` (an
/// admin's too: force-unlock is its own, audited, act) and writes are
/// refused and the lock stays; the same principal (another run of one
/// token) may release it, which docs/cloud-block.md says, with the
/// remedy (one `[[tokens]]` name per pipeline). At the http door the
/// lock's ID is needed, and hidden from non-admins.
#[test]
fn decided_a_tfe_lock_belongs_to_the_principal_who_took_it() {
    let f = fixture();
    let id = f.create("w", &[]);

    // The http door: another run of the same token cannot learn the ID
    // nor release the lock without it.
    assert_eq!(
        f.http("LOCK", "/states/acme/w", &f.runner, Some(&lock_info("L2")))
            .status,
        200
    );
    let conflict = f.http(
        "LOCK",
        "/states/acme/w",
        &f.runner,
        Some(&lock_info("other")),
    );
    assert_eq!(conflict.status, 423);
    assert!(!conflict.text().contains("\"L2\""), "{}", conflict.text());
    let forced = f.http("UNLOCK", "/states/acme/w", &f.runner, None);
    assert_eq!(forced.status, 403, "{}", forced.text());
    assert_eq!(f.http("UNLOCK", "/states/acme/w", &f.ci, None).status, 200);

    // The TFE door: `runner` locks; `ci` (another principal, an admin)
    // can neither unlock it nor write under it.
    let action = |token: &str, action: &str| {
        f.api(
            "POST",
            &format!("workspaces/{id}/actions/{action}"),
            token,
            None,
        )
    };
    assert_eq!(action(&f.runner, "lock").status, 200);
    let unlock = action(&f.ci, "unlock");
    assert_eq!(unlock.status, 409, "{}", unlock.text());
    assert!(
        unlock.text().contains("locked by User runner"),
        "{}",
        unlock.text()
    );
    let one = state(1);
    let inline = |token: &str| {
        f.api(
            "POST",
            &format!("workspaces/{id}/state-versions"),
            token,
            Some(&format!(
                r#"{{"data":{{"type":"state-versions","attributes":{{"serial":1,"md5":"{}","lineage":"test-lineage","state":"{}"}}}}}}"#,
                md5_hex(&one),
                base64::engine::general_purpose::STANDARD.encode(&one)
            )),
        )
    };
    let foreign_write = inline(&f.ci);
    // 409 (the TFE door's answer to a lock held by another), never written.
    assert_eq!(foreign_write.status, 409, "{}", foreign_write.text());
    assert!(
        foreign_write.text().contains("locked by runner"),
        "{}",
        foreign_write.text()
    );
    assert_eq!(f.http("GET", "/states/acme/w", &f.ci, None).status, 404);
    let doc = f.api("GET", &format!("workspaces/{id}"), &f.ci, None);
    assert_eq!(doc.json()["data"]["attributes"]["locked"], true);
    // The principal itself writes and releases (TFE's rule).
    assert_eq!(inline(&f.runner).status, 201);
    assert_eq!(action(&f.runner, "unlock").status, 200);
    let doc = f.api("GET", &format!("workspaces/{id}"), &f.ci, None);
    assert_eq!(doc.json()["data"]["attributes"]["locked"], false);
}

/// Fixed (F9): a workspace deleted at the http door loses its TFE
/// metadata: created again, it does not carry the old tags (which cloud
/// blocks select by) nor the old terraform-version.
#[test]
fn fixed_tags_are_forgotten_when_the_http_door_deletes_a_workspace() {
    let f = fixture();
    let id = f.create("old", &["prod"]);
    let patched = f.api(
        "PATCH",
        &format!("workspaces/{id}"),
        &f.ci,
        Some(r#"{"data":{"type":"workspaces","attributes":{"terraform-version":"1.2.3"}}}"#),
    );
    assert_eq!(patched.status, 200, "{}", patched.text());
    assert_eq!(
        f.http("DELETE", "/workspaces/acme/old", &f.ci, None).status,
        200
    );
    // Kept in the storage since contract 0.3.0: this replica's file has
    // none of it.
    assert!(!f.data.path().join("tfe").join("workspaces.json").exists());
    assert_eq!(
        f.http("PUT", "/workspaces/acme/old", &f.runner, None)
            .status,
        201
    );
    let tagged = f.api(
        "GET",
        "organizations/acme/workspaces?search%5Btags%5D=prod",
        &f.runner,
        None,
    );
    assert_eq!(tagged.status, 200);
    assert_eq!(tagged.json()["data"], serde_json::json!([]));
    let doc = f.api("GET", "organizations/acme/workspaces/old", &f.ci, None);
    assert_eq!(
        doc.json()["data"]["attributes"]["terraform-version"],
        "latest"
    );
}

/// Fixed (F10): the request log names the backend and workspace a TFE
/// request acts on (its path names only ids), and a tag or PATCH refused
/// for want of a grant is in the audit trail like any other refusal;
/// allowed tag changes are recorded too.
#[test]
fn fixed_tfe_requests_are_logged_under_their_workspace_and_tag_changes_audited() {
    let data = tempdir();
    let (ci, ci_sha) = generate_token();
    let (runner, runner_sha) = generate_token();
    let (reader, reader_sha) = generate_token();
    let server = Server::with_config(
        data.path(),
        &format!(
            "{}\n[[tokens]]\nname = \"reader\"\nsha256 = \"{reader_sha}\"\ngrants = [\"acme:*:read\"]\n",
            super::config(&ci_sha, &runner_sha)
        ),
    );
    let f = super::Fixture {
        server,
        ci,
        runner,
        data,
    };
    let id = f.create("logged-ws", &[]);
    let tag = |token: &str| {
        f.api(
            "POST",
            &format!("workspaces/{id}/relationships/tags"),
            token,
            Some(r#"{"data":[{"type":"tags","attributes":{"name":"blue"}}]}"#),
        )
        .status
    };
    assert_eq!(tag(&reader), 403);
    assert_eq!(tag(&f.runner), 204);
    let patch = f.api(
        "PATCH",
        &format!("workspaces/{id}"),
        &reader,
        Some(r#"{"data":{"type":"workspaces","attributes":{"terraform-version":"1.0.0"}}}"#),
    );
    assert_eq!(patch.status, 403, "{}", patch.text());
    wait_until(
        "the TFE request's log line",
        Duration::from_secs(10),
        || {
            f.server.log_text().lines().any(|l| {
                l.contains("method=POST")
                    && l.contains("backend=\"acme\"")
                    && l.contains("workspace=\"logged-ws\"")
                    && l.contains("status=204")
            })
        },
    );
    assert!(!f.server.log_text().contains("backend=\"v2\""));
    let records = audit_text(&f.data.path().join("audit"));
    let updates: Vec<&str> = records
        .lines()
        .filter(|l| l.contains("\"workspace-update\""))
        .collect();
    assert!(
        updates
            .iter()
            .any(|l| l.contains("\"caller\":\"reader\"") && l.contains("\"status\":403")),
        "{records}"
    );
    assert!(
        updates
            .iter()
            .any(|l| l.contains("\"caller\":\"runner\"") && l.contains("tags added: blue")),
        "{records}"
    );
}

/// Fixed (F6): one workspace's lock holder cannot fill the server's
/// pending uploads (4096): past 16 pending in one workspace, a clear 429
/// with Retry-After; other workspaces still get theirs.
#[test]
fn fixed_one_workspace_cannot_exhaust_pending_uploads() {
    let f = fixture();
    let busy = f.create("busy", &[]);
    let quiet = f.create("quiet", &[]);
    for id in [&busy, &quiet] {
        let locked = f.api(
            "POST",
            &format!("workspaces/{id}/actions/lock"),
            &f.runner,
            None,
        );
        assert_eq!(locked.status, 200, "{}", locked.text());
    }
    for _ in 0..16 {
        f.pending(&busy, &f.runner, &state(1), 1);
    }
    let refused = f.api(
        "POST",
        &format!("workspaces/{busy}/state-versions"),
        &f.runner,
        Some(&format!(
            r#"{{"data":{{"type":"state-versions","attributes":{{"serial":1,"md5":"{}","lineage":"test-lineage"}}}}}}"#,
            md5_hex(&state(1))
        )),
    );
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert!(refused.headers.contains_key("retry-after"));
    assert!(refused.text().contains("upload one"), "{}", refused.text());
    let url = f.pending(&quiet, &f.runner, &state(1), 1);
    let put = send_with(
        "PUT",
        &url,
        Some(&state(1)),
        &[("Content-Type", "application/octet-stream")],
    );
    assert_eq!(put.status, 200, "{}", put.text());
}

/// Review of the follow-ups (F9): an http-door delete whose path spells
/// the name with percent-escapes (`%6Fld` is `old`, as the route decodes
/// it) forgets the tags too.
#[test]
fn fixed_an_http_delete_with_an_escaped_name_forgets_the_tags() {
    let f = fixture();
    f.create("old", &["prod"]);
    assert_eq!(
        f.http("DELETE", "/workspaces/acme/%6Fld", &f.ci, None)
            .status,
        200
    );
    assert_eq!(
        f.http("PUT", "/workspaces/acme/old", &f.runner, None)
            .status,
        201
    );
    let tagged = f.api(
        "GET",
        "organizations/acme/workspaces?search%5Btags%5D=prod",
        &f.runner,
        None,
    );
    assert_eq!(tagged.status, 200, "{}", tagged.text());
    assert_eq!(tagged.json()["data"], serde_json::json!([]));
}

/// Review of the follow-ups (F6): versions whose uploads were spoiled
/// (discarded) or used are no longer pending, so they neither count
/// against their workspace nor fill the server's room: one writer
/// creating and spoiling 4096 of them in one workspace leaves room for
/// everyone else.
#[test]
fn fixed_spoiled_uploads_do_not_fill_the_servers_pending_uploads() {
    let f = fixture();
    let busy = f.create("busy", &[]);
    let quiet = f.create("quiet", &[]);
    for (id, token) in [(&busy, &f.runner), (&quiet, &f.ci)] {
        let locked = f.api(
            "POST",
            &format!("workspaces/{id}/actions/lock"),
            token,
            None,
        );
        assert_eq!(locked.status, 200, "{}", locked.text());
    }
    // One connection, kept alive: thousands of requests.
    let client = reqwest::blocking::Client::new();
    let auth = format!("Bearer {}", f.runner);
    let create = format!(
        r#"{{"data":{{"type":"state-versions","attributes":{{"serial":1,"md5":"{}","lineage":"test-lineage"}}}}}}"#,
        md5_hex(&state(1))
    );
    for _ in 0..4096 / 16 {
        let mut urls = Vec::new();
        for _ in 0..16 {
            let created = client
                .post(format!(
                    "{}/api/v2/workspaces/{busy}/state-versions",
                    f.server.url
                ))
                .header("Authorization", &auth)
                .header("Content-Type", "application/vnd.api+json")
                .body(create.clone())
                .send()
                .unwrap();
            assert_eq!(created.status(), 201);
            let doc: serde_json::Value = serde_json::from_slice(&created.bytes().unwrap()).unwrap();
            urls.push(
                doc["data"]["attributes"]["hosted-state-upload-url"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
        }
        for url in urls {
            let spoiled = client
                .put(url)
                .header("Content-Type", "application/octet-stream")
                .body("not the state announced")
                .send()
                .unwrap();
            assert_eq!(spoiled.status(), 422);
        }
    }
    // Another principal, another workspace: room as ever.
    let url = f.pending(&quiet, &f.ci, &state(1), 1);
    let put = send_with(
        "PUT",
        &url,
        Some(&state(1)),
        &[("Content-Type", "application/octet-stream")],
    );
    assert_eq!(put.status, 200, "{}", put.text());
}

/// Review of the follow-ups (F6): one principal cannot take the server's
/// room through many workspaces either (it may create as many as it
/// likes): past 64 pending of its own, a clear 429 naming it; another
/// principal still gets its upload.
#[test]
fn fixed_one_principal_cannot_exhaust_pending_uploads_across_workspaces() {
    let f = fixture();
    let ids: Vec<String> = (0..5).map(|i| f.create(&format!("w{i}"), &[])).collect();
    for id in &ids {
        let locked = f.api(
            "POST",
            &format!("workspaces/{id}/actions/lock"),
            &f.runner,
            None,
        );
        assert_eq!(locked.status, 200, "{}", locked.text());
    }
    for id in &ids[..4] {
        for _ in 0..16 {
            f.pending(id, &f.runner, &state(1), 1);
        }
    }
    let refused = f.api(
        "POST",
        &format!("workspaces/{}/state-versions", ids[4]),
        &f.runner,
        Some(&format!(
            r#"{{"data":{{"type":"state-versions","attributes":{{"serial":1,"md5":"{}","lineage":"test-lineage"}}}}}}"#,
            md5_hex(&state(1))
        )),
    );
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert!(refused.headers.contains_key("retry-after"));
    assert!(
        refused.text().contains("created by runner"),
        "{}",
        refused.text()
    );
    let theirs = f.create("theirs", &[]);
    let locked = f.api(
        "POST",
        &format!("workspaces/{theirs}/actions/lock"),
        &f.ci,
        None,
    );
    assert_eq!(locked.status, 200, "{}", locked.text());
    f.pending(&theirs, &f.ci, &state(1), 1);
}

/// Every audit file under `dir`, concatenated.
fn audit_text(dir: &std::path::Path) -> String {
    let mut all = String::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            all.push_str(&audit_text(&path));
        } else if path.extension().is_some_and(|e| e == "jsonl") {
            all.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
        }
    }
    all
}

/// Issue 44: a method the TFE door does not serve on a path it serves
/// (`GET workspaces/{id}/state-versions`, which terraform's tfe provider
/// may ask for) answers 404 like an unknown route, never a 405 or a 5xx
/// (terraform retries 5xx for minutes), with the API version terraform
/// checks; so does the upload path outside `/api/v2`.
#[test]
fn fixed_unserved_methods_answer_404() {
    let f = fixture();
    let id = f.create("w", &[]);
    let unserved = [
        ("GET", format!("workspaces/{id}/state-versions")),
        ("PUT", "ping".to_string()),
        ("DELETE", "account/details".to_string()),
        ("POST", format!("workspaces/{id}/current-state-version")),
        ("GET", format!("workspaces/{id}/actions/lock")),
        ("PUT", "organizations/acme/workspaces".to_string()),
    ];
    for (method, path) in unserved {
        let body = (method != "GET").then_some("{}");
        let answer = f.api(method, &path, &f.ci, body);
        assert_eq!(answer.status, 404, "{method} {path}: {}", answer.text());
        assert_eq!(answer.headers["tfp-api-version"], "2.5", "{method} {path}");
        assert_eq!(answer.json()["errors"][0]["status"], "404");
    }
    let upload = send(
        "GET",
        &format!("{}/_tfe/upload?capability=x", f.server.url),
        None,
    );
    assert_eq!(upload.status, 404, "{}", upload.text());
    let discovery = send(
        "POST",
        &format!("{}/.well-known/terraform.json", f.server.url),
        Some(b"{}"),
    );
    assert_eq!(discovery.status, 404, "{}", discovery.text());
}
