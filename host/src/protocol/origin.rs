//! Browsers are clients too. With no users configured the server is open
//! on loopback, and any web page the operator visits could send it a
//! simple request (`fetch(…, {mode: 'no-cors', method: 'POST'})` needs no
//! preflight), or read states back through DNS rebinding (its own host
//! name resolving to 127.0.0.1). So:
//!
//! - the `Host` of a request must be an IP address, `localhost`, or one of
//!   `server_names`: a rebinding page's own name is refused (421). On a
//!   wildcard address with no `server_names` configured the server cannot
//!   tell its names and does not check; it requires credentials there
//!   anyway, which a page cannot borrow.
//! - a state-changing request (anything but GET and HEAD) is refused (403)
//!   when the browser says it is cross-site (`Sec-Fetch-Site`), or when it
//!   carries an `Origin` that is not the request's own host;
//! - a state-changing request with a body must say it is JSON (415): the
//!   content types a page may send without a preflight are `text/plain`,
//!   form encodings, or none at all. The console's forms (`/ui/…`) are the
//!   exception: each carries its session's CSRF token instead.
//!
//! Terraform, OpenTofu and the CLI send IP or configured host names, no
//! `Origin`, and `application/json` on every body (the cloud block:
//! `application/vnd.api+json`, and `application/octet-stream` for state
//! uploads; neither is a type a page may send without a preflight).

use super::error::ApiError;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::IpAddr;

/// Which `Host` names the server answers to.
#[derive(Debug, Clone, Default)]
pub struct OriginPolicy {
    /// Names besides IP addresses and `localhost` (lower-case); `None`:
    /// any host (a wildcard address with no names configured).
    names: Option<Vec<String>>,
}

impl OriginPolicy {
    /// Answer to `server_names`, IP addresses and `localhost`; any host
    /// when `check_host` is false.
    pub fn new(server_names: Vec<String>, check_host: bool) -> Self {
        OriginPolicy {
            names: check_host.then_some(server_names),
        }
    }

    /// Whether `host` (a `Host` header's value, port included or not) is
    /// one of ours.
    fn is_ours(&self, host: &str) -> bool {
        let Some(names) = &self.names else {
            return true;
        };
        let name = host_part(host).to_ascii_lowercase();
        name == "localhost" || name.parse::<IpAddr>().is_ok() || names.contains(&name)
    }
}

/// The host of `host[:port]` or `[v6]:port`, without the port.
fn host_part(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !name.contains(':') => {
            name
        }
        _ => host,
    }
}

fn refused(status: StatusCode, reason: String) -> Response {
    ApiError::Message(status, reason).into_response()
}

/// The middleware: refuse what a web page could send on its own.
pub async fn guard(State(policy): State<OriginPolicy>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| request.uri().authority().map(|a| a.to_string()))
        .unwrap_or_default();
    if !policy.is_ours(&host) {
        return refused(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "this server does not answer to the host {host:?}; add it to [network] server_names if clients reach it by that name"
            ),
        );
    }
    let changes = !matches!(*request.method(), Method::GET | Method::HEAD);
    if changes {
        let site = headers
            .get("sec-fetch-site")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none");
        if !matches!(site, "same-origin" | "none") {
            return refused(
                StatusCode::FORBIDDEN,
                format!("a {site} request from a web page may not change anything here"),
            );
        }
        if let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
            let origin_host = origin.split_once("://").map_or(origin, |(_, rest)| rest);
            if origin_host != host {
                return refused(
                    StatusCode::FORBIDDEN,
                    format!("a request from the web page at {origin} may not change anything here"),
                );
            }
        }
        let has_body = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|n| n.trim() != "0")
            || headers.contains_key(header::TRANSFER_ENCODING);
        // JSON:API (the cloud block) and octet-stream (its state uploads)
        // are no more a page's to send without a preflight than JSON is.
        let json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|t| {
                let t = t.trim();
                [
                    "application/json",
                    "application/vnd.api+json",
                    "application/octet-stream",
                ]
                .iter()
                .any(|allowed| t.eq_ignore_ascii_case(allowed))
            });
        // The console's forms are form-encoded, as browsers send them; each
        // carries its session's CSRF token, which the console checks.
        let console_form = request.uri().path().starts_with("/ui/");
        if has_body && !json && !console_form {
            return refused(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "a body must be sent as Content-Type: application/json (as Terraform does); nothing was changed"
                    .into(),
            );
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_ours_when_they_are_addresses_localhost_or_configured() {
        let policy = OriginPolicy::new(vec!["state.example.com".into()], true);
        for ours in [
            "127.0.0.1:6061",
            "localhost:6061",
            "[::1]:6061",
            "10.0.0.5",
            "STATE.example.com:443",
            "state.example.com",
        ] {
            assert!(policy.is_ours(ours), "{ours}");
        }
        for theirs in [
            "evil.example:6061",
            "rebind.attacker.test",
            "state.example.com.evil.io",
        ] {
            assert!(!policy.is_ours(theirs), "{theirs}");
        }
        assert!(OriginPolicy::new(Vec::new(), false).is_ours("anything.example"));
    }
}
