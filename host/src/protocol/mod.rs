//! Terraform's HTTP backend protocol and wasmstate's workspace API, over any
//! [`Storage`]. This layer knows HTTP and nothing of wasmtime.
//!
//! Routes:
//! - `GET|POST|PUT|DELETE|LOCK|UNLOCK /states/{backend}/{workspace}`
//! - `GET /states/{backend}/{workspace}/versions[/{id}]`
//! - `GET /workspaces/{backend}`, `PUT|DELETE /workspaces/{backend}/{workspace}`
//! - `GET /audit/{backend}` (admins): the audit trail, filtered
//! - `GET /healthz`, `GET /metrics` (Prometheus)

mod audit;
mod buffers;
mod caller;
mod conditional;
mod error;
mod gate;
mod guard;
mod judge;
mod locks;
pub(crate) use locks::{force_unlock, lock as lock_workspace, unlock as unlock_workspace};
mod origin;
mod record;
mod reseal;
mod state;
pub mod versions;
mod workspaces;

pub use audit::{AuditAnswer, WRITER_WINDOW_MS};
pub use buffers::{BodyBudget, Held};
pub use caller::Caller;
pub use error::ApiError;
pub use gate::{Gate, WorkspaceGates};
pub(crate) use guard::write_unless_stale;
pub use origin::OriginPolicy;
pub use record::Answered;
pub(crate) use state::shared_outputs;
pub use workspaces::DEFAULT_WORKSPACE;

use crate::audit::Operation;
use crate::auth::{Authenticator, Role};
use crate::backend::{Storage, StorageError};
use crate::listen::ClientAddr;
use crate::metrics::Metrics;
use crate::names::check_name;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What the protocol layer serves: named backends and request limits.
pub struct App<S> {
    /// Backends by name.
    pub backends: BTreeMap<String, S>,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Time a client has to send a request body.
    pub body_timeout: Duration,
    /// Where requests and locks are counted.
    pub metrics: Arc<Metrics>,
    /// Who may do what; with no users or tokens, everyone may do anything.
    pub auth: Arc<Authenticator>,
    /// Per-backend switches a reload changes: which accept older or
    /// unrelated states (`state push -force`), which let old locks be
    /// taken over.
    pub switches: Arc<Switches>,
    /// Where every change is recorded.
    pub audit: Arc<crate::audit::AuditLog>,
    /// One change at a time per workspace on this host.
    pub gates: WorkspaceGates,
    /// Changes under way, each run to its end even when its client goes
    /// away; the server waits for them when it stops.
    pub changes: tokio_util::task::TaskTracker,
    /// Which hosts and origins browsers may reach the server through.
    pub origins: OriginPolicy,
    /// Set when the server is shutting down: no change starts any more.
    pub draining: Arc<AtomicBool>,
    /// The bodies the server holds at once (states arriving and answered).
    pub bodies: BodyBudget,
}

/// Per-backend switches as the config last read says: shared with the
/// reload, which sets them anew.
#[derive(Debug, Default)]
pub struct Switches(std::sync::RwLock<SwitchValues>);

/// What [`Switches`] holds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SwitchValues {
    /// Backends whose stale-write guard is off (`allow_force_push`).
    pub force_push: BTreeSet<String>,
    /// Backends whose locks may be taken over once this old (`lock_ttl`).
    pub lock_ttl: BTreeMap<String, Duration>,
}

impl Switches {
    /// Switches set to `values`.
    pub fn new(values: SwitchValues) -> Self {
        Switches(std::sync::RwLock::new(values))
    }

    fn values(&self) -> std::sync::RwLockReadGuard<'_, SwitchValues> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `backend` accepts older or unrelated states.
    pub fn allows_force_push(&self, backend: &str) -> bool {
        self.values().force_push.contains(backend)
    }

    /// After how long a lock on `backend` may be taken over; `None`: never.
    pub fn lock_ttl(&self, backend: &str) -> Option<Duration> {
        self.values().lock_ttl.get(backend).copied()
    }

    /// From now on, `values`.
    pub fn set(&self, values: SwitchValues) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = values;
    }
}

/// A validated request target: a known backend and a well-formed workspace.
pub struct Target<'a, S> {
    /// Backend name.
    pub backend: &'a str,
    /// Workspace name, checked by [`check_name`].
    pub workspace: &'a str,
    /// The backend's storage.
    pub storage: &'a S,
}

impl<S> Target<'_, S> {
    /// Map a storage failure for this target.
    pub fn error(&self, error: StorageError) -> ApiError {
        ApiError::from_storage(self.backend, error)
    }
}

impl<S> App<S> {
    /// Who sent the request (401 when authentication is on and the
    /// credentials are missing or wrong, 429 while its address or user name
    /// is throttled). Nothing of the body has been read yet.
    pub async fn identify(
        &self,
        headers: &HeaderMap,
        client: Option<Extension<ClientAddr>>,
    ) -> Result<Caller, ApiError> {
        let client = client.map_or(std::net::IpAddr::from([0, 0, 0, 0]), |c| c.0.0.ip());
        Caller::identify(&self.auth, &self.metrics, headers, client).await
    }

    /// Read a request body: at most `max_body_bytes` (413), within
    /// `body_timeout` (408), charged to the server's body budget as it
    /// arrives (503 past it); the charge is held as long as the [`Held`].
    pub async fn read_body(&self, body: Body) -> Result<(Bytes, Held), ApiError> {
        let mut held = Held::default();
        let bytes = self
            .read_body_charged(body, self.max_body_bytes, Some(&mut held))
            .await?;
        Ok((bytes, held))
    }

    /// Read a request body of at most `max` bytes (413), within
    /// `body_timeout` (408): for small bodies (forms), not charged.
    pub async fn read_body_up_to(&self, body: Body, max: usize) -> Result<Bytes, ApiError> {
        self.read_body_charged(body, max, None).await
    }

    async fn read_body_charged(
        &self,
        body: Body,
        max: usize,
        held: Option<&mut Held>,
    ) -> Result<Bytes, ApiError> {
        let limited = http_body_util::Limited::new(body, max);
        let charge = held.map(|held| (&self.bodies, held));
        match tokio::time::timeout(self.body_timeout, collect(limited, max, charge)).await {
            Err(_) => Err(ApiError::Message(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the body did not arrive within {} s (body_timeout_secs); nothing was written",
                    self.body_timeout.as_secs()
                ),
            )),
            Ok(Ok(collected)) => Ok(collected),
            Ok(Err(Collect::Refused(e))) => Err(e),
            Ok(Err(Collect::Body(e))) if e.is::<http_body_util::LengthLimitError>() => {
                Err(ApiError::Message(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "the body is larger than this server accepts (raise max_body_mib in its config); nothing was written"
                        .into(),
                ))
            }
            Ok(Err(Collect::Body(e))) => Err(ApiError::bad_request(format!(
                "could not read the request body: {e}"
            ))),
        }
    }

    /// 503 once the server is shutting down: a change either completes or
    /// never starts.
    pub fn refuse_while_draining(&self) -> Result<(), ApiError> {
        if self.draining.load(Ordering::Acquire) {
            return Err(ApiError::RetryAfter(
                StatusCode::SERVICE_UNAVAILABLE,
                1,
                "the server is shutting down; retry (on another replica, or when it is back)"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// Why a body was not read whole.
enum Collect {
    /// The body budget had no room for it.
    Refused(ApiError),
    /// Reading it failed (too big, cut off).
    Body(axum::BoxError),
}

/// Gather a body into one buffer, sized up front from its length
/// (`Content-Length`, which Terraform sends) so a big state is held once:
/// collecting frames and joining them afterwards would hold it twice.
/// Each frame is charged to `charge`'s budget before it is kept.
async fn collect(
    mut body: http_body_util::Limited<Body>,
    max: usize,
    mut charge: Option<(&BodyBudget, &mut Held)>,
) -> Result<Bytes, Collect> {
    use http_body_util::BodyExt;
    let hint = usize::try_from(http_body::Body::size_hint(&body).lower()).unwrap_or(max);
    // What the buffer takes is charged before it is taken: its capacity
    // up front (from Content-Length), then as it grows.
    let mut charge_capacity = |capacity: usize| match &mut charge {
        Some((budget, held)) => budget.hold_total(held, capacity).map_err(Collect::Refused),
        None => Ok(()),
    };
    charge_capacity(hint.min(max))?;
    let mut buffer = bytes::BytesMut::with_capacity(hint.min(max));
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.map_err(Collect::Body)?.into_data() {
            charge_capacity(buffer.len() + data.len())?;
            buffer.extend_from_slice(&data);
            charge_capacity(buffer.capacity())?;
        }
    }
    Ok(buffer.freeze())
}

impl<S: Storage> App<S> {
    /// Run `change` on `backend`/`workspace` alone on this host (its gate
    /// held) and to its end, whether or not the caller still waits: a
    /// client that hangs up mid-change must not leave half of it done (a
    /// lock taken and never released, a write detached from its gate).
    /// Callers refuse new changes while draining before they read a body;
    /// one accepted before that completes, as the server promises.
    pub async fn change<T, F, Fut>(
        self: &Arc<Self>,
        backend: &str,
        workspace: &str,
        change: F,
    ) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Self>, String, String) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, ApiError>> + Send + 'static,
    {
        let app = self.clone();
        let (backend, workspace) = (backend.to_string(), workspace.to_string());
        let task = self.changes.spawn(async move {
            let _gate = app.gates.enter(&backend, &workspace).await;
            change(app.clone(), backend, workspace).await
        });
        task.await.map_err(|e| {
            ApiError::Message(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the change stopped unexpectedly: {e}"),
            )
        })?
    }

    fn storage(&self, backend: &str) -> Result<&S, ApiError> {
        self.backends
            .get(backend)
            .ok_or_else(|| ApiError::not_found(format!("no backend named {backend:?}")))
    }

    /// The target `backend`/`workspace`: 404 for an unknown backend, 400
    /// for a malformed workspace name.
    pub(crate) fn target<'a>(
        &'a self,
        backend: &'a str,
        workspace: &'a str,
    ) -> Result<Target<'a, S>, ApiError> {
        let storage = self.storage(backend)?;
        check_name("workspace", workspace).map_err(ApiError::bad_request)?;
        Ok(Target {
            backend,
            workspace,
            storage,
        })
    }
}

/// The HTTP application, ready to serve (tests call it in-process too).
pub fn router<S: Storage>(app: App<S>) -> Router {
    router_with(Arc::new(app), Router::new())
}

/// The HTTP application with `more` routes served beside the API (the
/// console), behind the same origin checks and request log.
pub fn router_with<S: Storage>(app: Arc<App<S>>, more: Router) -> Router {
    let metrics = app.metrics.clone();
    let origins = app.origins.clone();
    Router::new()
        .route("/states/{backend}/{workspace}", any(state_route::<S>))
        .route(
            "/states/{backend}/{workspace}/versions",
            get(versions_route::<S>),
        )
        .route(
            "/states/{backend}/{workspace}/versions/{id}",
            get(version_route::<S>),
        )
        .route(
            "/states/{backend}/{workspace}/reseal",
            post(reseal_route::<S>),
        )
        .route("/workspaces/{backend}", get(list_route::<S>))
        .route("/workspaces/{backend}/{workspace}", any(workspace_route::<S>))
        .route("/audit/{backend}", get(audit::route::<S>))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics_route::<S>))
        .fallback(|| async {
            ApiError::not_found(
                "no such route; use /states/{backend}/{workspace}, /workspaces/{backend}, /ui or /healthz",
            )
        })
        .with_state(app)
        .merge(more)
        .layer(middleware::from_fn_with_state(origins, origin::guard))
        .layer(middleware::from_fn_with_state(metrics, log_request))
}

#[allow(clippy::too_many_arguments)]
async fn state_route<S: Storage>(
    State(app): State<Arc<App<S>>>,
    Path((backend, workspace)): Path<(String, String)>,
    client: Option<Extension<ClientAddr>>,
    method: Method,
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let caller = app.identify(&headers, client).await?;
    let target = app.target(&backend, &workspace)?;
    let Query(query) =
        query.map_err(|e| ApiError::bad_request(format!("bad query string: {e}")))?;
    state::handle(&app, target, &caller, method, query, headers, body).await
}

async fn versions_route<S: Storage>(
    State(app): State<Arc<App<S>>>,
    Path((backend, workspace)): Path<(String, String)>,
    client: Option<Extension<ClientAddr>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let caller = app.identify(&headers, client).await?;
    let target = app.target(&backend, &workspace)?;
    caller.may(&backend, Some(&workspace), Role::Read)?;
    versions::list(&app, target).await
}

async fn version_route<S: Storage>(
    State(app): State<Arc<App<S>>>,
    Path((backend, workspace, id)): Path<(String, String, String)>,
    client: Option<Extension<ClientAddr>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let caller = app.identify(&headers, client).await?;
    let target = app.target(&backend, &workspace)?;
    caller.may(&backend, Some(&workspace), Role::Read)?;
    versions::read(&app.bodies, target, &id).await
}

async fn reseal_route<S: Storage>(
    State(app): State<Arc<App<S>>>,
    Path((backend, workspace)): Path<(String, String)>,
    client: Option<Extension<ClientAddr>>,
    query: Result<Query<reseal::ResealQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let caller = app.identify(&headers, client).await?;
    let Query(query) =
        query.map_err(|e| ApiError::bad_request(format!("bad query string: {e}")))?;
    reseal::reseal(&app, caller, (&backend, &workspace), query).await
}

async fn list_route<S: Storage>(
    State(app): State<Arc<App<S>>>,
    Path(backend): Path<String>,
    client: Option<Extension<ClientAddr>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let caller = app.identify(&headers, client).await?;
    let storage = app.storage(&backend)?;
    caller.may(&backend, None, Role::Outputs)?;
    workspaces::list(&backend, storage, &caller).await
}

/// The metrics name every backend and show each one's traffic: only a
/// caller who may read every workspace of every backend (`*:*:read`, a
/// scraper's token, or more) reads them; anyone on a server without users.
async fn metrics_route<S: Storage>(
    State(app): State<Arc<App<S>>>,
    client: Option<Extension<ClientAddr>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let caller = app.identify(&headers, client).await?;
    // A grant's workspace pattern matches the name `*` only when it is `*`
    // itself (workspace names never are): a grant on every workspace.
    let everywhere = app
        .backends
        .keys()
        .all(|backend| caller.allows(backend, Some("*"), Role::Read));
    if !everywhere {
        let name = caller.identity().map_or("anyone", |i| i.name.as_str());
        return Err(ApiError::Message(
            StatusCode::FORBIDDEN,
            format!(
                "{name} may not read /metrics: they cover every backend; use a token with a grant of \"*:*:read\" (or more) for the scraper"
            ),
        ));
    }
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.metrics.render(),
    )
        .into_response())
}

async fn workspace_route<S: Storage>(
    State(app): State<Arc<App<S>>>,
    Path((backend, workspace)): Path<(String, String)>,
    client: Option<Extension<ClientAddr>>,
    method: Method,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let caller = app.identify(&headers, client).await?;
    // 404 for an unknown backend, 400 for a bad name, before anything else.
    app.target(&backend, &workspace)?;
    let (operation, role) = match method {
        Method::PUT => (Operation::WorkspaceCreate, Role::Write),
        Method::DELETE => (Operation::WorkspaceDelete, Role::Admin),
        _ => {
            return Ok((
                StatusCode::METHOD_NOT_ALLOWED,
                [(axum::http::header::ALLOW, "PUT, DELETE")],
                "use PUT to create or DELETE to delete a workspace\n",
            )
                .into_response());
        }
    };
    let at = (backend.as_str(), workspace.as_str());
    app.permit(&caller, at, role, operation).await?;
    app.refuse_while_draining()?;
    app.change(
        &backend,
        &workspace,
        move |app, backend, workspace| async move {
            let target = app.target(&backend, &workspace)?;
            let answer = match operation {
                Operation::WorkspaceCreate => workspaces::create(target).await,
                _ => workspaces::delete(target).await,
            };
            let at = (backend.as_str(), workspace.as_str());
            app.record(&caller, at, operation, Default::default(), &answer)
                .await;
            answer
        },
    )
    .await
}

/// Where a request landed, when its path does not say (the TFE door's
/// ids): a door sets it on its response, and the request log and metrics
/// name that backend and workspace.
#[derive(Debug, Clone)]
pub struct LoggedAt {
    /// The backend.
    pub backend: String,
    /// The workspace, or `-` for the backend itself.
    pub workspace: String,
}

/// One log line per request (method, backend, workspace, status,
/// duration), and the same in the request metrics.
async fn log_request(
    State(metrics): State<Arc<Metrics>>,
    request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let _in_flight = metrics.request_started();
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    let mut segments = path.trim_start_matches('/').split('/');
    // The TFE door's paths name ids and API words, not backends.
    let own_path = !matches!(segments.next(), Some("api" | "_tfe"));
    let (backend, workspace) = match response.extensions().get::<LoggedAt>() {
        Some(at) => (at.backend.as_str(), at.workspace.as_str()),
        None if own_path => (
            segments.next().unwrap_or("-"),
            segments.next().unwrap_or("-"),
        ),
        None => ("-", "-"),
    };
    let elapsed = started.elapsed();
    let status = response.status().as_u16();
    tracing::info!(
        method = %method,
        backend,
        workspace,
        status,
        ms = format_args!("{:.1}", elapsed.as_secs_f64() * 1000.0),
        "request"
    );
    metrics.request(backend, method.as_str(), status, elapsed);
    response
}
