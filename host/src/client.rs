//! The CLI's client for a running server's workspace API.

use anyhow::Context;

/// Talks to `--server`.
pub struct Client {
    server: String,
    http: reqwest::Client,
}

impl Client {
    /// A client for the server at `server` (e.g. `http://127.0.0.1:6061`).
    pub fn new(server: &str) -> Self {
        Client {
            server: server.trim_end_matches('/').to_string(),
            http: reqwest::Client::new(),
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
