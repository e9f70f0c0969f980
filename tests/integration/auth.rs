//! Authentication and authorisation over real HTTP, through the CLI and
//! with the real `terraform` (`username`/`password`).

use crate::common::*;
use crate::terraform::{CONFIG, ok, run};
use base64::Engine as _;
use std::io::Write;
use std::process::{Command, Stdio};

const PASSWORD: &str = "correct horse battery staple";

/// `echo PASSWORD | wasmstate hash-password`
pub fn hash(password: &str) -> String {
    let mut child = Command::new(BIN)
        .arg("hash-password")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{password}").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

struct Fixture {
    server: Server,
    token: String,
    _dir: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let dir = tempdir();
    let h = hash(PASSWORD);
    let (token, sha) = generate_token();
    let server = Server::with_config(
        dir.path(),
        &format!(
            r#"
            [backends.default]
            guest = "local"
            [backends.other]
            guest = "local"

            [[users]]
            name = "reader"
            password_hash = "{h}"
            grants = ["default:*:read"]
            [[users]]
            name = "writer"
            password_hash = "{h}"
            grants = ["default:*:write"]
            [[users]]
            name = "admin"
            password_hash = "{h}"
            grants = ["default:*:admin"]
            [[users]]
            name = "scraper"
            password_hash = "{h}"
            grants = ["*:*:read"]

            [[tokens]]
            name = "ci"
            sha256 = "{sha}"
            grants = ["default:ci-*:admin"]
            "#
        ),
    );
    Fixture {
        server,
        token,
        _dir: dir,
    }
}

fn basic(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

fn as_user(user: &str, method: &str, url: &str, body: Option<&[u8]>) -> Answer {
    send_with(
        method,
        url,
        body,
        &[("Authorization", &basic(user, PASSWORD))],
    )
}

#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Role {
    Read,
    Write,
    Admin,
}

#[test]
fn every_role_against_every_action() {
    let f = fixture();
    let s = &f.server;
    let ws = |name: &str| format!("{}/workspaces/default/{name}", s.url);
    let lock = lock_info("l", "x@host");
    let users = [
        ("reader", Role::Read),
        ("writer", Role::Write),
        ("admin", Role::Admin),
    ];
    for (user, role) in users {
        let url = s.state_url("default", &format!("ws-{user}"));
        assert_eq!(as_user("admin", "POST", &url, Some(&state(1))).status, 200);
        type Action<'a> = (&'a str, &'a str, String, Option<Vec<u8>>, Role);
        let actions: [Action; 9] = [
            ("read state", "GET", url.clone(), None, Role::Read),
            (
                "list workspaces",
                "GET",
                format!("{}/workspaces/default", s.url),
                None,
                Role::Read,
            ),
            (
                "write state",
                "POST",
                url.clone(),
                Some(state(2)),
                Role::Write,
            ),
            ("lock", "LOCK", url.clone(), Some(lock.clone()), Role::Write),
            (
                "unlock",
                "UNLOCK",
                url.clone(),
                Some(lock.clone()),
                Role::Write,
            ),
            (
                "create workspace",
                "PUT",
                ws(&format!("new-{user}")),
                None,
                Role::Write,
            ),
            ("force-unlock", "UNLOCK", url.clone(), None, Role::Admin),
            ("delete state", "DELETE", url.clone(), None, Role::Admin),
            (
                "delete workspace",
                "DELETE",
                ws(&format!("new-{user}")),
                None,
                Role::Admin,
            ),
        ];
        for (what, method, target, body, needs) in actions {
            let answer = as_user(user, method, &target, body.as_deref());
            if role >= needs {
                assert!(
                    answer.status < 400 || answer.status == 404,
                    "{user} may {what}: got {} {}",
                    answer.status,
                    answer.text()
                );
            } else {
                assert_eq!(
                    answer.status,
                    403,
                    "{user} must not {what}: {}",
                    answer.text()
                );
                assert!(answer.text().contains(user), "{}", answer.text());
            }
        }
    }
    // Grants are per backend.
    assert_eq!(
        as_user("admin", "GET", &s.state_url("other", "x"), None).status,
        403
    );
}

#[test]
fn missing_or_wrong_credentials_get_401_asking_for_basic() {
    let f = fixture();
    let url = f.server.state_url("default", "x");
    for headers in [
        vec![],
        vec![("Authorization", basic("writer", "wrong"))],
        vec![("Authorization", basic("nobody", PASSWORD))],
        vec![("Authorization", "Bearer wst_forged".to_string())],
    ] {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let answer = send_with("GET", &url, None, &headers);
        assert_eq!(answer.status, 401, "{headers:?}: {}", answer.text());
        assert!(
            answer.headers["www-authenticate"]
                .to_str()
                .unwrap()
                .starts_with("Basic realm=")
        );
    }
    assert_eq!(
        send("GET", &format!("{}/healthz", f.server.url), None).status,
        200,
        "health stays open"
    );
    assert_eq!(
        send("GET", &format!("{}/metrics", f.server.url), None).status,
        401
    );
    // The metrics cover every backend: a reader of one backend (or an
    // admin of one) may not read them; a reader of all may.
    let metrics = format!("{}/metrics", f.server.url);
    for user in ["reader", "admin"] {
        let refused = as_user(user, "GET", &metrics, None);
        assert_eq!(refused.status, 403, "{user}: {}", refused.text());
        assert!(refused.text().contains("*:*:read"), "{}", refused.text());
    }
    assert_eq!(as_user("scraper", "GET", &metrics, None).status, 200);
}

#[test]
fn tokens_carry_their_own_grants() {
    let f = fixture();
    let bearer = format!("Bearer {}", f.token);
    let allowed = f.server.state_url("default", "ci-pipeline");
    let other = f.server.state_url("default", "prod");
    assert_eq!(
        send_with(
            "POST",
            &allowed,
            Some(&state(1)),
            &[("Authorization", &bearer)]
        )
        .status,
        200
    );
    assert_eq!(
        send_with("UNLOCK", &allowed, None, &[("Authorization", &bearer)]).status,
        200,
        "admin there"
    );
    assert_eq!(
        send_with("GET", &other, None, &[("Authorization", &bearer)]).status,
        403
    );
}

#[test]
fn the_cli_signs_in() {
    let f = fixture();
    let out = Command::new(BIN)
        .args([
            "workspace",
            "list",
            "--server",
            &f.server.url,
            "--user",
            "reader",
        ])
        .env("WASMSTATE_PASSWORD", PASSWORD)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (ok, out) = wasmstate(&["workspace", "list", "--server", &f.server.url]);
    assert!(!ok && out.contains("401"), "{out}");
    let (ok, out) = wasmstate(&[
        "workspace",
        "create",
        "ci-new",
        "--server",
        &f.server.url,
        "--token",
        &f.token,
    ]);
    assert!(ok && out.contains("created"), "{out}");
}

#[test]
fn terraform_signs_in_with_username_and_password() {
    let f = fixture();
    let url = f.server.state_url("default", "tf-auth");
    let init = |dir: &std::path::Path, password: &str| {
        std::fs::write(
            dir.join("main.tf"),
            format!("terraform {{\n  backend \"http\" {{}}\n}}\n{CONFIG}"),
        )
        .unwrap();
        let mut args = vec!["init".to_string(), "-input=false".into()];
        for (k, v) in [
            ("address", url.as_str()),
            ("lock_address", &url),
            ("unlock_address", &url),
            ("username", "writer"),
            ("password", password),
        ] {
            args.push(format!("-backend-config={k}={v}"));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(dir, &args)
    };
    let good = tempdir();
    assert!(init(good.path(), PASSWORD).status.success());
    ok(good.path(), &["apply", "-auto-approve", "-input=false"]);
    assert_eq!(as_user("reader", "GET", &url, None).status, 200);

    // Terraform reads the state during init: a wrong password stops it there.
    let bad = tempdir();
    let refused = init(bad.path(), "wrong");
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("requires auth"), "{stderr}");
}

#[test]
fn a_public_address_without_auth_is_refused() {
    let dir = tempdir();
    let out = Command::new(BIN)
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0:0 without authentication"),
        "{stderr}"
    );
}

#[test]
fn writers_never_see_a_holders_lock_id_and_cannot_unlock_with_what_they_see() {
    let f = fixture();
    let url = f.server.state_url("default", "held");
    let secret_id = "6f3c1c1e-7b1a-4c55-9d59-held-by-another";
    let locked = as_user(
        "writer",
        "LOCK",
        &url,
        Some(&lock_info(secret_id, "a@host")),
    );
    assert_eq!(locked.status, 200, "{}", locked.text());

    // A second writer's LOCK: 423 with who holds it, but not the ID.
    let refused = as_user("writer", "LOCK", &url, Some(&lock_info("mine", "b@host")));
    assert_eq!(refused.status, 423, "{}", refused.text());
    let shown = refused.json()["ID"].as_str().unwrap().to_string();
    assert_ne!(shown, secret_id);
    assert!(shown.starts_with("hidden-"), "{shown}");
    assert_eq!(refused.json()["Who"], "a@host");
    // What a writer sees does not unlock (force-unlock is the admin's).
    let unlock = as_user("writer", "UNLOCK", &url, Some(&lock_info(&shown, "b@host")));
    assert!(
        unlock.status == 409 || unlock.status == 423,
        "unlocking with the hidden ID: {} {}",
        unlock.status,
        unlock.text()
    );
    // An admin sees the real ID (for `terraform force-unlock`).
    let admin_view = as_user("admin", "LOCK", &url, Some(&lock_info("x", "c@host")));
    assert_eq!(admin_view.status, 423, "{}", admin_view.text());
    assert_eq!(admin_view.json()["ID"], secret_id);
    // The holder still unlocks with its own ID.
    let released = as_user(
        "writer",
        "UNLOCK",
        &url,
        Some(&lock_info(secret_id, "a@host")),
    );
    assert_eq!(released.status, 200, "{}", released.text());
}
