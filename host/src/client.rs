//! The CLI's client for a running server's workspace API.

use anyhow::Context;

/// How the client signs in, when the server requires it.
#[derive(Debug, Clone)]
pub enum Credentials {
    /// HTTP Basic user and password.
    Basic(String, String),
    /// A bearer token.
    Bearer(String),
}

/// Talks to `--server`.
pub struct Client {
    server: String,
    http: reqwest::Client,
    credentials: Option<Credentials>,
}

impl Client {
    /// A client for the server at `server` (e.g. `http://127.0.0.1:6061`).
    pub fn new(server: &str, credentials: Option<Credentials>) -> Self {
        Client {
            server: server.trim_end_matches('/').to_string(),
            http: reqwest::Client::new(),
            credentials,
        }
    }

    /// The workspaces of `backend`.
    pub async fn list(&self, backend: &str) -> anyhow::Result<Vec<String>> {
        let url = format!("{}/workspaces/{backend}", self.server);
        let response = self.send(self.http.get(&url), &url).await?;
        Ok(response.json().await?)
    }

    /// Create `workspace`; the server's one-line answer.
    pub async fn create(&self, backend: &str, workspace: &str) -> anyhow::Result<String> {
        let url = format!("{}/workspaces/{backend}/{workspace}", self.server);
        let response = self.send(self.http.put(&url), &url).await?;
        Ok(response.text().await?.trim().to_string())
    }

    /// Delete `workspace`; the server's one-line answer.
    pub async fn delete(&self, backend: &str, workspace: &str) -> anyhow::Result<String> {
        let url = format!("{}/workspaces/{backend}/{workspace}", self.server);
        let response = self.send(self.http.delete(&url), &url).await?;
        Ok(response.text().await?.trim().to_string())
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        url: &str,
    ) -> anyhow::Result<reqwest::Response> {
        let request = match &self.credentials {
            Some(Credentials::Basic(user, password)) => request.basic_auth(user, Some(password)),
            Some(Credentials::Bearer(token)) => request.bearer_auth(token),
            None => request,
        };
        let response = request.send().await.with_context(|| {
            format!("cannot reach the wasmstate server at {} (is `wasmstate serve` running? pass --server)", self.server)
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = response.text().await.unwrap_or_default();
        let reason = match serde_json::from_str::<crate::backend::LockInfo>(&body) {
            Ok(holder) if !holder.id.is_empty() => format!(
                "locked by {} since {} (lock id {}, operation {})",
                holder.who, holder.created, holder.id, holder.operation
            ),
            _ => body.trim().to_string(),
        };
        anyhow::bail!("{url}: {status}: {reason}")
    }
}
