//! Terraform end to end, native S3 backend vs wasmstate, on the same moto:
//! `terraform apply` of 50 `terraform_data` resources, then a no-op `plan`,
//! through (a) `backend "s3"` with `use_lockfile = true` and (b)
//! `backend "http"` → wasmstate → the `s3-lockfile` guest. Runs alternate
//! between the two; medians are reported with the ratio b/a.
//!
//! First, the round trips of one apply cycle on each side (init and a
//! first apply, then a second apply changing all 50 resources), counted by
//! a meter between the client and moto: requests and bytes read from S3.
//!
//! `cargo bench --bench terraform_s3` (WASMSTATE_BENCH_RUNS=N, default 7;
//! WASMSTATE_BENCH_ROUND_TRIPS_ONLY=1: only the round trips).

#![allow(missing_docs, dead_code)]

#[path = "../../tests/integration/common/mod.rs"]
mod common;

use common::{Meter, Metered, Moto, Server, bench_runs, median, tempdir};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const BUCKET: &str = "bench-states";
const RESOURCES: &str = r#"
resource "terraform_data" "r" {
  count = 50
  input = "value-${count.index}"
}
"#;

fn terraform(dir: &Path, args: &[&str]) -> Duration {
    let rc = dir.join("bench.tfrc");
    std::fs::write(&rc, "").unwrap();
    let started = Instant::now();
    let out = Command::new("terraform")
        .current_dir(dir)
        .args(args)
        .args(["-input=false", "-no-color"])
        .env("CHECKPOINT_DISABLE", "1")
        .env("TF_IN_AUTOMATION", "1")
        .env("TF_CLI_CONFIG_FILE", rc)
        .output()
        .expect("run terraform");
    let elapsed = started.elapsed();
    assert!(
        out.status.success(),
        "terraform {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    elapsed
}

fn native_backend(moto: &str, run: usize) -> String {
    native_backend_at(moto, &format!("native/run-{run}.tfstate"))
}

fn native_backend_at(moto: &str, key: &str) -> String {
    format!(
        r#"terraform {{
  backend "s3" {{
    bucket = "{BUCKET}"
    key = "{key}"
    region = "us-east-1"
    endpoints = {{ s3 = "{moto}" }}
    use_path_style = true
    access_key = "test"
    secret_key = "test"
    skip_credentials_validation = true
    skip_requesting_account_id = true
    skip_metadata_api_check = true
    skip_region_validation = true
    use_lockfile = true
  }}
}}
"#
    )
}

fn http_backend(url: &str) -> String {
    format!(
        "terraform {{\n  backend \"http\" {{\n    address = \"{url}\"\n    lock_address = \"{url}\"\n    unlock_address = \"{url}\"\n  }}\n}}\n"
    )
}

/// (apply, plan) wall times for one run in a fresh directory and state.
fn one_run(backend: String) -> (Duration, Duration) {
    let dir = tempdir();
    std::fs::write(dir.path().join("main.tf"), backend + RESOURCES).unwrap();
    terraform(dir.path(), &["init"]);
    let apply = terraform(dir.path(), &["apply", "-auto-approve"]);
    let plan = terraform(dir.path(), &["plan", "-detailed-exitcode"]);
    (apply, plan)
}

/// A server with backend `s3` (the `s3-lockfile` guest) on `s3_url`.
fn server(data: &Path, s3_url: &str) -> Server {
    Server::with_config(
        data,
        &format!(
            "[backends.s3]\nguest = \"s3-lockfile\"\n[backends.s3.config]\nbucket = \"{BUCKET}\"\nkey = \"wasmstate.tfstate\"\nregion = \"us-east-1\"\nendpoints = {{ s3 = \"{s3_url}\" }}\nuse_path_style = true\naccess_key = \"test\"\nsecret_key = \"test\"\n"
        ),
    )
}

/// Requests and bytes read from S3 by one apply cycle on each side, with
/// what each request was.
fn round_trips(moto: &Moto) {
    let meter = Meter::start(&moto.url);
    let data = tempdir();
    let server = server(data.path(), &meter.url);
    meter.take(); // the server's start
    let native = common::apply_cycle(
        &meter,
        &native_backend_at(&meter.url, "native/cycle.tfstate"),
    );
    let wasm = common::apply_cycle(&meter, &http_backend(&server.state_url("s3", "cycle")));
    let (native, wasm) = (Metered::totals(&native), Metered::totals(&wasm));
    for (side, (_, _, kinds)) in [("native s3", &native), ("wasmstate s3-lockfile", &wasm)] {
        eprintln!("{side}:");
        for (what, count) in kinds {
            eprintln!("  {count} × {what}");
        }
    }
    println!(
        "\n| one apply cycle, 50 resources (second apply) | (a) native s3, use_lockfile | (b) http → wasmstate → s3-lockfile | b/a |\n|---|---|---|---|"
    );
    println!(
        "| requests to S3 | {} | {} | {:.2} |",
        native.0,
        wasm.0,
        wasm.0 as f64 / native.0 as f64
    );
    println!(
        "| bytes read from S3 | {} | {} | {:.2} |",
        native.1,
        wasm.1,
        wasm.1 as f64 / native.1 as f64
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks; there is nothing to list
    }
    let runs = bench_runs(7);
    let moto = Moto::start();
    moto.create_bucket(BUCKET);
    round_trips(&moto);
    if std::env::var("WASMSTATE_BENCH_ROUND_TRIPS_ONLY").is_ok() {
        return;
    }
    let data = tempdir();
    let server = server(data.path(), &moto.url);
    let (mut native, mut wasm) = (Vec::new(), Vec::new());
    for run in 0..runs {
        // Alternate which goes first, so drift affects both alike.
        let n = || one_run(native_backend(&moto.url, run));
        let w = || one_run(http_backend(&server.state_url("s3", &format!("run-{run}"))));
        if run % 2 == 0 {
            native.push(n());
            wasm.push(w());
        } else {
            wasm.push(w());
            native.push(n());
        }
        eprintln!(
            "run {run}: native {:?}, wasmstate {:?}",
            native[run], wasm[run]
        );
    }
    let row = |name: &str, a: Duration, b: Duration| {
        println!(
            "| {name} | {:.2} s | {:.2} s | {:.3} |",
            a.as_secs_f64(),
            b.as_secs_f64(),
            b.as_secs_f64() / a.as_secs_f64()
        );
    };
    println!(
        "\n| median of {runs} runs | (a) native s3, use_lockfile | (b) http → wasmstate → s3-lockfile | b/a |\n|---|---|---|---|"
    );
    row(
        "apply, 50 resources",
        median(native.iter().map(|r| r.0).collect()),
        median(wasm.iter().map(|r| r.0).collect()),
    );
    row(
        "no-op plan",
        median(native.iter().map(|r| r.1).collect()),
        median(wasm.iter().map(|r| r.1).collect()),
    );
    row(
        "apply + plan",
        median(native.iter().map(|r| r.0 + r.1).collect()),
        median(wasm.iter().map(|r| r.0 + r.1).collect()),
    );
}
