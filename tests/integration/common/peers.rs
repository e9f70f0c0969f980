//! The real programs the tests talk to, each on a free loopback port and
//! stopped on drop: moto (S3, DynamoDB, IAM, STS, KMS), etcd, `git daemon`, `git
//! http-backend` behind lighttpd, an OCI registry and a static file server.
//! Each is installed and version-checked by [`super::tools`] and supervised
//! by [`Helper`], so a peer that cannot start says why in one line. None can
//! bind port 0 and report its port, so each is started on ports that were
//! free a moment before, and again on others if one was taken meanwhile
//! ([`Helper::start_on_free_ports`]).

use super::process::Helper;
use super::tools::{self, DOCKER_REGISTRY, ETCD, GIT, LIGHTTPD};
use super::{send, send_with, tempdir};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// How long a peer may take to get ready.
const START_DEADLINE: Duration = Duration::from_secs(60);

/// An `Authorization` header moto accepts for `service` (it routes by the
/// credential scope and does not verify signatures).
fn moto_auth(service: &str) -> String {
    format!(
        "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/{service}/aws4_request, SignedHeaders=host, Signature=0"
    )
}

/// moto's server, one request at a time.
///
/// moto's `If-None-Match: *` is check-then-put without a lock, and its
/// `moto_server` command serves requests on threads, so two concurrent
/// conditional PUTs can both succeed (the conformance kit's parallel-lockers
/// case caught it). S3 makes them atomic; serving one request at a time
/// restores that. No documented entry point of moto serves on one thread,
/// so this runs the same WSGI application `moto_server` runs: the names
/// `moto.server` imports for its own `main` (present from moto 4 to the
/// 5.2.5 pinned in tests/tools/requirements.txt), under werkzeug's public
/// `run_simple`.
const MOTO_SINGLE_THREADED: &str = r#"
import os, sys
from werkzeug.serving import run_simple
from moto.server import DomainDispatcherApplication, create_backend_app
host, port = sys.argv[1], int(sys.argv[2])
os.environ.setdefault("MOTO_PORT", str(port))
run_simple(host, port, DomainDispatcherApplication(create_backend_app), threaded=False)
"#;

/// A throwaway moto server (S3 and DynamoDB) on a loopback port.
pub struct Moto {
    _helper: Helper,
    /// `http://127.0.0.1:PORT`
    pub url: String,
}

impl Moto {
    /// Start moto from the tests' Python environment and wait until it
    /// answers.
    pub fn start() -> Moto {
        let python = tools::python_env().python();
        let (helper, ports) = Helper::start_on_free_ports(
            "moto",
            1,
            "answering HTTP",
            START_DEADLINE,
            |ports: &[u16]| {
                let mut command = Command::new(&python);
                command.args([
                    "-c",
                    MOTO_SINGLE_THREADED,
                    "127.0.0.1",
                    &ports[0].to_string(),
                ]);
                command
            },
            |ports: &[u16]| {
                reqwest::blocking::get(format!("http://127.0.0.1:{}/moto-api/", ports[0])).is_ok()
            },
        );
        Moto {
            _helper: helper,
            url: format!("http://127.0.0.1:{}", ports[0]),
        }
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
        self.dynamodb("CreateTable", body);
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

    /// Call a KMS operation (`CreateKey`, …) on moto directly, before it
    /// checks signatures.
    pub fn kms(&self, operation: &str, body: serde_json::Value) -> serde_json::Value {
        let answer = send_with(
            "POST",
            &format!("{}/", self.url),
            Some(&serde_json::to_vec(&body).unwrap()),
            &[
                ("X-Amz-Target", &format!("TrentService.{operation}")),
                ("Content-Type", "application/x-amz-json-1.1"),
                ("Authorization", &moto_auth("kms")),
            ],
        );
        assert_eq!(answer.status, 200, "{operation}: {}", answer.text());
        answer.json()
    }

    /// Call a query-API action (IAM, STS) on moto, before it checks
    /// signatures; its XML answer, which must be a 200.
    pub fn query(&self, service: &str, action: &str, params: &[(&str, &str)]) -> String {
        let version = if service == "iam" {
            "2010-05-08"
        } else {
            "2011-06-15"
        };
        let mut form = vec![("Action", action), ("Version", version)];
        form.extend_from_slice(params);
        let answer = reqwest::blocking::Client::new()
            .post(format!("{}/", self.url))
            .header("Authorization", moto_auth(service))
            .form(&form)
            .send()
            .unwrap_or_else(|e| panic!("{service} {action}: {e}"));
        let status = answer.status();
        let text = answer.text().unwrap();
        assert!(status.is_success(), "{service} {action}: {status} {text}");
        text
    }

    /// From now on moto checks every request's signature against the
    /// access keys and roles it knows (IAM users' keys, assumed roles'
    /// session keys), and their policies.
    pub fn check_signatures(&self) {
        let answer = send_with(
            "POST",
            &format!("{}/moto-api/reset-auth", self.url),
            Some(b"0"),
            &[("Content-Type", "text/plain")],
        );
        assert_eq!(answer.status, 200, "reset-auth: {}", answer.text());
    }

    /// Turn on a bucket's versioning, as `aws s3api put-bucket-versioning`.
    pub fn enable_versioning(&self, bucket: &str) {
        let body = br#"<VersioningConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Status>Enabled</Status></VersioningConfiguration>"#;
        let answer = send_with(
            "PUT",
            &format!("{}/{bucket}?versioning", self.url),
            Some(body),
            &[("Authorization", &moto_auth("s3"))],
        );
        assert_eq!(answer.status, 200, "versioning: {}", answer.text());
    }

    /// Put `bytes` at `key` straight into moto, behind every server's back.
    pub fn put_object(&self, bucket: &str, key: &str, bytes: &[u8]) {
        let answer = send_with(
            "PUT",
            &format!("{}/{bucket}/{key}", self.url),
            Some(bytes),
            &[("Authorization", &moto_auth("s3"))],
        );
        assert_eq!(answer.status, 200, "put {key}: {}", answer.text());
    }

    /// The version ids of `key`, newest first, as S3 lists them.
    pub fn version_ids(&self, bucket: &str, key: &str) -> Vec<String> {
        let answer = send_with(
            "GET",
            &format!("{}/{bucket}?versions&prefix={key}", self.url),
            None,
            &[("Authorization", &moto_auth("s3"))],
        );
        assert_eq!(answer.status, 200, "list versions: {}", answer.text());
        // `<Version><Key>…</Key><VersionId>…</VersionId>…</Version>`, in order.
        let text = answer.text();
        let (mut ids, mut element, mut in_version) = (Vec::new(), String::new(), false);
        let (mut this_key, mut this_id) = (None::<String>, None::<String>);
        for token in xmlparser::Tokenizer::from(text.as_str()) {
            match token.unwrap_or_else(|e| panic!("listing is not XML: {e}")) {
                xmlparser::Token::ElementStart { local, .. } => {
                    element = local.to_string();
                    in_version |= element == "Version";
                }
                xmlparser::Token::Text { text } if in_version => match element.as_str() {
                    "Key" => this_key = Some(text.to_string()),
                    "VersionId" => this_id = Some(text.to_string()),
                    _ => {}
                },
                xmlparser::Token::ElementEnd {
                    end: xmlparser::ElementEnd::Close(_, local),
                    ..
                } => {
                    element.clear();
                    if local.as_str() == "Version" {
                        in_version = false;
                        if this_key.take().as_deref() == Some(key) {
                            ids.extend(this_id.take());
                        }
                    }
                }
                _ => {}
            }
        }
        ids
    }

    /// One version of an object, read straight from moto.
    pub fn object_version(&self, bucket: &str, key: &str, version: &str) -> Option<Vec<u8>> {
        let answer = send_with(
            "GET",
            &format!("{}/{bucket}/{key}?versionId={version}", self.url),
            None,
            &[("Authorization", &moto_auth("s3"))],
        );
        (answer.status == 200).then_some(answer.body)
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

/// A throwaway single-member etcd on loopback ports.
pub struct Etcd {
    _helper: Helper,
    /// `http://127.0.0.1:PORT`
    pub url: String,
    _dir: tempfile::TempDir,
}

impl Etcd {
    /// Start one (installing Debian's etcd-server when missing) and wait
    /// until it is healthy.
    pub fn start() -> Etcd {
        tools::require(&ETCD);
        let dir = tempdir();
        let (helper, ports) = Helper::start_on_free_ports(
            "etcd",
            2,
            "reporting healthy",
            START_DEADLINE,
            |ports: &[u16]| {
                let url = format!("http://127.0.0.1:{}", ports[0]);
                let peer_url = format!("http://127.0.0.1:{}", ports[1]);
                let mut command = Command::new("etcd");
                command
                    // A data directory per attempt: one that bootstrapped
                    // with other peer URLs would not start on these.
                    .arg("--data-dir")
                    .arg(dir.path().join(format!("etcd-{}", ports[0])))
                    .args([
                        "--listen-client-urls",
                        &url,
                        "--advertise-client-urls",
                        &url,
                    ])
                    .args(["--listen-peer-urls", &peer_url])
                    .args(["--initial-advertise-peer-urls", &peer_url])
                    .args(["--initial-cluster", &format!("default={peer_url}")]);
                command
            },
            |ports: &[u16]| {
                reqwest::blocking::get(format!("http://127.0.0.1:{}/health", ports[0]))
                    .ok()
                    .and_then(|r| r.text().ok())
                    .is_some_and(|t| t.contains("true"))
            },
        );
        Etcd {
            _helper: helper,
            url: format!("http://127.0.0.1:{}", ports[0]),
            _dir: dir,
        }
    }
}

/// Run `git` with a fixed identity; panics with its output on failure.
pub fn git(dir: &Path, args: &[&str]) -> String {
    tools::require(&GIT);
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
        .expect("run git");
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
    helper: Helper,
    base: PathBuf,
    /// Its port.
    pub port: u16,
}

impl GitDaemon {
    /// Serve `base` on a free port.
    pub fn start(base: &Path) -> GitDaemon {
        let (helper, ports) = Helper::start_on_free_ports(
            "git daemon",
            1,
            "accepting connections",
            START_DEADLINE,
            |ports: &[u16]| GitDaemon::command(base, ports[0]),
            |ports: &[u16]| std::net::TcpStream::connect(("127.0.0.1", ports[0])).is_ok(),
        );
        GitDaemon {
            helper,
            base: base.to_path_buf(),
            port: ports[0],
        }
    }

    /// Serve `base` on `port` (to bring a stopped remote back).
    pub fn start_on(base: &Path, port: u16) -> GitDaemon {
        let mut helper = Helper::start("git daemon", GitDaemon::command(base, port));
        helper.wait_for_port(port, START_DEADLINE);
        GitDaemon {
            helper,
            base: base.to_path_buf(),
            port,
        }
    }

    /// The command serving `base` on `port`.
    fn command(base: &Path, port: u16) -> Command {
        // Run git-daemon itself: `git daemon` is a wrapper that would
        // leave the real daemon listening when killed.
        let exec_path = git(base, &["--exec-path"]);
        let mut command = Command::new(Path::new(exec_path.trim()).join("git-daemon"));
        command
            .args([
                "--export-all",
                "--enable=receive-pack",
                "--reuseaddr",
                "--listen=127.0.0.1",
            ])
            .arg(format!("--port={port}"))
            .arg(format!("--base-path={}", base.display()))
            .arg(base);
        command
    }

    /// `git://127.0.0.1:PORT/<name>.git`
    pub fn url(&self, name: &str) -> String {
        format!("git://127.0.0.1:{}/{name}.git", self.port)
    }

    /// Stop serving (the repositories stay on disk).
    pub fn stop(mut self) -> (PathBuf, u16) {
        self.helper.stop();
        super::wait_until("git daemon to stop", Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err()
        });
        (self.base.clone(), self.port)
    }
}

/// An OCI registry (Debian's `docker-registry`, distribution v2) on a free
/// loopback port with its storage in a temporary directory; killed on drop.
pub struct Registry {
    _helper: Helper,
    _dir: tempfile::TempDir,
    /// `127.0.0.1:PORT`
    pub address: String,
}

impl Registry {
    /// Start one, installing the package when it is missing.
    pub fn start() -> Registry {
        tools::require(&DOCKER_REGISTRY);
        let dir = tempdir();
        let config = dir.path().join("config.yml");
        let (helper, ports) = Helper::start_on_free_ports(
            "docker-registry",
            1,
            "answering /v2/",
            START_DEADLINE,
            |ports: &[u16]| {
                std::fs::write(
                    &config,
                    format!(
                        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{}\n",
                        dir.path().join("data").display(),
                        ports[0]
                    ),
                )
                .unwrap();
                let mut command = Command::new("docker-registry");
                command.arg("serve").arg(&config);
                command
            },
            |ports: &[u16]| {
                reqwest::blocking::get(format!("http://127.0.0.1:{}/v2/", ports[0]))
                    .is_ok_and(|r| r.status().is_success())
            },
        );
        Registry {
            _helper: helper,
            _dir: dir,
            address: format!("127.0.0.1:{}", ports[0]),
        }
    }
}

/// lighttpd serving `git http-backend` (smart HTTP) for the repositories in
/// `<dir>/repos`, behind HTTP Basic with one user; killed on drop.
pub struct GitHttp {
    _helper: Helper,
    /// Its port.
    pub port: u16,
}

impl GitHttp {
    /// Start it, installing Debian's `lighttpd` when it is missing.
    pub fn start(dir: &Path, user: &str, password: &str) -> GitHttp {
        tools::require(&LIGHTTPD);
        let repos = dir.join("repos");
        std::fs::create_dir_all(&repos).unwrap();
        std::fs::write(dir.join("users"), format!("{user}:{password}\n")).unwrap();
        let backend = Path::new(git(dir, &["--exec-path"]).trim()).join("git-http-backend");
        let config = dir.join("lighttpd.conf");
        let write_config = |port: u16| {
            std::fs::write(
                &config,
                format!(
                    r#"server.modules = ("mod_alias", "mod_auth", "mod_authn_file", "mod_cgi", "mod_setenv")
server.document-root = "{root}"
server.bind = "127.0.0.1"
server.port = {port}
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
        };
        let (helper, ports) = Helper::start_on_free_ports(
            "lighttpd",
            1,
            "accepting connections",
            START_DEADLINE,
            |ports: &[u16]| {
                write_config(ports[0]);
                let mut command = Command::new("lighttpd");
                command.arg("-D").arg("-f").arg(&config);
                command
            },
            |ports: &[u16]| std::net::TcpStream::connect(("127.0.0.1", ports[0])).is_ok(),
        );
        GitHttp {
            _helper: helper,
            port: ports[0],
        }
    }

    /// `http://127.0.0.1:PORT/git/<name>.git`
    pub fn url(&self, name: &str) -> String {
        format!("http://127.0.0.1:{}/git/{name}.git", self.port)
    }
}

/// A static file server (Python's `http.server`, from the tests' Python
/// environment) for a folder, on a free loopback port; killed on drop.
pub struct FileServer {
    _helper: Helper,
    /// `http://127.0.0.1:PORT`
    pub url: String,
}

impl FileServer {
    /// Serve `dir`.
    pub fn start(dir: &Path) -> FileServer {
        let python = tools::python_env().python();
        let (helper, ports) = Helper::start_on_free_ports(
            "file server",
            1,
            "accepting connections",
            START_DEADLINE,
            |ports: &[u16]| {
                let mut command = Command::new(&python);
                command
                    .args([
                        "-m",
                        "http.server",
                        &ports[0].to_string(),
                        "--bind",
                        "127.0.0.1",
                    ])
                    .current_dir(dir);
                command
            },
            |ports: &[u16]| std::net::TcpStream::connect(("127.0.0.1", ports[0])).is_ok(),
        );
        FileServer {
            _helper: helper,
            url: format!("http://127.0.0.1:{}", ports[0]),
        }
    }
}
