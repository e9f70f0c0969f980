//! Remotes other than a local path: unreachable ones, `git daemon`, and
//! what crosses the transport (credentials, shallow fetches, refs pushed
//! by the git CLI).

use super::*;

#[test]
fn unreachable_remote_is_unavailable() {
    let r = Remote::new();
    let host = GitHost::new(r.tmp.path().join("clones"));
    for url in r.urls() {
        let g = grants(&url);
        let h = host.repo(&g, &url).unwrap();
        let c = h
            .commit(None, &[change("f", Some("x"))], "offline")
            .unwrap();
        let moved = r.tmp.path().join("moved.git");
        std::fs::rename(&r.bare, &moved).unwrap();
        let unavailable = |res: Result<(), GitError>| matches!(res, Err(GitError::Unavailable(_)));
        assert!(
            unavailable(h.fetch(&[MAIN.into()]).map(drop)),
            "{:?}",
            h.fetch(&[MAIN.into()])
        );
        assert!(unavailable(h.list_remote_refs("").map(drop)));
        assert!(unavailable(h.push(MAIN, &c, None)));
        assert!(unavailable(h.delete_ref(MAIN, &c)));
        std::fs::rename(&moved, &r.bare).unwrap();
    }
    // Nothing listens on a port we just released: connection refused.
    let port = free_port();
    let url = format!("git://127.0.0.1:{port}/remote.git");
    let g = grants(&url);
    let res = host.repo(&g, &url).unwrap().fetch(&[MAIN.into()]);
    assert!(
        matches!(&res, Err(GitError::Unavailable(m)) if m.contains(&url)),
        "{res:?}"
    );
}

#[test]
fn lock_branch_pushed_by_git_cli_is_listed_and_readable() {
    let r = Remote::new();
    git(&r.work, &["checkout", "-q", "-b", "locks/foo.tfstate"]);
    std::fs::write(r.work.join("foo.tfstate.lock"), r#"{"ID":"abc"}"#).unwrap();
    git(&r.work, &["add", "foo.tfstate.lock"]);
    git(&r.work, &["commit", "-q", "-m", "lock"]);
    git(
        &r.work,
        &["push", "-q", r.bare.to_str().unwrap(), "locks/foo.tfstate"],
    );
    let name = "refs/heads/locks/foo.tfstate";
    let target = r.rev(name).unwrap();

    let host = GitHost::new(r.tmp.path().join("clones"));
    let (url, g) = (r.path_url(), grants(&r.path_url()));
    let h = host.repo(&g, &url).unwrap();
    let want = RemoteRef {
        name: name.into(),
        target: target.clone(),
    };
    assert_eq!(
        h.list_remote_refs("refs/heads/locks/").unwrap(),
        std::slice::from_ref(&want)
    );
    let all = h.list_remote_refs("").unwrap();
    assert!(
        all.contains(&want) && all.iter().any(|r| r.name == MAIN),
        "{all:?}"
    );
    assert_eq!(fetch_one(&h, name), Some(target.clone()));
    assert_eq!(
        h.read_file(&target, "foo.tfstate.lock").unwrap(),
        Some(br#"{"ID":"abc"}"#.to_vec())
    );
}

#[test]
fn credential_offers_are_bounded_and_secrets_stay_out_of_messages() {
    let with_password = GitAuth {
        password: Some("s3cret".into()),
        ..GitAuth::default()
    };
    let auth = Auth::new(&with_password, None);
    for _ in 0..MAX_AUTH_ATTEMPTS {
        assert!(
            auth.offer(None, CredentialType::USER_PASS_PLAINTEXT)
                .is_ok()
        );
    }
    // libgit2 would keep asking forever after the server refuses; we stop.
    assert!(
        auth.offer(None, CredentialType::USER_PASS_PLAINTEXT)
            .is_err()
    );
    assert!(auth.refused.get());
    let none = GitAuth::default();
    let auth = Auth::new(&none, None);
    assert!(
        auth.offer(None, CredentialType::USER_PASS_PLAINTEXT)
            .is_err(),
        "nothing to offer"
    );
    assert!(auth.refused.get());
    assert!(!format!("{with_password:?}").contains("s3cret"));
    assert_eq!(
        redact("https://u:s3cret@h.example/r.git"),
        "https://***@h.example/r.git"
    );
    assert_eq!(redact("git@h.example:r.git"), "git@h.example:r.git");
    assert!(is_local("/srv/r.git") && is_local("file:///srv/r.git") && is_local("r.git"));
    assert!(!is_local("git@h.example:r.git") && !is_local("ssh://h/r") && !is_local("https://h/r"));
}

/// Why `fetch` does not ask for depth on local remotes.
#[test]
fn libgit2_local_transport_refuses_shallow_fetch() {
    let r = Remote::new();
    let repo = Repository::init_bare(r.tmp.path().join("probe.git")).unwrap();
    let mut remote = repo.remote_anonymous(&r.path_url()).unwrap();
    let mut opts = FetchOptions::new();
    opts.depth(1);
    let err = remote
        .fetch(&["+refs/heads/main:refs/probe"], Some(&mut opts), None)
        .unwrap_err();
    assert!(err.message().contains("shallow"), "{err}");
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `git-daemon` serving the remote over git:// with pushes enabled; killed on drop.
struct Daemon(Child);

impl Daemon {
    fn start(base: &Path) -> (Self, u16) {
        let port = free_port();
        // Run git-daemon itself: `git daemon` is a wrapper process, and killing
        // it would leave the real daemon running.
        let exec_path = git(base, &["--exec-path"]);
        let child = Command::new(Path::new(&exec_path).join("git-daemon"))
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .args([
                "--export-all",
                "--enable=receive-pack",
                "--listen=127.0.0.1",
            ])
            .arg(format!("--base-path={}", base.display()))
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut daemon = Daemon(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(daemon.0.try_wait().unwrap().is_none(), "git daemon exited");
            assert!(
                Instant::now() < deadline,
                "git daemon did not start listening"
            );
            std::thread::sleep(Duration::from_millis(10)); // poll interval, not synchronisation
        }
        (daemon, port)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn git_daemon_cas_push_and_shallow_fetch() {
    let r = Remote::new();
    // A second commit, so a depth-1 fetch has something to leave out.
    std::fs::write(r.work.join("state.tfstate"), "v2").unwrap();
    git(&r.work, &["commit", "-q", "-am", "v2"]);
    git(
        &r.work,
        &[
            "push",
            "-q",
            r.bare.to_str().unwrap(),
            "HEAD:refs/heads/main",
        ],
    );
    let (_daemon, port) = Daemon::start(r.tmp.path());
    let url = format!("git://127.0.0.1:{port}/remote.git");
    let host = GitHost::new(r.tmp.path().join("clones"));
    let g = grants(&url);
    let h = host.repo(&g, &url).unwrap();

    let main = fetch_one(&h, MAIN).unwrap();
    assert_eq!(Some(&main), r.rev(MAIN).as_ref());
    let clone = Repository::open_bare(
        r.tmp
            .path()
            .join("clones")
            .join(clone_dir_name(&clone_key(&url, &g[0]))),
    )
    .unwrap();
    assert!(clone.is_shallow(), "depth 1 works over git://");
    assert_eq!(
        h.read_file(&main, "state.tfstate").unwrap(),
        Some(b"v2".to_vec())
    );

    let lock = "refs/heads/locks/prod.tfstate";
    let mine = h
        .commit(
            Some(&main),
            &[change("prod.tfstate.lock", Some("me"))],
            "lock",
        )
        .unwrap();
    h.push(lock, &mine, None).unwrap();
    assert!(matches!(
        h.push(lock, &mine, None),
        Err(GitError::Rejected(_))
    ));
    assert_eq!(
        h.list_remote_refs("refs/heads/locks/").unwrap(),
        [RemoteRef {
            name: lock.into(),
            target: mine.clone()
        }]
    );

    let next = h
        .commit(Some(&main), &[change("state.tfstate", Some("v3"))], "v3")
        .unwrap();
    assert!(matches!(
        h.push(MAIN, &next, Some(&mine)),
        Err(GitError::Rejected(_))
    ));
    h.push(MAIN, &next, Some(&main)).unwrap();
    assert_eq!(r.rev(MAIN).as_ref(), Some(&next));
    h.delete_ref(lock, &mine).unwrap();
    assert_eq!(r.rev(lock), None);

    // receive-pack itself refuses a stale old value (the ref moves after our check).
    assert_update_is_atomic(&r, &h);
    // A commit we do not have locally is downloaded (incrementally, shallow).
    let theirs = interlope(&r.bare, MAIN);
    assert_eq!(fetch_one(&h, MAIN), Some(theirs.clone()));
    assert_eq!(
        h.read_file(&theirs, "state.tfstate").unwrap(),
        Some(b"v3".to_vec())
    );
    race(&r, &url, 5);
}

/// A push over git:// from a clone that lost an object the push needs (a
/// host cut off while writing it) is retryable, changes nothing on the
/// remote, and the next call fetches the clone afresh and goes through.
#[test]
fn a_push_missing_an_object_is_retryable_and_the_clone_heals() {
    let r = Remote::new();
    let (_daemon, port) = Daemon::start(r.tmp.path());
    let url = format!("git://127.0.0.1:{port}/remote.git");
    let clones = r.tmp.path().join("clones");
    let host = GitHost::new(clones.clone());
    let g = grants(&url);
    let h = host.repo(&g, &url).unwrap();
    let main = fetch_one(&h, MAIN).unwrap();
    let content = "a state whose blob goes missing";
    let commit = |h: &RepoHandle<'_>| {
        h.commit(
            Some(&main),
            &[change("state.tfstate", Some(content))],
            "next",
        )
        .unwrap()
    };
    let next = commit(&h);
    let blob = git2::Oid::hash_object(git2::ObjectType::Blob, content.as_bytes())
        .unwrap()
        .to_string();
    let clone = clones.join(clone_dir_name(&clone_key(&url, &g[0])));
    std::fs::remove_file(clone.join("objects").join(&blob[..2]).join(&blob[2..])).unwrap();
    let pushed = h.push(MAIN, &next, Some(&main));
    assert!(
        matches!(&pushed, Err(GitError::Unavailable(_))),
        "{pushed:?}"
    );
    assert_eq!(r.rev(MAIN).as_ref(), Some(&main), "the remote moved");
    // The next call starts from a fresh clone; the same write goes through.
    let h = host.repo(&g, &url).unwrap();
    assert_eq!(fetch_one(&h, MAIN).as_ref(), Some(&main));
    let again = commit(&h);
    h.push(MAIN, &again, Some(&main)).unwrap();
    assert_eq!(r.rev(MAIN).as_ref(), Some(&again));
}

/// Deepening a shallow clone's history (`file_history`) is capped while it
/// downloads: a history past what the clone may still hold is refused,
/// saying what to raise, and the clone stays as it was.
#[test]
fn a_history_past_the_clone_bound_is_refused_while_it_downloads() {
    let r = Remote::new();
    // Five commits of 200 KiB that do not compress: about 1 MiB of history.
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    for round in 0..5 {
        let noise: Vec<u8> = (0..200 << 10)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        std::fs::write(r.work.join("big.bin"), noise).unwrap();
        git(&r.work, &["add", "."]);
        git(&r.work, &["commit", "-q", "-m", &format!("round {round}")]);
    }
    let bare = r.bare.to_str().unwrap();
    git(&r.work, &["push", "-q", bare, "HEAD:refs/heads/main"]);
    let (_daemon, port) = Daemon::start(r.tmp.path());
    let url = format!("git://127.0.0.1:{port}/remote.git");
    // Room for the newest commit (a shallow fetch), not for its history.
    let host = GitHost::new(r.tmp.path().join("clones")).with_limits(400 << 10, 64 << 20);
    let g = grants(&url);
    let h = host.repo(&g, &url).unwrap();
    let main = fetch_one(&h, MAIN).unwrap();
    let refused = h.file_history(&main, "big.bin", 10).unwrap_err();
    assert!(
        matches!(&refused, GitError::Denied(m) if m.contains("git_clone_max_mib")),
        "{refused:?}"
    );
    let clone = Repository::open_bare(
        r.tmp
            .path()
            .join("clones")
            .join(clone_dir_name(&clone_key(&url, &g[0]))),
    )
    .unwrap();
    assert!(clone.is_shallow(), "nothing of the history was kept");
    // Its newest commit is still read.
    assert_eq!(
        h.read_file(&main, "big.bin").unwrap().unwrap().len(),
        200 << 10
    );
}
