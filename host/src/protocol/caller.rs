//! Who sent a request, established before anything else of it is read, and
//! what they may do.

use super::error::ApiError;
use crate::auth::{AuthError, Authenticator, Identity, Role};
use crate::metrics::Metrics;
use axum::http::{HeaderMap, StatusCode};
use std::net::IpAddr;

/// The sender of one request: an identity, or anyone when the server has
/// no users or tokens (loopback only).
#[derive(Debug, Clone)]
pub struct Caller {
    identity: Option<Identity>,
}

impl Caller {
    /// Authenticate the request's `Authorization` header from `client`.
    pub async fn identify(
        auth: &Authenticator,
        metrics: &Metrics,
        headers: &HeaderMap,
        client: IpAddr,
    ) -> Result<Caller, ApiError> {
        if !auth.enabled() {
            return Ok(Caller { identity: None });
        }
        let header = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        match auth.authenticate(header, client).await {
            Ok(identity) => Ok(Caller {
                identity: Some(identity),
            }),
            Err(AuthError::Missing) => Err(ApiError::Unauthorized(
                "credentials required: HTTP Basic (Terraform's username/password) or a bearer token"
                    .into(),
            )),
            Err(AuthError::Invalid) => {
                metrics.auth_failed(false);
                tracing::info!(%client, "sign-in refused: wrong user name, password or token");
                Err(ApiError::Unauthorized(
                    "wrong user name, password or token".into(),
                ))
            }
            Err(AuthError::Throttled(wait)) => {
                metrics.auth_failed(true);
                let seconds = wait.as_secs().max(1);
                tracing::warn!(%client, seconds, "sign-in throttled after repeated failures");
                Err(ApiError::RetryAfter(
                    StatusCode::TOO_MANY_REQUESTS,
                    seconds,
                    format!(
                        "too many failed sign-ins from this address or for this user; wait {seconds} s"
                    ),
                ))
            }
        }
    }

    /// A caller already identified (a console session); `None`: anyone, on
    /// a server without users.
    pub fn from_identity(identity: Option<Identity>) -> Caller {
        Caller { identity }
    }

    /// Who it is, when the server has users.
    pub fn identity(&self) -> Option<&Identity> {
        self.identity.as_ref()
    }

    /// Whether the caller may act as `role` on `backend` (and `workspace`).
    pub fn allows(&self, backend: &str, workspace: Option<&str>, role: Role) -> bool {
        self.identity
            .as_ref()
            .is_none_or(|i| i.may(backend, workspace, role))
    }

    /// Whether the caller is an administrator of `backend`/`workspace`.
    pub fn is_admin(&self, backend: &str, workspace: &str) -> bool {
        self.allows(backend, Some(workspace), Role::Admin)
    }

    /// 403 naming what is missing, unless the caller may act as `role`.
    pub fn may(&self, backend: &str, workspace: Option<&str>, role: Role) -> Result<(), ApiError> {
        if self.allows(backend, workspace, role) {
            return Ok(());
        }
        let name = self.identity.as_ref().map_or("anyone", |i| i.name.as_str());
        let on = match workspace {
            Some(ws) => format!("{backend}/{ws}"),
            None => backend.to_string(),
        };
        Err(ApiError::Message(
            StatusCode::FORBIDDEN,
            format!(
                "{name} may not {} {on} (needs the {role:?} role)",
                verb(role)
            )
            .to_lowercase(),
        ))
    }
}

fn verb(role: Role) -> &'static str {
    match role {
        Role::Outputs => "read the outputs of",
        Role::Read => "read",
        Role::Write => "write to",
        Role::Admin => "administer",
    }
}
