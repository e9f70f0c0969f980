//! A small blocking HTTP client over `wasi:http`, for guests whose storage is
//! a network service.
//!
//! The host only lets a request out when the operator granted its origin
//! (`allow_http = ["http://127.0.0.1:2379"]` in the backend's config). A
//! refused request is final and reported as [`Error::Internal`] naming the
//! origin to grant; a network failure is [`Error::Unavailable`], which the
//! client may retry.
//!
//! ```no_run
//! use wasmstate_guest::http;
//!
//! # fn demo() -> Result<(), wasmstate_guest::Error> {
//! let answer = http::post_json("http://127.0.0.1:2379/v3/kv/range", &serde_json::json!({"key": "Zm9v"}))?;
//! let value: serde_json::Value = answer.json()?;
//! # Ok(()) }
//! ```

use crate::Error;
use std::time::Duration;
use wstd::http::{Body, Client, Method, Request};

/// How long to wait for a connection to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// An HTTP answer, fully read.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Body bytes.
    pub body: Vec<u8>,
    /// Headers, names lowercase, in the order received.
    pub headers: Vec<(String, String)>,
}

impl Response {
    /// The first value of header `name` (any case), if it is text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body as text for an error message: trimmed, at most `max`
    /// characters, cut on a character's boundary.
    pub fn excerpt(&self, max: usize) -> String {
        let text = String::from_utf8_lossy(&self.body);
        let text = text.trim();
        text.char_indices()
            .nth(max)
            .map_or(text, |(end, _)| &text[..end])
            .to_string()
    }

    /// The body parsed as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(&self.body).map_err(|e| {
            Error::Internal(format!(
                "answer with status {} is not the expected JSON: {e}",
                self.status
            ))
        })
    }
}

/// Send `method` to `url` with `headers` and `body`; blocks until the whole
/// answer is read.
pub fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Result<Response, Error> {
    let method = Method::from_bytes(method.as_bytes())
        .map_err(|e| Error::InvalidInput(format!("bad HTTP method {method:?}: {e}")))?;
    let mut builder = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder
        .body(Body::from(body))
        .map_err(|e| Error::InvalidInput(format!("bad HTTP request to {url}: {e}")))?;
    wstd::runtime::block_on(async {
        let mut client = Client::new();
        client.set_connect_timeout(CONNECT_TIMEOUT);
        let response = client.send(request).await.map_err(|e| failure(url, &e))?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .filter_map(|(n, v)| Some((n.as_str().to_string(), v.to_str().ok()?.to_string())))
            .collect();
        let mut body = response.into_body();
        let bytes = body
            .contents()
            .await
            .map_err(|e| failure(url, &e))?
            .to_vec();
        Ok(Response {
            status,
            body: bytes,
            headers,
        })
    })
}

/// Pauses before a request that got no answer (a connection that broke,
/// the host closing it) is sent again by [`request_repeatable`].
pub const RETRY_PAUSES_MS: [u64; 3] = [10, 50, 250];

/// [`request`], sent again after each of [`RETRY_PAUSES_MS`] while no
/// answer comes ([`Error::Unavailable`]). Only for a request whose repeat
/// does no more than it did, since one without an answer may still have
/// been applied: a read, a change conditional on what it replaces. Every
/// try but the last sends a copy of `body`.
pub fn request_repeatable(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    mut body: Vec<u8>,
) -> Result<Response, Error> {
    let mut pauses = RETRY_PAUSES_MS.iter();
    loop {
        let last = pauses.len() == 0;
        let sent = if last {
            std::mem::take(&mut body)
        } else {
            body.clone()
        };
        match request(method, url, headers, sent) {
            Err(Error::Unavailable(_)) if !last => {
                pause(Duration::from_millis(
                    *pauses.next().expect("not the last try"),
                ));
            }
            answer => return answer,
        }
    }
}

/// Wait `duration` (between tries), blocking the guest.
pub fn pause(duration: Duration) {
    wstd::runtime::block_on(async { wstd::task::sleep(duration.into()).await });
}

/// `POST` `value` as JSON.
pub fn post_json<T: serde::Serialize>(url: &str, value: &T) -> Result<Response, Error> {
    let body = serde_json::to_vec(value)
        .map_err(|e| Error::Internal(format!("cannot encode request to {url}: {e}")))?;
    request("POST", url, &[("content-type", "application/json")], body)
}

/// `GET` `url`.
pub fn get(url: &str) -> Result<Response, Error> {
    request("GET", url, &[], Vec::new())
}

fn failure(url: &str, error: &wstd::http::Error) -> Error {
    let text = format!("{error:#}");
    if text.to_ascii_lowercase().contains("denied") {
        let origin = url.split('/').take(3).collect::<Vec<_>>().join("/");
        Error::Internal(format!(
            "the host refused the request to {origin}: the operator must grant it \
             (allow_http = [\"{origin}\"] in the backend's config)"
        ))
    } else {
        Error::Unavailable(format!("HTTP request to {url} failed: {text}"))
    }
}
