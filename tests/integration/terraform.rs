//! End to end with the real `terraform` binary (1.11.4 on these machines;
//! `backend "http"` and `terraform_data` need no network).

use crate::common::*;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

pub const CONFIG: &str = r#"
variable "value" {
  type    = string
  default = "one"
}

resource "terraform_data" "example" {
  input = var.value
}

output "value" {
  value = terraform_data.example.output
}
"#;

pub const HTTP_BACKEND: &str = "terraform {\n  backend \"http\" {}\n}\n";

/// `terraform` in `dir`, with no colour, no telemetry and no user config.
pub fn terraform(dir: &Path, args: &[&str]) -> Command {
    tools::require(&tools::TERRAFORM);
    let rc = dir.join("test.tfrc");
    if !rc.exists() {
        std::fs::write(&rc, "").unwrap();
    }
    let mut cmd = Command::new("terraform");
    cmd.current_dir(dir)
        .args(args)
        .arg("-no-color")
        .env("CHECKPOINT_DISABLE", "1")
        .env("TF_IN_AUTOMATION", "1")
        .env("TF_CLI_CONFIG_FILE", rc);
    cmd
}

pub fn run(dir: &Path, args: &[&str]) -> Output {
    run_with_env(dir, args, &[])
}

/// [`run`], with these environment variables set for terraform.
pub fn run_with_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    terraform(dir, args)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("cannot run terraform (is it on the PATH?): {e}"))
}

pub fn ok(dir: &Path, args: &[&str]) -> String {
    ok_with_env(dir, args, &[])
}

/// [`ok`], with these environment variables set for terraform.
pub fn ok_with_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let out = run_with_env(dir, args, env);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "terraform {args:?} failed:\n{text}");
    text
}

pub fn backend_config(url: &str) -> Vec<String> {
    ["address", "lock_address", "unlock_address"]
        .iter()
        .map(|k| format!("-backend-config={k}={url}"))
        .collect()
}

pub(crate) fn init(dir: &Path, url: &str, extra: &[&str]) -> String {
    let mut args = vec!["init", "-input=false"];
    args.extend_from_slice(extra);
    let config = backend_config(url);
    args.extend(config.iter().map(String::as_str));
    ok(dir, &args)
}

pub fn stored_output(url: &str) -> String {
    let state = send("GET", url, None).json();
    state["outputs"]["value"]["value"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn lock_conflicts(server: &Server) -> usize {
    server
        .log_text()
        .lines()
        .filter(|l| l.contains("method=LOCK") && l.contains("status=423"))
        .count()
}

#[test]
fn init_apply_plan_state_list_locking_and_force_unlock() {
    let data = tempdir();
    let server = Server::start(data.path());
    let url = server.state_url("default", "e2e");
    let work = tempdir();
    let dir = work.path();
    first_apply(dir, &url);

    // A first apply waiting at its approval prompt holds the lock.
    let (mut holder, holder_out) = capture_terraform(dir, &["apply", "-var", "value=two"]);
    wait_until(
        "the first apply's approval prompt",
        Duration::from_secs(60),
        || holder_out.lock().unwrap().contains("Enter a value:"),
    );

    // A second apply with no lock timeout is refused, naming the holder.
    let refused = run(
        dir,
        &[
            "apply",
            "-auto-approve",
            "-input=false",
            "-lock-timeout=0s",
            "-var",
            "value=three",
        ],
    );
    assert!(!refused.status.success());
    let text = String::from_utf8_lossy(&refused.stderr);
    assert!(text.contains("Error acquiring the state lock"), "{text}");
    assert!(text.contains("OperationTypeApply"), "{text}");

    // With a lock timeout it waits while the lock is held...
    let conflicts_before = lock_conflicts(&server);
    let waiter = terraform(
        dir,
        &[
            "apply",
            "-auto-approve",
            "-input=false",
            "-lock-timeout=120s",
            "-var",
            "value=three",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    wait_until(
        "the waiting apply to be refused once",
        Duration::from_secs(60),
        || lock_conflicts(&server) > conflicts_before,
    );

    // ...and proceeds once the first apply gives up the lock.
    holder.stdin.take().unwrap().write_all(b"no\n").unwrap();
    let _ = holder.wait_with_output().unwrap();
    let waited = waiter.wait_with_output().unwrap();
    assert!(
        waited.status.success(),
        "waiting apply failed:\n{}{}",
        String::from_utf8_lossy(&waited.stdout),
        String::from_utf8_lossy(&waited.stderr)
    );
    assert_eq!(
        stored_output(&url),
        "three",
        "the waiting apply's change was stored"
    );

    // A lock left behind by a crashed process is cleared by force-unlock.
    assert_eq!(
        send("LOCK", &url, Some(&lock_info("crashed-run", "ci@runner"))).status,
        200
    );
    let blocked = run(dir, &["plan", "-input=false", "-lock-timeout=0s"]);
    assert!(
        !blocked.status.success(),
        "plan must be blocked by the stale lock"
    );
    ok(dir, &["force-unlock", "-force", "crashed-run"]);
    ok(
        dir,
        &[
            "apply",
            "-auto-approve",
            "-input=false",
            "-var",
            "value=four",
        ],
    );
    assert_eq!(stored_output(&url), "four");
}

#[test]
fn init_migrate_state_moves_local_state_to_the_server() {
    let data = tempdir();
    let server = Server::start(data.path());
    let url = server.state_url("default", "migrated");
    let work = tempdir();
    let dir = work.path();

    // Start on the local backend.
    std::fs::write(dir.join("main.tf"), CONFIG).unwrap();
    ok(dir, &["init", "-input=false"]);
    ok(
        dir,
        &[
            "apply",
            "-auto-approve",
            "-input=false",
            "-var",
            "value=local",
        ],
    );
    assert!(dir.join("terraform.tfstate").exists());
    assert_eq!(send("GET", &url, None).status, 404);

    // Switch to wasmstate and migrate.
    std::fs::write(dir.join("backend.tf"), HTTP_BACKEND).unwrap();
    init(dir, &url, &["-migrate-state", "-force-copy"]);
    assert_eq!(stored_output(&url), "local");
    let plan = run(
        dir,
        &[
            "plan",
            "-detailed-exitcode",
            "-input=false",
            "-var",
            "value=local",
        ],
    );
    assert_eq!(
        plan.status.code(),
        Some(0),
        "migrated state must match the config"
    );
}

/// A configuration on `url` in `dir`: init, apply, the state stored, a plan
/// with no changes, the resource in `state list`.
fn first_apply(dir: &Path, url: &str) {
    std::fs::write(dir.join("main.tf"), format!("{HTTP_BACKEND}{CONFIG}")).unwrap();
    init(dir, url, &[]);
    ok(dir, &["apply", "-auto-approve", "-input=false"]);
    assert_eq!(stored_output(url), "one");
    let plan = run(dir, &["plan", "-detailed-exitcode", "-input=false"]);
    assert_eq!(plan.status.code(), Some(0), "plan must show no changes");
    assert!(ok(dir, &["state", "list"]).contains("terraform_data.example"));
}

/// The journey every storage guest must support, through `url` on `server`:
/// init, apply, a plan with no changes, state list, a refused apply while
/// another holder has the lock, and an apply after it is released.
pub fn apply_and_check(dir: &Path, url: &str, server: &Server) {
    first_apply(dir, url);

    let lock = lock_info("other-run", "ci@elsewhere");
    assert_eq!(send("LOCK", url, Some(&lock)).status, 200);
    let conflicts = lock_conflicts(server);
    let refused = run(
        dir,
        &[
            "apply",
            "-auto-approve",
            "-input=false",
            "-lock-timeout=0s",
            "-var",
            "value=two",
        ],
    );
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("other-run"));
    assert!(lock_conflicts(server) > conflicts);
    assert_eq!(send("UNLOCK", url, Some(&lock)).status, 200);
    ok(
        dir,
        &[
            "apply",
            "-auto-approve",
            "-input=false",
            "-var",
            "value=two",
        ],
    );
    assert_eq!(stored_output(url), "two");
}

/// Start `terraform args` with piped stdin, capturing its stdout as it
/// comes (to wait for a prompt).
pub fn capture_terraform(
    dir: &Path,
    args: &[&str],
) -> (
    std::process::Child,
    std::sync::Arc<std::sync::Mutex<String>>,
) {
    let mut child = terraform(dir, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let output = capture(child.stdout.take().unwrap());
    (child, output)
}
