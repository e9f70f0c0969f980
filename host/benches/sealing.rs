//! What encryption at rest costs a request, by where the key lives: GET
//! and POST of a 100 KiB Terraform state through the `local` guest with no
//! encryption, a file key, an AWS KMS key on moto (data keys cached, the
//! default), and the same KMS key with the cache off (every read asks KMS),
//! with the KMS calls each made per request from the server's metrics.
//!
//! moto answers on loopback in about a millisecond; a real KMS in the same
//! region answers in a few (AWS quotes single-digit milliseconds), so the
//! KMS rows are a floor: add a KMS round trip per write, and per uncached
//! read.
//!
//! `cargo bench --bench sealing` (`WASMSTATE_BENCH_RUNS`, default 200).

#![allow(missing_docs, dead_code)]

#[path = "../../tests/integration/common/mod.rs"]
mod common;

use common::{Moto, Server, bench_runs, key_file, median, tempdir};
use std::time::{Duration, Instant};

const SIZE: usize = 100 << 10;

fn state(serial: u64) -> Vec<u8> {
    let head = format!(
        r#"{{"version":4,"serial":{serial},"lineage":"bench","outputs":{{"blob":{{"value":""#
    );
    let tail = r#"","type":"string"}}}"#;
    let fill = SIZE - head.len() - tail.len();
    [
        head.as_bytes(),
        "x".repeat(fill).as_bytes(),
        tail.as_bytes(),
    ]
    .concat()
}

fn calls(server: &Server, backend: &str, call: &str) -> f64 {
    let name =
        format!("wasmstate_key_service_calls_total{{backend=\"{backend}\",call=\"{call}\"}}");
    let text = reqwest::blocking::get(format!("{}/metrics", server.url))
        .unwrap()
        .text()
        .unwrap();
    text.lines()
        .find_map(|l| {
            l.strip_prefix(&name)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

fn main() {
    let runs = bench_runs(200);
    let moto = Moto::start();
    let created = moto.kms(
        "CreateKey",
        serde_json::json!({"KeyUsage": "ENCRYPT_DECRYPT"}),
    );
    let arn = created["KeyMetadata"]["Arn"].as_str().unwrap().to_string();
    let data = tempdir();
    let file_key = key_file(data.path());
    let kms = format!(
        "{{ id = \"kms\", aws_kms = \"{arn}\", endpoint = \"{}\" }}], aws = {{ access_key = \"test\", secret_key = \"test\" }}",
        moto.url
    );
    let config = format!(
        "[backends.plain]\nguest = \"local\"\nhistory = 0\n\
         [backends.file]\nguest = \"local\"\nhistory = 0\nencryption = {{ keys = [{{ id = \"k1\", file = {file_key:?} }}] }}\n\
         [backends.kms]\nguest = \"local\"\nhistory = 0\nencryption = {{ keys = [{kms} }}\n\
         [backends.kms-uncached]\nguest = \"local\"\nhistory = 0\nencryption = {{ keys = [{kms}, data_key_cache_seconds = 0 }}\n"
    );
    let server = Server::with_config(data.path(), &config);
    let http = reqwest::blocking::Client::new();
    println!(
        "| key | POST 100 KiB (median) | GET 100 KiB (median) | KMS calls per POST | per GET |"
    );
    println!("|---|---|---|---|---|");
    for (backend, label) in [
        ("plain", "none (no encryption)"),
        ("file", "file key"),
        ("kms", "AWS KMS on moto, cached data keys (default)"),
        (
            "kms-uncached",
            "AWS KMS on moto, data_key_cache_seconds = 0",
        ),
    ] {
        let url = server.state_url(backend, "bench");
        let (mut posts, mut gets) = (Vec::new(), Vec::new());
        // KMS calls (generate + unwrap) made by POSTs and by GETs.
        let (mut post_calls, mut get_calls) = (0.0, 0.0);
        let total =
            |server: &Server| calls(server, backend, "generate") + calls(server, backend, "unwrap");
        for serial in 1..=runs as u64 {
            let body = state(serial);
            let before = total(&server);
            let started = Instant::now();
            let answer = http
                .post(&url)
                .header("Content-Type", "application/json")
                .body(body)
                .send()
                .unwrap();
            posts.push(started.elapsed());
            assert!(
                answer.status().is_success(),
                "{backend} POST: {}",
                answer.text().unwrap()
            );
            let between = total(&server);
            let started = Instant::now();
            let answer = http.get(&url).send().unwrap();
            gets.push(started.elapsed());
            assert!(answer.status().is_success(), "{backend} GET");
            assert_eq!(answer.bytes().unwrap().len(), SIZE);
            post_calls += between - before;
            get_calls += total(&server) - between;
        }
        let generate = post_calls / runs as f64;
        let unwrap = get_calls / runs as f64;
        let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1000.0);
        println!(
            "| {label} | {} | {} | {generate:.2} | {unwrap:.2} |",
            ms(median(posts)),
            ms(median(gets))
        );
    }
}
