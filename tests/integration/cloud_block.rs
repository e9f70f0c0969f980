//! Issue 44: Terraform's `cloud {}` block (the TFE API v2 subset, local
//! execution) against the same listener and store as the http door, with
//! the real `terraform` over plain http through a CLI-config `host` block
//! and `TF_TOKEN_<host>:<port>` (a literal colon, as terraform maps it).

mod guests;
mod login;
mod meta_review;
mod outputs_role;
mod remote;
mod replicas;
mod tls;
mod uploads;

use crate::common::*;
use crate::terraform::{CONFIG, terraform};
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

const SENSITIVE: &str = r#"
output "secret" {
  value     = "s3cret-${var.value}"
  sensitive = true
}
"#;

/// A server with backends `acme` and `other`; token `ci` administers
/// `acme`, token `foreign` administers `other`, user `alice` writes the
/// `team-*` workspaces of `acme`.
struct Fixture {
    server: Server,
    ci: String,
    foreign: String,
    /// `alice:<password>`: a user's TFE token.
    alice: String,
    /// `wasmstate.example:<port>`: the name terraform knows the server by.
    host: String,
    _data: tempfile::TempDir,
}

/// Backends `acme` and `other` on the `local` guest.
const LOCAL: &str = "[backends.acme]\nguest = \"local\"\n[backends.other]\nguest = \"local\"\n";

fn fixture() -> Fixture {
    fixture_with(LOCAL, "")
}

/// The fixture's tokens and users over `backends` (which must define
/// `acme` and `other`), with `extra` config appended.
fn fixture_with(backends: &str, extra: &str) -> Fixture {
    let data = tempdir();
    let (ci, ci_sha) = generate_token();
    let (foreign, foreign_sha) = generate_token();
    let password = "correct horse";
    let alice_hash = crate::auth::hash(password);
    let server = Server::with_config(
        data.path(),
        &format!(
            r#"
            {backends}

            [[tokens]]
            name = "ci"
            sha256 = "{ci_sha}"
            grants = ["acme:*:admin"]
            [[tokens]]
            name = "foreign"
            sha256 = "{foreign_sha}"
            grants = ["other:*:admin"]
            [[users]]
            name = "alice"
            password_hash = "{alice_hash}"
            grants = ["acme:team-*:write"]
            {extra}
            "#
        ),
    );
    let port = server.url.rsplit(':').next().unwrap().to_string();
    Fixture {
        host: format!("wasmstate.example:{port}"),
        server,
        ci,
        foreign,
        alice: format!("alice:{password}"),
        _data: data,
    }
}

impl Fixture {
    /// A working directory whose CLI config points `host` at the server
    /// over plain http (no discovery), with `main.tf` = `config`.
    fn workdir(&self, config: &str) -> tempfile::TempDir {
        let dir = tempdir();
        let api = format!("{}/api/v2/", self.server.url);
        std::fs::write(
            dir.path().join("test.tfrc"),
            format!(
                "host \"{}\" {{\n  services = {{\n    \"tfe.v2\" = \"{api}\"\n    \"tfe.v2.1\" = \"{api}\"\n  }}\n}}\n",
                self.host
            ),
        )
        .unwrap();
        std::fs::write(dir.path().join("main.tf"), config).unwrap();
        dir
    }

    fn cloud(&self, workspaces: &str) -> String {
        format!(
            "terraform {{\n  cloud {{\n    hostname     = \"{}\"\n    organization = \"acme\"\n    workspaces {{\n      {workspaces}\n    }}\n  }}\n}}\n{CONFIG}{SENSITIVE}",
            self.host
        )
    }

    /// `terraform args` in `dir` with `token`, `stdin` fed.
    fn tf(&self, dir: &Path, token: &str, args: &[&str], stdin: &str) -> Output {
        let mut child = terraform(dir, args)
            .env(format!("TF_TOKEN_{}", self.host.replace('.', "_")), token)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
        child.wait_with_output().unwrap()
    }

    fn ok(&self, dir: &Path, args: &[&str]) -> String {
        let out = self.tf(dir, &self.ci, args, "");
        let text = text(&out);
        assert!(out.status.success(), "terraform {args:?} failed:\n{text}");
        text
    }

    /// The TFE API as `token`.
    fn api(&self, method: &str, path: &str, token: &str, body: Option<&str>) -> Answer {
        let auth = format!("Bearer {token}");
        send_with(
            method,
            &format!("{}/api/v2/{path}", self.server.url),
            body.map(str::as_bytes),
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/vnd.api+json"),
            ],
        )
    }

    /// The http door as `token`.
    fn http(&self, method: &str, path: &str, body: Option<&[u8]>) -> Answer {
        let auth = format!("Bearer {}", self.ci);
        send_with(
            method,
            &format!("{}{path}", self.server.url),
            body,
            &[("Authorization", &auth)],
        )
    }

    fn workspace_id(&self, name: &str) -> String {
        let answer = self.api(
            "GET",
            &format!("organizations/acme/workspaces/{name}"),
            &self.ci,
            None,
        );
        assert_eq!(answer.status, 200, "{}", answer.text());
        answer.json()["data"]["id"].as_str().unwrap().to_string()
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn names(list: &serde_json::Value) -> Vec<String> {
    list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["attributes"]["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn tags_workspaces_apply_outputs_and_one_store_with_the_http_door() {
    let f = fixture();
    let work = f.workdir(&f.cloud("tags = [\"app\"]"));
    let dir = work.path();

    // Nothing tagged yet: init asks for a name and creates that workspace.
    let out = f.tf(dir, &f.ci, &["init", "-input=true"], "dev\n");
    assert!(out.status.success(), "{}", text(&out));
    let tagged = f.api(
        "GET",
        "organizations/acme/workspaces?search%5Btags%5D=app",
        &f.ci,
        None,
    );
    assert_eq!(tagged.status, 200, "{}", tagged.text());
    assert_eq!(tagged.headers["tfp-api-version"], "2.5");
    assert_eq!(names(&tagged.json()), ["dev"]);
    // Tags are ANDed: nothing has both.
    let both = f.api(
        "GET",
        "organizations/acme/workspaces?search%5Btags%5D=app,db",
        &f.ci,
        None,
    );
    assert!(names(&both.json()).is_empty());

    f.ok(dir, &["workspace", "new", "prod"]);
    let list = f.ok(dir, &["workspace", "list"]);
    assert!(list.contains("dev") && list.contains("prod"), "{list}");
    f.ok(dir, &["workspace", "select", "dev"]);
    // One store: the http door lists the cloud block's workspaces.
    let http_list = f.http("GET", "/workspaces/acme", None).json();
    let http_list: Vec<&str> = http_list
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        http_list.contains(&"dev") && http_list.contains(&"prod"),
        "{http_list:?}"
    );

    f.ok(dir, &["apply", "-auto-approve", "-input=false"]);
    let stored = f.http("GET", "/states/acme/dev", None);
    assert_eq!(stored.status, 200);
    assert_eq!(stored.json()["outputs"]["value"]["value"], "one");
    let outputs: serde_json::Value =
        serde_json::from_str(&f.ok(dir, &["output", "-json"])).unwrap();
    assert_eq!(outputs["value"]["value"], "one");
    assert_eq!(outputs["secret"]["value"], "s3cret-one");

    // Sensitive values only where asked for, one at a time.
    let id = f.workspace_id("dev");
    let listed = f
        .api(
            "GET",
            &format!("workspaces/{id}/current-state-version-outputs"),
            &f.ci,
            None,
        )
        .json();
    let secret = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["attributes"]["name"] == "secret")
        .unwrap()
        .clone();
    assert_eq!(secret["attributes"]["sensitive"], true);
    assert!(secret["attributes"]["value"].is_null(), "{secret}");
    let revealed = f.api(
        "GET",
        &format!("state-version-outputs/{}", secret["id"].as_str().unwrap()),
        &f.ci,
        None,
    );
    assert_eq!(revealed.json()["data"]["attributes"]["value"], "s3cret-one");

    // state pull is the http door's GET, byte for byte.
    let pulled = f.ok(dir, &["state", "pull"]);
    let first: serde_json::Value = serde_json::from_str(&pulled).unwrap();
    assert_eq!(
        first,
        serde_json::from_slice::<serde_json::Value>(&f.http("GET", "/states/acme/dev", None).body)
            .unwrap()
    );

    // A newer state moves on; pushing the older one back is refused by the
    // stale-write guard (no allow_force_push), even with -force, and
    // terraform keeps its lock, as it does with HCP Terraform.
    f.ok(
        dir,
        &[
            "apply",
            "-auto-approve",
            "-input=false",
            "-var",
            "value=two",
        ],
    );
    let serial_now = f.http("GET", "/states/acme/dev", None).json()["serial"].clone();
    std::fs::write(dir.join("old.tfstate"), &pulled).unwrap();
    let stale = f.tf(dir, &f.ci, &["state", "push", "-force", "old.tfstate"], "");
    assert!(!stale.status.success());
    assert!(
        text(&stale).contains("nothing was written"),
        "{}",
        text(&stale)
    );
    let after = f.http("GET", "/states/acme/dev", None).json();
    assert_eq!(after["serial"], serial_now);
    assert_eq!(after["outputs"]["value"]["value"], "two");
    // The audit trail has this door's writes, the refused one included,
    // under the token's name, beside the http door's.
    let trail = f
        .http("GET", "/audit/acme?workspace=dev&operation=write", None)
        .json();
    let writes: Vec<(String, u64)> = trail["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["caller"].as_str().unwrap().to_string(),
                r["status"].as_u64().unwrap(),
            )
        })
        .collect();
    assert!(writes.contains(&("ci".into(), 200)), "{writes:?}");
    assert!(writes.contains(&("ci".into(), 409)), "{writes:?}");
    f.ok(dir, &["force-unlock", "-force", "acme/dev"]);

    // workspace delete (empty) goes; the http door no longer lists it.
    f.ok(dir, &["workspace", "delete", "prod"]);
    let http_list = f.http("GET", "/workspaces/acme", None).text();
    assert!(!http_list.contains("prod"), "{http_list}");
}

#[test]
fn a_lock_at_either_door_stops_the_other_and_force_unlock_recovers_a_killed_apply() {
    let f = fixture();
    let work = f.workdir(&f.cloud("name = \"net\""));
    let dir = work.path();
    f.ok(dir, &["init", "-input=false"]);
    f.ok(dir, &["apply", "-auto-approve", "-input=false"]);

    // A lock taken at the http door stops the cloud block.
    let lock = lock_info("http-door-run", "someone@laptop");
    assert_eq!(f.http("LOCK", "/states/acme/net", Some(&lock)).status, 200);
    let refused = f.tf(
        dir,
        &f.ci,
        &["apply", "-auto-approve", "-input=false", "-lock-timeout=0s"],
        "",
    );
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("workspace already locked"),
        "{}",
        text(&refused)
    );
    assert_eq!(
        f.http("UNLOCK", "/states/acme/net", Some(&lock)).status,
        200
    );

    // An apply of the cloud block waiting at its prompt holds the lock: the
    // http door's LOCK is refused, naming the token.
    let mut holder = terraform(dir, &["apply", "-var", "value=two"])
        .env(format!("TF_TOKEN_{}", f.host.replace('.', "_")), &f.ci)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let said = capture(holder.stdout.take().unwrap());
    wait_until(
        "the apply's approval prompt",
        Duration::from_secs(60),
        || said.lock().unwrap().contains("Enter a value:"),
    );
    let other = lock_info("http-door-run-2", "someone@laptop");
    let blocked = f.http("LOCK", "/states/acme/net", Some(&other));
    assert_eq!(blocked.status, 423, "{}", blocked.text());
    assert_eq!(blocked.json()["Who"], "ci");
    // Killed while it holds the lock: the lock stays...
    holder.kill().unwrap();
    holder.wait().unwrap();
    let id = f.workspace_id("net");
    let ws = f
        .api("GET", &format!("workspaces/{id}"), &f.ci, None)
        .json();
    assert_eq!(ws["data"]["attributes"]["locked"], true);
    // ...until terraform force-unlock with the id it prints.
    let out = f.tf(dir, &f.ci, &["force-unlock", "-force", "acme/net"], "");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(f.http("LOCK", "/states/acme/net", Some(&other)).status, 200);
    assert_eq!(
        f.http("UNLOCK", "/states/acme/net", Some(&other)).status,
        200
    );
    let again = f.tf(dir, &f.ci, &["force-unlock", "-force", "acme/net"], "");
    assert!(
        text(&again).contains("already unlocked"),
        "{}",
        text(&again)
    );
}

/// Issue 44: Terraform's http backend signs in with a `[[tokens]]` token
/// as its password (it cannot send a bearer), and sees the cloud block's
/// state.
#[test]
fn a_ci_token_works_at_the_http_door_as_the_basic_password() {
    let f = fixture();
    let cloud = f.workdir(&f.cloud("name = \"shared\""));
    f.ok(cloud.path(), &["init", "-input=false"]);
    f.ok(cloud.path(), &["apply", "-auto-approve", "-input=false"]);
    let http = tempdir();
    std::fs::write(
        http.path().join("main.tf"),
        format!("{}{CONFIG}", crate::terraform::HTTP_BACKEND),
    )
    .unwrap();
    let url = f.server.state_url("acme", "shared");
    let env = [
        ("TF_HTTP_USERNAME", "terraform"),
        ("TF_HTTP_PASSWORD", f.ci.as_str()),
    ];
    let mut init = vec!["init", "-input=false"];
    let config = crate::terraform::backend_config(&url);
    init.extend(config.iter().map(String::as_str));
    crate::terraform::ok_with_env(http.path(), &init, &env);
    let out = crate::terraform::ok_with_env(http.path(), &["output", "-raw", "value"], &env);
    assert!(out.contains("one"), "{out}");
    let wrong = [
        ("TF_HTTP_USERNAME", "terraform"),
        ("TF_HTTP_PASSWORD", "wst_wrong"),
    ];
    let refused = crate::terraform::run_with_env(http.path(), &["plan", "-input=false"], &wrong);
    assert!(!refused.status.success());
}

#[test]
fn wrong_and_foreign_tokens_learn_nothing() {
    let f = fixture();
    let work = f.workdir(&f.cloud("name = \"net\""));
    let dir = work.path();
    f.ok(dir, &["init", "-input=false"]);

    let wrong = f.tf(dir, "wst_wrong", &["plan", "-input=false"], "");
    assert!(!wrong.status.success());
    assert!(
        text(&wrong).to_lowercase().contains("unauthorized"),
        "{}",
        text(&wrong)
    );
    let foreign = f.tf(dir, &f.foreign, &["plan", "-input=false"], "");
    assert!(!foreign.status.success());
    assert!(text(&foreign).contains("not found"), "{}", text(&foreign));

    // The same answer for acme, which exists, as for one that does not.
    let seen = f.api(
        "GET",
        "organizations/acme/entitlement-set",
        &f.foreign,
        None,
    );
    let missing = f.api(
        "GET",
        "organizations/nope/entitlement-set",
        &f.foreign,
        None,
    );
    assert_eq!((seen.status, missing.status), (404, 404));
    let projects = f.api("GET", "organizations/acme/projects", &f.ci, None);
    assert_eq!(projects.status, 200);
    assert_eq!(projects.json()["data"], serde_json::json!([]));
    let projects = f.api("GET", "organizations/acme/projects", &f.foreign, None);
    assert_eq!(projects.status, 404);
    let id = f.workspace_id("net");
    let by_id = f.api("GET", &format!("workspaces/{id}"), &f.foreign, None);
    assert_eq!(by_id.status, 404);
    // No token at all: 401, still with the API version terraform checks.
    let none = send(
        "GET",
        &format!("{}/api/v2/account/details", f.server.url),
        None,
    );
    assert_eq!(none.status, 401);
    assert_eq!(none.headers["tfp-api-version"], "2.5");
    // A user's token is `name:password`; grants apply per workspace.
    let account = f.api("GET", "account/details", &f.alice, None);
    assert_eq!(account.json()["data"]["attributes"]["username"], "alice");
    let create = |name: &str| {
        f.api(
            "POST",
            "organizations/acme/workspaces",
            &f.alice,
            Some(&format!(
                r#"{{"data":{{"type":"workspaces","attributes":{{"name":"{name}"}}}}}}"#
            )),
        )
    };
    assert_eq!(create("team-a").status, 201);
    assert_eq!(create("prod").status, 403);
    let seen = f.api("GET", "organizations/acme/workspaces", &f.alice, None);
    assert_eq!(names(&seen.json()), ["team-a"]);
    assert_eq!(
        f.api("GET", &format!("workspaces/{id}"), &f.alice, None)
            .status,
        404,
        "net is not alice's to see"
    );
    let wrong_password = f.api("GET", "account/details", "alice:nope", None);
    assert_eq!(wrong_password.status, 401);

    // A web page cannot send a change here either: only non-simple
    // content types (which a browser preflights) are accepted.
    let page = send_with(
        "POST",
        &format!("{}/api/v2/organizations/acme/workspaces", f.server.url),
        Some(br#"{"data":{"attributes":{"name":"team-b"}}}"#),
        &[
            ("Authorization", &format!("Bearer {}", f.ci)),
            ("Content-Type", "text/plain"),
        ],
    );
    assert_eq!(page.status, 415);

    // Tags added later select the workspace; safe-delete waits for its lock.
    let team = f.api("GET", "organizations/acme/workspaces/team-a", &f.ci, None);
    let team = team.json()["data"]["id"].as_str().unwrap().to_string();
    let tag = f.api(
        "POST",
        &format!("workspaces/{team}/relationships/tags"),
        &f.ci,
        Some(r#"{"data":[{"type":"tags","attributes":{"name":"blue"}}]}"#),
    );
    assert_eq!(tag.status, 204, "{}", tag.text());
    let blue = f.api(
        "GET",
        "organizations/acme/workspaces?search%5Btags%5D=blue",
        &f.ci,
        None,
    );
    assert_eq!(names(&blue.json()), ["team-a"]);
    let lock = |action: &str| {
        f.api(
            "POST",
            &format!("workspaces/{team}/actions/{action}"),
            &f.ci,
            None,
        )
        .status
    };
    let safe_delete = || {
        f.api(
            "POST",
            "organizations/acme/workspaces/team-a/actions/safe-delete",
            &f.ci,
            None,
        )
        .status
    };
    assert_eq!(lock("lock"), 200);
    assert_eq!(lock("lock"), 409, "a TFE lock is not taken twice");
    assert_eq!(safe_delete(), 409);
    assert_eq!(lock("unlock"), 200);
    assert_eq!(lock("unlock"), 409, "already unlocked");
    assert_eq!(safe_delete(), 204);
    assert!(
        !f.http("GET", "/workspaces/acme", None)
            .text()
            .contains("team-a")
    );

    // Unknown routes: 404, never a 5xx terraform would retry for minutes.
    let runs = f.api("POST", "runs", &f.ci, Some("{}"));
    assert_eq!(runs.status, 404);
}
