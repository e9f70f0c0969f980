//! What a hostile backend costs the others: a healthy `local` backend's GET
//! latency (one keep-alive client, 1,000 requests each) while the hostile
//! fixture (`tests/fixtures/hostile`) runs beside it on the same server:
//!
//! - idle: nothing else runs;
//! - memory flood: 48 concurrent requests to a guest that touches 200 MiB
//!   and spins until its deadline (the server runs in a memory cgroup of
//!   3 GiB, as in a small container, with default settings);
//! - file I/O spin: 8 concurrent requests writing, syncing and reading
//!   4 MiB files until their deadline.
//!
//! `cargo bench --bench isolation`; prints a Markdown table for docs/benchmarks.md.

#![allow(missing_docs, dead_code)]

#[path = "../../tests/integration/common/mod.rs"]
mod common;

use common::{MemoryCgroup, Server, peak_rss_kib, send, state, tempdir, wait_until};
use std::time::{Duration, Instant};

const HOSTILE_WASM: &str = env!("WASMSTATE_FIXTURE_HOSTILE");
const SAMPLES: usize = 1000;

fn latencies(url: &str, n: usize) -> Vec<Duration> {
    let client = reqwest::blocking::Client::new();
    (0..n)
        .map(|_| {
            let started = Instant::now();
            let answer = client.get(url).send().unwrap();
            assert_eq!(answer.status(), 200);
            answer.bytes().unwrap();
            started.elapsed()
        })
        .collect()
}

fn percentile(samples: &mut [Duration], p: usize) -> Duration {
    samples.sort();
    samples[(samples.len() * p / 100).min(samples.len() - 1)]
}

struct Row {
    name: &'static str,
    p50: Duration,
    p99: Duration,
}

fn measure(name: &'static str, url: &str) -> Row {
    let mut samples = latencies(url, SAMPLES);
    Row {
        name,
        p50: percentile(&mut samples, 50),
        p99: percentile(&mut samples, 99),
    }
}

/// Start `requests` attacks on `backend`, measure the healthy backend
/// while they run, wait for them.
fn under(
    name: &'static str,
    server: &Server,
    backend: &str,
    requests: usize,
    healthy: &str,
) -> Row {
    let url = server.state_url(backend, "attack");
    let attackers: Vec<_> = (0..requests)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || send("GET", &url, None).status)
        })
        .collect();
    wait_until("the attack to be running", Duration::from_secs(30), || {
        server.metric("wasmstate_requests_in_flight") >= 1.0
    });
    let row = measure(name, healthy);
    let statuses: Vec<u16> = attackers.into_iter().map(|a| a.join().unwrap()).collect();
    assert!(statuses.iter().all(|s| *s >= 500), "{statuses:?}");
    row
}

fn main() {
    let dir = tempdir();
    let spin_dir = dir.path().join("spin");
    let config = format!(
        "[backends.healthy]\nguest = \"local\"\n\
         [backends.flood]\nguest = {HOSTILE_WASM:?}\n\
         [backends.flood.config]\nattack = \"memory-spin\"\nmib = \"200\"\n\
         [backends.spin]\nguest = {HOSTILE_WASM:?}\ndir = {spin_dir:?}\n\
         [backends.spin.config]\nattack = \"file-spin\"\n"
    );
    let cgroup = MemoryCgroup::create(3 << 30).expect("a memory cgroup for the benchmark");
    let server = Server::in_cgroup(dir.path(), &config, &cgroup);
    let healthy = server.state_url("healthy", "ws");
    assert_eq!(send("POST", &healthy, Some(&state(1))).status, 200);
    latencies(&healthy, 200);

    let idle = measure("idle", &healthy);
    let flood = under(
        "48 requests touching 200 MiB, spinning",
        &server,
        "flood",
        48,
        &healthy,
    );
    let spin = under(
        "8 requests spinning in file I/O",
        &server,
        "spin",
        8,
        &healthy,
    );
    let peak = peak_rss_kib(server.pid()) / 1024;
    let budget = server.metric("wasmstate_guest_memory_budget_bytes") as u64 >> 20;

    println!("| healthy GET while another backend runs | p50 | p99 | p99 / idle p99 |");
    println!("|---|---|---|---|");
    for row in [&idle, &flood, &spin] {
        println!(
            "| {} | {:.2} ms | {:.2} ms | {:.2}× |",
            row.name,
            row.p50.as_secs_f64() * 1000.0,
            row.p99.as_secs_f64() * 1000.0,
            row.p99.as_secs_f64() / idle.p99.as_secs_f64()
        );
    }
    println!(
        "\nserver peak RSS {peak} MiB in a 3 GiB cgroup; guest memory budget {budget} MiB (half the cgroup, less the pool's resident part)"
    );
}
