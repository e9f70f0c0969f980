//! Terraform's HTTP backend protocol and wasmstate's workspace API, over any
//! [`Storage`]. This layer knows HTTP and nothing of wasmtime.
//!
//! Routes:
//! - `GET|POST|PUT|DELETE|LOCK|UNLOCK /states/{backend}/{workspace}`
//! - `GET /states/{backend}/{workspace}/versions[/{id}]`
//! - `GET /workspaces/{backend}`, `PUT|DELETE /workspaces/{backend}/{workspace}`
//! - `GET /healthz`, `GET /metrics` (Prometheus)

mod error;
mod state;
mod versions;
mod workspaces;

pub use error::ApiError;
pub use workspaces::DEFAULT_WORKSPACE;

use crate::auth::{AuthError, Authenticator, Identity, Role};
use crate::backend::{Storage, StorageError};
use crate::metrics::Metrics;
use crate::names::check_name;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

/// What the protocol layer serves: named backends and request limits.
pub struct App<S> {
    /// Backends by name.
    pub backends: BTreeMap<String, S>,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Where requests and locks are counted.
    pub metrics: Arc<Metrics>,
    /// Who may do what; with no users or tokens, everyone may do anything.
    pub auth: Arc<Authenticator>,
    /// Backends that accept older or unrelated states (`state push -force`).
    pub allow_force_push: BTreeSet<String>,
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
    /// Who sent the request: `None` when authentication is off, 401 when
    /// it is on and the credentials are missing or wrong.
    pub fn identify(&self, headers: &HeaderMap) -> Result<Option<Identity>, ApiError> {
        if !self.auth.enabled() {
            return Ok(None);
        }
        let header = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        self.auth.authenticate(header).map(Some).map_err(|e| {
            ApiError::Unauthorized(match e {
                AuthError::Missing => "credentials required: HTTP Basic (Terraform's username/password) or a bearer token".into(),
                AuthError::Invalid => "wrong user name, password or token".into(),
            })
        })
    }

    /// Allow the request only if its credentials may act as `role` on
    /// `backend` (and `workspace`): 401 without valid credentials, 403 when
    /// the caller lacks the grant.
    pub fn authorize(
        &self,
        headers: &HeaderMap,
        backend: &str,
        workspace: Option<&str>,
        role: Role,
    ) -> Result<(), ApiError> {
        let Some(identity) = self.identify(headers)? else {
            return Ok(());
        };
        if identity.may(backend, workspace, role) {
            return Ok(());
        }
        let on = match workspace {
            Some(ws) => format!("{backend}/{ws}"),
            None => backend.to_string(),
        };
        Err(ApiError::Message(
            StatusCode::FORBIDDEN,
            format!(
                "{} may not {} {on} (needs the {role:?} role)",
                identity.name,
                role_verb(role)
            )
            .to_lowercase(),
        ))
    }
}

fn role_verb(role: Role) -> &'static str {
    match role {
        Role::Read => "read",
        Role::Write => "write to",
        Role::Admin => "administer",
    }
}

impl<S: Storage> App<S> {
    fn storage(&self, backend: &str) -> Result<&S, ApiError> {
        self.backends.get(backend).ok_or_else(|| {
            let known: Vec<&str> = self.backends.keys().map(String::as_str).collect();
            ApiError::not_found(format!(
                "no backend named {backend:?} (configured: {})",
                known.join(", ")
            ))
        })
    }

    fn target<'a>(
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
    let limit = app.max_body_bytes;
    let metrics = app.metrics.clone();
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
        .route("/workspaces/{backend}", get(list_route::<S>))
        .route("/workspaces/{backend}/{workspace}", any(workspace_route::<S>))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics_route::<S>))
        .fallback(|| async {
            ApiError::not_found(
                "no such route; use /states/{backend}/{workspace}, /workspaces/{backend} or /healthz",
            )
        })
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(metrics, log_request))
        .with_state(Arc::new(app))
}

async fn state_route<S: Storage>(
    State(app): State<Arc<App<S>>>,
    Path((backend, workspace)): Path<(String, String)>,
    method: Method,
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let target = app.target(&backend, &workspace)?;
    let Query(query) =
        query.map_err(|e| ApiError::bad_request(format!("bad query string: {e}")))?;
    state::handle(&app, target, method, query, headers, body).await
}

async fn versions_route<S: Storage>(
    State(app): State<Arc<App<S>>>,
    Path((backend, workspace)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let target = app.target(&backend, &workspace)?;
    app.authorize(&headers, &backend, Some(&workspace), Role::Read)?;
    versions::list(target).await
}

async fn version_route<S: Storage>(
    State(app): State<Arc<App<S>>>,
    Path((backend, workspace, id)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let target = app.target(&backend, &workspace)?;
    app.authorize(&headers, &backend, Some(&workspace), Role::Read)?;
    versions::read(target, &id).await
}

async fn list_route<S: Storage>(
    State(app): State<Arc<App<S>>>,
    Path(backend): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let storage = app.storage(&backend)?;
    app.authorize(&headers, &backend, None, Role::Read)?;
    workspaces::list(&backend, storage).await
}

/// Any signed-in caller may read the metrics (they name backends, not data).
async fn metrics_route<S: Storage>(
    State(app): State<Arc<App<S>>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    app.identify(&headers)?;
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
    method: Method,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let target = app.target(&backend, &workspace)?;
    match method {
        Method::PUT => {
            app.authorize(&headers, &backend, Some(&workspace), Role::Write)?;
            workspaces::create(target).await
        }
        Method::DELETE => {
            app.authorize(&headers, &backend, Some(&workspace), Role::Admin)?;
            workspaces::delete(target).await
        }
        _ => Ok((
            StatusCode::METHOD_NOT_ALLOWED,
            [(axum::http::header::ALLOW, "PUT, DELETE")],
            "use PUT to create or DELETE to delete a workspace\n",
        )
            .into_response()),
    }
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
    let mut segments = path.trim_start_matches('/').split('/').skip(1);
    let backend = segments.next().unwrap_or("-");
    let workspace = segments.next().unwrap_or("-");
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
