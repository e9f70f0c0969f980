//! The operator console: `/ui`, HTML pages served by the host itself, with
//! everything they need embedded in the binary.
//!
//! - Sign-in: the same users and tokens as the API. A browser signs in at
//!   `/ui/login` with a user from the config and gets a session cookie; a
//!   client sending `Authorization` (Basic or bearer) is served directly.
//! - Roles as in the API: read sees, admin acts (force-unlock, restore).
//! - Admin actions are form POSTs that must carry the session's CSRF token;
//!   the cookie is `SameSite=Strict`, and the server's origin guard
//!   ([`crate::protocol`]) refuses cross-site and cross-origin POSTs first.
//! - Every answer carries a strict Content-Security-Policy (no script at
//!   all), `X-Frame-Options: DENY`, `Referrer-Policy: same-origin` and
//!   `Cache-Control: no-store`.
//! - `/ui/api/…` serves, as JSON, the data each page shows ([`data`]).

mod audit;
pub mod changes;
pub mod data;
pub mod diff;
mod next;
mod pages;
pub mod search;
mod session;
mod state_pages;
pub mod state_view;
pub mod viewer;

use next::{login_url, safe_next};

use crate::auth::Identity;
use crate::backend::Storage;
use crate::listen::ClientAddr;
use crate::protocol::{ApiError, App, Caller};
use axum::extract::{Extension, Form, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use pages::Viewer;
use serde::Deserialize;
use session::{COOKIE, Session, Sessions};
use std::sync::Arc;

/// The policy every console answer carries: nothing but this server's own
/// stylesheet, images and forms; no script, no frames.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'self'; img-src 'self'; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const STYLE: &str = include_str!("style.css");

/// How the console is served.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Mark the session cookie `Secure` (the server speaks HTTPS).
    pub secure_cookies: bool,
    /// The data directory, whose installed guests the Guests page lists.
    pub data_dir: std::path::PathBuf,
}

struct Console<S> {
    app: Arc<App<S>>,
    sessions: Sessions,
    options: Options,
}

type Shared<S> = State<Arc<Console<S>>>;

/// The console's routes, to merge into the server's router.
pub fn routes<S: Storage>(app: Arc<App<S>>, options: Options) -> Router {
    let console = Arc::new(Console {
        app,
        sessions: Sessions::default(),
        options,
    });
    Router::new()
        .route("/ui", get(|| async { Redirect::to("/ui/backends") }))
        .route("/ui/assets/style.css", get(style))
        .route("/ui/login", get(login_page::<S>).post(login::<S>))
        .route("/ui/logout", post(logout::<S>))
        .route("/ui/backends", get(backends_page::<S>))
        .route("/ui/guests", get(guests_page::<S>))
        .route("/ui/audit/{backend}", get(audit::audit_page::<S>))
        .route("/ui/api/audit/{backend}", get(audit::audit_json::<S>))
        .route("/ui/backends/{backend}", get(workspaces_page::<S>))
        .route(
            "/ui/backends/{backend}/{workspace}",
            get(versions_page::<S>),
        )
        .route(
            "/ui/backends/{backend}/{workspace}/state",
            get(state_pages::state_page::<S>),
        )
        .route(
            "/ui/api/backends/{backend}/{workspace}/state",
            get(viewer::state_json::<S>),
        )
        .route("/ui/search/{backend}", get(state_pages::search_page::<S>))
        .route("/ui/api/search/{backend}", get(search::search_json::<S>))
        .route(
            "/ui/backends/{backend}/{workspace}/force-unlock",
            post(force_unlock::<S>),
        )
        .route(
            "/ui/backends/{backend}/{workspace}/restore",
            post(restore::<S>),
        )
        .route("/ui/api/backends", get(backends_json::<S>))
        .route("/ui/api/guests", get(installed_json::<S>))
        .route("/ui/api/backends/{backend}", get(workspaces_json::<S>))
        .route("/ui/api/backends/{backend}/locks", get(locks_json::<S>))
        .route(
            "/ui/api/backends/{backend}/{workspace}/versions",
            get(versions_json::<S>),
        )
        .route(
            "/ui/api/backends/{backend}/{workspace}/diff",
            get(diff_json::<S>),
        )
        .layer(middleware::from_fn_with_state(
            console.clone(),
            read_forms::<S>,
        ))
        .layer(middleware::from_fn(secure_headers))
        .with_state(console)
}

/// Most bytes a console form may hold: a user name and password, a CSRF
/// token, a version id.
const FORM_BYTES: usize = 16 << 10;

/// Read every console POST's body before its handler runs (before the
/// session is checked, too): at most [`FORM_BYTES`] (413), within the API's
/// `body_timeout_secs` (408). A body dripped a byte at a time cannot hold a
/// connection longer than the API's can.
async fn read_forms<S: Storage>(
    State(console): State<Arc<Console<S>>>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() != axum::http::Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    match console.app.read_body_up_to(body, FORM_BYTES).await {
        Ok(bytes) => next.run(Request::from_parts(parts, bytes.into())).await,
        Err(refused) => refused.into_response(),
    }
}

async fn secure_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_FRAME_OPTIONS, "DENY"),
        // `no-referrer` would make Chromium send `Origin: null` with the
        // console's own forms, which the origin guard then refuses.
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

/// Who is asking: a session cookie, or credentials sent with the request.
enum Visitor {
    /// Signed in through the form.
    Session(Session),
    /// Sent `Authorization` (scripts): no session, so no admin forms.
    Header(Caller),
}

impl Visitor {
    fn caller(&self) -> Caller {
        match self {
            Visitor::Session(s) => Caller::from_identity(s.identity.clone()),
            Visitor::Header(c) => c.clone(),
        }
    }

    fn viewer(&self) -> Viewer<'_> {
        match self {
            Visitor::Session(s) => Viewer {
                name: Some(s.identity.as_ref().map_or("anyone", |i| i.name.as_str())),
                csrf: &s.csrf,
            },
            Visitor::Header(_) => Viewer {
                name: None,
                csrf: "",
            },
        }
    }
}

fn cookie_value(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(cookie::Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|c| c.name() == COOKIE)
        .map(|c| c.value().to_string())
}

/// The visitor, or where to send a browser that has not signed in.
impl<S: Storage> FromRequestParts<Arc<Console<S>>> for Visitor {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        console: &Arc<Console<S>>,
    ) -> Result<Self, Response> {
        let headers = &parts.headers;
        if let Some(session) = cookie_value(headers).and_then(|id| console.sessions.get(&id)) {
            return Ok(Visitor::Session(session));
        }
        if headers.contains_key(header::AUTHORIZATION) {
            let client = parts.extensions.get::<ClientAddr>().copied().map(Extension);
            return console
                .app
                .identify(headers, client)
                .await
                .map(Visitor::Header)
                .map_err(IntoResponse::into_response);
        }
        // A server without users lets anyone in on loopback, as the API
        // does; pages still send browsers to get a session (admin forms
        // need its token), scripts reading JSON need none.
        if !console.app.auth.enabled() && parts.uri.path().starts_with("/ui/api/") {
            return Ok(Visitor::Header(Caller::from_identity(None)));
        }
        // A page opened without a session (a link pasted in a chat) is
        // where the browser goes back to after signing in.
        let wanted = parts.uri.path_and_query().map_or("", |p| p.as_str());
        let back = (parts.method == axum::http::Method::GET)
            .then(|| safe_next(wanted))
            .flatten();
        Err(Redirect::to(&login_url(back)).into_response())
    }
}

fn page(title: &str, visitor: &Visitor, body: maud::Markup) -> Response {
    Html(pages::layout(title, &visitor.viewer(), body).into_string()).into_response()
}

fn session_cookie(value: &str, max_age: time::Duration, secure: bool) -> HeaderValue {
    let cookie = cookie::Cookie::build((COOKIE, value.to_string()))
        .path("/ui")
        .http_only(true)
        .secure(secure)
        .same_site(cookie::SameSite::Strict)
        .max_age(max_age)
        .build();
    HeaderValue::from_str(&cookie.to_string()).expect("a cookie is a valid header value")
}

fn signed_in<S>(console: &Console<S>, identity: Option<Identity>, next: Option<&str>) -> Response {
    let id = console.sessions.start(identity);
    let lifetime = time::Duration::seconds(session::SESSION_LIFETIME.as_secs() as i64);
    let cookie = session_cookie(&id, lifetime, console.options.secure_cookies);
    let to = next.and_then(safe_next).unwrap_or("/ui/backends");
    ([(header::SET_COOKIE, cookie)], Redirect::to(to)).into_response()
}

#[derive(Deserialize, Default)]
struct AfterSignIn {
    next: Option<String>,
}

async fn login_page<S: Storage>(
    State(console): Shared<S>,
    headers: HeaderMap,
    axum::extract::Query(wanted): axum::extract::Query<AfterSignIn>,
) -> Response {
    let next = wanted.next.as_deref().and_then(safe_next);
    if !console.app.auth.enabled() {
        if cookie_value(&headers).is_some_and(|id| console.sessions.get(&id).is_some()) {
            return Redirect::to(next.unwrap_or("/ui/backends")).into_response();
        }
        // No users: everyone may do anything (loopback only), yet admin
        // forms still need a session's token.
        return signed_in(&console, None, next);
    }
    Html(pages::login(None, next).into_string()).into_response()
}

#[derive(Deserialize)]
struct Credentials {
    user: String,
    password: String,
    /// The page to go back to (checked again: the form is the client's).
    next: Option<String>,
}

async fn login<S: Storage>(
    State(console): Shared<S>,
    client: Option<Extension<ClientAddr>>,
    Form(form): Form<Credentials>,
) -> Response {
    use base64::Engine as _;
    // A CI job's token lives minutes; a console session, hours: signing in
    // with one would keep its grants past its expiry. A `[[tokens]]` token
    // (a CI secret, sent as the Basic password at the http door) would
    // open a browser session with any user name: the API only, too.
    if console.app.auth.is_oidc_token(&form.password)
        || console.app.auth.is_api_token(&form.password)
    {
        let why = "an OIDC or API token signs in to the API only (a console session would outlive it): \
                   sign in with a user name and password";
        return (
            StatusCode::FORBIDDEN,
            Html(pages::login(Some(why), form.next.as_deref().and_then(safe_next)).into_string()),
        )
            .into_response();
    }
    // The same check as the API's Basic sign-in, throttling included.
    let basic = base64::engine::general_purpose::STANDARD
        .encode(format!("{}:{}", form.user, form.password));
    let mut headers = HeaderMap::new();
    if let Ok(value) = HeaderValue::from_str(&format!("Basic {basic}")) {
        headers.insert(header::AUTHORIZATION, value);
    }
    match console.app.identify(&headers, client).await {
        Ok(caller) => signed_in(&console, caller.identity().cloned(), form.next.as_deref()),
        Err(e) => {
            let status = e.status();
            let page = pages::login(Some(&e.message()), form.next.as_deref().and_then(safe_next));
            (status, Html(page.into_string())).into_response()
        }
    }
}

#[derive(Deserialize)]
struct Token {
    csrf: String,
}

/// The session of an admin form's sender, if its token and origin check
/// out; otherwise 403, and nothing happens.
fn checked_session<S: Storage>(
    console: &Console<S>,
    headers: &HeaderMap,
    token: &str,
) -> Result<Session, ApiError> {
    let forbidden = |why: &str| ApiError::Message(StatusCode::FORBIDDEN, why.to_string());
    let session = cookie_value(headers)
        .and_then(|id| console.sessions.get(&id))
        .ok_or_else(|| forbidden("sign in at /ui/login first; nothing was changed"))?;
    if !session.csrf_matches(token) {
        return Err(forbidden(
            "the form's CSRF token is missing or wrong (a request from another site?); nothing was changed",
        ));
    }
    Ok(session)
}

async fn logout<S: Storage>(
    State(console): Shared<S>,
    headers: HeaderMap,
    Form(token): Form<Token>,
) -> Response {
    if let Err(e) = checked_session(&console, &headers, &token.csrf) {
        return e.into_response();
    }
    if let Some(id) = cookie_value(&headers) {
        console.sessions.end(&id);
    }
    (
        [(
            header::SET_COOKIE,
            session_cookie("", time::Duration::ZERO, console.options.secure_cookies),
        )],
        Redirect::to("/ui/login"),
    )
        .into_response()
}

#[derive(Deserialize, Default)]
struct Paging {
    page: Option<usize>,
    from: Option<String>,
    to: Option<String>,
}

impl Paging {
    fn page(&self) -> usize {
        self.page.unwrap_or(1)
    }
}

/// Pages and JSON answer with the data or the one-line error.
type Answer = Result<Response, ApiError>;

async fn backends_page<S: Storage>(State(console): Shared<S>, visitor: Visitor) -> Response {
    let list = data::backends(&console.app, &visitor.caller());
    page("Backends", &visitor, pages::backends(&list))
}

async fn guests_page<S: Storage>(State(console): Shared<S>, visitor: Visitor) -> Answer {
    let caller = visitor.caller();
    let list = data::backends(&console.app, &caller);
    let installed = data::installed(&console.app, &caller, &console.options.data_dir)?;
    Ok(page("Guests", &visitor, pages::guests(&list, &installed)))
}

async fn workspaces_page<S: Storage>(
    State(console): Shared<S>,
    Path(backend): Path<String>,
    Query(paging): Query<Paging>,
    visitor: Visitor,
) -> Answer {
    let caller = visitor.caller();
    let list = data::workspaces(&console.app, &caller, &backend, paging.page()).await?;
    let body = pages::workspaces(&backend, &list, &visitor.viewer());
    let body = match caller.allows(&backend, None, crate::auth::Role::Admin) {
        true => maud::html! {
            p.links { a #audit-link href={ "/ui/audit/" (backend) } { "Audit trail" } }
            (body)
        },
        false => body,
    };
    let body = maud::html! {
        form #search method="get" action={ "/ui/search/" (backend) } {
            label { "Which state holds " input name="q" placeholder="aws_s3_bucket.logs" required; }
            button type="submit" { "Search" }
        }
        (body)
    };
    Ok(page(&format!("Workspaces of {backend}"), &visitor, body))
}

async fn versions_page<S: Storage>(
    State(console): Shared<S>,
    Path((backend, workspace)): Path<(String, String)>,
    Query(paging): Query<Paging>,
    visitor: Visitor,
) -> Answer {
    let (app, caller) = (&console.app, visitor.caller());
    let list = data::versions(app, &caller, &backend, &workspace, paging.page()).await?;
    let compared = match (&paging.from, &paging.to) {
        (Some(from), Some(to)) => Some((
            from.as_str(),
            to.as_str(),
            data::version_diff(app, &caller, &backend, &workspace, from, to).await?,
        )),
        _ => None,
    };
    let admin = matches!(visitor, Visitor::Session(_)) && caller.is_admin(&backend, &workspace);
    let body = pages::versions(
        &backend,
        &workspace,
        &list,
        compared.as_ref().map(|(f, t, d)| (*f, *t, d)),
        admin,
        &visitor.viewer(),
    );
    Ok(page(&format!("{backend}/{workspace}"), &visitor, body))
}

async fn force_unlock<S: Storage>(
    State(console): Shared<S>,
    Path((backend, workspace)): Path<(String, String)>,
    headers: HeaderMap,
    Form(token): Form<Token>,
) -> Answer {
    let visitor = Visitor::Session(checked_session(&console, &headers, &token.csrf)?);
    let holder = data::force_unlock(&console.app, &visitor.caller(), &backend, &workspace).await?;
    let by = visitor.viewer().name.unwrap_or("anyone");
    tracing::warn!(%backend, %workspace, by, "console force-unlock");
    let text = match holder {
        Some(h) => format!(
            "Released the lock of {backend}/{workspace} held by {}.",
            h.who
        ),
        None => format!("{backend}/{workspace} was not locked."),
    };
    let back = format!("/ui/backends/{backend}");
    Ok(page("Force unlock", &visitor, pages::message(&text, &back)))
}

#[derive(Deserialize)]
struct RestoreForm {
    csrf: String,
    version: String,
}

async fn restore<S: Storage>(
    State(console): Shared<S>,
    Path((backend, workspace)): Path<(String, String)>,
    headers: HeaderMap,
    Form(form): Form<RestoreForm>,
) -> Answer {
    let visitor = Visitor::Session(checked_session(&console, &headers, &form.csrf)?);
    let who = visitor.viewer().name.unwrap_or("anyone").to_string();
    let (caller, version) = (visitor.caller(), &form.version);
    let serial = data::restore(&console.app, &caller, &backend, &workspace, version, &who).await?;
    tracing::warn!(%backend, %workspace, %version, serial, by = %who, "console restore");
    let text = format!("Restored version {version} of {backend}/{workspace} as serial {serial}.");
    let back = format!("/ui/backends/{backend}/{workspace}");
    Ok(page("Restore", &visitor, pages::message(&text, &back)))
}

async fn backends_json<S: Storage>(State(console): Shared<S>, visitor: Visitor) -> Response {
    Json(data::backends(&console.app, &visitor.caller())).into_response()
}

async fn workspaces_json<S: Storage>(
    State(console): Shared<S>,
    Path(backend): Path<String>,
    Query(paging): Query<Paging>,
    visitor: Visitor,
) -> Answer {
    let list = data::workspaces(&console.app, &visitor.caller(), &backend, paging.page()).await?;
    Ok(Json(list).into_response())
}

/// The header of a listing of locks that looked at only some workspaces.
pub const LOCKS_CUT: &str = "x-wasmstate-locks-cut";

async fn locks_json<S: Storage>(
    State(console): Shared<S>,
    Path(backend): Path<String>,
    visitor: Visitor,
) -> Answer {
    let (held, cut) = data::held_locks(&console.app, &visitor.caller(), &backend).await?;
    let mut answer = Json(held).into_response();
    // The answer stays a list (what clients parse); a listing cut short
    // says so in a header.
    if let Some(total) = cut {
        let note = format!(
            "only the first {} of {total} workspaces (by name) were looked at",
            data::MAX_LOCK_CHECKS
        );
        if let Ok(value) = axum::http::HeaderValue::from_str(&note) {
            answer.headers_mut().insert(LOCKS_CUT, value);
        }
    }
    Ok(answer)
}

async fn versions_json<S: Storage>(
    State(console): Shared<S>,
    Path((backend, workspace)): Path<(String, String)>,
    Query(paging): Query<Paging>,
    visitor: Visitor,
) -> Answer {
    let (app, caller) = (&console.app, visitor.caller());
    let list = data::versions(app, &caller, &backend, &workspace, paging.page()).await?;
    Ok(Json(list).into_response())
}

async fn diff_json<S: Storage>(
    State(console): Shared<S>,
    Path((backend, workspace)): Path<(String, String)>,
    Query(paging): Query<Paging>,
    visitor: Visitor,
) -> Answer {
    let (Some(from), Some(to)) = (&paging.from, &paging.to) else {
        return Err(ApiError::bad_request(
            "give ?from=<version id>&to=<version id or current>",
        ));
    };
    let (app, caller) = (&console.app, visitor.caller());
    let diff = data::version_diff(app, &caller, &backend, &workspace, from, to).await?;
    Ok(Json(diff).into_response())
}

async fn installed_json<S: Storage>(State(console): Shared<S>, visitor: Visitor) -> Answer {
    let caller = visitor.caller();
    let installed = data::installed(&console.app, &caller, &console.options.data_dir)?;
    Ok(Json(installed).into_response())
}

#[cfg(test)]
mod tests {
    use super::session_cookie;

    #[test]
    fn the_session_cookie_is_strict_and_secure_over_https() {
        let plain = session_cookie("v", time::Duration::hours(1), false);
        let plain = plain.to_str().unwrap();
        for flag in ["HttpOnly", "SameSite=Strict", "Path=/ui"] {
            assert!(plain.contains(flag), "{plain}");
        }
        assert!(!plain.contains("Secure"), "{plain}");
        let https = session_cookie("v", time::Duration::hours(1), true);
        assert!(https.to_str().unwrap().contains("Secure"));
    }
}
