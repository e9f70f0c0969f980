//! `wasi:http` outgoing requests, filtered by the backend's
//! [`OutboundPolicy`] before anything leaves the host: the URI's origin
//! first, then every address its host resolves to. The host resolves the
//! name once and connects only to an address it checked (no second
//! lookup for DNS to answer differently), with TLS verified for the name.

use crate::capabilities::aws::AwsSigner;
use crate::capabilities::azure::{self, AzureSigner};
use crate::capabilities::gcp::{self, GcpAuth};
use crate::policy::OutboundPolicy;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

/// The hooks object of one sandbox: checks each request's URI against the
/// policy, logs and refuses what is not granted, sends the rest with
/// wasmtime's default client.
pub struct Outbound {
    /// What this backend may reach.
    pub policy: Arc<OutboundPolicy>,
    /// Backend name, for the log line of a refusal.
    pub backend: Arc<str>,
    /// Signs requests to the backend's AWS endpoints with its credentials.
    pub aws: Option<Arc<AwsSigner>>,
    /// Signs requests to the backend's Azure Storage account.
    pub azure: Option<Arc<AzureSigner>>,
    /// Adds the backend's Google token to requests to its bucket.
    pub gcp: Option<Arc<GcpAuth>>,
    /// Largest body the host reads whole to sign.
    pub max_body_bytes: usize,
    /// Requests of this instance under way.
    pub requests: Requests,
    /// The backend's and the server's memory budgets: a body the host
    /// reads whole to sign is charged to both while it is held.
    pub budgets: [super::limits::Budget; 2],
    /// The backend's heavy host work: hashing a big body to sign.
    pub work: crate::work::HostWork,
}

/// Outgoing requests one instance may have under way at once; more wait.
pub const MAX_REQUESTS_IN_FLIGHT: usize = 4;

/// The outgoing requests of one instance: at most
/// [`MAX_REQUESTS_IN_FLIGHT`] sending at once (each may hold a body the
/// host reads whole to sign), and a count of every request handed to the
/// host whose answer's head has not come (or that was dropped).
///
/// The count is taken in `send_request` itself, not when the request's
/// task first runs: wasmtime-wasi-http spawns that task, so a request the
/// guest sent and never awaited may not have started when its call
/// returns, and an instance kept for the request's next call must not
/// carry it over unseen. Once the head is in, the connection's own task
/// (wasmtime-wasi-http's) carries the rest of both bodies, uncounted: it
/// lives as long as the guest holds the answer, within the same request
/// and grant.
#[derive(Clone)]
pub struct Requests {
    turns: Arc<tokio::sync::Semaphore>,
    open: Arc<AtomicUsize>,
}

/// One request counted in [`Requests`] until it is dropped.
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Requests {
    /// No request under way yet.
    pub fn new() -> Self {
        Requests {
            turns: Arc::new(tokio::sync::Semaphore::new(MAX_REQUESTS_IN_FLIGHT)),
            open: Arc::default(),
        }
    }

    /// Whether every request handed to the host has its answer's head
    /// or was dropped.
    pub fn none_under_way(&self) -> bool {
        self.open.load(Ordering::Acquire) == 0
    }

    fn open(&self) -> Open {
        self.open.fetch_add(1, Ordering::AcqRel);
        Open(self.open.clone())
    }
}

impl Default for Requests {
    fn default() -> Self {
        Self::new()
    }
}

type ResponseFuture = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), Error>> + Send>,
                ),
                Error,
            >,
        > + Send,
>;

impl WasiHttpHooks for Outbound {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> ResponseFuture {
        let open = self.requests.open();
        if let Err(reason) = self.policy.check(request.uri()) {
            // Scheme, authority and path only: queries may carry signatures.
            let uri = request.uri();
            let shown = format!(
                "{}://{}{}",
                uri.scheme_str().unwrap_or("?"),
                uri.authority().map_or("", |a| a.as_str()),
                uri.path()
            );
            tracing::warn!(backend = %self.backend, "refused outbound request to {shown}: {reason}");
            return Box::new(async move {
                let _open = open;
                // Take the body the guest is still writing before refusing:
                // clients (wstd among them) send the body and await the
                // answer together, and a body cut off would reach them as a
                // broken connection, hiding the refusal. The guest's
                // deadline bounds this; dropping the store aborts it.
                use http_body_util::BodyExt;
                let mut body = request.into_body();
                while let Some(Ok(_)) = body.frame().await {}
                Err(Error::HttpRequestDenied)
            });
        }
        drop(fut);
        let (policy, backend) = (self.policy.clone(), self.backend.clone());
        // Requests to the backend's cloud endpoints leave signed (or with
        // a token) by the host, and only those in the grant's scope.
        let aws = self.aws.clone().filter(|aws| aws.signs(request.uri()));
        let azure = self.azure.clone().filter(|a| a.signs(request.uri()));
        let gcp = self.gcp.clone().filter(|g| g.covers(request.uri()));
        let limit = self.max_body_bytes;
        let (turns, budgets) = (self.requests.turns.clone(), self.budgets.clone());
        let work = self.work.clone();
        Box::new(async move {
            let _open = open;
            // The instance's semaphore is never closed.
            let _turn = turns.acquire_owned().await.ok();
            let mut charged = Vec::new();
            let held = (&budgets, &mut charged);
            let mut starts = gcp::Authorized::Plain;
            // An Azure request carrying an Entra ID token: the token, and
            // the request again when it has no body (sent once more with a
            // fresh token should Azure answer 401).
            let mut bearer = None;
            let request = if let Some(aws) = aws {
                let (parts, body) = request.into_parts();
                let body = read_whole(body, limit, &backend, held).await?;
                let request = aws
                    .sign(http::Request::from_parts(parts, body), &work)
                    .await
                    .map_err(|reason| {
                        tracing::warn!(%backend, "cannot sign an AWS request: {reason}");
                        Error::InternalError(Some(reason))
                    })?;
                request.map(full)
            } else if let Some(azure) = &azure {
                use http_body::Body as _;
                let (mut parts, body) = request.into_parts();
                let length = body.size_hint().exact();
                if let Some(token) = authorize_azure(azure, &mut parts, length, &backend).await? {
                    let bodiless = matches!(
                        parts.method,
                        http::Method::GET | http::Method::HEAD | http::Method::DELETE
                    ) || length == Some(0);
                    bearer = Some((token, bodiless.then(|| copy_parts(&parts))));
                }
                http::Request::from_parts(parts, body)
            } else if let Some(gcp) = &gcp {
                let (mut parts, body) = request.into_parts();
                if gcp.needs_body(&parts.method, &parts.uri) {
                    let body = read_whole(body, limit, &backend, held).await?;
                    starts = authorize_gcp(gcp, &mut parts, Some(&body), &backend).await?;
                    http::Request::from_parts(parts, full(body))
                } else {
                    starts = authorize_gcp(gcp, &mut parts, None, &backend).await?;
                    http::Request::from_parts(parts, body)
                }
            } else {
                request
            };
            let (mut response, mut io) =
                super::pinned::send(request, options, &policy, &backend).await?;
            // Azure answers 401 to a token it no longer takes (Azurite:
            // 403 AuthenticationFailed; a missing role is another code).
            let token_refused = response.status() == http::StatusCode::UNAUTHORIZED
                || (response.status() == http::StatusCode::FORBIDDEN
                    && response
                        .headers()
                        .get("x-ms-error-code")
                        .is_some_and(|c| c == "AuthenticationFailed"));
            if token_refused && let (Some(azure), Some((token, again))) = (&azure, bearer) {
                // Revoked, or the clocks disagree: once more with a new one.
                azure.token_refused(&token).await;
                if let Some(mut parts) = again {
                    tracing::info!(%backend, "Azure refused the Entra ID token; minting another");
                    drop((response, io));
                    authorize_azure(azure, &mut parts, Some(0), &backend).await?;
                    let request = http::Request::from_parts(parts, full(bytes::Bytes::new()));
                    (response, io) =
                        super::pinned::send(request, options, &policy, &backend).await?;
                }
            }
            if starts == gcp::Authorized::StartsSession
                && let (Some(gcp), Some(location)) = (&gcp, response.headers().get("location"))
            {
                gcp.session_started(location.to_str().unwrap_or_default());
            }
            // The body went out with the request: its charge goes back.
            drop(charged);
            Ok((
                response.map(http_body_util::BodyExt::boxed_unsync),
                Box::new(io) as Box<dyn Future<Output = Result<(), Error>> + Send>,
            ))
        })
    }
}

/// A request outside its grant's scope: logged, and refused to the guest.
fn refused(backend: &str, cloud: &str, reason: String) -> Error {
    tracing::warn!(backend, "refused to authorize a {cloud} request: {reason}");
    Error::HttpRequestDenied
}

/// Authorize an Azure request, or refuse it (out of scope) or fail it (no
/// Entra ID token to be had: what to fix is logged and handed to the guest,
/// which answers 503). The Entra ID token it carries, if any.
async fn authorize_azure(
    azure: &AzureSigner,
    parts: &mut http::request::Parts,
    length: Option<u64>,
    backend: &str,
) -> Result<Option<String>, Error> {
    match azure.authorize(parts, length).await {
        Ok(token) => Ok(token),
        Err(azure::Refusal::OutOfScope(reason)) => Err(refused(backend, "Azure", reason)),
        Err(azure::Refusal::NoToken(reason)) => {
            tracing::warn!(backend, "{reason}");
            Err(Error::InternalError(Some(reason)))
        }
    }
}

/// The head of a bodiless request, to send it again.
fn copy_parts(parts: &http::request::Parts) -> http::request::Parts {
    let mut copy = http::Request::new(()).into_parts().0;
    copy.method = parts.method.clone();
    copy.uri = parts.uri.clone();
    copy.version = parts.version;
    copy.headers = parts.headers.clone();
    copy
}

/// Add the Google token to `parts`, or refuse it (out of scope) or fail it
/// (no token to be had: the reason is logged and handed to the guest).
async fn authorize_gcp(
    gcp: &GcpAuth,
    parts: &mut http::request::Parts,
    body: Option<&[u8]>,
    backend: &str,
) -> Result<gcp::Authorized, Error> {
    match gcp.authorize(parts, body).await {
        Ok(authorized) => Ok(authorized),
        Err(gcp::Refusal::OutOfScope(reason)) => Err(refused(backend, "Google Cloud", reason)),
        Err(gcp::Refusal::NoToken(reason)) => Err(Error::InternalError(Some(reason))),
    }
}

fn full(bytes: bytes::Bytes) -> WasiBody {
    use http_body_util::BodyExt;
    http_body_util::Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// The whole of `body` (SigV4 signs the payload's hash; a GCS upload names
/// its object in it), at most `limit` bytes, each frame charged to the
/// memory budgets before it is kept: a guest cannot make the host hold
/// more than they allow.
async fn read_whole(
    mut body: WasiBody,
    limit: usize,
    backend: &str,
    (budgets, charged): (
        &[super::limits::Budget; 2],
        &mut Vec<tokio::sync::OwnedSemaphorePermit>,
    ),
) -> Result<bytes::Bytes, Error> {
    use http_body_util::BodyExt;
    let mut whole = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| Error::HttpRequestBodySize(Some(limit as u64)))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if whole.len() + data.len() > limit {
            return Err(Error::HttpRequestBodySize(Some(limit as u64)));
        }
        let pages = (whole.len() + data.len()).div_ceil(super::limits::WASM_PAGE as usize)
            - whole.len().div_ceil(super::limits::WASM_PAGE as usize);
        for budget in budgets {
            match budget.take_owned(pages as u64) {
                Some(permit) => charged.extend(permit),
                None => {
                    tracing::warn!(backend, "a body to sign is past the guest memory budget");
                    return Err(Error::InternalError(Some(
                        "the request body is past the guest memory budget".into(),
                    )));
                }
            }
        }
        whole.extend_from_slice(&data);
    }
    Ok(whole.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_counts_from_its_hand_over_until_dropped() {
        let requests = Requests::new();
        assert!(requests.none_under_way());
        // Handed over, its task not yet started (it never takes a turn).
        let first = requests.open();
        let second = requests.clone().open();
        assert!(!requests.none_under_way());
        drop(first);
        assert!(!requests.none_under_way());
        drop(second);
        assert!(requests.none_under_way());
    }
}
