//! Test harness: real `wasmstate` server processes on free loopback ports,
//! and a small HTTP helper. Every server is killed when its handle drops.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
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

/// A running `wasmstate serve`, killed on drop.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`
    pub url: String,
    /// Its stderr (logs), for assertions and failure messages.
    pub log: PathBuf,
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

    fn spawn(data_dir: &Path, config: Option<&Path>, env: &[(&str, &str)]) -> Server {
        std::fs::create_dir_all(data_dir).unwrap();
        let log = data_dir.join(format!("server-{}.log", unique()));
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .arg("--cache-dir")
            .arg(shared_cache_dir())
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
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(first)) = lines.next() {
                let _ = tx.send(first);
            }
            // Keep draining so the server never blocks on a full pipe.
            for _ in lines {}
        });
        let first = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "wasmstate did not start; its log:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
        };
        let url = first
            .strip_prefix("wasmstate listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {first}"))
            .to_string();
        Server { child, url, log }
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
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut request = client.request(reqwest::Method::from_bytes(method.as_bytes()).unwrap(), url);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    if let Some(body) = body {
        request = request.body(body.to_vec());
    }
    let response = request
        .send()
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.bytes().unwrap().to_vec();
    Answer {
        status,
        body,
        headers,
    }
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

/// Poll `condition` until true or `deadline` passes.
pub fn wait_until(what: &str, deadline: Duration, mut condition: impl FnMut() -> bool) {
    let until = Instant::now() + deadline;
    while !condition() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
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

/// Make sure `binary` is on the PATH, installing Debian's `package` when it
/// is missing (the machines here are Debian and tests run as root).
pub fn ensure_installed(binary: &str, package: &str) {
    ensure_tool(
        binary,
        &format!(
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {package}"
        ),
    );
}

/// Make sure `binary` is on the PATH, installing the PyPI `package` with
/// pip when it is missing.
pub fn ensure_pip_installed(binary: &str, package: &str) {
    ensure_tool(
        binary,
        &format!(
            "python3 -m pip install -q '{package}' && (command -v pyenv >/dev/null && pyenv rehash || true)"
        ),
    );
}

/// Run the shell command `install` when `binary` is not on the PATH; fail
/// the test with the reason when that does not produce it. One install at a
/// time: tests run in parallel.
fn ensure_tool(binary: &str, install: &str) {
    use std::sync::Mutex;
    static INSTALLING: Mutex<()> = Mutex::new(());
    let _guard = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
    let present = || {
        Command::new("sh")
            .args(["-c", &format!("command -v {binary}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if present() {
        return;
    }
    eprintln!("{binary} is missing: running `{install}`");
    let status = Command::new("sh").args(["-c", install]).status();
    assert!(
        matches!(status, Ok(s) if s.success()) && present(),
        "{binary} is not installed and `{install}` did not install it; install it and run the tests again"
    );
}

/// A free TCP port on 127.0.0.1 (for servers that cannot report the port
/// they bound).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Run `wasmstate` with `args`; (success, stdout + stderr).
pub fn wasmstate(args: &[&str]) -> (bool, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// The `N passed, M failed` line of a conformance report in `out`.
pub fn summary(out: &str) -> &str {
    out.lines()
        .rev()
        .find(|l| l.contains(" passed, ") && l.ends_with(" failed"))
        .unwrap_or_else(|| panic!("no summary line in:\n{out}"))
}

/// An `Authorization` header moto accepts for `service` (it routes by the
/// credential scope and does not verify signatures).
fn moto_auth(service: &str) -> String {
    format!(
        "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/{service}/aws4_request, SignedHeaders=host, Signature=0"
    )
}

/// `moto_server`, but serving one request at a time.
const MOTO_SINGLE_THREADED: &str = r#"
import os, sys
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from moto.moto_server.threaded_moto_server import MotoRequestHandler
host, port = sys.argv[1], int(sys.argv[2])
os.environ.setdefault("MOTO_PORT", str(port))
run_simple(host, port, DomainDispatcherApplication(create_backend_app), threaded=False, request_handler=MotoRequestHandler)
"#;

/// A throwaway moto server (S3 and DynamoDB) on a loopback port.
pub struct Moto {
    child: std::process::Child,
    /// `http://127.0.0.1:PORT`
    pub url: String,
}

impl Moto {
    /// Start moto and wait until it answers.
    pub fn start() -> Moto {
        ensure_pip_installed("moto_server", "moto[server]");
        let port = free_port();
        // moto's `If-None-Match: *` is check-then-put without a lock, and
        // `moto_server` serves requests on threads, so two concurrent
        // conditional PUTs can both succeed. S3 makes them atomic; serving
        // one request at a time restores that guarantee.
        let child = Command::new("python3")
            .args(["-c", MOTO_SINGLE_THREADED, "127.0.0.1", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto_server");
        let moto = Moto {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        wait_until("moto to answer", Duration::from_secs(60), || {
            reqwest::blocking::get(format!("{}/moto-api/", moto.url)).is_ok()
        });
        moto
    }

    /// Create an S3 bucket.
    pub fn create_bucket(&self, bucket: &str) {
        let answer = send("PUT", &format!("{}/{bucket}", self.url), None);
        assert_eq!(answer.status, 200, "create bucket: {}", answer.text());
    }

    /// Create a DynamoDB table keyed by `LockID`, as Terraform's docs say.
    pub fn create_lock_table(&self, table: &str) {
        let body = serde_json::json!({
            "TableName": table,
            "KeySchema": [{"AttributeName": "LockID", "KeyType": "HASH"}],
            "AttributeDefinitions": [{"AttributeName": "LockID", "AttributeType": "S"}],
            "BillingMode": "PAY_PER_REQUEST"
        });
        let answer = send_with(
            "POST",
            &format!("{}/", self.url),
            Some(&serde_json::to_vec(&body).unwrap()),
            &[
                ("X-Amz-Target", "DynamoDB_20120810.CreateTable"),
                ("Content-Type", "application/x-amz-json-1.0"),
                ("Authorization", &moto_auth("dynamodb")),
            ],
        );
        assert_eq!(answer.status, 200, "create table: {}", answer.text());
    }

    /// Call a DynamoDB operation (`PutItem`, `GetItem`, …) on moto directly.
    pub fn dynamodb(&self, operation: &str, body: serde_json::Value) -> serde_json::Value {
        let answer = send_with(
            "POST",
            &format!("{}/", self.url),
            Some(&serde_json::to_vec(&body).unwrap()),
            &[
                ("X-Amz-Target", &format!("DynamoDB_20120810.{operation}")),
                ("Content-Type", "application/x-amz-json-1.0"),
                ("Authorization", &moto_auth("dynamodb")),
            ],
        );
        assert_eq!(answer.status, 200, "{operation}: {}", answer.text());
        answer.json()
    }

    /// An object's bytes, read straight from moto.
    pub fn object(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        // Objects are private: moto wants a (syntactically) signed request.
        let answer = send_with(
            "GET",
            &format!("{}/{bucket}/{key}", self.url),
            None,
            &[("Authorization", &moto_auth("s3"))],
        );
        (answer.status == 200).then_some(answer.body)
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run `git` with a fixed identity; panics with its output on failure.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args([
            "-c",
            "user.name=Plain Git",
            "-c",
            "user.email=plain@git",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .output()
        .expect("run git (is it installed?)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "git {args:?} failed:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// A fresh bare repository `<dir>/<name>.git` whose default branch is main.
pub fn bare_repo(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(format!("{name}.git"));
    git(
        dir,
        &[
            "init",
            "-q",
            "--bare",
            "--initial-branch=main",
            path.to_str().unwrap(),
        ],
    );
    path
}

/// `git daemon` serving every repository under a folder, with pushes
/// enabled, on a free loopback port; killed on drop.
pub struct GitDaemon {
    child: Child,
    base: PathBuf,
    /// Its port.
    pub port: u16,
}

impl GitDaemon {
    /// Serve `base` on a free port.
    pub fn start(base: &Path) -> GitDaemon {
        GitDaemon::start_on(base, free_port())
    }

    /// Serve `base` on `port` (to bring a stopped remote back).
    pub fn start_on(base: &Path, port: u16) -> GitDaemon {
        // Run git-daemon itself: `git daemon` is a wrapper that would
        // leave the real daemon listening when killed.
        let exec_path = git(base, &["--exec-path"]);
        let child = Command::new(Path::new(exec_path.trim()).join("git-daemon"))
            .args([
                "--export-all",
                "--enable=receive-pack",
                "--reuseaddr",
                "--listen=127.0.0.1",
            ])
            .arg(format!("--port={port}"))
            .arg(format!("--base-path={}", base.display()))
            .arg(base)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start git daemon");
        wait_until(
            "git daemon to accept connections",
            Duration::from_secs(30),
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        );
        GitDaemon {
            child,
            base: base.to_path_buf(),
            port,
        }
    }

    /// `git://127.0.0.1:PORT/<name>.git`
    pub fn url(&self, name: &str) -> String {
        format!("git://127.0.0.1:{}/{name}.git", self.port)
    }

    /// Stop serving (the repositories stay on disk).
    pub fn stop(mut self) -> (PathBuf, u16) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        wait_until("git daemon to stop", Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err()
        });
        (self.base.clone(), self.port)
    }
}

impl Drop for GitDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An OCI registry (Debian's `docker-registry`, distribution v2) on a free
/// loopback port with its storage in a temporary directory; killed on drop.
pub struct Registry {
    child: Child,
    _dir: tempfile::TempDir,
    /// `127.0.0.1:PORT`
    pub address: String,
}

impl Registry {
    /// Start one, installing the package when it is missing.
    pub fn start() -> Registry {
        ensure_installed("docker-registry", "docker-registry");
        let dir = tempdir();
        let port = free_port();
        let address = format!("127.0.0.1:{port}");
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {address}\n",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start docker-registry");
        let url = format!("http://{address}/v2/");
        wait_until("the registry to answer", Duration::from_secs(30), || {
            reqwest::blocking::get(&url).is_ok_and(|r| r.status().is_success())
        });
        Registry {
            child,
            _dir: dir,
            address,
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// lighttpd serving `git http-backend` (smart HTTP) for the repositories in
/// `<dir>/repos`, behind HTTP Basic with one user; killed on drop.
pub struct GitHttp {
    child: Child,
    /// Its port.
    pub port: u16,
}

impl GitHttp {
    /// Start it, installing Debian's `lighttpd` when it is missing.
    pub fn start(dir: &Path, user: &str, password: &str) -> GitHttp {
        ensure_installed("lighttpd", "lighttpd");
        let repos = dir.join("repos");
        std::fs::create_dir_all(&repos).unwrap();
        std::fs::write(dir.join("users"), format!("{user}:{password}\n")).unwrap();
        let backend = Path::new(git(dir, &["--exec-path"]).trim()).join("git-http-backend");
        let port = free_port();
        let config = dir.join("lighttpd.conf");
        std::fs::write(
            &config,
            format!(
                r#"server.modules = ("mod_alias", "mod_auth", "mod_authn_file", "mod_cgi", "mod_setenv")
server.document-root = "{root}"
server.bind = "127.0.0.1"
server.port = {port}
server.errorlog = "{root}/lighttpd.log"
alias.url = ("/git" => "{backend}")
$HTTP["url"] =~ "^/git" {{
  cgi.assign = ("" => "")
  setenv.add-environment = ("GIT_PROJECT_ROOT" => "{repos}", "GIT_HTTP_EXPORT_ALL" => "")
}}
auth.backend = "plain"
auth.backend.plain.userfile = "{root}/users"
auth.require = ("/git" => ("method" => "basic", "realm" => "git", "require" => "valid-user"))
"#,
                root = dir.display(),
                repos = repos.display(),
                backend = backend.display(),
            ),
        )
        .unwrap();
        let child = Command::new("lighttpd")
            .arg("-D")
            .arg("-f")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start lighttpd");
        wait_until(
            "lighttpd to accept connections",
            Duration::from_secs(30),
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        );
        GitHttp { child, port }
    }

    /// `http://127.0.0.1:PORT/git/<name>.git`
    pub fn url(&self, name: &str) -> String {
        format!("http://127.0.0.1:{}/git/{name}.git", self.port)
    }
}

impl Drop for GitHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
