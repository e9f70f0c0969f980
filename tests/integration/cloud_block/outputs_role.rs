//! The `outputs` role (issue 44, item 4): a caller who sees a workspace's
//! outputs and nothing else of its state, at every door. Terraform's own
//! `terraform_remote_state` (backend "remote", and backend "http" with the
//! token as its password) reads the outputs; a state pull or GET holds no
//! resources and no sensitive output; locks, writes, history and other
//! workspaces stay closed.

use super::{LOCAL, fixture_with, text};
use crate::common::*;

/// Only in the producer's resources: it must never reach the reader.
const RESOURCE_ONLY: &str = "resource-only-attribute-7f3a";
/// The producer's sensitive output: never shown to the outputs role.
const SENSITIVE_VALUE: &str = "sensitive-value-91c2";

fn producer(host: &str) -> String {
    format!(
        r#"terraform {{
  cloud {{
    hostname     = "{host}"
    organization = "acme"
    workspaces {{
      name = "shared"
    }}
  }}
}}
resource "terraform_data" "db" {{
  input = "{RESOURCE_ONLY}"
}}
output "endpoint" {{
  value = "db.internal:5432"
}}
output "password" {{
  value     = "{SENSITIVE_VALUE}"
  sensitive = true
}}
"#
    )
}

#[test]
fn the_outputs_role_reads_outputs_and_nothing_else_at_every_door() {
    let (reader, reader_sha) = generate_token();
    let f = fixture_with(
        LOCAL,
        &format!(
            "[[tokens]]\nname = \"reader\"\nsha256 = \"{reader_sha}\"\ngrants = [\"acme:shared:outputs\"]\n"
        ),
    );
    let work = f.workdir(&producer(&f.host));
    f.ok(work.path(), &["init", "-input=false"]);
    f.ok(work.path(), &["apply", "-auto-approve", "-input=false"]);
    // Another workspace the reader has no grant on.
    assert_eq!(
        f.http("POST", "/states/acme/private", Some(&state(1)))
            .status,
        200
    );
    let full = f.http("GET", "/states/acme/shared", None);
    assert!(full.text().contains(RESOURCE_ONLY), "{}", full.text());

    // terraform_remote_state through backend "remote" (the TFE door) and
    // backend "http" (the token as the Basic password), as the reader.
    let remote = format!(
        "hostname = \"{}\"\n    organization = \"acme\"\n    workspaces = {{ name = \"shared\" }}",
        f.host
    );
    let http = format!(
        "address = \"{}\"\n    username = \"reader\"\n    password = \"{reader}\"",
        f.server.state_url("acme", "shared")
    );
    let consumer = f.workdir(&format!(
        r#"data "terraform_remote_state" "remote" {{
  backend = "remote"
  config = {{
    {remote}
  }}
}}
data "terraform_remote_state" "http" {{
  backend = "http"
  config = {{
    {http}
  }}
}}
output "via_remote" {{
  value = data.terraform_remote_state.remote.outputs.endpoint
}}
output "via_http" {{
  value = data.terraform_remote_state.http.outputs.endpoint
}}
"#
    ));
    let run = |args: &[&str]| {
        let out = f.tf(consumer.path(), &reader, args, "");
        assert!(out.status.success(), "{args:?}:\n{}", text(&out));
        text(&out)
    };
    run(&["init", "-input=false"]);
    run(&["apply", "-auto-approve", "-input=false"]);
    assert_eq!(
        run(&["output", "-raw", "via_remote"]).trim(),
        "db.internal:5432"
    );
    assert_eq!(
        run(&["output", "-raw", "via_http"]).trim(),
        "db.internal:5432"
    );
    // A sensitive output is not there for the reader (not even as null).
    std::fs::write(
        consumer.path().join("main.tf"),
        format!(
            "data \"terraform_remote_state\" \"remote\" {{\n  backend = \"remote\"\n  config = {{\n    {remote}\n  }}\n}}\noutput \"pw\" {{\n  value     = data.terraform_remote_state.remote.outputs.password\n  sensitive = true\n}}\n"
        ),
    )
    .unwrap();
    let out = f.tf(consumer.path(), &reader, &["plan", "-input=false"], "");
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("password"), "{}", text(&out));

    // What the reader downloads holds the outputs, never the resources or
    // the sensitive value: the http door's GET, the TFE door's download,
    // and `terraform state pull` through the cloud block.
    let basic = base64_basic("reader", &reader);
    let got = send_with(
        "GET",
        &f.server.state_url("acme", "shared"),
        None,
        &[("Authorization", &basic)],
    );
    assert_eq!(got.status, 200, "{}", got.text());
    let shared = got.text();
    assert!(shared.contains("db.internal:5432"), "{shared}");
    assert!(!shared.contains(RESOURCE_ONLY), "{shared}");
    assert!(!shared.contains(SENSITIVE_VALUE), "{shared}");
    let got = got.json();
    assert_eq!(got["resources"], serde_json::json!([]));
    let full = full.json();
    assert_eq!(
        (&got["serial"], &got["lineage"]),
        (&full["serial"], &full["lineage"])
    );
    let id = f.workspace_id("shared");
    let current = f.api(
        "GET",
        &format!("workspaces/{id}/current-state-version"),
        &reader,
        None,
    );
    assert_eq!(current.status, 200, "{}", current.text());
    let version = current.json()["data"]["id"].as_str().unwrap().to_string();
    let download = f.api(
        "GET",
        &format!("state-versions/{version}/download"),
        &reader,
        None,
    );
    assert_eq!(download.status, 200, "{}", download.text());
    assert_eq!(
        download.body,
        send_with(
            "GET",
            &f.server.state_url("acme", "shared"),
            None,
            &[("Authorization", &basic)],
        )
        .body
    );
    let pull = f.workdir(&producer(&f.host));
    let out = f.tf(pull.path(), &reader, &["init", "-input=false"], "");
    assert!(out.status.success(), "{}", text(&out));
    let pulled = f.tf(pull.path(), &reader, &["state", "pull"], "");
    assert!(pulled.status.success(), "{}", text(&pulled));
    let pulled = String::from_utf8_lossy(&pulled.stdout).to_string();
    assert!(pulled.contains("db.internal:5432"), "{pulled}");
    assert!(!pulled.contains(RESOURCE_ONLY) && !pulled.contains(SENSITIVE_VALUE));

    // The outputs API: the sensitive one is left out of the list and
    // refused one at a time; the writer still sees it.
    let listed = f.api(
        "GET",
        &format!("workspaces/{id}/current-state-version-outputs"),
        &reader,
        None,
    );
    assert_eq!(listed.status, 200, "{}", listed.text());
    assert_eq!(super::names(&listed.json()), ["endpoint"]);
    let all = f
        .api(
            "GET",
            &format!("workspaces/{id}/current-state-version-outputs"),
            &f.ci,
            None,
        )
        .json();
    let secret = all["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["attributes"]["name"] == "password")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let one = f.api(
        "GET",
        &format!("state-version-outputs/{secret}"),
        &reader,
        None,
    );
    assert_eq!(one.status, 403, "{}", one.text());
    assert!(!one.text().contains(SENSITIVE_VALUE));

    // No lock, no write, no history, nothing of another workspace.
    let before = f.http("GET", "/states/acme/shared", None).body;
    for (method, path) in [
        ("POST", format!("workspaces/{id}/actions/lock")),
        ("POST", format!("workspaces/{id}/state-versions")),
        ("POST", format!("workspaces/{id}/relationships/tags")),
        ("PATCH", format!("workspaces/{id}")),
        ("GET", format!("state-versions/{version}")),
    ] {
        let answer = f.api(method, &path, &reader, Some(r#"{"data":{}}"#));
        assert_eq!(answer.status, 403, "{method} {path}: {}", answer.text());
    }
    let door = |method: &str, path: &str, body: Option<&[u8]>| {
        send_with(
            method,
            &format!("{}{path}", f.server.url),
            body,
            &[("Authorization", &basic)],
        )
        .status
    };
    let lock = lock_info("reader-lock", "reader");
    assert_eq!(door("LOCK", "/states/acme/shared", Some(&lock)), 403);
    assert_eq!(door("POST", "/states/acme/shared", Some(&state(99))), 403);
    assert_eq!(door("GET", "/states/acme/shared/versions", None), 403);
    assert_eq!(door("GET", "/states/acme/private", None), 403);
    // The console's state pages (versions, the state viewer, search)
    // need the read role.
    for page in [
        "/ui/api/backends/acme/shared/versions",
        "/ui/api/backends/acme/shared/state",
        "/ui/api/search/acme?q=terraform_data",
    ] {
        assert_eq!(door("GET", page, None), 403, "{page}");
    }
    let other = f.api(
        "GET",
        "organizations/acme/workspaces/private",
        &reader,
        None,
    );
    assert_eq!(other.status, 404, "{}", other.text());
    let seen = f.api("GET", "organizations/acme/workspaces", &reader, None);
    assert_eq!(super::names(&seen.json()), ["shared"]);
    // terraform itself cannot write through the cloud block as the reader.
    let refused = f.tf(
        pull.path(),
        &reader,
        &["apply", "-auto-approve", "-input=false"],
        "",
    );
    assert!(!refused.status.success(), "{}", text(&refused));
    assert_eq!(f.http("GET", "/states/acme/shared", None).body, before);
    // The refusals are in the audit trail under the reader's name.
    let refusals = audit_text(&f._data.path().join("audit"));
    assert!(
        refusals.contains("\"caller\":\"reader\"") && refusals.contains("\"status\":403"),
        "{refusals}"
    );
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

fn base64_basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}
