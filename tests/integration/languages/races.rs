//! Requests racing through two replicas of a template's backend: two
//! unlocked writers of one serial; a workspace delete and a lock; a write
//! into a workspace that cannot hold a file.

use crate::common::*;
use std::path::Path;

/// A state of `serial` that differs per `racer`: the second of two such
/// writes is a conflict, never a harmless repeat.
fn racer_state(serial: u64, racer: usize) -> Vec<u8> {
    format!(
        r#"{{"version":4,"terraform_version":"1.11.4","serial":{serial},"lineage":"race","outputs":{{}},"resources":[],"racer":{racer}}}"#
    )
    .into_bytes()
}

/// Two servers of backend `race` (the guest `wasm`) on one directory, as
/// replicas are; the directory lives as long as the first value.
fn two_replicas(wasm: &Path) -> (tempfile::TempDir, [Server; 2]) {
    let root = tempdir();
    let store = root.path().join("store");
    let config = format!("[backends.race]\nguest = {wasm:?}\ndir = {store:?}\n");
    let servers = [
        Server::with_config(&root.path().join("a"), &config),
        Server::with_config(&root.path().join("b"), &config),
    ];
    (root, servers)
}

/// Two unlocked writes from one serial, sent at once to two servers on one
/// directory (replicas), round after round: one 200 and one 409 each time,
/// and the stored state is the one answered 200. Neither server takes a
/// lock for them: the guest's conditional write (its `expect`) is what
/// stands between them.
pub(super) fn unlocked_racers_get_one_200_and_one_409(wasm: &Path) {
    let (_root, servers) = two_replicas(wasm);
    let urls: Vec<String> = servers
        .iter()
        .map(|s| s.state_url("race", "race"))
        .collect();
    let first = send("POST", &urls[0], Some(&racer_state(1, 0)));
    assert_eq!(first.status, 200, "{}", first.text());
    for serial in 2..14u64 {
        let start = std::sync::Barrier::new(2);
        let answers: Vec<(u16, String, Vec<u8>)> = std::thread::scope(|scope| {
            let racers: Vec<_> = (0..2)
                .map(|racer| {
                    let (start, url) = (&start, &urls[racer]);
                    scope.spawn(move || {
                        let body = racer_state(serial, racer);
                        start.wait();
                        let answer = send("POST", url, Some(&body));
                        (answer.status, answer.text(), body)
                    })
                })
                .collect();
            racers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let mut statuses: Vec<u16> = answers.iter().map(|a| a.0).collect();
        statuses.sort_unstable();
        assert_eq!(statuses, [200, 409], "serial {serial}: {answers:?}");
        let winner = &answers.iter().find(|a| a.0 == 200).unwrap().2;
        let stored = send("GET", &urls[serial as usize % 2], None);
        assert!(
            &stored.body == winner,
            "serial {serial}: the stored state is not the write answered 200"
        );
    }
}

/// A workspace delete and a lock sent at once to two servers on one
/// directory, round after round: the template deletes under a lock of its
/// own, so the lock is refused naming the delete (423), taken first (the
/// delete refused, 423), or taken after it; a lock answered 200 is held
/// until its holder unlocks it, never removed by the delete.
pub(super) fn a_lock_granted_during_a_workspace_delete_is_kept(wasm: &Path) {
    let (_root, servers) = two_replicas(wasm);
    let state = servers[0].state_url("race", "doomed");
    let workspace = format!("{}/workspaces/race/doomed", servers[0].url);
    let lock_url = servers[1].state_url("race", "doomed");
    let mut granted = 0;
    for round in 0..40u64 {
        let created = send("POST", &state, Some(&racer_state(round + 1, 0)));
        assert_eq!(created.status, 200, "round {round}: {}", created.text());
        let id = format!("racer-{round}");
        let start = std::sync::Barrier::new(2);
        let (deleted, locked) = std::thread::scope(|scope| {
            let delete = scope.spawn(|| {
                start.wait();
                send("DELETE", &workspace, None)
            });
            let lock = scope.spawn(|| {
                let body = lock_info(&id, "racer@test");
                start.wait();
                send("LOCK", &lock_url, Some(&body))
            });
            (delete.join().unwrap(), lock.join().unwrap())
        });
        let answers = format!(
            "round {round}: delete {} {}, lock {} {}",
            deleted.status,
            deleted.text(),
            locked.status,
            locked.text()
        );
        // A guest's 500 says what failed only in its server's log.
        let answers = match deleted.status == 500 || locked.status == 500 {
            true => format!(
                "{answers}; logs: {}",
                servers
                    .iter()
                    .map(Server::log_text)
                    .map(|log| log.lines().rev().take(12).collect::<Vec<_>>().join(" | "))
                    .collect::<Vec<_>>()
                    .join(" || ")
            ),
            false => answers,
        };
        assert!(matches!(deleted.status, 200 | 423 | 503), "{answers}");
        // 503: the lock's directory went three times under it (rare).
        assert!(matches!(locked.status, 200 | 423 | 503), "{answers}");
        if locked.status == 200 {
            granted += 1;
            // Still held: a second client is refused, naming the first.
            let second = send("LOCK", &state, Some(&lock_info("second", "other@test")));
            assert_eq!(
                second.status,
                423,
                "{answers}; second lock: {}",
                second.text()
            );
            assert!(
                second.text().contains(&id),
                "{answers}; second lock: {}",
                second.text()
            );
            let unlocked = send("UNLOCK", &lock_url, Some(&lock_info(&id, "racer@test")));
            assert_eq!(
                unlocked.status,
                200,
                "{answers}; unlock: {}",
                unlocked.text()
            );
        } else {
            // Nobody holds it: the delete let go of its own lock.
            let next = send("LOCK", &state, Some(&lock_info("next", "other@test")));
            assert_eq!(next.status, 200, "{answers}; next lock: {}", next.text());
            let unlocked = send("UNLOCK", &state, Some(&lock_info("next", "other@test")));
            assert_eq!(
                unlocked.status,
                200,
                "{answers}; unlock: {}",
                unlocked.text()
            );
        }
    }
    assert!(granted > 0, "no lock was granted in 40 rounds");
}

/// A workspace that is a dangling symbolic link: a write to it is a 500
/// naming the cause, not a 503 inviting a retry (which the template
/// answers when a delete removed the directory under the write, a race a
/// retry gets past), and nothing is stored.
pub(super) fn a_write_into_a_dangling_link_is_a_500(wasm: &Path) {
    let (root, servers) = two_replicas(wasm);
    let store = root.path().join("store");
    let first = send(
        "POST",
        &servers[0].state_url("race", "ws"),
        Some(&racer_state(1, 0)),
    );
    assert_eq!(first.status, 200, "{}", first.text());
    std::os::unix::fs::symlink("nowhere", store.join("gone")).unwrap();
    let url = servers[0].state_url("race", "gone");
    let written = send("POST", &url, Some(&racer_state(1, 0)));
    assert_eq!(written.status, 500, "{}", written.text());
    assert!(!store.join("nowhere").exists(), "something was stored");
}
