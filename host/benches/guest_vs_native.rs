//! What the sandbox costs: every operation through the embedded `local`
//! guest (fresh wasmtime instance per call) beside a native Rust twin of the
//! same file layout, at three levels: the storage call alone, a whole HTTP
//! request served in-process by the protocol layer, and a request over a
//! loopback socket as a client sees it. Also: instantiation.
//!
//! `cargo bench --bench guest_vs_native` prints criterion's report and, at
//! the end, the Markdown table kept in docs/benchmarks.md.

#![allow(missing_docs)]

#[path = "native_local.rs"]
mod native_local;
#[path = "guest_vs_native/paired.rs"]
mod paired;

use axum::body::Body;
use axum::http::Request;
use criterion::{BenchmarkId, Criterion};
use native_local::NativeLocal;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tower::ServiceExt;
use wasmstate::backend::{LockInfo, Storage};
use wasmstate::config::{Config, Overrides};
use wasmstate::protocol::{App, router};
use wasmstate::runtime::{GuestBackend, Runtime};

const SIZES: &[(&str, usize)] = &[("100KiB", 100 << 10), ("10MiB", 10 << 20)];

/// A state of `size` bytes whose serial sits in a fixed-width slot (JSON
/// allows the padding spaces), so [`next_serial`] can set it in place.
fn state_of(size: usize) -> Vec<u8> {
    let header = format!(
        r#"{{"version":4,"serial":{:>SERIAL_WIDTH$},"lineage":"bench","pad":""#,
        1
    );
    let mut body = header.into_bytes();
    body.resize(size - 2, b'x');
    body.extend_from_slice(b"\"}");
    body
}

const SERIAL_WIDTH: usize = 20;
const SERIAL_AT: usize = r#"{"version":4,"serial":"#.len();

/// The same state with the next serial. Every POST through the protocol
/// must carry a newer serial: the stale-write guard answers a repeated one
/// without writing, which would time a read instead of a write.
fn next_serial(body: &mut [u8], serial: &mut u64) {
    *serial += 1;
    let slot = format!("{:>SERIAL_WIDTH$}", *serial);
    body[SERIAL_AT..SERIAL_AT + SERIAL_WIDTH].copy_from_slice(slot.as_bytes());
}

/// The protocol layer serving `storage` as backend `default`.
fn single_backend_app<S: Storage>(storage: S) -> axum::Router {
    router(App {
        backends: BTreeMap::from([("default".to_string(), storage)]),
        max_body_bytes: 64 << 20,
        metrics: metrics(),
        auth: Default::default(),
        switches: Default::default(),
        audit: std::sync::Arc::new(wasmstate::audit::AuditLog::disabled()),
        gates: Default::default(),
        changes: Default::default(),
        body_timeout: Duration::from_secs(120),
        origins: Default::default(),
        draining: Default::default(),
        bodies: wasmstate::protocol::BodyBudget::new(1 << 30, 0),
    })
}

fn criterion_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/criterion")
}

struct Fixture {
    rt: tokio::runtime::Runtime,
    _runtime: Runtime,
    guest: std::sync::Arc<GuestBackend>,
    native: std::sync::Arc<NativeLocal>,
    _dir: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = Config::default_with(Overrides {
        data_dir: Some(dir.path().join("data")),
        ..Overrides::default()
    });
    let runtime = Runtime::new(&config, metrics()).unwrap();
    let backend = &config.backends[0];
    let guest = rt
        .block_on(wasmstate::loader::load(
            &config,
            backend,
            &runtime,
            wasmstate::loader::Ungranted::Refuse,
        ))
        .unwrap();
    Fixture {
        rt,
        _runtime: runtime,
        guest: std::sync::Arc::new(guest),
        native: std::sync::Arc::new(NativeLocal::new(&dir.path().join("native"))),
        _dir: dir,
    }
}

fn metrics() -> std::sync::Arc<wasmstate::metrics::Metrics> {
    std::sync::Arc::new(wasmstate::metrics::Metrics::new(["default".to_string()]))
}

fn lock_info() -> LockInfo {
    LockInfo {
        id: "bench-lock".into(),
        operation: "OperationTypeApply".into(),
        who: "bench@host".into(),
        ..LockInfo::default()
    }
}

fn storage_benches<S: Storage>(c: &mut Criterion, f: &Fixture, name: &str, storage: &S) {
    for &(label, size) in SIZES {
        let body = bytes::Bytes::from(state_of(size));
        f.rt.block_on(storage.write("bench", body.clone(), None))
            .unwrap();
        c.benchmark_group(format!("storage-GET-{label}"))
            .bench_function(name, |b| {
                b.iter(|| f.rt.block_on(storage.read("bench")).unwrap())
            });
        c.benchmark_group(format!("storage-POST-{label}"))
            .bench_function(name, |b| {
                b.iter(|| {
                    f.rt.block_on(storage.write("bench", body.clone(), None))
                        .unwrap()
                })
            });
    }
    c.benchmark_group("storage-LOCK+UNLOCK")
        .bench_function(name, |b| {
            b.iter(|| {
                f.rt.block_on(async {
                    storage.lock("bench", lock_info()).await.unwrap();
                    storage.unlock("bench", "bench-lock").await.unwrap();
                })
            })
        });
}

fn http_benches<S: Storage>(c: &mut Criterion, f: &Fixture, name: &str, storage: S) {
    let app = single_backend_app(storage);
    let request = |method: &str, body: Vec<u8>| {
        Request::builder()
            .method(method)
            .uri("/states/default/http")
            .body(Body::from(body))
            .unwrap()
    };
    let call = |req: Request<Body>| {
        f.rt.block_on(async {
            let response = app.clone().oneshot(req).await.unwrap();
            assert!(response.status().is_success(), "{}", response.status());
            axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap()
        })
    };
    // One serial for the whole workspace: every POST must be newer.
    let mut serial = 0;
    for &(label, size) in SIZES {
        let mut body = state_of(size);
        next_serial(&mut body, &mut serial);
        call(request("POST", body.clone()));
        c.benchmark_group(format!("http-GET-{label}"))
            .bench_function(name, |b| b.iter(|| call(request("GET", Vec::new()))));
        c.benchmark_group(format!("http-POST-{label}"))
            .bench_function(name, |b| {
                b.iter(|| {
                    next_serial(&mut body, &mut serial);
                    call(request("POST", body.clone()))
                })
            });
    }
    let lock = serde_json::to_vec(&lock_info()).unwrap();
    c.benchmark_group("http-LOCK+UNLOCK")
        .bench_function(name, |b| {
            b.iter(|| {
                call(request("LOCK", lock.clone()));
                call(request("UNLOCK", lock.clone()));
            })
        });
}

/// `storage` served as backend `default` on a loopback socket: the
/// server's task and the URL of its workspace `workspace`.
fn serve_on_socket<S: Storage>(
    f: &Fixture,
    storage: S,
    workspace: &str,
) -> (tokio::task::JoinHandle<()>, String) {
    let app = single_backend_app(storage);
    let listener =
        f.rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
    let url = format!(
        "http://{}/states/default/{workspace}",
        listener.local_addr().unwrap()
    );
    let server = f.rt.spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (server, url)
}

/// One request from `client`, answered with a success.
fn socket_call(
    f: &Fixture,
    client: &reqwest::Client,
    url: &str,
    method: &str,
    body: Vec<u8>,
) -> bytes::Bytes {
    f.rt.block_on(async {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let response = client
            .request(method, url)
            // As Terraform sends every body (others are refused, 415).
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "{}", response.status());
        response.bytes().await.unwrap()
    })
}

/// What a client sees: a real HTTP/1.1 server on a loopback socket, a
/// keep-alive client, 100 KiB states.
fn socket_benches<S: Storage>(c: &mut Criterion, f: &Fixture, name: &str, storage: S) {
    let (server, url) = serve_on_socket(f, storage, "socket");
    let client = reqwest::Client::new();
    let call = |method: &str, body: Vec<u8>| socket_call(f, &client, &url, method, body);
    let (mut body, mut serial) = (state_of(100 << 10), 0);
    next_serial(&mut body, &mut serial);
    call("POST", body.clone());
    c.benchmark_group("socket-GET-100KiB")
        .bench_function(name, |b| b.iter(|| call("GET", Vec::new())));
    c.benchmark_group("socket-POST-100KiB")
        .bench_function(name, |b| {
            b.iter(|| {
                next_serial(&mut body, &mut serial);
                call("POST", body.clone())
            })
        });
    let lock = serde_json::to_vec(&lock_info()).unwrap();
    c.benchmark_group("socket-LOCK+UNLOCK")
        .bench_function(name, |b| {
            b.iter(|| {
                call("LOCK", lock.clone());
                call("UNLOCK", lock.clone());
            })
        });
    server.abort();
}

/// Whether to run the alternating rounds: on a whole `cargo bench` run
/// (no arguments but cargo's `--bench`), or when an argument names
/// `paired`; never when criterion only lists, tests or profiles.
fn runs_alternating_rounds() -> bool {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |flag: &str| {
        args.iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
    };
    if !has("--bench")
        || ["--list", "--test", "--ignored", "--profile-time"]
            .iter()
            .any(|f| has(f))
    {
        return false;
    }
    args.iter().any(|a| a.contains("paired")) || args.iter().all(|a| a == "--bench")
}

/// Median of one benchmark, from criterion's saved estimates.
fn median(group: &str, name: &str) -> Option<f64> {
    let path = criterion_dir()
        .join(group)
        .join(name)
        .join("new/estimates.json");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    json["median"]["point_estimate"].as_f64()
}

fn pretty(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.1} µs", ns / 1e3)
    }
}

fn print_table(paired: &[paired::Paired]) {
    println!("\n| operation | native | guest | guest / native |\n|---|---|---|---|");
    let mut groups = vec![];
    for level in ["storage", "http"] {
        for &(label, _) in SIZES {
            groups.push(format!("{level}-GET-{label}"));
            groups.push(format!("{level}-POST-{label}"));
        }
        groups.push(format!("{level}-LOCK+UNLOCK"));
    }
    groups.extend(
        [
            "socket-GET-100KiB",
            "socket-POST-100KiB",
            "socket-LOCK+UNLOCK",
        ]
        .map(String::from),
    );
    for group in groups {
        if let (Some(n), Some(g)) = (median(&group, "native"), median(&group, "guest")) {
            println!(
                "| {group} | {} | {} | {:.2}× |",
                pretty(n),
                pretty(g),
                g / n
            );
        }
    }
    if let Some(i) = median("instantiate", "guest") {
        println!(
            "| instantiate + one empty call, back to back | — | {} | — |",
            pretty(i)
        );
    }
    if let Some(i) = median("made-ahead", "guest") {
        println!(
            "| one empty call on the instance made ahead (the request's path) | — | {} | — |",
            pretty(i)
        );
    }
    if paired.is_empty() {
        return;
    }
    println!(
        "\nThe socket rows in alternating rounds (median of the rounds' ratios, and their range):\n\n\
         | operation | native | guest | guest / native | range |\n|---|---|---|---|---|"
    );
    for p in paired {
        println!(
            "| {} | {} | {} | {:.2}× | {:.2}–{:.2}× |",
            p.row,
            pretty(p.native.as_nanos() as f64),
            pretty(p.guest.as_nanos() as f64),
            p.ratio,
            p.lowest,
            p.highest
        );
    }
}

fn main() {
    let mut c = Criterion::default()
        .output_directory(&criterion_dir())
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
        .configure_from_args();
    let f = fixture();
    storage_benches(&mut c, &f, "native", &*f.native);
    storage_benches(&mut c, &f, "guest", &*f.guest);
    http_benches(&mut c, &f, "native", f.native.clone());
    http_benches(&mut c, &f, "guest", f.guest.clone());
    socket_benches(&mut c, &f, "native", f.native.clone());
    socket_benches(&mut c, &f, "guest", f.guest.clone());
    // Calls back to back: each finds the instance made after the one
    // before it still being made (or just made), so about every other
    // call makes its own on its path.
    c.benchmark_group("instantiate")
        .bench_function(BenchmarkId::from_parameter("guest"), |b| {
            b.iter(|| f.rt.block_on(f.guest.validate_config()).unwrap())
        });
    // A request's path when its backend is in use: clients' requests
    // come apart (a network round trip, Terraform's own work), and the
    // instance made after the last call is ready. Only the call is timed.
    c.benchmark_group("made-ahead")
        .bench_function(BenchmarkId::from_parameter("guest"), |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    let deadline = Instant::now() + Duration::from_secs(5);
                    while !f.guest.has_ready_instance() {
                        assert!(Instant::now() < deadline, "no instance was made ahead");
                        std::thread::yield_now();
                    }
                    let started = Instant::now();
                    f.rt.block_on(f.guest.validate_config()).unwrap();
                    timed += started.elapsed();
                }
                timed
            })
        });
    c.final_summary();
    let paired = match runs_alternating_rounds() {
        true => paired::socket_rounds(&f),
        false => Vec::new(),
    };
    print_table(&paired);
}
