//! The HCP Terraform / Terraform Enterprise API v2 subset behind
//! Terraform's `cloud {}` block and `backend "remote"`, with local
//! execution: discovery, workspaces, locks, state versions and outputs,
//! served on the same listener as the http door.
//!
//! An organization is a backend; its workspaces are the backend's
//! workspaces. Every change goes through the protocol layer's own steps,
//! so a workspace is the same whichever door it is reached by: the
//! workspace gate ([`App::change`]), the stale-write guard
//! ([`crate::protocol::write_unless_stale`]), the lock and unlock steps,
//! the audit record and the grant check. A lock taken at one door stops
//! the other.
//!
//! A caller who may not read an organization or workspace is told it does
//! not exist (404), exactly as for one that does not: a token for another
//! backend learns nothing. Routes not served answer a JSON:API 404 (never
//! a 5xx: terraform retries those for minutes). Every answer under
//! `/api/v2` carries `TFP-API-Version`, which the cloud block requires.
//!
//! A caller with only the `outputs` role on a workspace sees it exist, its
//! current state version, its outputs that are not sensitive, and a
//! download of its state without resources
//! ([`crate::statefile::outputs_only`]): what `terraform_remote_state`
//! and the `tfe_outputs` data source need. Every other use needs `read`
//! or more.

mod discovery;
mod ids;
mod jsonapi;
mod locks;
mod meta;
mod outputs;
mod states;
mod uploads;
mod workspaces;

use crate::audit::Operation;
use crate::auth::Role;
use crate::backend::Storage;
use crate::listen::ClientAddr;
use crate::protocol::{App, Caller, LoggedAt};
use axum::Router;
use axum::extract::Extension;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use axum::routing::{any, get, post, put};
use jsonapi::TfeError;
use std::path::PathBuf;
use std::sync::Arc;

/// The API version the cloud block requires at least (2.5); sent on every
/// answer under `/api/v2`.
pub const API_VERSION: &str = "2.5";

/// Where `/.well-known/terraform.json` points `tfe.v2`, `tfe.v2.1`,
/// `tfe.v2.2` and `state.v2`.
pub const API_PATH: &str = "/api/v2/";

/// Where upload capabilities are served (no bearer: terraform sends none).
/// The secret travels in the query (`?capability=`), which the request log
/// leaves out, never in the path, which it prints.
const UPLOAD_PATH: &str = "/_tfe/upload";

/// How the TFE door is set up.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Where workspace metadata (tags, terraform-version) is kept for a
    /// storage that keeps none, and found from before contract 0.3.0;
    /// `None`: in memory only.
    pub data_dir: Option<PathBuf>,
    /// Whether the server speaks HTTPS (the scheme of upload URLs).
    pub secure: bool,
}

/// The TFE door's state: the protocol layer's [`App`], what it adds.
pub struct Tfe<S> {
    app: Arc<App<S>>,
    meta: Arc<meta::MetaStore>,
    uploads: uploads::Uploads,
    secure: bool,
}

/// Forget a deleted workspace's TFE metadata: `(backend, workspace)`.
type Forget = Arc<
    dyn Fn(String, String) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        + Send
        + Sync,
>;

/// The TFE door: its routes, and what it must learn of the http door.
pub struct Door {
    /// The routes, to merge beside the http door's.
    pub routes: Router,
    forget: Forget,
}

impl Door {
    /// `router` (the http door, with this door's routes merged in), told
    /// to forget a workspace's TFE metadata when the http door deletes the
    /// workspace, or the state that is all there is of it (`s3-lockfile`):
    /// created again, it must not come back with the old tags (which cloud
    /// blocks select by). The http door is the lower layer and knows
    /// nothing of this one, so this door watches its answers.
    pub fn around(&self, router: Router) -> Router {
        router.layer(axum::middleware::from_fn_with_state(
            self.forget.clone(),
            forget_deleted,
        ))
    }
}

/// After a 2xx `DELETE /workspaces/{backend}/{workspace}` or `DELETE
/// /states/{backend}/{workspace}` (the http door), forget the workspace's
/// metadata if the workspace is gone.
async fn forget_deleted(
    axum::extract::State(forget): axum::extract::State<Forget>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let deleted = (request.method() == axum::http::Method::DELETE)
        .then(|| {
            let mut parts = request.uri().path().trim_start_matches('/').split('/');
            match (parts.next(), parts.next(), parts.next(), parts.next()) {
                // Decoded as the route decodes them (`n%65t` is `net`).
                (Some("workspaces" | "states"), Some(backend), Some(workspace), None) => {
                    let decode = |part: &str| {
                        percent_encoding::percent_decode_str(part)
                            .decode_utf8()
                            .ok()
                            .map(|p| p.into_owned())
                    };
                    decode(backend).zip(decode(workspace))
                }
                _ => None,
            }
        })
        .flatten();
    let response = next.run(request).await;
    if let Some((backend, workspace)) = deleted
        && response.status().is_success()
    {
        forget(backend, workspace).await;
    }
    response
}

/// The TFE door, to merge beside the http door ([`Door::routes`]) and
/// wrap around it ([`Door::around`]).
pub fn routes<S: Storage>(app: Arc<App<S>>, options: Options) -> Door {
    let meta = Arc::new(meta::MetaStore::open(options.data_dir));
    for (backend, storage) in &app.backends {
        meta.check(backend, storage);
    }
    let tfe = Arc::new(Tfe {
        app,
        meta,
        uploads: uploads::Uploads::default(),
        secure: options.secure,
    });
    let forget: Forget = {
        let tfe = tfe.clone();
        Arc::new(move |backend, workspace| {
            let tfe = tfe.clone();
            Box::pin(async move {
                if let Some(storage) = tfe.app.backends.get(&backend) {
                    tfe.meta.forget_if_gone(storage, &backend, &workspace).await;
                }
            })
        })
    };
    let org = "/api/v2/organizations/{org}";
    let ws = "/api/v2/workspaces/{id}";
    let api = Router::new()
        .route("/api/v2/ping", get(discovery::ping))
        .route("/api/v2/account/details", get(discovery::account::<S>))
        .route(
            &format!("{org}/entitlement-set"),
            get(discovery::entitlements::<S>),
        )
        .route(&format!("{org}/projects"), get(discovery::projects::<S>))
        .route(
            &format!("{org}/workspaces"),
            get(workspaces::list::<S>).post(workspaces::create::<S>),
        )
        .route(
            &format!("{org}/workspaces/{{name}}"),
            get(workspaces::read_by_name::<S>)
                .patch(workspaces::update_by_name::<S>)
                .delete(workspaces::delete_by_name::<S>),
        )
        .route(
            &format!("{org}/workspaces/{{name}}/actions/safe-delete"),
            post(workspaces::safe_delete_by_name::<S>),
        )
        .route(
            ws,
            get(workspaces::read_by_id::<S>)
                .patch(workspaces::update_by_id::<S>)
                .delete(workspaces::delete_by_id::<S>),
        )
        .route(
            &format!("{ws}/actions/safe-delete"),
            post(workspaces::safe_delete_by_id::<S>),
        )
        .route(
            &format!("{ws}/relationships/tags"),
            post(workspaces::add_tags::<S>).delete(workspaces::remove_tags::<S>),
        )
        .route(&format!("{ws}/actions/lock"), post(locks::lock::<S>))
        .route(&format!("{ws}/actions/unlock"), post(locks::unlock::<S>))
        .route(
            &format!("{ws}/actions/force-unlock"),
            post(locks::force_unlock::<S>),
        )
        .route(
            &format!("{ws}/current-state-version"),
            get(states::current::<S>),
        )
        .route(&format!("{ws}/state-versions"), post(states::create::<S>))
        .route(
            &format!("{ws}/current-state-version-outputs"),
            get(outputs::list::<S>),
        )
        .route("/api/v2/state-versions/{id}", get(states::read::<S>))
        .route(
            "/api/v2/state-versions/{id}/download",
            get(states::download::<S>),
        )
        .route(
            "/api/v2/state-version-outputs/{id}",
            get(outputs::read::<S>),
        )
        .route("/api/v2", any(unknown))
        .route("/api/v2/{*rest}", any(unknown))
        // A served path with a method it does not serve (`GET
        // workspaces/{id}/state-versions`): 404 as well, not 405.
        .method_not_allowed_fallback(unknown)
        .layer(axum::middleware::from_fn(require_jsonapi))
        .layer(axum::middleware::map_response(api_version))
        .layer(axum::middleware::from_fn_with_state(
            tfe.clone(),
            attribute::<S>,
        ))
        .with_state(tfe.clone());
    let routes = Router::new()
        .route("/.well-known/terraform.json", get(discovery::services))
        .route(UPLOAD_PATH, put(states::upload::<S>))
        .method_not_allowed_fallback(unknown)
        .with_state(tfe)
        .merge(api);
    Door { routes, forget }
}

/// Name the backend and workspace a request's path names through its ids
/// on its answer ([`LoggedAt`]), for the request log and metrics; only a
/// backend that exists (a forged id must not mint metric labels).
async fn attribute<S: Storage>(
    axum::extract::State(tfe): axum::extract::State<Arc<Tfe<S>>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let at = ids::at_of_path(request.uri().path())
        .filter(|(backend, _)| tfe.app.backends.contains_key(backend));
    let mut response = next.run(request).await;
    if let Some((backend, workspace)) = at {
        response
            .extensions_mut()
            .insert(LoggedAt { backend, workspace });
    }
    response
}

/// Every answer under `/api/v2` names the API version (a 401 without it
/// reads as "Unsupported Terraform Enterprise version" to terraform).
async fn api_version(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert("tfp-api-version", HeaderValue::from_static(API_VERSION));
    response
}

/// Every request under `/api/v2` but a GET (or HEAD) must say it sends
/// JSON:API, as go-tfe always does: a browser cannot send that content
/// type without a CORS preflight, so no page can make a bodyless "simple"
/// POST (lock, force-unlock, safe-delete) land here. 415 otherwise. The
/// upload PUT is outside `/api/v2`: its capability is its guard.
async fn require_jsonapi(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    use axum::response::IntoResponse as _;
    let method = request.method();
    if method == axum::http::Method::GET || method == axum::http::Method::HEAD {
        return next.run(request).await;
    }
    let jsonapi = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(jsonapi::MEDIA_TYPE));
    if jsonapi {
        return next.run(request).await;
    }
    TfeError::new(
        axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "send this request with Content-Type: application/vnd.api+json (as terraform does); nothing was changed",
    )
    .into_response()
}

/// Anything not served: 404, so terraform stops instead of retrying.
async fn unknown() -> TfeError {
    TfeError::not_found(
        "this server does not serve that part of the TFE API (wasmstate serves workspaces, locks, state versions and outputs, with local execution)",
    )
}

/// The client's address, when the listener knows it.
type Client = Option<Extension<ClientAddr>>;

impl<S: Storage> Tfe<S> {
    /// Who sent the request: 401 without valid credentials.
    async fn caller(&self, headers: &HeaderMap, client: Client) -> Result<Caller, TfeError> {
        Ok(self.app.identify(headers, client).await?)
    }

    /// The backend an organization names, when the caller may see it;
    /// otherwise the same 404 as for one that does not exist.
    fn organization(&self, caller: &Caller, org: &str) -> Result<&S, TfeError> {
        match self.app.backends.get(org) {
            Some(storage) if caller.allows(org, None, Role::Outputs) => Ok(storage),
            _ => Err(TfeError::not_found(format!(
                "organization {org:?} not found (an organization is a wasmstate backend this token may read)"
            ))),
        }
    }

    /// `org`/`name` when the caller may read it, or its outputs (404
    /// otherwise, whether it exists or not), and whether it exists.
    async fn visible(&self, caller: &Caller, org: &str, name: &str) -> Result<bool, TfeError> {
        let storage = self.organization(caller, org)?;
        if crate::names::check_name("workspace", name).is_err()
            || !caller.allows(org, Some(name), Role::Outputs)
        {
            return Err(workspace_not_found(org, name));
        }
        let names = storage
            .list_workspaces()
            .await
            .map_err(|e| crate::protocol::ApiError::from_storage(org, e))?;
        Ok(names.iter().any(|n| n == name))
    }

    /// `org`/`name`, which must exist and be readable by the caller.
    async fn existing(&self, caller: &Caller, org: &str, name: &str) -> Result<(), TfeError> {
        if self.visible(caller, org, name).await? {
            Ok(())
        } else {
            Err(workspace_not_found(org, name))
        }
    }

    /// The workspace a workspace id names, existing and readable.
    async fn by_id(&self, caller: &Caller, id: &str) -> Result<ids::At, TfeError> {
        let (org, name) =
            ids::parse_workspace(id).ok_or_else(|| TfeError::not_found("no such workspace id"))?;
        self.existing(caller, &org, &name).await?;
        Ok((org, name))
    }

    /// The caller and the workspace id `id` names, when the caller may
    /// act as `role` on it (a refusal recorded as `operation` refused, as
    /// at the http door) and the server is not stopping: the first steps
    /// of every change made through a workspace id.
    async fn permitted(
        &self,
        headers: &HeaderMap,
        client: Client,
        id: &str,
        role: Role,
        operation: Operation,
    ) -> Result<(Caller, ids::At), TfeError> {
        let caller = self.caller(headers, client).await?;
        let (org, name) = self.by_id(&caller, id).await?;
        self.app
            .permit(&caller, (&org, &name), role, operation)
            .await?;
        self.app.refuse_while_draining()?;
        Ok((caller, (org, name)))
    }

    /// `scheme://host` of this request, for the absolute URLs terraform
    /// needs (uploads). The `Host` was checked by the origin guard.
    fn base(&self, headers: &HeaderMap) -> String {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("127.0.0.1");
        let scheme = if self.secure { "https" } else { "http" };
        format!("{scheme}://{host}")
    }
}

fn workspace_not_found(org: &str, name: &str) -> TfeError {
    TfeError::not_found(format!("workspace {org}/{name} not found"))
}

/// Whether `caller` sees all of `org`/`name`'s state, not only its
/// outputs that are not sensitive (the `outputs` role).
fn sees_all(caller: &Caller, org: &str, name: &str) -> bool {
    caller.allows(org, Some(name), Role::Read)
}

/// The name the TFE door knows a caller by (its locks carry it).
fn principal(caller: &Caller) -> String {
    caller
        .identity()
        .map_or_else(|| "anyone".to_string(), |i| i.name.clone())
}
