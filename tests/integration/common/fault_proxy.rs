//! A fault proxy between the hosts and their storage (moto, a git HTTP
//! remote): it forwards HTTP requests and, where a rule says so, answers
//! in a way real storage sometimes does:
//!
//! - `503` without forwarding (throttled, overloaded),
//! - `500` without forwarding (an internal error),
//! - forwarded and applied, then the connection dropped with no answer:
//!   the guest cannot know its request took effect, the hardest case for
//!   a client of storage;
//! - held until the test releases it, then forwarded whether or not its
//!   sender is still there: a request storage applies late.
//!
//! The chaos checker draws faults at random ([`FaultProxy::random`]);
//! tests of one interleaving name the requests to hit
//! ([`FaultProxy::with_rule`]). Each request goes upstream on a connection
//! of its own with its headers as they came (the `Host` a signature covers
//! included), from a task of its own, so it is applied even when its
//! sender has gone.

use super::loopback::LoopbackServer;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the proxy does to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answered 503, not forwarded.
    Throttled,
    /// Answered 500, not forwarded.
    Failed,
    /// Forwarded, applied, then the connection closed without an answer.
    AppliedThenDropped,
    /// Held until [`FaultProxy::release`], then forwarded; once upstream
    /// answered, the log says so (a second entry).
    Held,
}

/// Which fault, if any, for a request described as
/// `PUT /bucket/key?x-id=PutObject` or `POST / DynamoDB_20120810.PutItem`
/// (method, path and query, `X-Amz-Target`).
pub type Rule = Box<dyn Fn(&str) -> Option<Fault> + Send + Sync>;

/// A running proxy; stopped when dropped.
pub struct FaultProxy {
    /// Where the hosts send what is meant for upstream.
    pub url: String,
    /// Every fault injected, with the request it hit.
    pub injected: Arc<Mutex<Vec<String>>>,
    released: Arc<tokio::sync::Semaphore>,
    _server: LoopbackServer,
}

impl FaultProxy {
    /// Forward to `upstream` (`http://127.0.0.1:PORT`), a fault drawn for
    /// about `percent` of every hundred requests by a generator seeded
    /// with `seed` (never [`Fault::Held`]).
    pub fn random(upstream: &str, seed: u64, percent: usize) -> FaultProxy {
        FaultProxy::start(upstream, random_rule(seed, percent), false)
    }

    /// [`FaultProxy::random`] in front of fake-gcs-server, adding the one
    /// precondition the emulator ignores and Cloud Storage keeps: a
    /// `DELETE` with `ifGenerationMatch` naming another generation (or
    /// none there) answers 412 and deletes nothing (checked by hand
    /// against fake-gcs-server: it answers 200 and deletes). The check and
    /// the delete run under one lock every request that changes storage
    /// takes, so nothing lands between them.
    pub fn random_gcs(upstream: &str, seed: u64, percent: usize) -> FaultProxy {
        FaultProxy::start(upstream, random_rule(seed, percent), true)
    }

    /// Forward to `upstream`, with the fault `rule` names for each request.
    pub fn with_rule(upstream: &str, rule: Rule) -> FaultProxy {
        FaultProxy::start(upstream, rule, false)
    }

    /// Forward to `upstream` with `rule`; keeping Cloud Storage's delete
    /// precondition when `gcs_deletes`.
    fn start(upstream: &str, rule: Rule, gcs_deletes: bool) -> FaultProxy {
        let injected = Arc::new(Mutex::new(Vec::new()));
        let released = Arc::new(tokio::sync::Semaphore::new(0));
        let shared = Arc::new(Shared {
            upstream: upstream
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string(),
            rule,
            log: injected.clone(),
            released: released.clone(),
            gcs_deletes,
            changes: tokio::sync::Mutex::new(()),
        });
        let server = LoopbackServer::start("fault proxy", false, |_| {
            move |request| handle(request, shared.clone())
        });
        FaultProxy {
            url: server.url.clone(),
            injected,
            released,
            _server: server,
        }
    }

    /// Let one held request go upstream.
    pub fn release(&self) {
        self.released.add_permits(1);
    }

    /// Wait until `count` faults were injected (a held request has
    /// arrived, say), for at most `limit`.
    pub fn wait_for_faults(&self, count: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let injected = self.injected.lock().unwrap().clone();
            if injected.len() >= count {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the fault proxy saw {} of the {count} requests it waits for within {limit:?}: {injected:?}",
                injected.len()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A fault for about `percent` of every hundred requests, drawn by a
/// generator seeded with `seed` (never [`Fault::Held`]).
fn random_rule(seed: u64, percent: usize) -> Rule {
    let rng = Mutex::new(super::Rng::new(seed));
    Box::new(move |_| {
        let mut rng = rng.lock().unwrap();
        (rng.below(100) < percent)
            .then(|| [Fault::Throttled, Fault::Failed, Fault::AppliedThenDropped][rng.below(3)])
    })
}

/// What every connection's handler shares.
struct Shared {
    upstream: String,
    rule: Rule,
    log: Arc<Mutex<Vec<String>>>,
    released: Arc<tokio::sync::Semaphore>,
    /// Whether deletes keep `ifGenerationMatch` ([`FaultProxy::random_gcs`]).
    gcs_deletes: bool,
    /// Taken by every request that changes storage while `gcs_deletes`.
    changes: tokio::sync::Mutex<()>,
}

/// One request: forwarded, or answered with the rule's fault.
async fn handle(
    request: Request<Incoming>,
    shared: Arc<Shared>,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let what = describe(&request);
    let fault = (shared.rule)(&what);
    if let Some(fault) = fault {
        shared
            .log
            .lock()
            .unwrap()
            .push(format!("{fault:?}: {what}"));
    }
    let refused = |status: StatusCode, body: String| {
        Response::builder()
            .status(status)
            .body(Full::new(Bytes::from(body)))
            .map_err(std::io::Error::other)
    };
    match fault {
        Some(Fault::Throttled) => {
            return refused(StatusCode::SERVICE_UNAVAILABLE, "injected fault".into());
        }
        Some(Fault::Failed) => {
            return refused(StatusCode::INTERNAL_SERVER_ERROR, "injected fault".into());
        }
        _ => {}
    }
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    // A task of its own: hyper drops this handler when the sender hangs
    // up, and storage applies a request whoever waits for it.
    let task = tokio::spawn(async move {
        if fault != Some(Fault::Held) {
            if shared.gcs_deletes {
                return forward_keeping_gcs_deletes(parts, body, &shared).await;
            }
            return forward(
                Request::from_parts(parts, Full::new(body)),
                &shared.upstream,
            )
            .await;
        }
        // The proxy owns the semaphore and never closes it.
        let _ = shared.released.acquire().await.map(|p| p.forget());
        let answered = forward(
            Request::from_parts(parts, Full::new(body)),
            &shared.upstream,
        )
        .await;
        let status = match &answered {
            Ok(answer) => answer.status().to_string(),
            Err(e) => format!("no answer ({e})"),
        };
        shared
            .log
            .lock()
            .unwrap()
            .push(format!("held request answered {status}: {what}"));
        answered
    });
    match (fault, task.await) {
        // Applied upstream; the error makes hyper close the connection
        // without a response.
        (Some(Fault::AppliedThenDropped), _) => Err(std::io::Error::other("dropped on purpose")),
        (_, Ok(Ok(answer))) => Ok(answer),
        (_, Ok(Err(e))) => refused(
            StatusCode::BAD_GATEWAY,
            format!("fault proxy: upstream: {e}"),
        ),
        (_, Err(e)) => refused(StatusCode::BAD_GATEWAY, format!("fault proxy: {e}")),
    }
}

/// Forward a request to fake-gcs-server as Cloud Storage would take it:
/// a change waits for every other change, and a `DELETE` whose
/// `ifGenerationMatch` does not name the live generation answers 412.
async fn forward_keeping_gcs_deletes(
    parts: hyper::http::request::Parts,
    body: Bytes,
    shared: &Shared,
) -> Result<Response<Full<Bytes>>, Box<dyn std::error::Error + Send + Sync>> {
    let reads = parts.method == hyper::Method::GET || parts.method == hyper::Method::HEAD;
    let _change = match reads {
        true => None,
        false => Some(shared.changes.lock().await),
    };
    let expected = (parts.method == hyper::Method::DELETE)
        .then(|| {
            parts.uri.query().and_then(|q| {
                q.split('&')
                    .find_map(|pair| pair.strip_prefix("ifGenerationMatch="))
                    .map(str::to_owned)
            })
        })
        .flatten();
    if let Some(expected) = expected {
        let look = Request::get(parts.uri.path())
            .header("host", &shared.upstream)
            .body(Full::new(Bytes::new()))?;
        let live = forward(look, &shared.upstream).await?;
        let status = live.status();
        let bytes = live.into_body().collect().await?.to_bytes();
        let generation = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|o| o["generation"].as_str().map(str::to_owned));
        let holds = match status {
            StatusCode::NOT_FOUND => expected == "0",
            StatusCode::OK => generation.as_deref() == Some(expected.as_str()),
            other => return Err(format!("looking before a delete: {other}").into()),
        };
        if !holds {
            let failed = Response::builder()
                .status(StatusCode::PRECONDITION_FAILED)
                .body(Full::new(Bytes::from_static(b"conditionNotMet")))?;
            return Ok(failed);
        }
    }
    forward(
        Request::from_parts(parts, Full::new(body)),
        &shared.upstream,
    )
    .await
}

/// `PUT /bucket/key?x-id=PutObject ` or `POST / DynamoDB_20120810.PutItem`.
fn describe(request: &Request<Incoming>) -> String {
    let target = request
        .headers()
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    format!("{} {} {target}", request.method(), request.uri())
}

/// Send `request` upstream on a fresh connection; its answer, whole.
pub(crate) async fn forward(
    request: Request<Full<Bytes>>,
    upstream: &str,
) -> Result<Response<Full<Bytes>>, Box<dyn std::error::Error + Send + Sync>> {
    let stream = tokio::net::TcpStream::connect(upstream).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let answer = sender.send_request(request).await?;
    let (parts, body) = answer.into_parts();
    let body = body.collect().await?.to_bytes();
    Ok(Response::from_parts(parts, Full::new(body)))
}
