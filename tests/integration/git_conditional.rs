//! Contract 0.3.0 on the `git` guest, against real git remotes (a bare
//! repository by path, `git daemon` on loopback): a state's version is
//! its file's blob id in the branch tip (digest `git-blob:<id>`), a
//! conditional write is a push expecting the tip it checked the blob in,
//! re-checked after a lost push, so only a change to the same workspace's
//! file refuses it; metadata is `.wasmstate/metadata/<ws>.json` on the same
//! branch. The guest is loaded as `serve` loads it and called through the
//! host's `Storage` trait; two loads are two replicas with their own
//! clones.

use crate::common::*;
use crate::postgres_conditional::{Loaded, padded};
use std::path::Path;
use std::sync::{Arc, Barrier};
use wasmstate::backend::Expect;

fn load(url: &str) -> Loaded {
    Loaded::load("git", vec![("repository".into(), url.into())])
}

/// The blob id of `path` on main, as plain git tells it (`None`: no file).
fn blob(repo: &Path, path: &str) -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["rev-parse", "--verify", "-q", &format!("main:{path}")])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn commits(repo: &Path) -> usize {
    git(repo, &["rev-list", "--count", "main"])
        .trim()
        .parse()
        .unwrap()
}

/// Commit `content` to `path` on main with plain git, through a clone.
fn plain_commit(repo: &Path, path: &str, content: &[u8]) {
    let work = tempdir();
    let clone = work.path().join("c");
    git(
        work.path(),
        &[
            "clone",
            "-q",
            repo.to_str().unwrap(),
            clone.to_str().unwrap(),
        ],
    );
    std::fs::write(clone.join(path), content).unwrap();
    git(&clone, &["add", path]);
    git(
        &clone,
        &["commit", "-q", "-m", &format!("plain edit of {path}")],
    );
    git(&clone, &["push", "-q", "origin", "main"]);
}

#[test]
fn the_git_head_agrees_with_a_read_and_names_the_blob() {
    let dir = tempdir();
    let repo = bare_repo(dir.path(), "states");
    let guest = load(repo.to_str().unwrap());
    assert_eq!(guest.head("default"), None, "no branch, no head");
    // A created workspace is an empty file: no state to a head or a read,
    // and a write expecting none replaces it.
    assert!(guest.create_workspace("made"));
    assert_eq!(guest.head("made"), None);
    assert_eq!(guest.read("made"), None);
    assert!(guest.write_if("made", &state(1), Expect::Absent));
    assert_eq!(guest.read("made"), Some(state(1)));

    let binary: Vec<u8> = (0..=255u8).cycle().take(100 << 10).collect();
    for (ws, bytes) in [
        ("small", padded(7, 0)),
        ("large", padded(7, 300 << 10)),
        ("binary", binary),
    ] {
        assert!(guest.write_if(ws, &bytes, Expect::Absent), "{ws}");
        let head = guest.head(ws).expect("a head");
        let id = blob(&repo, &format!("{ws}.tfstate")).expect("committed");
        assert_eq!(guest.read(ws).as_deref(), Some(&bytes[..]), "{ws}");
        assert_eq!(head.version, id, "{ws}: the file's blob id");
        assert_eq!(head.digest, Some(format!("git-blob:{id}")), "{ws}");
        assert_eq!(head.size, bytes.len() as u64, "{ws}");
        assert_eq!(head.prefix, bytes[..bytes.len().min(64 << 10)], "{ws}");
        assert!(!guest.write_if(ws, &bytes, Expect::Absent), "{ws}");
    }
}

#[test]
fn a_git_write_expecting_a_stale_version_changes_nothing() {
    let dir = tempdir();
    let repo = bare_repo(dir.path(), "states");
    let guest = load(repo.to_str().unwrap());
    assert!(guest.write_if("prod", &state(1), Expect::Absent));
    let first = guest.version("prod");
    assert!(guest.write_if("prod", &state(2), first.clone()));
    let before = commits(&repo);
    assert!(!guest.write_if("prod", &state(3), first.clone()));
    assert!(!guest.write_if("prod", &state(3), Expect::Absent));
    assert_eq!(guest.read("prod"), Some(state(2)));
    assert_eq!(commits(&repo), before, "a refused write commits nothing");

    // Another workspace's commit moves the branch, not this state: the
    // version still holds.
    let current = guest.version("prod");
    plain_commit(&repo, "staging.tfstate", &state(5));
    assert!(guest.write_if("prod", &state(3), current));
    // A commit of this workspace's file by plain git (terraform-backend-git
    // or a person) makes the version read before it stale.
    let before_plain = guest.version("prod");
    plain_commit(&repo, "prod.tfstate", &state(4));
    let before = commits(&repo);
    assert!(!guest.write_if("prod", &state(9), before_plain));
    assert_eq!(guest.read("prod"), Some(state(4)));
    assert_eq!(commits(&repo), before);
    assert_eq!(
        String::from_utf8(state(5)).unwrap(),
        git(&repo, &["show", "main:staging.tfstate"])
    );
}

#[test]
fn two_git_replicas_racing_from_one_version_one_wins() {
    let dir = tempdir();
    let daemon = GitDaemon::start(dir.path());
    let repo = bare_repo(dir.path(), "states");
    let url = daemon.url("states");
    let (mut a, mut b) = (load(&url), load(&url));
    assert!(a.write_if("prod", &state(1), Expect::Absent));
    assert!(a.write_if("staging", &state(1), Expect::Absent));
    for round in 0..6u64 {
        let from = a.version("prod");
        assert_eq!(b.version("prod"), from);
        let barrier = Arc::new(Barrier::new(2));
        let race = |guest: Loaded, body: Vec<u8>| {
            let (barrier, from) = (barrier.clone(), from.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let won = guest.write_if("prod", &body, from);
                (guest, won)
            })
        };
        let ours = padded(round + 2, 100);
        let theirs = padded(round + 2, 200);
        let (one, two) = (race(a, ours.clone()), race(b, theirs.clone()));
        let ((ga, won_a), (gb, won_b)) = (one.join().unwrap(), two.join().unwrap());
        assert!(won_a != won_b, "round {round}: {won_a} and {won_b}");
        let winner = if won_a { ours } else { theirs };
        assert_eq!(gb.read("prod"), Some(winner), "round {round}");
        (a, b) = (ga, gb);
    }
    // Two workspaces from one tip: the push that loses the branch is
    // rebuilt on the winner's commit, and both are written.
    let (prod, staging) = (a.version("prod"), b.version("staging"));
    let barrier = Arc::new(Barrier::new(2));
    let writers: Vec<_> = [(a, "prod", prod), (b, "staging", staging)]
        .into_iter()
        .map(|(guest, ws, from)| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let won = guest.write_if(ws, &state(50), from);
                (guest, won)
            })
        })
        .collect();
    let ended: Vec<(Loaded, bool)> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    assert!(
        ended.iter().all(|(_, won)| *won),
        "another workspace's commit refused a write"
    );
    for ws in ["prod", "staging"] {
        assert_eq!(
            git(&repo, &["show", &format!("main:{ws}.tfstate")]).into_bytes(),
            state(50)
        );
    }
}

#[test]
fn two_git_servers_racing_unlocked_writes_from_one_serial_one_wins() {
    let dir = tempdir();
    let daemon = GitDaemon::start(dir.path());
    let repo = bare_repo(dir.path(), "states");
    let config = format!(
        "[backends.default]\nguest = \"git\"\n[backends.default.config]\nrepository = {:?}\n",
        daemon.url("states")
    );
    let (d1, d2) = (tempdir(), tempdir());
    let servers = [
        Server::with_config(d1.path(), &config),
        Server::with_config(d2.path(), &config),
    ];
    let urls: Vec<String> = servers
        .iter()
        .map(|s| s.state_url("default", "race"))
        .collect();
    assert_eq!(send("POST", &urls[0], Some(&state(1))).status, 200);
    for round in 0..6u64 {
        let before = commits(&repo);
        let barrier = Arc::new(Barrier::new(2));
        let racers: Vec<_> = urls
            .iter()
            .enumerate()
            .map(|(i, url)| {
                let (url, barrier) = (url.clone(), barrier.clone());
                let body = padded(round + 2, 100 * (i + 1));
                std::thread::spawn(move || {
                    barrier.wait();
                    let answer = send("POST", &url, Some(&body));
                    (answer.status, answer.text(), body)
                })
            })
            .collect();
        let mut ended: Vec<(u16, String, Vec<u8>)> =
            racers.into_iter().map(|r| r.join().unwrap()).collect();
        ended.sort_by_key(|(status, ..)| *status);
        let statuses: Vec<u16> = ended.iter().map(|(s, ..)| *s).collect();
        assert_eq!(statuses, [200, 409], "round {round}: {ended:?}");
        assert_eq!(
            git(&repo, &["show", "main:race.tfstate"]).into_bytes(),
            ended[0].2,
            "the winner's"
        );
        assert_eq!(commits(&repo), before + 1, "one write committed");
    }
}

#[test]
fn git_metadata_is_compare_and_swapped_and_goes_with_its_workspace() {
    let dir = tempdir();
    let repo = bare_repo(dir.path(), "states");
    let (guest, other) = (load(repo.to_str().unwrap()), load(repo.to_str().unwrap()));
    let path = ".wasmstate/metadata/staging.json";
    assert_eq!(guest.metadata("staging"), Ok(None), "no branch yet");
    assert!(guest.create_workspace("staging"));
    assert!(guest.write_metadata("staging", Some(r#"{"tags":["a"]}"#), Expect::Absent));
    assert!(!guest.write_metadata("staging", Some("{}"), Expect::Absent));
    let first = other.metadata("staging").unwrap().expect("kept");
    assert_eq!(first.content, r#"{"tags":["a"]}"#);
    assert_eq!(
        Some(first.version.clone()),
        blob(&repo, path),
        "its blob id"
    );
    let v1 = Expect::Version(first.version.clone());
    assert!(other.write_metadata("staging", Some(r#"{"tags":["b"]}"#), v1.clone()));
    let before = commits(&repo);
    assert!(!guest.write_metadata("staging", Some(r#"{"tags":["c"]}"#), v1.clone()));
    assert!(!guest.write_metadata("staging", None, v1));
    assert_eq!(commits(&repo), before, "refused: nothing committed");
    assert_eq!(
        guest.metadata("staging").unwrap().unwrap().content,
        r#"{"tags":["b"]}"#
    );
    // A state write in between (the same branch) leaves it current.
    let current = Expect::Version(guest.metadata("staging").unwrap().unwrap().version);
    assert!(guest.write_if("staging", &state(1), Expect::Absent));
    assert!(guest.write_metadata("staging", Some(r#"{"tags":["d"]}"#), current));
    // Not a workspace of its own: the listing is the states'.
    let listed = guest
        .rt
        .block_on(wasmstate::backend::Storage::list_workspaces(
            &*guest.loaded.storage,
        ))
        .unwrap();
    assert!(
        !listed
            .iter()
            .any(|w| w.contains("json") || w.contains("metadata")),
        "{listed:?}"
    );

    // Deleting the workspace removes the state and the metadata in one
    // commit; another workspace's metadata stays.
    assert!(guest.write_metadata("default", Some("{}"), Expect::Any));
    let before = commits(&repo);
    guest.delete_workspace("staging");
    assert_eq!(commits(&repo), before + 1);
    assert_eq!(blob(&repo, path), None);
    assert_eq!(blob(&repo, "staging.tfstate"), None);
    assert_eq!(other.metadata("staging"), Ok(None));
    assert!(blob(&repo, ".wasmstate/metadata/default.json").is_some());
}
