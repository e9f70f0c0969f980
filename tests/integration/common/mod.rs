//! Test harness: real `wasmstate` server processes on free loopback ports,
//! and a small HTTP helper. Every server is killed when its handle drops.

#![allow(dead_code, unused_imports)]

pub mod azurite;
mod canary;
mod fault_proxy;
mod gcs;
mod google;
mod limits;
mod loopback;
mod meter;
mod peers;
mod postgres;
mod process;
mod rng;
pub mod tools;

pub use azurite::Azurite;
pub use canary::{CANARY, Canary};
pub use fault_proxy::{Fault, FaultProxy, Rule};
pub use gcs::FakeGcs;
pub use google::{GoogleFront, service_account_key};
pub use limits::{MemoryCgroup, peak_rss_kib, reset_peak_rss, rss_kib};
pub use loopback::LoopbackServer;
pub use meter::{Meter, Metered, apply_cycle};
pub use peers::{Etcd, FileServer, GitDaemon, GitHttp, Moto, Registry, bare_repo, git};
pub use postgres::Postgres;
pub use rng::Rng;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The `wasmstate` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_wasmstate");
/// The fixture guest that traps, loops or exhausts memory on demand.
pub const MISBEHAVE_WASM: &str = env!("WASMSTATE_FIXTURE_MISBEHAVE");

/// Compiled guests shared by every test server, so each server start maps
/// the cached machine code instead of compiling again.
pub fn shared_cache_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("guest-cache")
}

/// Give a server's data directory the key that vouches for the shared
/// cache's entries (as replicas sharing a cache share their data
/// directory), unless it has one.
fn share_cache_key(data_dir: &Path) {
    use std::io::Read;
    let shared = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("guest-cache.key");
    if !shared.exists() {
        let mut key = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut key))
            .unwrap();
        let temp = shared.with_extension(format!("tmp-{}", unique()));
        std::fs::write(&temp, key).unwrap();
        // Another test process may have made it meanwhile: keep theirs.
        let _ = std::fs::hard_link(&temp, &shared);
        let _ = std::fs::remove_file(&temp);
    }
    let own = data_dir.join("cache.key");
    if !own.exists() {
        std::fs::copy(&shared, own).unwrap();
    }
}

/// A running `wasmstate serve`, killed on drop.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`
    pub url: String,
    /// Its stderr (logs), for assertions and failure messages.
    pub log: PathBuf,
    /// Its stdout after the first line (audit records, when asked).
    pub stdout: PathBuf,
}

impl Server {
    /// Serve the default config with its data in `data_dir`.
    pub fn start(data_dir: &Path) -> Server {
        Server::spawn(data_dir, None, &[])
    }

    /// Serve `config` (TOML, written into `data_dir/wasmstate.toml`).
    pub fn with_config(data_dir: &Path, config: &str) -> Server {
        std::fs::create_dir_all(data_dir).unwrap();
        let path = data_dir.join("wasmstate.toml");
        std::fs::write(&path, config).unwrap();
        Server::spawn(data_dir, Some(&path), &[])
    }

    /// Serve an existing config file (its data directory: `data_dir`).
    pub fn with_config_file(data_dir: &Path, config: &Path) -> Server {
        Server::spawn(data_dir, Some(config), &[])
    }

    /// Serve an existing config file with extra environment variables (the
    /// values its `{ env = "…" }` entries name).
    pub fn with_config_env(data_dir: &Path, config: &Path, env: &[(&str, &str)]) -> Server {
        Server::spawn(data_dir, Some(config), env)
    }

    /// Serve `config` with compiled guests cached in `cache_dir` (not the
    /// tests' shared cache), for tests that tamper with the cache.
    pub fn with_cache(data_dir: &Path, config: &str, cache_dir: &Path) -> Server {
        std::fs::create_dir_all(data_dir).unwrap();
        let path = data_dir.join("wasmstate.toml");
        std::fs::write(&path, config).unwrap();
        Server::launch(data_dir, Some(&path), &[], None, cache_dir)
    }

    /// Serve `config` from inside `cgroup` (its memory limit applies to the
    /// server, as a container's would).
    pub fn in_cgroup(data_dir: &Path, config: &str, cgroup: &MemoryCgroup) -> Server {
        std::fs::create_dir_all(data_dir).unwrap();
        let path = data_dir.join("wasmstate.toml");
        std::fs::write(&path, config).unwrap();
        Server::launch(
            data_dir,
            Some(&path),
            &[],
            Some(cgroup),
            &shared_cache_dir(),
        )
    }

    fn spawn(data_dir: &Path, config: Option<&Path>, env: &[(&str, &str)]) -> Server {
        Server::launch(data_dir, config, env, None, &shared_cache_dir())
    }

    fn launch(
        data_dir: &Path,
        config: Option<&Path>,
        env: &[(&str, &str)],
        cgroup: Option<&MemoryCgroup>,
        cache_dir: &Path,
    ) -> Server {
        std::fs::create_dir_all(data_dir).unwrap();
        if cache_dir == shared_cache_dir() {
            share_cache_key(data_dir);
        }
        let log = data_dir.join(format!("server-{}.log", unique()));
        let mut cmd = match cgroup {
            // The shell joins the cgroup, then becomes the server (same pid).
            Some(cgroup) => {
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg("echo $$ > \"$0\" && exec \"$@\"")
                    .arg(cgroup.procs())
                    .arg(BIN);
                sh
            }
            None => Command::new(BIN),
        };
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .arg("--cache-dir")
            .arg(cache_dir)
            .env("WASMSTATE_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap());
        if let Some(config) = config {
            cmd.arg("--config").arg(config);
        }
        let mut child = cmd.spawn().expect("start wasmstate");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let rest = log.with_extension("stdout");
        let mut kept = std::fs::File::create(&rest).unwrap();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(first)) = lines.next() {
                let _ = tx.send(first);
            }
            // Keep draining so the server never blocks on a full pipe.
            for line in lines.map_while(Result::ok) {
                let _ = writeln!(kept, "{line}");
            }
        });
        let first = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => line,
            Err(error) => {
                // No first line: it exited (its stdout closed) or hangs.
                let mut exited = child.try_wait().ok().flatten();
                if error == mpsc::RecvTimeoutError::Disconnected {
                    let until = Instant::now() + Duration::from_secs(5);
                    while exited.is_none() && Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(20));
                        exited = child.try_wait().ok().flatten();
                    }
                }
                let _ = child.kill();
                let _ = child.wait();
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let cause = text
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("(no output)");
                match exited {
                    Some(status) => panic!(
                        "wasmstate exited ({status}) before listening: {cause}\n--- its log ---\n{text}"
                    ),
                    None => panic!(
                        "wasmstate did not start listening within 60 s: {cause}\n--- its log ---\n{text}"
                    ),
                }
            }
        };
        let url = first
            .strip_prefix("wasmstate listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {first}"))
            .to_string();
        Server {
            child,
            url,
            log,
            stdout: rest,
        }
    }

    /// URL of a state.
    pub fn state_url(&self, backend: &str, workspace: &str) -> String {
        format!("{}/states/{backend}/{workspace}", self.url)
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The value of an unlabelled metric, from `GET /metrics`.
    pub fn metric(&self, name: &str) -> f64 {
        let text = send("GET", &format!("{}/metrics", self.url), None).text();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
    }

    /// Send SIGTERM and wait (up to `deadline`) for a clean exit.
    pub fn terminate(mut self, deadline: Duration) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let until = Instant::now() + deadline;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < until, "server did not stop after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process-unique number, for names.
pub fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    std::process::id() as u64 * 1_000_000 + NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A fresh temporary directory, removed on drop.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("wasmstate-test-")
        .tempdir()
        .unwrap()
}

/// An HTTP answer: status and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
    pub headers: reqwest::header::HeaderMap,
}

impl Answer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

/// Send one request (any method, including LOCK and UNLOCK).
pub fn send(method: &str, url: &str, body: Option<&[u8]>) -> Answer {
    send_with(method, url, body, &[])
}

/// Send one request with extra headers.
pub fn send_with(method: &str, url: &str, body: Option<&[u8]>, headers: &[(&str, &str)]) -> Answer {
    try_send_with(method, url, body, headers).unwrap_or_else(|e| panic!("{method} {url}: {e}"))
}

/// [`send_with`], the server's failure to answer returned, not a panic.
pub fn try_send_with(
    method: &str,
    url: &str,
    body: Option<&[u8]>,
    headers: &[(&str, &str)],
) -> reqwest::Result<Answer> {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut request = client.request(reqwest::Method::from_bytes(method.as_bytes()).unwrap(), url);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    if let Some(body) = body {
        // As Terraform sends every body (the server refuses other types).
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            request = request.header("Content-Type", "application/json");
        }
        request = request.body(body.to_vec());
    }
    let response = request.send()?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.bytes()?.to_vec();
    Ok(Answer {
        status,
        body,
        headers,
    })
}

/// A LockInfo body as Terraform sends it.
pub fn lock_info(id: &str, who: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "ID": id,
        "Operation": "OperationTypeApply",
        "Info": "",
        "Who": who,
        "Version": "1.11.4",
        "Created": "2026-01-02T15:04:05.123456789Z",
        "Path": ""
    }))
    .unwrap()
}

/// A minimal valid state with `serial`.
pub fn state(serial: u64) -> Vec<u8> {
    format!(r#"{{"version":4,"terraform_version":"1.11.4","serial":{serial},"lineage":"test-lineage","outputs":{{}},"resources":[]}}"#)
        .into_bytes()
}

/// A `[backends.NAME]` table serving `guest`, with `extra` lines (keys of
/// the backend's own) and the guest's `config` pairs, TOML-quoted.
pub fn backend_table(name: &str, guest: &str, extra: &str, config: &[(String, String)]) -> String {
    let pairs: Vec<String> = config
        .iter()
        .map(|(k, v)| format!("{k:?} = {v:?}"))
        .collect();
    format!(
        "[backends.{name}]\nguest = {guest:?}\n{extra}[backends.{name}.config]\n{}\n",
        pairs.join("\n")
    )
}

/// Poll `condition` until true or `deadline` passes.
pub fn wait_until(what: &str, deadline: Duration, mut condition: impl FnMut() -> bool) {
    let until = Instant::now() + deadline;
    while !condition() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How many times its quiet latency a client may take under the load a
/// test puts on the server, when the machine is already slow without it.
pub const BUSY_MACHINE_FACTOR: u32 = 10;

/// A latency bound that holds on a machine busy with other work (the rest
/// of the suite): `fixed`, the regression guard for a quiet machine, or
/// [`BUSY_MACHINE_FACTOR`] times `quiet`, the same client's latency measured
/// just before without the load under test, when other work alone already
/// makes it that slow. On a quiet machine it is `fixed`.
pub fn latency_bound(fixed: Duration, quiet: Duration) -> Duration {
    fixed.max(quiet * BUSY_MACHINE_FACTOR)
}

/// Read everything a child wrote to a pipe, on a thread, into a shared buffer
/// that tests can poll while the child runs.
pub fn capture(pipe: impl Read + Send + 'static) -> std::sync::Arc<std::sync::Mutex<String>> {
    let buffer = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = buffer.clone();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut chunk = [0u8; 4096];
        while let Ok(n) = reader.read(&mut chunk) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&chunk[..n]));
        }
    });
    buffer
}

/// The example etcd guest (built by the host's build script).
pub const ETCD_GUEST_WASM: &str = env!("WASMSTATE_EXAMPLE_ETCD");
/// A guest built for a WIT version the host does not support.
pub const FUTURE_VERSION_WASM: &str = env!("WASMSTATE_FIXTURE_FUTURE_VERSION");

/// A TCP port on 127.0.0.1 that was free a moment ago. Another process may
/// take it before whoever is told it binds it: start helpers with
/// [`process::Helper::start_on_free_ports`], which tries other ports then.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Run `wasmstate` with `args`; (success, stdout + stderr).
pub fn wasmstate(args: &[&str]) -> (bool, String) {
    let out = Command::new(BIN)
        .args(args)
        .current_dir(cli_dir())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// Where [`wasmstate`] runs the CLI: a command that loads a guest keeps
/// its compiled code in `./wasmstate-data`, which belongs in the target
/// directory (shared by every call and run, as the compile cache is
/// worth sharing), not in the source tree.
fn cli_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli");
        std::fs::create_dir_all(&dir).unwrap();
        dir
    })
}

/// The digest `wasmstate guest inspect` prints for a component file.
pub fn sha256_of(wasm: impl AsRef<Path>) -> String {
    let (ok, out) = wasmstate(&["guest", "inspect", wasm.as_ref().to_str().unwrap()]);
    assert!(ok, "{out}");
    out.lines()
        .find_map(|l| l.strip_prefix("sha256"))
        .expect("inspect prints sha256")
        .trim()
        .to_string()
}

/// A fresh key file `k1.key` in `dir`, for `encryption.keys`, from
/// `wasmstate generate-key --out` (owner-only, as the docs make it).
pub fn key_file(dir: &Path) -> PathBuf {
    let path = dir.join("k1.key");
    let (ok, out) = wasmstate(&["generate-key", "--out", path.to_str().unwrap()]);
    assert!(ok, "{out}");
    path
}

/// `wasmstate generate-token`: (token, sha256)
pub fn generate_token() -> (String, String) {
    let (ok, out) = wasmstate(&["generate-token"]);
    assert!(ok, "{out}");
    let field = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap()
            .trim()
            .to_string()
    };
    (field("token:"), field("sha256:"))
}

/// The `N passed, M failed` line of a conformance report in `out`.
pub fn summary(out: &str) -> &str {
    out.lines()
        .rev()
        .find(|l| l.contains(" passed, ") && l.ends_with(" failed"))
        .unwrap_or_else(|| panic!("no summary line in:\n{out}"))
}

/// How many runs an end-to-end benchmark makes: `WASMSTATE_BENCH_RUNS`, or
/// `default`.
pub fn bench_runs(default: usize) -> usize {
    std::env::var("WASMSTATE_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The median of a benchmark's samples.
pub fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// `GET <state url>/versions`, and the serials it lists, newest first.
pub fn versions(state_url: &str) -> (serde_json::Value, Vec<u64>) {
    let listed = send("GET", &format!("{state_url}/versions"), None).json();
    let serials = listed
        .as_array()
        .unwrap_or_else(|| panic!("not a list of versions: {listed}"))
        .iter()
        .map(|v| v["serial"].as_u64().unwrap())
        .collect();
    (listed, serials)
}
