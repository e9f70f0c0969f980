//! Many clients across two host processes sharing one data directory: the
//! lock is never granted twice, no update is lost, no read sees a torn state.

use crate::common::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const CLIENTS: usize = 6;
const INCREMENTS: usize = 15;

fn counter_state(counter: u64) -> Vec<u8> {
    format!(r#"{{"version":4,"serial":{counter},"lineage":"counter","counter":{counter}}}"#)
        .into_bytes()
}

fn read_counter(url: &str) -> u64 {
    let answer = send("GET", url, None);
    match answer.status {
        404 => 0,
        200 => answer.json()["counter"].as_u64().unwrap(),
        other => panic!("GET {url}: {other} {}", answer.text()),
    }
}

#[test]
fn two_hosts_one_directory_no_lost_update() {
    let dir = tempdir();
    let servers = [Server::start(dir.path()), Server::start(dir.path())];
    let urls: Vec<String> = servers
        .iter()
        .map(|s| s.state_url("default", "counter"))
        .collect();
    increment_concurrently(&urls, CLIENTS, INCREMENTS);
}

/// `clients` threads each increment a counter state `increments` times
/// under the lock, alternating between `urls` (one per host) so the hosts
/// contend for every lock. Fails if a lock is ever granted twice or an
/// update is lost.
pub fn increment_concurrently(urls: &[String], clients: usize, increments: usize) {
    let holders = Arc::new(AtomicUsize::new(0));
    let before = read_counter(&urls[0]);
    std::thread::scope(|scope| {
        for client in 0..clients {
            let holders = holders.clone();
            scope.spawn(move || {
                for i in 0..increments {
                    // Alternate hosts so both processes contend for every lock.
                    let url = &urls[(client + i) % urls.len()];
                    let id = format!("client-{client}-{i}");
                    let deadline = Instant::now() + Duration::from_secs(120);
                    loop {
                        let answer = send("LOCK", url, Some(&lock_info(&id, "test@host")));
                        match answer.status {
                            200 => break,
                            423 => assert!(Instant::now() < deadline, "lock starvation"),
                            // The remote briefly out of reach (a git daemon
                            // on a loaded machine): the server says retry.
                            503 => assert!(
                                Instant::now() < deadline,
                                "LOCK kept answering 503: {}",
                                answer.text()
                            ),
                            other => panic!("LOCK: {other} {}", answer.text()),
                        }
                        std::thread::yield_now();
                    }
                    assert_eq!(
                        holders.fetch_add(1, Ordering::SeqCst),
                        0,
                        "lock granted twice"
                    );
                    let other = &urls[(client + i + 1) % urls.len()];
                    let counter = read_counter(other);
                    let write = send(
                        "POST",
                        &format!("{url}?ID={id}"),
                        Some(&counter_state(counter + 1)),
                    );
                    assert_eq!(write.status, 200, "{}", write.text());
                    holders.fetch_sub(1, Ordering::SeqCst);
                    let unlock = send("UNLOCK", other, Some(&lock_info(&id, "test@host")));
                    assert_eq!(unlock.status, 200, "{}", unlock.text());
                }
            });
        }
    });
    assert_eq!(
        read_counter(&urls[0]),
        before + (clients * increments) as u64
    );
}

#[test]
fn readers_never_see_a_torn_state() {
    let dir = tempdir();
    let servers = [Server::start(dir.path()), Server::start(dir.path())];
    let url_a = servers[0].state_url("default", "torn");
    let url_b = servers[1].state_url("default", "torn");
    // 1 MiB states that differ everywhere from one serial to the next.
    const PAD: usize = 1 << 20;
    // The letter a serial's pad is made of.
    let fill = |serial: u64| if serial.is_multiple_of(2) { 'a' } else { 'b' };
    let make = |serial: u64| {
        format!(
            r#"{{"version":4,"serial":{serial},"lineage":"t","pad":"{}"}}"#,
            fill(serial).to_string().repeat(PAD)
        )
        .into_bytes()
    };
    assert_eq!(send("POST", &url_a, Some(&make(1))).status, 200);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for serial in 2..22u64 {
                let url = if serial.is_multiple_of(2) {
                    &url_a
                } else {
                    &url_b
                };
                let answer = send("POST", url, Some(&make(serial)));
                assert_eq!(answer.status, 200, "{}", answer.text());
            }
        });
        scope.spawn(|| {
            for i in 0..40 {
                let url = if i % 2 == 0 { &url_b } else { &url_a };
                let state = send("GET", url, None).json();
                // A whole state: its pad is one letter throughout, and the
                // letter is the one its serial wrote.
                let serial = state["serial"].as_u64().unwrap();
                let pad = state["pad"].as_str().unwrap();
                assert!(
                    pad.len() == PAD && pad.chars().all(|c| c == fill(serial)),
                    "torn state at serial {serial}"
                );
            }
        });
    });
}

/// A listing of workspaces never fails while other workspaces come and
/// go: the WASI layer asks each entry's type as it lists, and an entry
/// removed between the listing and that question used to fail the whole
/// listing (500). Directories are made and removed beside the server as
/// fast as the filesystem allows, while a client lists.
#[test]
fn listing_workspaces_while_others_come_and_go_never_fails() {
    let dir = tempdir();
    let store = dir.path().join("store");
    std::fs::create_dir_all(&store).unwrap();
    let config = format!("[backends.default]\nguest = \"local\"\ndir = {store:?}\n");
    let server = Server::with_config(&dir.path().join("server"), &config);
    let list = format!("{}/workspaces/default", server.url);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let churned = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                for n in 0..32 {
                    let _ = std::fs::create_dir(store.join(format!("churn-{n}")));
                }
                for n in 0..32 {
                    let _ = std::fs::remove_dir(store.join(format!("churn-{n}")));
                }
                churned.fetch_add(1, Ordering::Relaxed);
            }
        });
        for round in 0..200 {
            let answer = send("GET", &list, None);
            if answer.status != 200 {
                stop.store(true, Ordering::Relaxed);
                panic!("listing {round}: {} {}", answer.status, answer.text());
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(
        churned.load(Ordering::Relaxed) > 0,
        "no directory came or went"
    );
}
