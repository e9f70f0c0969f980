//! The git guest and the host's git capability against real git: a bare
//! repository by path and `file://`, and `git daemon` on loopback.

use crate::common::*;
use crate::concurrency::increment_concurrently;
use crate::terraform::{apply_and_check, ok};
use std::path::Path;

fn git_backend(url: &str) -> String {
    format!(
        "[backends.default]\nguest = \"git\"\n[backends.default.config]\nrepository = {url:?}\n"
    )
}

/// The file `path` on branch `branch` of the bare repository, via plain git.
fn show(repo: &Path, branch: &str, path: &str) -> String {
    git(repo, &["show", &format!("{branch}:{path}")])
}

#[test]
fn conformance_kit_passes_by_path_file_url_and_git_daemon() {
    let dir = tempdir();
    let daemon = GitDaemon::start(dir.path());
    for (name, url) in [
        (
            "by-path",
            bare_repo(dir.path(), "by-path").display().to_string(),
        ),
        (
            "file-url",
            format!("file://{}", bare_repo(dir.path(), "file-url").display()),
        ),
        ("daemon", {
            bare_repo(dir.path(), "daemon");
            daemon.url("daemon")
        }),
    ] {
        let (passed, out) = wasmstate(&[
            "guest",
            "test",
            "git",
            "--config",
            &format!("repository={url}"),
        ]);
        assert!(passed, "{name}: {out}");
        assert_eq!(summary(&out), "33 passed, 0 failed", "{name}");
    }
}

#[test]
fn terraform_through_the_git_guest_and_the_layout_plain_git_sees() {
    let dir = tempdir();
    let daemon = GitDaemon::start(dir.path());
    let repo = bare_repo(dir.path(), "tf");
    let data = tempdir();
    let server = Server::with_config(data.path(), &git_backend(&daemon.url("tf")));
    let url = server.state_url("default", "prod");
    let work = tempdir();
    apply_and_check(work.path(), &url, &server);

    // The state is the file <workspace>.tfstate on main, one commit per write.
    let stored: serde_json::Value =
        serde_json::from_str(&show(&repo, "main", "prod.tfstate")).unwrap();
    assert_eq!(stored, send("GET", &url, None).json());
    let log = git(&repo, &["log", "main", "--format=%s"]);
    assert!(log.lines().count() >= 2, "{log}");
    assert!(
        log.contains("workspace prod") && log.contains("serial"),
        "{log}"
    );

    // A lock is the branch locks/prod.tfstate holding prod.tfstate.lock.
    let stuck = lock_info("stuck-run", "ci@elsewhere");
    assert_eq!(send("LOCK", &url, Some(&stuck)).status, 200);
    let lock: serde_json::Value =
        serde_json::from_str(&show(&repo, "locks/prod.tfstate", "prod.tfstate.lock")).unwrap();
    assert_eq!(lock["ID"], "stuck-run");
    // terraform force-unlock (an empty UNLOCK body) deletes the branch.
    ok(work.path(), &["force-unlock", "-force", "stuck-run"]);
    let branches = git(&repo, &["branch", "--list", "locks/*"]);
    assert!(branches.trim().is_empty(), "{branches}");
}

/// A bare repository by path holding one state written through wasmstate
/// (workspace = the repository's name), and a plain `git` clone of it.
struct Plain {
    _dir: tempfile::TempDir,
    _data: tempfile::TempDir,
    _server: Server,
    repo: std::path::PathBuf,
    url: String,
    clone: std::path::PathBuf,
}

impl Plain {
    fn new(name: &str) -> Plain {
        let dir = tempdir();
        let repo = bare_repo(dir.path(), name);
        let data = tempdir();
        let server = Server::with_config(data.path(), &git_backend(repo.to_str().unwrap()));
        let url = server.state_url("default", name);
        assert_eq!(send("POST", &url, Some(&state(1))).status, 200);
        let clone = dir.path().join("clone");
        git(
            dir.path(),
            &[
                "clone",
                "-q",
                repo.to_str().unwrap(),
                clone.to_str().unwrap(),
            ],
        );
        Plain {
            _dir: dir,
            _data: data,
            _server: server,
            repo,
            url,
            clone,
        }
    }
}

#[test]
fn lock_branches_made_with_plain_git_are_honoured() {
    let Plain {
        repo, url, clone, ..
    } = &Plain::new("interop");

    // terraform-backend-git's way: a branch off main adding the lock file.
    git(clone, &["checkout", "-q", "-b", "locks/interop.tfstate"]);
    std::fs::write(
        clone.join("interop.tfstate.lock"),
        lock_info("plain-git-lock", "alice@laptop"),
    )
    .unwrap();
    git(clone, &["add", "interop.tfstate.lock"]);
    git(clone, &["commit", "-q", "-m", "Lock interop.tfstate"]);
    git(clone, &["push", "-q", "origin", "locks/interop.tfstate"]);

    let refused = send("LOCK", url, Some(&lock_info("mine", "bob@host")));
    assert_eq!(refused.status, 423, "{}", refused.text());
    assert_eq!(refused.json()["ID"], "plain-git-lock");
    assert_eq!(refused.json()["Who"], "alice@laptop");
    assert_eq!(send("POST", url, Some(&state(2))).status, 423);
    // The holder may write with its ID.
    assert_eq!(
        send("POST", &format!("{url}?ID=plain-git-lock"), Some(&state(2))).status,
        200
    );
    assert_eq!(show(repo, "main", "interop.tfstate").as_bytes(), state(2));
    assert_eq!(
        send(
            "UNLOCK",
            url,
            Some(&lock_info("plain-git-lock", "alice@laptop"))
        )
        .status,
        200
    );
    assert_eq!(
        send("LOCK", url, Some(&lock_info("mine", "bob@host"))).status,
        200
    );
}

#[test]
fn two_hosts_with_their_own_clones_never_double_grant_or_lose_updates() {
    let dir = tempdir();
    let daemon = GitDaemon::start(dir.path());
    bare_repo(dir.path(), "shared");
    let config = git_backend(&daemon.url("shared"));
    let (a, b) = (tempdir(), tempdir());
    let servers = [
        Server::with_config(a.path(), &config),
        Server::with_config(b.path(), &config),
    ];
    let urls: Vec<String> = servers
        .iter()
        .map(|s| s.state_url("default", "counter"))
        .collect();
    increment_concurrently(&urls, 4, 5);
    // Each host fetched into its own clone under its data directory.
    assert!(a.path().join("git").is_dir() && b.path().join("git").is_dir());
}

#[test]
fn a_remote_that_goes_away_gives_503_and_the_state_survives() {
    let dir = tempdir();
    let daemon = GitDaemon::start(dir.path());
    let repo = bare_repo(dir.path(), "flaky");
    let data = tempdir();
    let server = Server::with_config(data.path(), &git_backend(&daemon.url("flaky")));
    let url = server.state_url("default", "flaky");
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);

    let (base, port) = daemon.stop();
    for (method, body) in [
        ("GET", None),
        ("POST", Some(state(2))),
        ("LOCK", Some(lock_info("x", "y"))),
    ] {
        let answer = send(method, &url, body.as_deref());
        assert_eq!(answer.status, 503, "{method}: {}", answer.text());
        assert!(
            answer.text().contains("unavailable"),
            "{method}: {}",
            answer.text()
        );
    }
    assert_eq!(show(&repo, "main", "flaky.tfstate").as_bytes(), state(1));

    let _back = GitDaemon::start_on(&base, port);
    assert_eq!(send("GET", &url, None).body, state(1));
    assert_eq!(send("POST", &url, Some(&state(2))).status, 200);
    assert_eq!(show(&repo, "main", "flaky.tfstate").as_bytes(), state(2));
}

#[test]
fn a_repository_the_operator_did_not_grant_is_refused() {
    let dir = tempdir();
    let granted = bare_repo(dir.path(), "granted");
    let other = bare_repo(dir.path(), "other");
    let data = tempdir();
    let config = format!(
        "[backends.default]\nguest = \"git\"\nallow_git = [{granted:?}]\n[backends.default.config]\nrepository = {other:?}\n"
    );
    let server = Server::with_config(data.path(), &config);
    let answer = send("POST", &server.state_url("default", "x"), Some(&state(1)));
    assert_eq!(answer.status, 500, "{}", answer.text());
    assert!(answer.text().contains("allow_git"), "{}", answer.text());
    assert!(
        server.log_text().contains("repository not granted"),
        "{}",
        server.log_text()
    );
    let refs = git(&other, &["for-each-ref"]);
    assert!(
        refs.trim().is_empty(),
        "nothing may reach the ungranted repository: {refs}"
    );
}

#[test]
fn smart_http_with_credentials_that_only_the_host_holds() {
    let dir = tempdir();
    let web = GitHttp::start(dir.path(), "ci", "s3cret");
    let repo = bare_repo(&dir.path().join("repos"), "state");
    let config_for = |data: &Path| {
        let path = data.join("wasmstate.toml");
        std::fs::create_dir_all(data).unwrap();
        std::fs::write(
            &path,
            format!(
                "[backends.default]\nguest = \"git\"\ngit_auth = {{ username_env = \"GIT_USER\", password_env = \"GIT_TOKEN\" }}\n[backends.default.config]\nrepository = {:?}\n",
                web.url("state")
            ),
        )
        .unwrap();
        path
    };
    let data = tempdir();
    let server = Server::with_config_env(
        data.path(),
        &config_for(data.path()),
        &[("GIT_USER", "ci"), ("GIT_TOKEN", "s3cret")],
    );
    let url = server.state_url("default", "web");
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);
    assert_eq!(send("GET", &url, None).body, state(1));
    assert_eq!(
        send("LOCK", &url, Some(&lock_info("web-lock", "ci@host"))).status,
        200
    );
    assert!(show(&repo, "locks/web.tfstate", "web.tfstate.lock").contains("web-lock"));
    assert_eq!(
        send("UNLOCK", &url, Some(&lock_info("web-lock", "ci@host"))).status,
        200
    );
    assert_eq!(show(&repo, "main", "web.tfstate").as_bytes(), state(1));

    // A wrong password: refused with a message about credentials, nothing written.
    let other = tempdir();
    let wrong = Server::with_config_env(
        other.path(),
        &config_for(other.path()),
        &[("GIT_USER", "ci"), ("GIT_TOKEN", "not-the-Pa55word")],
    );
    let answer = send("POST", &wrong.state_url("default", "web"), Some(&state(2)));
    assert!(answer.status >= 500, "{}", answer.text());
    assert!(answer.text().contains("credentials"), "{}", answer.text());
    assert!(
        !answer.text().contains("Pa55word"),
        "the password leaked: {}",
        answer.text()
    );
    assert_eq!(show(&repo, "main", "web.tfstate").as_bytes(), state(1));
}

#[test]
fn an_unreadable_lock_branch_still_locks_until_force_unlocked() {
    let Plain { url, clone, .. } = &Plain::new("broken");

    // A lock branch without its lock file (a crashed tool, a hand edit).
    git(
        clone,
        &[
            "push",
            "-q",
            "origin",
            "HEAD:refs/heads/locks/broken.tfstate",
        ],
    );

    let refused = send("LOCK", url, Some(&lock_info("mine", "bob@host")));
    assert_eq!(refused.status, 423, "{}", refused.text());
    assert!(
        refused.json()["Info"]
            .as_str()
            .unwrap()
            .contains("force-unlock")
    );
    // Presenting the made-up holder id does not get anyone past it.
    let id = refused.json()["ID"].as_str().unwrap().to_string();
    assert_eq!(
        send("POST", &format!("{url}?ID={id}"), Some(&state(2))).status,
        423
    );
    assert_eq!(
        send("LOCK", url, Some(&lock_info(&id, "bob@host"))).status,
        423
    );
    // Force-unlock (Terraform's empty UNLOCK) removes it.
    assert_eq!(send("UNLOCK", url, Some(b"")).status, 200);
    assert_eq!(
        send("LOCK", url, Some(&lock_info("mine", "bob@host"))).status,
        200
    );
}

#[test]
fn git_commits_are_the_version_history_and_restore_writes_one_back() {
    let dir = tempdir();
    let daemon = GitDaemon::start(dir.path());
    bare_repo(dir.path(), "hist");
    // history = 0: the versions come from the guest's commits, not the host.
    let config = format!(
        "[backends.default]\nguest = \"git\"\nhistory = 0\n[backends.default.config]\nrepository = {:?}\n",
        daemon.url("hist")
    );
    let data = tempdir();
    let server = Server::with_config(data.path(), &config);
    let url = server.state_url("default", "hist");
    let noted = |serial: u64, note: &str| {
        format!(r#"{{"version":4,"serial":{serial},"lineage":"git-hist","note":"{note}"}}"#)
            .into_bytes()
    };
    for (serial, note) in [(1, "one"), (2, "two"), (3, "three")] {
        assert_eq!(send("POST", &url, Some(&noted(serial, note))).status, 200);
    }
    let (versions, serials) = versions(&url);
    assert_eq!(serials, [3, 2, 1], "{versions}");
    let first = versions[2]["id"].as_str().unwrap().to_string();
    assert_eq!(first.len(), 40, "a commit id: {first}");
    assert_eq!(
        send("GET", &format!("{url}/versions/{first}"), None).body,
        noted(1, "one")
    );

    // Restore through the CLI: a new commit with the old content, serial 4.
    let (ok, out) = wasmstate(&["state", "restore", "hist", &first, "--server", &server.url]);
    assert!(ok && out.contains("as serial 4"), "{out}");
    assert_eq!(send("GET", &url, None).json()["note"], "one");

    // Another host with a fresh, shallow clone sees the whole history.
    let other_data = tempdir();
    let other = Server::with_config(other_data.path(), &config);
    let listed = send(
        "GET",
        &format!("{}/versions", other.state_url("default", "hist")),
        None,
    )
    .json();
    assert_eq!(listed.as_array().unwrap().len(), 4, "{listed}");
    assert_eq!(listed[0]["serial"], 4);
}
