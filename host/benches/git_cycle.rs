//! One Terraform locking cycle against a git remote: LOCK → GET → POST →
//! UNLOCK through wasmstate's git guest, beside the raw `git` commands that
//! do the same to the repository (push a lock branch, commit the state and
//! push it, delete the lock branch). Remotes: a bare repository by path and
//! `git daemon` on loopback. Cycles alternate between the two ways; medians
//! are reported with the ratio wasmstate/raw.
//!
//! `cargo bench --bench git_cycle` (WASMSTATE_BENCH_RUNS=N cycles, default 30).

#![allow(missing_docs, dead_code)]

#[path = "../../tests/integration/common/mod.rs"]
mod common;

use common::{GitDaemon, Server, bare_repo, bench_runs, git, lock_info, median, send, tempdir};
use std::path::Path;
use std::time::{Duration, Instant};

fn state(serial: u64) -> Vec<u8> {
    format!(r#"{{"version":4,"serial":{serial},"lineage":"bench","outputs":{{}},"resources":[]}}"#)
        .into_bytes()
}

fn wasmstate_cycle(url: &str, serial: u64) -> Duration {
    let id = format!("bench-{serial}");
    let lock = lock_info(&id, "bench@host");
    let started = Instant::now();
    assert_eq!(send("LOCK", url, Some(&lock)).status, 200);
    let read = send("GET", url, None).status;
    assert!(read == 200 || read == 404, "GET: {read}");
    let write = send("POST", &format!("{url}?ID={id}"), Some(&state(serial)));
    assert_eq!(write.status, 200, "{}", write.text());
    assert_eq!(send("UNLOCK", url, Some(&lock)).status, 200);
    started.elapsed()
}

/// The same repository changes with the git CLI, in a clone of the remote:
/// push a lock branch, commit and push the state, delete the lock branch.
/// (Its own branch `raw`, so it never races the guest's `main`.)
fn raw_git_cycle(clone: &Path, serial: u64) -> Duration {
    std::fs::write(
        clone.join("raw.tfstate.lock"),
        lock_info(&format!("raw-{serial}"), "bench@host"),
    )
    .unwrap();
    let started = Instant::now();
    // The lock: a commit holding the lock file, pushed create-only.
    let blob = git(clone, &["hash-object", "-w", "raw.tfstate.lock"]);
    let tree = git_stdin(
        clone,
        &["mktree"],
        &format!("100644 blob {}\traw.tfstate.lock\n", blob.trim()),
    );
    let commit = git(
        clone,
        &["commit-tree", tree.trim(), "-m", "Lock raw.tfstate"],
    );
    git(
        clone,
        &[
            "push",
            "-q",
            "origin",
            &format!("{}:refs/heads/locks/raw.tfstate", commit.trim()),
        ],
    );
    // The state: a commit on main, pushed.
    std::fs::write(clone.join("raw.tfstate"), state(serial)).unwrap();
    git(
        clone,
        &[
            "commit",
            "-q",
            "-a",
            "-m",
            &format!("Update raw.tfstate (serial {serial})"),
        ],
    );
    git(clone, &["push", "-q", "origin", "HEAD:refs/heads/raw"]);
    // The unlock: delete the branch.
    git(
        clone,
        &["push", "-q", "origin", ":refs/heads/locks/raw.tfstate"],
    );
    started.elapsed()
}

fn git_stdin(dir: &Path, args: &[&str], input: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("git")
        .current_dir(dir)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn measure(label: &str, url: &str, dir: &Path, runs: usize) -> String {
    let data = tempdir();
    let server = Server::with_config(
        data.path(),
        &format!(
            "[backends.default]\nguest = \"git\"\n[backends.default.config]\nrepository = {url:?}\n"
        ),
    );
    let state_url = server.state_url("default", "bench");
    let clone = dir.join(format!("clone-{label}"));
    git(dir, &["clone", "-q", url, clone.to_str().unwrap()]);
    std::fs::write(clone.join("raw.tfstate"), state(0)).unwrap();
    git(&clone, &["checkout", "-q", "-b", "main"]);
    git(&clone, &["add", "raw.tfstate"]);
    git(&clone, &["commit", "-q", "-m", "start"]);
    git(&clone, &["push", "-q", "origin", "HEAD:refs/heads/raw"]);
    // Warm both paths (clone cache, compiled guest) before measuring.
    wasmstate_cycle(&state_url, 1);
    raw_git_cycle(&clone, 1);
    let (mut ours, mut raw) = (Vec::new(), Vec::new());
    for i in 0..runs {
        let serial = i as u64 + 2;
        if i % 2 == 0 {
            ours.push(wasmstate_cycle(&state_url, serial));
            raw.push(raw_git_cycle(&clone, serial));
        } else {
            raw.push(raw_git_cycle(&clone, serial));
            ours.push(wasmstate_cycle(&state_url, serial));
        }
    }
    let (ours, raw) = (median(ours), median(raw));
    format!(
        "| {label} | {} | {} | {:.2}× |",
        ms(ours),
        ms(raw),
        ours.as_secs_f64() / raw.as_secs_f64()
    )
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks; there is nothing to list
    }
    let runs = bench_runs(30);
    let dir = tempdir();
    let path_repo = bare_repo(dir.path(), "by-path");
    bare_repo(dir.path(), "daemon");
    let daemon = GitDaemon::start(dir.path());
    let rows = [
        measure(
            "bare repository by path",
            path_repo.to_str().unwrap(),
            dir.path(),
            runs,
        ),
        measure(
            "git daemon on loopback",
            &daemon.url("daemon"),
            dir.path(),
            runs,
        ),
    ];
    println!("\nlock → read → write → unlock, median of {runs} cycles\n");
    println!("| remote | wasmstate (HTTP → guest → host git) | raw git commands | ratio |");
    println!("|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
}
