//! Terraform end to end through each of wasmstate's doors, on the same
//! server and storage (the embedded `local` guest): `terraform apply` of 50
//! `terraform_data` resources, then a no-op `plan`, through (a)
//! `backend "http"` (a `[[tokens]]` token as the Basic password) and (b) the
//! `cloud {}` block (the TFE API v2, local execution; the same token as
//! `TF_TOKEN_<host>`, plain http through a CLI-config `host` block). Runs
//! alternate between the two; medians are reported with the ratio b/a.
//!
//! `cargo bench --bench doors` (WASMSTATE_BENCH_RUNS=N, default 7).

#![allow(missing_docs, dead_code)]

#[path = "../../tests/integration/common/mod.rs"]
mod common;

use common::{Server, bench_runs, generate_token, median, tempdir};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const RESOURCES: &str = r#"
resource "terraform_data" "r" {
  count = 50
  input = "value-${count.index}"
}
"#;

/// What terraform needs to reach one door: the `terraform {}` block, the
/// CLI config and the environment.
struct Door {
    block: String,
    cli_config: String,
    env: Vec<(String, String)>,
}

fn terraform(dir: &Path, door: &Door, args: &[&str]) -> Duration {
    let started = Instant::now();
    let out = Command::new("terraform")
        .current_dir(dir)
        .args(args)
        .args(["-input=false", "-no-color"])
        .env("CHECKPOINT_DISABLE", "1")
        .env("TF_IN_AUTOMATION", "1")
        .env("TF_CLI_CONFIG_FILE", dir.join("bench.tfrc"))
        .envs(door.env.iter().map(|(k, v)| (k, v)))
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

fn http_door(server: &Server, token: &str, workspace: &str) -> Door {
    let url = server.state_url("acme", workspace);
    Door {
        block: format!(
            "terraform {{\n  backend \"http\" {{\n    address = \"{url}\"\n    lock_address = \"{url}\"\n    unlock_address = \"{url}\"\n    username = \"ci\"\n    password = \"{token}\"\n  }}\n}}\n"
        ),
        cli_config: String::new(),
        env: Vec::new(),
    }
}

fn cloud_door(server: &Server, token: &str, workspace: &str) -> Door {
    let port = server.url.rsplit(':').next().unwrap();
    let host = format!("wasmstate.example:{port}");
    let api = format!("{}/api/v2/", server.url);
    Door {
        block: format!(
            "terraform {{\n  cloud {{\n    hostname = \"{host}\"\n    organization = \"acme\"\n    workspaces {{\n      name = \"{workspace}\"\n    }}\n  }}\n}}\n"
        ),
        cli_config: format!(
            "host \"{host}\" {{\n  services = {{\n    \"tfe.v2\" = \"{api}\"\n    \"tfe.v2.1\" = \"{api}\"\n  }}\n}}\n"
        ),
        env: vec![(
            format!("TF_TOKEN_{}", host.replace('.', "_")),
            token.to_string(),
        )],
    }
}

/// (apply, plan) wall times for one run in a fresh directory and workspace.
fn one_run(door: Door) -> (Duration, Duration) {
    let dir = tempdir();
    std::fs::write(dir.path().join("main.tf"), door.block.clone() + RESOURCES).unwrap();
    std::fs::write(dir.path().join("bench.tfrc"), &door.cli_config).unwrap();
    terraform(dir.path(), &door, &["init"]);
    let apply = terraform(dir.path(), &door, &["apply", "-auto-approve"]);
    let plan = terraform(dir.path(), &door, &["plan", "-detailed-exitcode"]);
    (apply, plan)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks; there is nothing to list
    }
    let runs = bench_runs(7);
    let (token, sha) = generate_token();
    let data = tempdir();
    let server = Server::with_config(
        data.path(),
        &format!(
            "[backends.acme]\nguest = \"local\"\n\n[[tokens]]\nname = \"ci\"\nsha256 = \"{sha}\"\ngrants = [\"acme:*:admin\"]\n"
        ),
    );
    let (mut http, mut cloud) = (Vec::new(), Vec::new());
    for run in 0..runs {
        // Alternate which goes first, so drift affects both alike.
        let h = || one_run(http_door(&server, &token, &format!("http-{run}")));
        let c = || one_run(cloud_door(&server, &token, &format!("cloud-{run}")));
        if run % 2 == 0 {
            http.push(h());
            cloud.push(c());
        } else {
            cloud.push(c());
            http.push(h());
        }
        eprintln!("run {run}: http {:?}, cloud {:?}", http[run], cloud[run]);
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
        "\n| median of {runs} runs | (a) backend \"http\" | (b) cloud {{}} block | b/a |\n|---|---|---|---|"
    );
    row(
        "apply, 50 resources",
        median(http.iter().map(|r| r.0).collect()),
        median(cloud.iter().map(|r| r.0).collect()),
    );
    row(
        "no-op plan",
        median(http.iter().map(|r| r.1).collect()),
        median(cloud.iter().map(|r| r.1).collect()),
    );
    row(
        "apply + plan",
        median(http.iter().map(|r| r.0 + r.1).collect()),
        median(cloud.iter().map(|r| r.0 + r.1).collect()),
    );
}
