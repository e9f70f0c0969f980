//! The git capability against real repositories: bare repositories by
//! path and `file://`, and `git daemon` on loopback.

use super::*;
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Barrier;
use std::time::{Duration, Instant};
use tempfile::TempDir;

const MAIN: &str = "refs/heads/main";

thread_local! {
    /// Runs between the expected-value check and the ref update (race injection).
    static BEFORE_UPDATE: RefCell<Option<Box<dyn FnOnce()>>> = RefCell::new(None);
}

pub(super) fn run_before_update_hook() {
    if let Some(hook) = BEFORE_UPDATE.with(|h| h.borrow_mut().take()) {
        hook();
    }
}

fn set_before_update(hook: impl FnOnce() + 'static) {
    BEFORE_UPDATE.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
}

fn git_cmd(dir: &Path) -> Command {
    let mut cmd = Command::new("git");
    cmd.current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "-c",
            "init.defaultBranch=main",
        ]);
    cmd
}

/// Run the git CLI in `dir`, panic on failure, return trimmed stdout.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = git_cmd(dir).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A bare remote made by the git CLI, with `main` holding `state.tfstate` = "v1".
struct Remote {
    tmp: TempDir,
    bare: PathBuf,
    work: PathBuf,
}

impl Remote {
    fn new() -> Self {
        let tmp = TempDir::new().unwrap();
        let (bare, work) = (tmp.path().join("remote.git"), tmp.path().join("work"));
        git(tmp.path(), &["init", "-q", "--bare", "remote.git"]);
        git(tmp.path(), &["init", "-q", "work"]);
        std::fs::write(work.join("state.tfstate"), "v1").unwrap();
        git(&work, &["add", "."]);
        git(&work, &["commit", "-q", "-m", "seed"]);
        git(
            &work,
            &["push", "-q", bare.to_str().unwrap(), "HEAD:refs/heads/main"],
        );
        Remote { tmp, bare, work }
    }

    fn path_url(&self) -> String {
        self.bare.to_str().unwrap().to_owned()
    }

    fn urls(&self) -> [String; 2] {
        [self.path_url(), format!("file://{}", self.path_url())]
    }

    /// The remote's value of `name`, read by the git CLI.
    fn rev(&self, name: &str) -> Option<String> {
        let out = git_cmd(&self.bare)
            .args(["rev-parse", "--verify", "-q", name])
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8(out.stdout).unwrap().trim().to_owned())
    }
}

/// Move `name` in the bare repo to a new commit made by the git CLI (a concurrent writer).
fn interlope(bare: &Path, name: &str) -> String {
    // A unique message: the same tree, message and second would give the same id.
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let msg = format!(
        "interloper {}",
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let c = git(
        bare,
        &["commit-tree", "-m", &msg, &format!("{MAIN}^{{tree}}")],
    );
    git(bare, &["update-ref", name, &c]);
    c
}

fn grants(url: &str) -> Vec<GitGrant> {
    vec![GitGrant {
        url: url.into(),
        auth: GitAuth::default(),
        refs: vec!["**".into()],
        paths: vec!["**".into()],
    }]
}

fn change(path: &str, content: Option<&str>) -> FileChange {
    FileChange {
        path: path.into(),
        content: content.map(|c| c.as_bytes().to_vec()),
    }
}

fn fetch_one(h: &RepoHandle<'_>, name: &str) -> Option<String> {
    h.fetch(&[name.to_owned()]).unwrap().remove(0)
}

#[test]
fn fetch_existing_and_missing_refs() {
    let r = Remote::new();
    let host = GitHost::new(r.tmp.path().join("clones"));
    for url in r.urls() {
        let g = grants(&url);
        let h = host.repo(&g, &url).unwrap();
        let got = h
            .fetch(&[MAIN.into(), "refs/heads/missing".into()])
            .unwrap();
        assert_eq!(got, vec![r.rev(MAIN), None]);
        assert_eq!(
            h.read_file(got[0].as_deref().unwrap(), "state.tfstate")
                .unwrap(),
            Some(b"v1".to_vec())
        );
        // Again, now incremental: same answer.
        assert_eq!(
            h.fetch(&[MAIN.into(), "refs/heads/missing".into()])
                .unwrap(),
            got
        );
    }
}

#[test]
fn commit_with_nested_paths_then_read_and_list() {
    let r = Remote::new();
    let host = GitHost::new(r.tmp.path().join("clones"));
    let (url, g) = (r.path_url(), grants(&r.path_url()));
    let h = host.repo(&g, &url).unwrap();
    let main = fetch_one(&h, MAIN).unwrap();
    let c1 = h
        .commit(
            Some(&main),
            &[
                change("a/b/c.tfstate", Some("deep")),
                change("top.txt", Some("top")),
            ],
            "one",
        )
        .unwrap();
    assert_eq!(
        h.read_file(&c1, "a/b/c.tfstate").unwrap(),
        Some(b"deep".to_vec())
    );
    assert_eq!(
        h.read_file(&c1, "state.tfstate").unwrap(),
        Some(b"v1".to_vec()),
        "parent's files are kept"
    );
    assert_eq!(h.read_file(&c1, "nope").unwrap(), None);
    assert_eq!(
        h.read_file(&c1, "a/b").unwrap(),
        None,
        "a directory is not a file"
    );
    assert_eq!(h.list_files(&c1, "").unwrap(), ["state.tfstate", "top.txt"]);
    assert_eq!(h.list_files(&c1, "a").unwrap(), Vec::<String>::new());
    assert_eq!(h.list_files(&c1, "a/b").unwrap(), ["c.tfstate"]);
    assert_eq!(h.list_files(&c1, "a/b/").unwrap(), ["c.tfstate"]);
    assert_eq!(h.list_files(&c1, "zzz").unwrap(), Vec::<String>::new());

    let changes = [
        change("a/b/c.tfstate", None),
        change("ghost", None),
        change("top.txt", Some("t2")),
    ];
    let c2 = h.commit(Some(&c1), &changes, "two").unwrap();
    assert_eq!(h.read_file(&c2, "a/b/c.tfstate").unwrap(), None);
    assert_eq!(h.list_files(&c2, "a/b").unwrap(), Vec::<String>::new());
    assert_eq!(h.read_file(&c2, "top.txt").unwrap(), Some(b"t2".to_vec()));
    let same_path_twice = [change("x", Some("first")), change("x", Some("last"))];
    let root = h.commit(None, &same_path_twice, "root").unwrap();
    assert_eq!(h.list_files(&root, "").unwrap(), ["x"]);
    assert_eq!(h.read_file(&root, "x").unwrap(), Some(b"last".to_vec()));
    // Commits are local only.
    assert_eq!(r.rev(MAIN), Some(main));

    let unknown = "1111111111111111111111111111111111111111";
    assert!(matches!(
        h.commit(Some(unknown), &[], "m"),
        Err(GitError::NotFound(_))
    ));
    assert!(matches!(
        h.read_file(unknown, "x"),
        Err(GitError::NotFound(_))
    ));
    assert!(matches!(
        h.list_files(unknown, ""),
        Err(GitError::NotFound(_))
    ));
    let conflict = h.commit(Some(&c1), &[change("top.txt/x", Some("?"))], "df");
    assert!(
        matches!(conflict, Err(GitError::InvalidInput(_))),
        "{conflict:?}"
    );
}

#[test]
fn create_only_push_succeeds_once_then_is_rejected() {
    let r = Remote::new();
    let host = GitHost::new(r.tmp.path().join("clones"));
    for (i, url) in r.urls().iter().enumerate() {
        let (g, name) = (grants(url), format!("refs/heads/locks/{i}.tfstate"));
        let h = host.repo(&g, url).unwrap();
        let first = h
            .commit(
                None,
                &[change(&format!("{i}.tfstate.lock"), Some("me"))],
                "lock",
            )
            .unwrap();
        h.push(&name, &first, None).unwrap();
        assert_eq!(r.rev(&name).as_ref(), Some(&first));
        let second = h
            .commit(
                None,
                &[change(&format!("{i}.tfstate.lock"), Some("you"))],
                "lock",
            )
            .unwrap();
        assert!(matches!(
            h.push(&name, &second, None),
            Err(GitError::Rejected(_))
        ));
        assert_eq!(r.rev(&name), Some(first));
    }
}

#[test]
fn push_with_stale_expected_is_rejected_and_changes_nothing() {
    let r = Remote::new();
    let host = GitHost::new(r.tmp.path().join("clones"));
    for url in r.urls() {
        let g = grants(&url);
        let h = host.repo(&g, &url).unwrap();
        let main = fetch_one(&h, MAIN).unwrap();
        let next = h
            .commit(Some(&main), &[change("state.tfstate", Some("v2"))], "v2")
            .unwrap();
        let stale = "1111111111111111111111111111111111111111";
        assert!(matches!(
            h.push(MAIN, &next, Some(stale)),
            Err(GitError::Rejected(_))
        ));
        assert!(matches!(
            h.push("refs/heads/absent", &next, Some(&main)),
            Err(GitError::Rejected(_))
        ));
        assert_eq!(r.rev(MAIN).as_ref(), Some(&main));
        h.push(MAIN, &next, Some(&main)).unwrap();
        assert_eq!(r.rev(MAIN).as_ref(), Some(&next));
        // Not a fast-forward: refused, even with the right expected value
        // (a ref only moves forward; no forced updates).
        let unrelated = h
            .commit(None, &[change("other", Some("x"))], "root")
            .unwrap();
        assert!(matches!(
            h.push(MAIN, &unrelated, Some(&next)),
            Err(GitError::Rejected(m)) if m.contains("only moves forward")
        ));
        assert!(matches!(
            h.push(MAIN, &main, Some(&next)),
            Err(GitError::Rejected(_))
        ));
        assert_eq!(r.rev(MAIN), Some(next.clone()));
    }
}

#[test]
fn delete_ref_is_compare_and_swap() {
    let r = Remote::new();
    let host = GitHost::new(r.tmp.path().join("clones"));
    for url in r.urls() {
        let g = grants(&url);
        let h = host.repo(&g, &url).unwrap();
        let name = "refs/heads/locks/x.tfstate";
        let c = h
            .commit(None, &[change("x.tfstate.lock", Some("me"))], "lock")
            .unwrap();
        h.push(name, &c, None).unwrap();
        let wrong = "1111111111111111111111111111111111111111";
        assert!(matches!(
            h.delete_ref(name, wrong),
            Err(GitError::Rejected(_))
        ));
        assert_eq!(r.rev(name).as_ref(), Some(&c));
        h.delete_ref(name, &c).unwrap();
        assert_eq!(r.rev(name), None);
        assert!(matches!(h.delete_ref(name, &c), Err(GitError::NotFound(_))));
    }
}

/// The ref moves after our expected-value check but before the update:
/// the update itself must still fail (the check is not just advisory).
fn assert_update_is_atomic(r: &Remote, h: &RepoHandle<'_>) {
    let main = fetch_one(h, MAIN).unwrap();
    let next = h
        .commit(
            Some(&main),
            &[change("state.tfstate", Some("mine"))],
            "mine",
        )
        .unwrap();
    let bare = r.bare.clone();
    set_before_update(move || drop(interlope(&bare, MAIN)));
    let res = h.push(MAIN, &next, Some(&main));
    assert!(matches!(res, Err(GitError::Rejected(_))), "{res:?}");
    let theirs = r.rev(MAIN).unwrap();
    assert_ne!(theirs, main);
    assert_ne!(theirs, next);

    let lock = "refs/heads/locks/atomic.tfstate";
    let c = h
        .commit(None, &[change("atomic.tfstate.lock", Some("me"))], "lock")
        .unwrap();
    h.push(lock, &c, None).unwrap();
    let bare = r.bare.clone();
    set_before_update(move || drop(git(&bare, &["update-ref", lock, &theirs])));
    assert!(matches!(h.delete_ref(lock, &c), Err(GitError::Rejected(_))));
    assert!(r.rev(lock).is_some());
    git(&r.bare, &["update-ref", "-d", lock]);
}

#[test]
fn local_update_racing_after_check_is_rejected() {
    let r = Remote::new();
    let host = GitHost::new(r.tmp.path().join("clones"));
    for url in r.urls() {
        let g = grants(&url);
        assert_update_is_atomic(&r, &host.repo(&g, &url).unwrap());
    }
}

/// Two hosts (separate clones) push from threads against the same expected
/// value: exactly one wins each round and the remote holds the winner's commit.
fn race(r: &Remote, url: &str, rounds: usize) {
    let dirs = TempDir::new_in(r.tmp.path()).unwrap();
    let hosts = [
        GitHost::new(dirs.path().join("a")),
        GitHost::new(dirs.path().join("b")),
    ];
    let g = grants(url);
    for round in 0..rounds {
        let barrier = Barrier::new(2);
        let results: Vec<Result<String, GitError>> = std::thread::scope(|s| {
            let joins: Vec<_> = hosts
                .iter()
                .enumerate()
                .map(|(i, host)| {
                    let (g, barrier) = (&g, &barrier);
                    s.spawn(move || {
                        let h = host.repo(g, url).unwrap();
                        let cur = fetch_one(&h, MAIN).unwrap();
                        let content = format!("round {round} host {i}");
                        let c = h
                            .commit(
                                Some(&cur),
                                &[change("state.tfstate", Some(&content))],
                                "race",
                            )
                            .unwrap();
                        barrier.wait(); // both have read the same value; now push together
                        h.push(MAIN, &c, Some(&cur)).map(|()| c)
                    })
                })
                .collect();
            joins.into_iter().map(|j| j.join().unwrap()).collect()
        });
        let winners: Vec<&String> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        assert!(
            results
                .iter()
                .any(|r| matches!(r, Err(GitError::Rejected(_)))),
            "{results:?}"
        );
        assert_eq!(r.rev(MAIN).as_ref(), Some(winners[0]));
    }
}

#[test]
fn concurrent_cas_pushes_on_local_remote_exactly_one_wins() {
    let r = Remote::new();
    for url in r.urls() {
        race(&r, &url, 5);
    }
}

#[test]
fn ungranted_url_is_denied() {
    let r = Remote::new();
    let host = GitHost::new(r.tmp.path().join("clones"));
    let g = grants(&r.path_url());
    let err = host.repo(&g, "/somewhere/else.git").err().unwrap();
    assert!(
        matches!(&err, GitError::Denied(m) if m.contains("allow_git")),
        "{err}"
    );
    assert!(
        host.repo(&g, &format!("{}/", r.path_url())).is_ok(),
        "trailing slash is ignored"
    );
    assert!(matches!(
        host.repo(&[], &r.path_url()),
        Err(GitError::Denied(_))
    ));
}

#[test]
fn invalid_refs_paths_and_oids_are_rejected() {
    let r = Remote::new();
    let host = GitHost::new(r.tmp.path().join("clones"));
    let (url, g) = (r.path_url(), grants(&r.path_url()));
    let h = host.repo(&g, &url).unwrap();
    let main = fetch_one(&h, MAIN).unwrap();
    let invalid = |res: Result<_, GitError>| matches!(res, Err(GitError::InvalidInput(_)));
    for bad in [
        "main",
        "refs/heads/a..b",
        "refs/heads/x.lock",
        "refs/heads/sp ace",
        "refs/heads/",
        "",
    ] {
        assert!(invalid(h.fetch(&[bad.into()]).map(drop)), "{bad:?}");
        assert!(invalid(h.push(bad, &main, None)), "{bad:?}");
        assert!(invalid(h.delete_ref(bad, &main)), "{bad:?}");
    }
    for bad in [
        "",
        "/abs",
        "a/../b",
        "..",
        "./a",
        "a/./b",
        "a//b",
        "a/",
        ".git/config",
        "x/.GIT/y",
        "a\0b",
    ] {
        assert!(invalid(h.read_file(&main, bad).map(drop)), "{bad:?}");
        assert!(
            invalid(
                h.commit(Some(&main), &[change(bad, Some("x"))], "m")
                    .map(drop)
            ),
            "{bad:?}"
        );
    }
    assert!(invalid(h.list_files(&main, "../x").map(drop)));
    for bad in ["xyz", "abc", "", "g".repeat(40).as_str()] {
        assert!(
            invalid(h.read_file(bad, "state.tfstate").map(drop)),
            "{bad:?}"
        );
        assert!(invalid(h.push(MAIN, bad, None)), "{bad:?}");
        assert!(invalid(h.push(MAIN, &main, Some(bad))), "{bad:?}");
    }
    assert!(invalid(h.commit(None, &[], "nul\0byte").map(drop)));
}

mod remotes;

mod clones;
