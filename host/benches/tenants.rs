//! The server at many tenants: a config with `WASMSTATE_TENANTS` backends
//! (default 10,000), each the embedded `local` guest on its own directory,
//! as a hosted service would give each tenant. Measures the time from
//! `serve` to listening, the idle resident memory, and the first and
//! second request to the last backend (the first instantiates it).
//!
//! `cargo bench --bench tenants` (`WASMSTATE_TENANTS=300` for the issue's
//! smaller point). Run it after a change to start-up or to what a backend
//! holds.

#![allow(missing_docs)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    kib / 1024.0
}

fn main() {
    let tenants: usize = std::env::var("WASMSTATE_TENANTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let data = tempfile::tempdir().unwrap();
    let mut config = String::new();
    for i in 0..tenants {
        let dir = data.path().join("tenants").join(format!("t{i}"));
        config.push_str(&format!(
            "[backends.t{i}]\nguest = \"local\"\ndir = {dir:?}\n"
        ));
    }
    let path = data.path().join("wasmstate.toml");
    std::fs::write(&path, config).unwrap();
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_wasmstate"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data.path())
        .arg("--config")
        .arg(&path)
        .env("WASMSTATE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start wasmstate");
    let mut first = String::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    out.read_line(&mut first).expect("the banner");
    let start_time = started.elapsed();
    std::thread::spawn(move || for _ in out.lines() {});
    let url = first
        .trim()
        .strip_prefix("wasmstate listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {first}"))
        .to_string();
    let pid = child.id();
    // Start-up work after the banner (history probes) settles first.
    let mut idle = rss_mib(pid);
    let settle = Instant::now() + Duration::from_secs(30);
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = rss_mib(pid);
        if (now - idle).abs() < 1.0 || Instant::now() > settle {
            idle = now;
            break;
        }
        idle = now;
    }
    let http = reqwest::blocking::Client::new();
    let last = format!("{url}/states/t{}/default", tenants - 1);
    let timed = |what: &str| {
        let started = Instant::now();
        let answer = match what {
            "POST" => http
                .post(&last)
                .header("Content-Type", "application/json")
                .body(r#"{"version":4,"serial":1,"lineage":"t","resources":[]}"#)
                .send(),
            _ => http.get(&last).send(),
        }
        .unwrap();
        assert!(answer.status().is_success(), "{what}: {}", answer.status());
        started.elapsed()
    };
    let (post, get, get_again) = (timed("POST"), timed("GET"), timed("GET"));
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
    println!("| backends | start to listening | idle RSS | first POST | then GET | GET again |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| {tenants} | {:.2} s | {idle:.0} MiB | {} | {} | {} |",
        start_time.as_secs_f64(),
        ms(post),
        ms(get),
        ms(get_again)
    );
    let _ = child.kill();
    let _ = child.wait();
}
