//! Throughput under load: `CLIENTS` Terraform-like clients, each on its own
//! workspace, run lock → get → post → unlock cycles against one `wasmstate
//! serve` on the embedded default (`local`), over loopback keep-alive
//! connections, for `WASMSTATE_LOAD_SECONDS` (default 10). Prints requests
//! per second and cycle latency percentiles, the row kept in
//! docs/benchmarks.md.
//!
//! `cargo bench --bench load`

#![allow(missing_docs)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CLIENTS: usize = 32;

fn lock_info(id: &str) -> String {
    format!(
        r#"{{"ID":"{id}","Operation":"OperationTypeApply","Info":"","Who":"load@bench","Version":"1.11.4","Created":"2026-01-02T15:04:05Z","Path":""}}"#
    )
}

fn state(serial: u64) -> String {
    format!(
        r#"{{"version":4,"terraform_version":"1.11.4","serial":{serial},"lineage":"load","outputs":{{}},"resources":[]}}"#
    )
}

/// Start the server on a free port; its URL and process (killed on drop).
struct Server(std::process::Child, String);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(data: &std::path::Path) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_wasmstate"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data)
        .env("WASMSTATE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start wasmstate");
    let mut first = String::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    out.read_line(&mut first).expect("the banner");
    // Keep draining so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in out.lines() {});
    let url = first
        .trim()
        .strip_prefix("wasmstate listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {first}"))
        .to_string();
    Server(child, url)
}

fn main() {
    let seconds: u64 = std::env::var("WASMSTATE_LOAD_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let data = tempfile::tempdir().unwrap();
    let server = start(data.path());
    let until = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let results: Vec<(u64, Vec<Duration>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..CLIENTS)
            .map(|client| {
                let base = format!("{}/states/default/load-{client}", server.1);
                scope.spawn(move || {
                    // Terraform's content type: the server refuses others (415).
                    let mut headers = reqwest::header::HeaderMap::new();
                    headers.insert("content-type", "application/json".parse().unwrap());
                    let http = reqwest::blocking::Client::builder()
                        .default_headers(headers)
                        .build()
                        .unwrap();
                    let method = |m: &str| reqwest::Method::from_bytes(m.as_bytes()).unwrap();
                    let (mut requests, mut cycles) = (0u64, Vec::new());
                    let mut serial = 0;
                    while Instant::now() < until {
                        let cycle = Instant::now();
                        let id = format!("load-{client}-{serial}");
                        let ok = |r: reqwest::Result<reqwest::blocking::Response>, what: &str| {
                            let r = r.unwrap_or_else(|e| panic!("{what}: {e}"));
                            assert!(
                                r.status().is_success() || r.status() == 404,
                                "{what}: {}",
                                r.status()
                            );
                        };
                        ok(
                            http.request(method("LOCK"), &base)
                                .body(lock_info(&id))
                                .send(),
                            "LOCK",
                        );
                        ok(http.get(&base).send(), "GET");
                        serial += 1;
                        ok(
                            http.post(format!("{base}?ID={id}"))
                                .body(state(serial))
                                .send(),
                            "POST",
                        );
                        ok(
                            http.request(method("UNLOCK"), &base)
                                .body(lock_info(&id))
                                .send(),
                            "UNLOCK",
                        );
                        requests += 4;
                        cycles.push(cycle.elapsed());
                    }
                    (requests, cycles)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let requests: u64 = results.iter().map(|(r, _)| r).sum();
    let mut cycles: Vec<Duration> = results.into_iter().flat_map(|(_, c)| c).collect();
    cycles.sort();
    let at = |q: f64| cycles[((cycles.len() as f64 * q) as usize).min(cycles.len() - 1)];
    println!(
        "| {CLIENTS} clients × lock/get/post/unlock, embedded default, {seconds} s | {:.0} req/s | cycle p50 {:.1} ms, p99 {:.1} ms |",
        requests as f64 / elapsed,
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3
    );
}
