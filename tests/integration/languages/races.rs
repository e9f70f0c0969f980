//! Requests racing through two replicas of a template's backend: two
//! unlocked writers of one serial; a workspace delete and a lock, or its
//! metadata's write; a write into a workspace that cannot hold a file.

use crate::common::*;
use std::path::Path;
use std::time::Duration;

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
    two_replicas_with(wasm, "")
}

/// [`two_replicas`], with `extra` in their config.
fn two_replicas_with(wasm: &Path, extra: &str) -> (tempfile::TempDir, [Server; 2]) {
    let root = tempdir();
    let store = root.path().join("store");
    let config = format!("[backends.race]\nguest = {wasm:?}\ndir = {store:?}\n{extra}");
    let servers = [
        Server::with_config(&root.path().join("a"), &config),
        Server::with_config(&root.path().join("b"), &config),
    ];
    (root, servers)
}

/// `first` and `second` (each named) sent at once, from a barrier; their
/// answers, and a line saying both for a failed assertion.
fn at_once(
    round: u64,
    first: (&str, impl FnOnce() -> Answer + Send),
    second: (&str, impl FnOnce() -> Answer + Send),
) -> (Answer, Answer, String) {
    let start = std::sync::Barrier::new(2);
    let ((first_name, first), (second_name, second)) = (first, second);
    let (a, b) = std::thread::scope(|scope| {
        let a = scope.spawn(|| {
            start.wait();
            first()
        });
        let b = scope.spawn(|| {
            start.wait();
            second()
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    let line = format!(
        "round {round}: {first_name} {} {}, {second_name} {} {}",
        a.status,
        a.text(),
        b.status,
        b.text()
    );
    (a, b, line)
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
        let body = lock_info(&id, "racer@test");
        let (deleted, locked, answers) = at_once(
            round,
            ("delete", || send("DELETE", &workspace, None)),
            ("lock", || send("LOCK", &lock_url, Some(&body))),
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

/// [`two_replicas`] with a token that may administer backend `race`
/// through the TFE API; the token.
fn two_replicas_at_the_tfe_door(wasm: &Path) -> (tempfile::TempDir, [Server; 2], String) {
    let (token, sha) = generate_token();
    let tokens =
        format!("[[tokens]]\nname = \"ci\"\nsha256 = \"{sha}\"\ngrants = [\"race:*:admin\"]\n");
    // A minute per guest call: a call held by a test's pause spins on one
    // of the machine's cores while the other replica serves the race.
    let config = format!("timeout_ms = 60000\n{tokens}");
    let (root, servers) = two_replicas_with(wasm, &config);
    (root, servers, token)
}

/// A TFE API request (`/api/v2/{path}`) to `server` with `token`.
fn tfe(server: &Server, token: &str, method: &str, path: &str, body: Option<&str>) -> Answer {
    send_with(
        method,
        &format!("{}/api/v2/{path}", server.url),
        body.map(str::as_bytes),
        &[
            ("Authorization", &format!("Bearer {token}")),
            ("Content-Type", "application/vnd.api+json"),
        ],
    )
}

/// The tag body of a TFE tag change adding `name`.
fn tag_body(name: &str) -> String {
    format!(r#"{{"data":[{{"type":"tags","attributes":{{"name":"{name}"}}}}]}}"#)
}

/// The tags of workspace `name` of backend `race`.
fn tags_of(server: &Server, token: &str, name: &str) -> Vec<String> {
    let read = tfe(
        server,
        token,
        "GET",
        &format!("organizations/race/workspaces/{name}"),
        None,
    );
    assert_eq!(read.status, 200, "{}", read.text());
    let tags = &read.json()["data"]["attributes"]["tag-names"];
    let tags = tags
        .as_array()
        .unwrap_or_else(|| panic!("no tag-names: {}", read.text()));
    tags.iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect()
}

/// A tag change that read a workspace's metadata, then waited (the
/// template built with [`HELD_TAG`]'s pause) while the workspace was
/// deleted and made again by the same name with tags of its own: its
/// version never lands on the new workspace's metadata (the new tags
/// would be lost and the deleted workspace's brought back); the change
/// is applied to what the new workspace has.
pub(super) fn a_metadata_write_of_a_deleted_workspace_never_lands_on_its_successor(wasm: &Path) {
    let (root, servers, token) = two_replicas_at_the_tfe_door(wasm);
    let store = root.path().join("store");
    let api = |server: &Server, method: &str, path: &str, body: Option<&str>| {
        tfe(server, &token, method, path, body)
    };
    let create = r#"{"data":{"type":"workspaces","attributes":{"name":"reborn"}}}"#;
    let made_with = |tag: &str| {
        let created = api(
            &servers[0],
            "POST",
            "organizations/race/workspaces",
            Some(create),
        );
        assert_eq!(created.status, 201, "{}", created.text());
        let id = created.json()["data"]["id"].as_str().unwrap().to_string();
        let tagged = api(
            &servers[0],
            "POST",
            &format!("workspaces/{id}/relationships/tags"),
            Some(&tag_body(tag)),
        );
        assert_eq!(tagged.status, 204, "{}", tagged.text());
        id
    };
    let id = made_with("old");
    let hold = Hold::new(store.join(".hold"));
    std::thread::scope(|scope| {
        let held = scope.spawn(|| {
            let path = format!("workspaces/{id}/relationships/tags");
            api(&servers[1], "POST", &path, Some(&tag_body(HELD_TAG)))
        });
        wait_until(
            "the tag change to read the metadata",
            Duration::from_secs(60),
            || store.join(".held").exists() || held.is_finished(),
        );
        if held.is_finished() {
            let early = held.join().unwrap();
            panic!(
                "the tag change did not wait: {} {}",
                early.status,
                early.text()
            );
        }
        let deleted = api(
            &servers[0],
            "DELETE",
            "organizations/race/workspaces/reborn",
            None,
        );
        assert_eq!(deleted.status, 204, "{}", deleted.text());
        made_with("new");
        drop(hold);
        let held = held.join().unwrap();
        assert!(matches!(held.status, 204 | 404), "{}", held.text());
    });
    let tags = tags_of(&servers[1], &token, "reborn");
    assert!(
        tags.contains(&"new".to_string()),
        "the new workspace's tag was lost: {tags:?}"
    );
    assert!(
        !tags.contains(&"old".to_string()),
        "the deleted workspace's tag came back: {tags:?}"
    );
}

/// A directory whose presence holds a template's paused call; removed
/// when dropped, so a failed assertion does not leave the call waiting
/// until its deadline.
struct Hold(std::path::PathBuf);

impl Hold {
    fn new(path: std::path::PathBuf) -> Self {
        std::fs::create_dir(&path).unwrap();
        Hold(path)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The tag whose metadata write waits in the templates built by
/// `languages::held_before_metadata_writes`.
pub(super) const HELD_TAG: &str = "held";

/// A workspace deleted through one replica while the other adds a tag
/// (the TFE door's read-modify-write of the workspace's metadata, kept in
/// the workspace's directory by the templates; the workspace made with
/// metadata, or by a state push without), round after round: neither
/// is a 500 (the delete removes the tag write's temporary file and its
/// metadata directory under it, or the write links a version into the
/// directory the delete is emptying); a delete that met a write answers
/// 503 and the next one completes; and after each round the workspace is
/// gone (a metadata write never makes its workspace again).
pub(super) fn a_metadata_write_racing_a_workspace_delete_is_never_a_500(wasm: &Path) {
    let (_root, servers, token) = two_replicas_at_the_tfe_door(wasm);
    let api = |server: &Server, method: &str, path: &str, body: Option<&str>| {
        tfe(server, &token, method, path, body)
    };
    let delete = || {
        api(
            &servers[0],
            "DELETE",
            "organizations/race/workspaces/doomed",
            None,
        )
    };
    let create = r#"{"data":{"type":"workspaces","attributes":{"name":"doomed"}}}"#;
    let tag = tag_body("racer");
    let mut tagged = 0;
    for round in 0..30u64 {
        // Made through the TFE API (with metadata), or, every other round,
        // by a state pushed at the http door (none: the tag writes the
        // first version).
        let created = match round % 2 {
            0 => api(
                &servers[0],
                "POST",
                "organizations/race/workspaces",
                Some(create),
            ),
            _ => {
                let state = servers[0].state_url("race", "doomed");
                let bearer = format!("Bearer {token}");
                let body = racer_state(round + 1, 0);
                let pushed = send_with("POST", &state, Some(&body), &[("Authorization", &bearer)]);
                assert_eq!(pushed.status, 200, "round {round}: {}", pushed.text());
                api(
                    &servers[0],
                    "GET",
                    "organizations/race/workspaces/doomed",
                    None,
                )
            }
        };
        assert!(
            matches!(created.status, 200 | 201),
            "round {round}: {}",
            created.text()
        );
        let id = created.json()["data"]["id"].as_str().unwrap().to_string();
        let path = format!("workspaces/{id}/relationships/tags");
        let (deleted, tags, answers) = at_once(
            round,
            ("delete", delete),
            ("tag", || api(&servers[1], "POST", &path, Some(&tag))),
        );
        assert!(matches!(deleted.status, 204 | 503), "{answers}");
        assert!(matches!(tags.status, 204 | 404 | 409 | 503), "{answers}");
        if deleted.status == 503 {
            // The write that reached the workspace was kept: shown until
            // the next delete, which completes.
            let doc = api(&servers[1], "GET", &format!("workspaces/{id}"), None);
            assert_eq!(doc.status, 200, "{answers}; read: {}", doc.text());
            let again = delete();
            assert_eq!(again.status, 204, "{answers}; again: {}", again.text());
        }
        if tags.status == 204 {
            tagged += 1;
        }
        let left = api(&servers[1], "GET", &format!("workspaces/{id}"), None);
        assert_eq!(left.status, 404, "{answers}; after: {}", left.text());
    }
    assert!(tagged > 0, "no tag landed in 30 rounds");
}
