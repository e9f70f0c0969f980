//! Issue 44, item 3: `terraform login <host>` with a pasted token. The
//! real terraform reads the token from a terminal, so it runs in a
//! pseudo-terminal (python3's `pty`), answers `yes` and pastes the token
//! at its prompts; the credentials it stores under `$HOME/.terraform.d`
//! then serve `terraform init` and `apply` with no `TF_TOKEN_`.

use super::{fixture, text};
use crate::common::*;
use crate::terraform::terraform;
use std::path::Path;
use std::process::Output;

/// Runs argv in a pseudo-terminal; answers the first `Enter a value:`
/// with `yes` and the next with `$PASTE` (never on a command line);
/// prints all it said and exits with its status. Gives up after 120 s.
const PTY: &str = r#"
import os, pty, select, sys, time
paste = os.environ.pop("PASTE").encode()
pid, fd = pty.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
said, answers, mark = b"", [b"yes", paste], 0
deadline = time.time() + 120
while time.time() < deadline:
    ready, _, _ = select.select([fd], [], [], 1)
    if not ready:
        continue
    try:
        data = os.read(fd, 4096)
    except OSError:
        break
    if not data:
        break
    said += data
    if answers and b"Enter a value:" in said[mark:]:
        mark = len(said)
        os.write(fd, answers.pop(0) + b"\n")
else:
    os.kill(pid, 9)
_, status = os.waitpid(pid, 0)
sys.stdout.buffer.write(said)
sys.exit(os.waitstatus_to_exitcode(status))
"#;

/// `terraform login host` in `dir` with `home` as `$HOME`, pasting `token`.
fn login(dir: &Path, home: &Path, host: &str, token: &str) -> Output {
    let cmd = terraform(dir, &["login", host]);
    // terraform as python's argv, with terraform()'s environment.
    let program = cmd.get_program().to_owned();
    let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
    // The CLI config is `$HOME/.terraformrc`, as a user's: with
    // TF_CLI_CONFIG_FILE set, terraform reads no credentials file.
    let envs: Vec<_> = cmd
        .get_envs()
        .filter(|(k, _)| *k != "TF_CLI_CONFIG_FILE")
        .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned())))
        .collect();
    let mut python = std::process::Command::new("python3");
    python
        .current_dir(dir)
        .arg("-c")
        .arg(PTY)
        .arg(program)
        .args(args)
        .envs(envs)
        .env_remove("TF_CLI_CONFIG_FILE")
        .env("HOME", home)
        .env("BROWSER", "/bin/false")
        .env("PASTE", token);
    let mut out = python.output().expect("python3 runs");
    // The terminal echoes what was pasted: keep it out of failure messages.
    let said = String::from_utf8_lossy(&out.stdout).replace(token, "<pasted token>");
    out.stdout = said.into_bytes();
    out
}

#[test]
fn terraform_login_with_a_pasted_token_then_init_and_apply_with_it() {
    let f = fixture();
    let home = tempdir();
    let work = f.workdir(&f.cloud("name = \"logged-in\""));
    let dir = work.path();
    // The `host` block (plain http on loopback) in the user's CLI config.
    std::fs::copy(dir.join("test.tfrc"), home.path().join(".terraformrc")).unwrap();

    // A wrong token is refused, and nothing is stored.
    let refused = login(dir, home.path(), &f.host, "wst_wrong");
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(
        text(&refused).contains("Token is invalid") || text(&refused).contains("nauthorized"),
        "{}",
        text(&refused)
    );
    let stored = home
        .path()
        .join(".terraform.d")
        .join("credentials.tfrc.json");
    assert!(!stored.exists());
    // terraform 1.11.4 writes the file but does not make its folder.
    std::fs::create_dir_all(stored.parent().unwrap()).unwrap();

    let out = login(dir, home.path(), &f.host, &f.ci);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("Retrieved token for user ci"),
        "{}",
        text(&out)
    );
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&stored).unwrap()).unwrap();
    assert_eq!(saved["credentials"][&f.host]["token"], f.ci.as_str());

    // The stored credentials, and no TF_TOKEN_, serve the cloud block.
    let with_home = |args: &[&str]| {
        let out = terraform(dir, args)
            .env("HOME", home.path())
            .env_remove("TF_CLI_CONFIG_FILE")
            .output()
            .unwrap();
        assert!(out.status.success(), "terraform {args:?}:\n{}", text(&out));
        text(&out)
    };
    with_home(&["init", "-input=false"]);
    with_home(&["apply", "-auto-approve", "-input=false"]);
    let stored_state = f.http("GET", "/states/acme/logged-in", None);
    assert_eq!(stored_state.status, 200, "{}", stored_state.text());
    assert_eq!(stored_state.json()["outputs"]["value"]["value"], "one");
    // `terraform logout` forgets it: the next plan has no token.
    with_home(&["logout", &f.host]);
    let out = terraform(dir, &["plan", "-input=false"])
        .env("HOME", home.path())
        .env_remove("TF_CLI_CONFIG_FILE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out).contains("terraform login"), "{}", text(&out));
}
