//! The clones the host keeps: their bounds, who shares one, and what a
//! stopped host leaves in one.

use super::*;

/// Issue 27, finding 2: commits chained without a fetch grew the clone
/// without bound (only fetches checked it). Now a clone past its bound
/// takes no further commit until a fetch starts it afresh: it holds at
/// most its bound plus one commit.
#[test]
fn commits_without_a_fetch_stop_once_the_clone_is_past_its_bound() {
    let r = Remote::new();
    let host = GitHost::new(r.tmp.path().join("clones")).with_limits(1 << 20, 1 << 20);
    let url = r.bare.to_str().unwrap().to_owned();
    let g = grants(&url);
    let h = host.repo(&g, &url).unwrap();
    let mut parent = fetch_one(&h, MAIN);
    let mut committed = 0u64;
    let refused = loop {
        // Bytes that do not compress.
        let bytes: Vec<u8> = (0..(512u64 << 10))
            .map(|i| (i.wrapping_mul(2654435761).wrapping_add(committed * 7919) >> 7) as u8)
            .collect();
        let change = FileChange {
            path: format!("f-{committed}.tfstate"),
            content: Some(bytes),
        };
        match h.commit(parent.as_deref(), &[change], "grow") {
            Ok(commit) => {
                parent = Some(commit);
                committed += 1;
                assert!(committed < 10, "ten commits of 512 KiB past a 1 MiB bound");
            }
            Err(e) => break e,
        }
    };
    assert!(
        matches!(&refused, GitError::Unavailable(m) if m.contains("git_clone_max_mib")),
        "{refused:?}"
    );
    // At most the bound plus one commit.
    assert!(committed <= 3, "{committed} commits of 512 KiB went in");
    // A fetch starts afresh, and commits go in again.
    let tip = fetch_one(&h, MAIN);
    let change = FileChange {
        path: "again.tfstate".into(),
        content: Some(b"x".to_vec()),
    };
    h.commit(tip.as_deref(), &[change], "after a fetch")
        .unwrap();
}

/// Issue 27, finding 12: clones were shared per URL, so a backend could
/// push a commit another backend, granted the same repository with other
/// credentials or paths, had made in the shared clone. Each grant now has
/// a clone of its own.
#[test]
fn backends_granted_one_repository_differently_do_not_share_a_clone() {
    let r = Remote::new();
    let host = GitHost::new(r.tmp.path().join("clones"));
    let url = r.bare.to_str().unwrap().to_owned();
    let wide = grants(&url);
    let narrow = vec![GitGrant {
        paths: vec!["only-this.tfstate".into()],
        ..wide[0].clone()
    }];
    let a = host.repo(&wide, &url).unwrap();
    let tip = fetch_one(&a, MAIN);
    let theirs = a
        .commit(
            tip.as_deref(),
            &[change("only-this.tfstate", Some("a's"))],
            "a's commit",
        )
        .unwrap();
    let b = host.repo(&narrow, &url).unwrap();
    fetch_one(&b, MAIN);
    let pushed = b.push(MAIN, &theirs, tip.as_deref());
    assert!(pushed.is_err(), "b pushed a commit only a's clone holds");
    assert_eq!(r.rev(MAIN), tip, "the remote moved");
}

/// A host killed while libgit2 held a ref's lock file leaves `<ref>.lock`
/// in the clone; every later fetch updating that ref failed with
/// "locked", forever. A host opening the clone afresh removes them.
#[test]
fn lock_files_a_stopped_host_left_in_a_clone_are_removed() {
    let (r, clones, url, g) = granted_remote();
    {
        let host = GitHost::new(clones.clone());
        fetch_one(&host.repo(&g, &url).unwrap(), MAIN);
    }
    let clone = the_clone(&clones);
    let tracking = clone.join(tracking_ref(MAIN));
    assert!(
        tracking.is_file(),
        "no tracking ref at {}",
        tracking.display()
    );
    let stale = tracking.with_extension("lock");
    std::fs::write(&stale, "").unwrap();
    std::fs::write(clone.join("packed-refs.lock"), "").unwrap();
    // The remote moves, so the fetch must update the tracking ref.
    let moved = interlope(&r.bare, MAIN);
    let host = GitHost::new(clones);
    let h = host.repo(&g, &url).unwrap();
    assert_eq!(fetch_one(&h, MAIN).as_deref(), Some(moved.as_str()));
    assert!(!stale.exists(), "the stale lock is still there");
    let commit = h
        .commit(
            Some(&moved),
            &[change("state.tfstate", Some("v2"))],
            "after a kill",
        )
        .unwrap();
    h.push(MAIN, &commit, Some(&moved)).unwrap();
    assert_eq!(r.rev(MAIN), Some(commit));
}

/// A push whose ancestry cannot be walked in the clone (objects missing)
/// was refused as a forced update, and stayed refused: the damaged clone
/// was kept. Now it is retryable and the clone is fetched afresh.
#[test]
fn a_push_over_a_clone_missing_history_is_retryable_and_heals() {
    let (r, clones, url, g) = granted_remote();
    let host = GitHost::new(clones.clone());
    let h = host.repo(&g, &url).unwrap();
    let tip = fetch_one(&h, MAIN).unwrap();
    // Commits made in the clone are loose objects: lose the middle one.
    let first = h
        .commit(Some(&tip), &[change("state.tfstate", Some("v2"))], "first")
        .unwrap();
    let second = h
        .commit(
            Some(&first),
            &[change("state.tfstate", Some("v3"))],
            "second",
        )
        .unwrap();
    let third = h
        .commit(
            Some(&second),
            &[change("state.tfstate", Some("v4"))],
            "third",
        )
        .unwrap();
    let clone = the_clone(&clones);
    let object = clone.join("objects").join(&second[..2]).join(&second[2..]);
    std::fs::remove_file(&object).unwrap();
    let pushed = h.push(MAIN, &third, Some(&first));
    assert!(
        matches!(&pushed, Err(GitError::Unavailable(_))),
        "{pushed:?}"
    );
    assert_eq!(
        r.rev(MAIN).as_deref(),
        Some(tip.as_str()),
        "the remote moved"
    );
    // The next call starts the clone afresh and a write goes through.
    let tip = fetch_one(&h, MAIN).unwrap();
    let commit = h
        .commit(Some(&tip), &[change("state.tfstate", Some("v2"))], "again")
        .unwrap();
    h.push(MAIN, &commit, Some(&tip)).unwrap();
    assert_eq!(r.rev(MAIN), Some(commit));
}

/// The one clone under `clones`.
fn the_clone(clones: &Path) -> PathBuf {
    std::fs::read_dir(clones)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "git"))
        .expect("a clone")
}

/// Two processes given one clones directory (replicas sharing a data
/// directory) would share clones, and one would remove the lock files the
/// other holds. The second claims a directory of its own.
#[test]
fn a_second_host_on_the_same_clones_directory_uses_its_own() {
    let (_remote, clones, url, g) = granted_remote();
    let first = GitHost::new(clones.clone());
    fetch_one(&first.repo(&g, &url).unwrap(), MAIN);
    let mine = the_clone(&clones);
    // A lock the first host holds right now.
    let held = mine.join("refs").join("heads").join("held.lock");
    std::fs::create_dir_all(held.parent().unwrap()).unwrap();
    std::fs::write(&held, "").unwrap();
    let second = GitHost::new(clones.clone());
    fetch_one(&second.repo(&g, &url).unwrap(), MAIN);
    assert!(
        held.exists(),
        "the second host removed the first's lock file"
    );
    assert!(the_clone(&clones.join("replicas").join("1")).is_dir());
    // Once the first is gone, a new host takes the directory back. (A
    // process another test forks at that moment holds a copy of the lock's
    // descriptor until it execs: a busy machine can stretch that, so the
    // new host is made again until the directory is free.)
    drop(first);
    drop(second);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let third = GitHost::new(clones.clone());
        fetch_one(&third.repo(&g, &url).unwrap(), MAIN);
        if !held.exists() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a stale lock file stayed"
        );
        drop(third);
        std::thread::yield_now();
    }
}

/// A second process that cannot claim a directory of its own refuses
/// git, instead of sharing the first one's unowned.
#[test]
fn a_host_that_cannot_claim_a_clones_directory_refuses_git() {
    let (_remote, clones, url, g) = granted_remote();
    let first = GitHost::new(clones.clone());
    fetch_one(&first.repo(&g, &url).unwrap(), MAIN);
    std::fs::write(clones.join("replicas"), "not a directory").unwrap();
    let second = GitHost::new(clones.clone());
    let refused = second.repo(&g, &url).err();
    assert!(
        matches!(&refused, Some(GitError::Internal(m)) if m.contains("keeps no git clones")),
        "{:?}",
        refused.map(|e| e.to_string())
    );
}

/// A remote, where a host's clones of it go, its URL (a path) and a grant
/// of all of it.
fn granted_remote() -> (Remote, PathBuf, String, Vec<GitGrant>) {
    let r = Remote::new();
    let clones = r.tmp.path().join("clones");
    let url = r.bare.to_str().unwrap().to_owned();
    let g = grants(&url);
    (r, clones, url, g)
}
