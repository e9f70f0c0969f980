//! Big states through a running server: how much memory it takes, and
//! that the bytes come back exact.
//!
//! 1. A 100 MiB state POSTed and read back through the `local` guest: the
//!    server's peak RSS (`VmHWM`, reset just before) minus its RSS before,
//!    as a multiple of the state's size.
//! 2. A large state (1 GiB by default, `WASMSTATE_BIG_MIB`) round-trips
//!    byte-exact through `local` and through `s3-lockfile` on moto.
//! 3. The real `terraform state push` and `state pull` of a 200 MiB state.
//!
//! `cargo bench --bench big_states`; it prints the table in docs/benchmarks.md.

#![allow(missing_docs, dead_code)]

#[path = "../../tests/integration/common/mod.rs"]
mod common;

use common::{Moto, Server, peak_rss_kib, reset_peak_rss, rss_kib, tempdir};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;
const BUCKET: &str = "big-states";

/// A Terraform state of about `size` bytes: the bulk in one output.
fn big_state(size: usize, serial: u64) -> Vec<u8> {
    let head = format!(
        r#"{{"version":4,"terraform_version":"1.11.4","serial":{serial},"lineage":"5b4a1b8e-0000-4000-8000-00000000b16b","outputs":{{"blob":{{"value":""#
    );
    let tail = r#"","type":"string"}},"resources":[],"check_results":null}"#;
    let mut state = Vec::with_capacity(size);
    state.extend_from_slice(head.as_bytes());
    let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ+/";
    let mut x: u32 = 0x9e37_79b9;
    while state.len() < size.saturating_sub(tail.len()) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        state.push(alphabet[(x % 64) as usize]);
    }
    state.extend_from_slice(tail.as_bytes());
    state
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(900))
        .build()
        .unwrap()
}

fn post(url: &str, body: &[u8]) -> Duration {
    let started = Instant::now();
    let answer = client()
        .post(url)
        .header("Content-Type", "application/json")
        .body(body.to_vec())
        .send()
        .unwrap();
    let status = answer.status();
    let text = answer.text().unwrap_or_default();
    assert!(status.is_success(), "POST {url}: {status} {text}");
    started.elapsed()
}

fn get(url: &str) -> (Vec<u8>, Duration) {
    let started = Instant::now();
    let answer = client().get(url).send().unwrap();
    assert!(
        answer.status().is_success(),
        "GET {url}: {}",
        answer.status()
    );
    let body = answer.bytes().unwrap().to_vec();
    (body, started.elapsed())
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// POST and GET `state` at `url`, checking it comes back exact.
fn round_trip(url: &str, state: &[u8]) -> (Duration, Duration) {
    let posted = post(url, state);
    let (back, got) = get(url);
    assert_eq!(back.len(), state.len(), "{url}: size differs");
    assert_eq!(sha(&back), sha(state), "{url}: bytes differ");
    (posted, got)
}

fn memory_growth(server: &Server) -> (f64, Duration, Duration) {
    let pid = server.pid();
    let url = server.state_url("default", "rss");
    round_trip(&url, &big_state(100_000, 1)); // warm: compiled, pool slot used
    let before = rss_kib(pid);
    reset_peak_rss(pid);
    let state = big_state(100 * MIB, 2);
    let (posted, got) = round_trip(&url, &state);
    let peak = peak_rss_kib(pid);
    let growth = (peak.saturating_sub(before) * 1024) as f64 / state.len() as f64;
    (growth, posted, got)
}

fn terraform(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new("terraform")
        .current_dir(dir)
        .args(args)
        .env("CHECKPOINT_DISABLE", "1")
        .env("TF_IN_AUTOMATION", "1")
        .output()
        .expect("run terraform");
    assert!(
        out.status.success(),
        "terraform {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `terraform state push` then `state pull` of a 200 MiB state; the pulled
/// state's output equals the pushed one.
fn terraform_push_pull(server: &Server) -> (Duration, Duration) {
    let dir = tempdir();
    let url = server.state_url("default", "terraform-big");
    std::fs::write(
        dir.path().join("main.tf"),
        format!("terraform {{\n  backend \"http\" {{\n    address = \"{url}\"\n    lock_address = \"{url}\"\n    unlock_address = \"{url}\"\n  }}\n}}\n"),
    )
    .unwrap();
    terraform(dir.path(), &["init", "-input=false", "-no-color"]);
    let state = big_state(200 * MIB, 3);
    std::fs::write(dir.path().join("big.tfstate"), &state).unwrap();
    let started = Instant::now();
    terraform(dir.path(), &["state", "push", "big.tfstate"]);
    let pushed = started.elapsed();
    let started = Instant::now();
    let pulled = terraform(dir.path(), &["state", "pull"]);
    let pull = started.elapsed();
    let value = |bytes: &[u8]| -> String {
        let json: serde_json::Value = serde_json::from_slice(bytes).unwrap();
        sha(json["outputs"]["blob"]["value"]
            .as_str()
            .unwrap()
            .as_bytes())
    };
    assert_eq!(
        value(&pulled),
        value(&state),
        "the pulled state's output differs"
    );
    (pushed, pull)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks; there is nothing to list
    }
    let big_mib: usize = std::env::var("WASMSTATE_BIG_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let moto = Moto::start();
    moto.create_bucket(BUCKET);
    let data = tempdir();
    let server = Server::with_config(
        data.path(),
        &format!(
            // A GiB takes longer than the default 10 s per call.
            "max_body_mib = {}\n[backends.default]\nguest = \"local\"\ntimeout_ms = 300000\n\
             [backends.s3]\nguest = \"s3-lockfile\"\ntimeout_ms = 300000\n[backends.s3.config]\nbucket = \"{BUCKET}\"\n\
             key = \"big.tfstate\"\nregion = \"us-east-1\"\nendpoints = {{ s3 = \"{}\" }}\n\
             use_path_style = true\naccess_key = \"test\"\nsecret_key = \"test\"\n",
            big_mib + 16,
            moto.url
        ),
    );
    let (growth, posted, got) = memory_growth(&server);
    eprintln!("100 MiB: peak RSS growth {growth:.2}x, POST {posted:?}, GET {got:?}");
    let big = big_state(big_mib * MIB, 4);
    let local = round_trip(&server.state_url("default", "big"), &big);
    eprintln!(
        "{big_mib} MiB through local: POST {:?}, GET {:?}",
        local.0, local.1
    );
    let s3 = round_trip(&server.state_url("s3", "big"), &big);
    eprintln!(
        "{big_mib} MiB through s3-lockfile: POST {:?}, GET {:?}",
        s3.0, s3.1
    );
    drop(big);
    let (push, pull) = terraform_push_pull(&server);
    eprintln!("terraform 200 MiB: push {push:?}, pull {pull:?}");
    println!("\n| measurement | result |\n|---|---|");
    println!(
        "| 100 MiB POST + GET through `local`: server peak RSS growth | {growth:.2}× the state (POST {:.2} s, GET {:.2} s) |",
        posted.as_secs_f64(),
        got.as_secs_f64()
    );
    println!(
        "| {big_mib} MiB round trip through `local`, byte-exact | POST {:.1} s, GET {:.1} s |",
        local.0.as_secs_f64(),
        local.1.as_secs_f64()
    );
    println!(
        "| {big_mib} MiB round trip through `s3-lockfile` on moto, byte-exact | POST {:.1} s, GET {:.1} s |",
        s3.0.as_secs_f64(),
        s3.1.as_secs_f64()
    );
    println!(
        "| `terraform state push` / `pull` of 200 MiB | push {:.1} s, pull {:.1} s |",
        push.as_secs_f64(),
        pull.as_secs_f64()
    );
}
