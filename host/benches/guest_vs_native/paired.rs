//! The socket rows again, guest and twin measured in alternating rounds.
//!
//! Criterion times the twin's row, then the guest's, seconds apart. On a
//! VM whose `fsync` latency drifts by a third within a minute, the ratio
//! of the two medians carries that drift (the same binary has given
//! LOCK+UNLOCK 1.08× and 1.37× in one hour). Here both servers run at
//! once, and each round times a batch on one and then on the other (about
//! 0.1 s each), the order swapped every round, so a drift slower than a
//! round falls on both alike. The ratio reported is the median of the
//! rounds' ratios, with their range.

use super::{Fixture, lock_info, next_serial, serve_on_socket, socket_call, state_of};
use std::time::{Duration, Instant};

/// One socket row measured in rounds.
pub struct Paired {
    pub row: &'static str,
    /// Median time per operation over the rounds, twin and guest.
    pub native: Duration,
    pub guest: Duration,
    /// Median, lowest and highest of the rounds' guest ÷ twin ratios.
    pub ratio: f64,
    pub lowest: f64,
    pub highest: f64,
}

/// What one timed operation of a row is.
#[derive(Clone, Copy)]
enum Op {
    Get,
    Post,
    LockUnlock,
}

/// Rounds per row (`WASMSTATE_PAIRED_ROUNDS`, 21 by default, at least 1).
fn rounds() -> usize {
    std::env::var("WASMSTATE_PAIRED_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(21)
        .max(1)
}

/// The socket rows, guest and twin alternated round by round.
pub fn socket_rounds(f: &Fixture) -> Vec<Paired> {
    let (native_server, native_url) = serve_on_socket(f, f.native.clone(), "paired");
    let (guest_server, guest_url) = serve_on_socket(f, f.guest.clone(), "paired");
    let client = reqwest::Client::new();
    let call = |url: &str, method: &str, body: Vec<u8>| socket_call(f, &client, url, method, body);
    let (mut body, mut serial) = (state_of(100 << 10), 0);
    next_serial(&mut body, &mut serial);
    for url in [&native_url, &guest_url] {
        call(url, "POST", body.clone());
    }
    let lock = serde_json::to_vec(&lock_info()).unwrap();
    // One operation on `url`. Both servers take every serial in turn,
    // each newer than the last it saw.
    let mut run = |op: Op, url: &str| match op {
        Op::Get => {
            call(url, "GET", Vec::new());
        }
        Op::Post => {
            next_serial(&mut body, &mut serial);
            call(url, "POST", body.clone());
        }
        Op::LockUnlock => {
            call(url, "LOCK", lock.clone());
            call(url, "UNLOCK", lock.clone());
        }
    };
    let rows = [
        ("socket-GET-100KiB", Op::Get, 500),
        ("socket-POST-100KiB", Op::Post, 80),
        ("socket-LOCK+UNLOCK", Op::LockUnlock, 60),
    ];
    let mut results = Vec::new();
    for (row, op, batch) in rows {
        let mut time_batch = |url: &str| {
            let started = Instant::now();
            for _ in 0..batch {
                run(op, url);
            }
            started.elapsed() / batch
        };
        // Three batches each first, untimed: caches, connections, the
        // instance made ahead.
        for _ in 0..3 {
            time_batch(&native_url);
            time_batch(&guest_url);
        }
        let (mut natives, mut guests, mut ratios) = (vec![], vec![], vec![]);
        for round in 0..rounds() {
            let (native, guest) = if round % 2 == 0 {
                let native = time_batch(&native_url);
                (native, time_batch(&guest_url))
            } else {
                let guest = time_batch(&guest_url);
                (time_batch(&native_url), guest)
            };
            ratios.push(guest.as_secs_f64() / native.as_secs_f64());
            // `WASMSTATE_PAIRED_VERBOSE=1`: each round on stderr, to see
            // what follows what.
            if std::env::var_os("WASMSTATE_PAIRED_VERBOSE").is_some() {
                let first = if round % 2 == 0 { "twin" } else { "guest" };
                eprintln!("{row} round {round} ({first} first): twin {native:?}, guest {guest:?}");
            }
            natives.push(native);
            guests.push(guest);
        }
        natives.sort();
        guests.sort();
        ratios.sort_by(f64::total_cmp);
        results.push(Paired {
            row,
            native: natives[natives.len() / 2],
            guest: guests[guests.len() / 2],
            ratio: ratios[ratios.len() / 2],
            lowest: ratios[0],
            highest: ratios[ratios.len() - 1],
        });
    }
    native_server.abort();
    guest_server.abort();
    results
}
