//! Search across a backend's states, `/ui/search/{backend}?q=…`: which
//! states hold a resource address (`aws_s3_bucket.logs`) or type
//! (`aws_s3_bucket`). Only the workspaces the caller may read are looked
//! at, or named; the work is bounded (workspaces and bytes per search, one
//! search at a time in the whole server) and the answer says when a bound
//! cut it short.

use super::data::{readable_workspaces, storage_of};
use super::state_view::find;
use super::{Answer, Shared, Visitor};
use crate::backend::Storage;
use crate::protocol::{ApiError, App, Caller};
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Most workspaces one search reads the states of (the first, by name).
pub const MAX_WORKSPACES: usize = 200;
/// Bytes one search reads at most: it stops before the next state once it
/// has read this many (so it reads at most this plus one state).
pub const MAX_BYTES: u64 = 256 << 20;
/// Longest query.
pub const MAX_QUERY: usize = 256;
/// How long a search waits for the one under way: then 503, retry.
const SEARCH_WAIT: Duration = Duration::from_secs(10);

/// What the search form sends.
#[derive(Deserialize, Default)]
pub(super) struct Asked {
    pub(super) q: Option<String>,
}

/// One state holding what was asked for.
#[derive(Debug, Serialize)]
pub struct Hit {
    /// Its workspace.
    pub workspace: String,
    /// The matching resource addresses (the first few).
    pub addresses: Vec<String>,
    /// How many resources matched in all.
    pub matched: usize,
}

/// What a search found, and how much it looked at.
#[derive(Debug, Default, Serialize)]
pub struct Searched {
    /// The query.
    pub query: String,
    /// The states holding it, by workspace name.
    pub hits: Vec<Hit>,
    /// Workspaces whose state OpenTofu encrypted: not searchable here.
    pub encrypted: Vec<String>,
    /// Workspaces whose state could not be read or walked, and why.
    pub failed: Vec<(String, String)>,
    /// Workspaces looked at.
    pub searched: usize,
    /// Workspaces the caller may read.
    pub readable: usize,
    /// Bytes of state read.
    pub bytes_read: u64,
    /// Why not every readable workspace was searched, when a bound hit.
    pub cut: Option<String>,
}

/// Which of the states of `backend` the caller may read hold `query`.
pub async fn search<S: Storage>(
    app: &App<S>,
    caller: &Caller,
    backend: &str,
    query: &str,
) -> Result<Searched, ApiError> {
    static ONE_AT_A_TIME: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
    let storage = storage_of(app, caller, backend, None)?;
    let query = query.trim();
    if query.is_empty() || query.len() > MAX_QUERY || query.chars().any(char::is_control) {
        return Err(ApiError::bad_request(format!(
            "give ?q=<resource address or type>, at most {MAX_QUERY} characters, such as aws_s3_bucket.logs"
        )));
    }
    let _turn = match tokio::time::timeout(SEARCH_WAIT, ONE_AT_A_TIME.acquire()).await {
        Ok(Ok(turn)) => turn,
        Ok(Err(_)) => return Err(ApiError::bad_request("the server is stopping")),
        Err(_) => {
            return Err(ApiError::RetryAfter(
                StatusCode::SERVICE_UNAVAILABLE,
                5,
                "the console is running another search (one at a time): busy, retry in a few seconds"
                    .into(),
            ));
        }
    };
    let names = readable_workspaces(storage, caller, backend).await?;
    let mut searched = Searched {
        query: query.to_string(),
        readable: names.len(),
        ..Searched::default()
    };
    let work = storage.host_work();
    for name in names.into_iter().take(MAX_WORKSPACES) {
        if searched.bytes_read >= MAX_BYTES {
            searched.cut = Some(format!(
                "stopped after reading {} MiB of states (the most one search reads)",
                searched.bytes_read >> 20
            ));
            break;
        }
        searched.searched += 1;
        let bytes = match storage.read(&name).await {
            Ok(Some(bytes)) => bytes,
            Ok(None) => continue,
            Err(e) => {
                let why = ApiError::from_storage(backend, e).message();
                searched.failed.push((name, why));
                continue;
            }
        };
        searched.bytes_read += bytes.len() as u64;
        let wanted = query.to_string();
        match work
            .run_over(bytes, move |bytes| find(bytes, &wanted))
            .await
        {
            Ok(Ok(found)) if found.encrypted => searched.encrypted.push(name),
            Ok(Ok(found)) if found.matched > 0 => searched.hits.push(Hit {
                workspace: name,
                addresses: found.addresses,
                matched: found.matched,
            }),
            Ok(Ok(_)) => {}
            Ok(Err(why)) => searched.failed.push((name, why)),
            Err(e) => searched.failed.push((name, e.to_string())),
        }
    }
    if searched.cut.is_none() && searched.searched < searched.readable {
        searched.cut = Some(format!(
            "searched only the first {MAX_WORKSPACES} workspaces by name (the most one search reads)"
        ));
    }
    Ok(searched)
}

pub(super) async fn search_json<S: Storage>(
    State(console): Shared<S>,
    Path(backend): Path<String>,
    Query(asked): Query<Asked>,
    visitor: Visitor,
) -> Answer {
    let query = asked.q.unwrap_or_default();
    let found = search(&console.app, &visitor.caller(), &backend, &query).await?;
    Ok(Json(found).into_response())
}
