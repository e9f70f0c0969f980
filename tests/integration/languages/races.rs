//! Unlocked writers racing through two replicas of a template's backend.

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

/// Two unlocked writes from one serial, sent at once to two servers on one
/// directory (replicas), round after round: one 200 and one 409 each time,
/// and the stored state is the one answered 200. Neither server takes a
/// lock for them: the guest's conditional write (its `expect`) is what
/// stands between them.
pub(super) fn unlocked_racers_get_one_200_and_one_409(wasm: &Path) {
    let root = tempdir();
    let store = root.path().join("store");
    let config = format!("[backends.race]\nguest = {wasm:?}\ndir = {store:?}\n");
    let servers = [
        Server::with_config(&root.path().join("a"), &config),
        Server::with_config(&root.path().join("b"), &config),
    ];
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
