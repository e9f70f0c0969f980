//! A meter between a client and its S3 (moto): it forwards every request
//! unchanged and notes what it was and how many bytes the answer carried,
//! so a test or benchmark can count the round trips and the bytes read of
//! a Terraform run, the way a metered store bills them.

use super::loopback::LoopbackServer;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// One request that went through.
#[derive(Debug, Clone)]
pub struct Metered {
    /// `GET state range`, `PUT lock If-None-Match`, `GET list`, …
    pub what: String,
    /// The answer's status.
    pub status: u16,
    /// Bytes of the answer's body: what the client read.
    pub read: u64,
    /// Bytes of the request's body: what the client sent.
    pub sent: u64,
}

/// A running meter; stopped when dropped.
pub struct Meter {
    /// Where clients send what is meant for upstream.
    pub url: String,
    seen: Arc<Mutex<Vec<Metered>>>,
    _server: LoopbackServer,
}

impl Meter {
    /// Forward to `upstream` (`http://127.0.0.1:PORT`).
    pub fn start(upstream: &str) -> Meter {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let upstream = upstream.trim_start_matches("http://").trim_end_matches('/');
        let (log, upstream) = (seen.clone(), upstream.to_string());
        let server = LoopbackServer::start("S3 meter", true, |_| {
            move |request| handle(request, upstream.clone(), log.clone())
        });
        Meter {
            url: server.url.clone(),
            seen,
            _server: server,
        }
    }

    /// What went through since the last call, emptied.
    pub fn take(&self) -> Vec<Metered> {
        std::mem::take(&mut self.seen.lock().unwrap())
    }
}

impl Metered {
    /// Requests, bytes read and the count of each kind of request (with
    /// its status) among `seen`.
    pub fn totals(seen: &[Metered]) -> (usize, u64, BTreeMap<String, usize>) {
        let mut kinds = BTreeMap::new();
        for m in seen {
            *kinds
                .entry(format!("{} → {}", m.what, m.status))
                .or_insert(0) += 1;
        }
        (seen.len(), seen.iter().map(|m| m.read).sum(), kinds)
    }
}

async fn handle(
    request: Request<Incoming>,
    upstream: String,
    seen: Arc<Mutex<Vec<Metered>>>,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let what = describe(&request);
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    let sent = body.len() as u64;
    let answer = async {
        let stream = tokio::net::TcpStream::connect(&upstream).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let answer = sender
            .send_request(Request::from_parts(parts, Full::new(body)))
            .await?;
        let (parts, body) = answer.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Response::from_parts(
            parts,
            Full::new(body),
        ))
    }
    .await;
    match answer {
        Ok(answer) => {
            use hyper::body::Body;
            seen.lock().unwrap().push(Metered {
                what,
                status: answer.status().as_u16(),
                read: answer.body().size_hint().exact().unwrap_or(0),
                sent,
            });
            Ok(answer)
        }
        Err(e) => Response::builder()
            .status(StatusCode::BAD_GATEWAY)
            .body(Full::new(Bytes::from(format!("S3 meter: upstream: {e}"))))
            .map_err(std::io::Error::other),
    }
}

/// `GET state range`, `PUT lock If-None-Match`, `GET list`, `HEAD
/// metadata`: the method, what the key is (a Terraform state, a lock
/// object, wasmstate's metadata, a bucket listing) and the conditions sent.
fn describe(request: &Request<Incoming>) -> String {
    let path = request.uri().path();
    let query = request.uri().query().unwrap_or_default();
    let object = if query.contains("list-type=2") {
        "list"
    } else if path.ends_with(".tflock") {
        "lock"
    } else if path.ends_with(".wasmstate-metadata") {
        "metadata"
    } else if path.matches('/').count() >= 2 {
        "state"
    } else {
        "bucket"
    };
    let mut what = format!("{} {object}", request.method());
    for (header, label) in [
        ("range", "range"),
        ("if-match", "If-Match"),
        ("if-none-match", "If-None-Match"),
    ] {
        if request.headers().contains_key(header) {
            what.push(' ');
            what.push_str(label);
        }
    }
    what
}

/// Fifty resources whose inputs follow `var.v`: one apply creates them,
/// a second with another `v` changes every one (a state of about 23 KB).
pub const FIFTY_RESOURCES: &str = r#"
variable "v" {
  type    = string
  default = "a"
}

resource "terraform_data" "r" {
  count = 50
  input = "${var.v}-${count.index}"
}
"#;

/// One Terraform apply cycle on an existing state, metered: in a fresh
/// directory with `backend_block` and [`FIFTY_RESOURCES`], `init` and a
/// first apply (not metered), then what a second apply that changes every
/// resource makes `meter` see (lock, read, write, unlock).
pub fn apply_cycle(meter: &Meter, backend_block: &str) -> Vec<Metered> {
    let dir = super::tempdir();
    std::fs::write(
        dir.path().join("main.tf"),
        format!("{backend_block}{FIFTY_RESOURCES}"),
    )
    .unwrap();
    let terraform = |args: &[&str]| {
        let rc = dir.path().join("meter.tfrc");
        std::fs::write(&rc, "").unwrap();
        let out = std::process::Command::new("terraform")
            .current_dir(dir.path())
            .args(args)
            .args(["-input=false", "-no-color"])
            .env("CHECKPOINT_DISABLE", "1")
            .env("TF_IN_AUTOMATION", "1")
            .env("TF_CLI_CONFIG_FILE", rc)
            .output()
            .expect("run terraform");
        assert!(
            out.status.success(),
            "terraform {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    terraform(&["init"]);
    terraform(&["apply", "-auto-approve"]);
    meter.take();
    terraform(&["apply", "-auto-approve", "-var", "v=b"]);
    meter.take()
}
