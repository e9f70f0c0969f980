//! The CLI's client for a running server: the workspace API, version
//! history and restore.

use crate::backend::{LockInfo, Version};
use anyhow::Context;
use base64::Engine as _;
use md5::{Digest, Md5};
use std::path::PathBuf;

/// How the client signs in, when the server requires it.
#[derive(Debug, Clone)]
pub enum Credentials {
    /// HTTP Basic user and password.
    Basic(String, String),
    /// A bearer token.
    Bearer(String),
}

/// Certificates for an https server.
#[derive(Debug, Clone, Default)]
pub struct ClientTls {
    /// Extra CA to trust (PEM), e.g. the server's private CA.
    pub ca_cert: Option<PathBuf>,
    /// Client certificate and key (PEM) for servers that require one.
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// Talks to `--server`.
pub struct Client {
    server: String,
    http: reqwest::Client,
    credentials: Option<Credentials>,
}

impl Client {
    /// A client for the server at `server` (e.g. `http://127.0.0.1:6061`).
    pub fn new(
        server: &str,
        credentials: Option<Credentials>,
        tls: &ClientTls,
    ) -> anyhow::Result<Self> {
        let read = |path: &PathBuf| {
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
        };
        let mut http = reqwest::Client::builder().use_rustls_tls();
        if let Some(ca) = &tls.ca_cert {
            let cert = reqwest::Certificate::from_pem(&read(ca)?)
                .with_context(|| format!("{}: not a PEM certificate", ca.display()))?;
            http = http.add_root_certificate(cert);
        }
        if let Some((cert, key)) = &tls.identity {
            let pem = [read(cert)?, b"\n".to_vec(), read(key)?].concat();
            let identity = reqwest::Identity::from_pem(&pem).with_context(|| {
                format!(
                    "{} and {}: not a PEM certificate and private key",
                    cert.display(),
                    key.display()
                )
            })?;
            http = http.identity(identity);
        }
        Ok(Client {
            server: server.trim_end_matches('/').to_string(),
            http: http.build().context("cannot set up the HTTP client")?,
            credentials,
        })
    }

    fn state_url(&self, backend: &str, workspace: &str) -> String {
        format!("{}/states/{backend}/{workspace}", self.server)
    }

    /// The kept versions of a state, newest first.
    pub async fn versions(&self, backend: &str, workspace: &str) -> anyhow::Result<Vec<Version>> {
        Ok(self.versions_with_source(backend, workspace).await?.0)
    }

    /// [`Client::versions`], with who keeps them as the server says
    /// (`storage`, `replica`, `none`; `None` from a server that does not).
    pub async fn versions_with_source(
        &self,
        backend: &str,
        workspace: &str,
    ) -> anyhow::Result<(Vec<Version>, Option<String>)> {
        let url = format!("{}/versions", self.state_url(backend, workspace));
        let response = self.send(self.http.get(&url), &url).await?;
        let source = response
            .headers()
            .get(crate::protocol::versions::HISTORY_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        Ok((response.json().await?, source))
    }

    /// Write version `id` back as the newest state, under the lock, with
    /// the next serial (so Terraform and the stale-write guard see a newer
    /// state). Returns the serial written.
    pub async fn restore(&self, backend: &str, workspace: &str, id: &str) -> anyhow::Result<u64> {
        let base = self.state_url(backend, workspace);
        let url = format!("{base}/versions/{id}");
        let old = self.send(self.http.get(&url), &url).await?.bytes().await?;
        // OpenTofu checks that an encrypted state's clear serial is the one
        // inside its ciphertext: without the key there is no next serial
        // to give it.
        if crate::statefile::read(&old)
            .is_ok_and(|h| h.kind == crate::statefile::Kind::OpenTofuEncrypted)
        {
            anyhow::bail!(
                "version {id} is an OpenTofu-encrypted state: wasmstate cannot give it a new serial without OpenTofu's key; \
                 save it (GET {url}) and push it with `tofu state push -force` (the server accepts its older serial only with allow_force_push = true on the backend)"
            );
        }
        let old_serial = crate::statefile::read(&old)
            .map_err(|e| anyhow::anyhow!("version {id}: {e}"))?
            .serial;
        let info = restore_lock_info(id);
        let lock_body = info.to_json();
        let lock = reqwest::Method::from_bytes(b"LOCK").expect("valid method");
        self.send(
            self.http
                .request(lock, &base)
                .header("Content-Type", "application/json")
                .body(lock_body.clone()),
            &base,
        )
        .await
        .context("cannot take the lock to restore")?;
        let written = async {
            let current = self.credentials(self.http.get(&base)).send().await?;
            let current_serial = match current.status() {
                reqwest::StatusCode::OK => {
                    let bytes = current.bytes().await?;
                    crate::statefile::read(&bytes).ok().and_then(|h| h.serial)
                }
                _ => None,
            };
            let serial = match (current_serial, old_serial) {
                (Some(current), _) => current + 1,
                (None, Some(old)) => old,
                (None, None) => 1,
            };
            // Renumbered in place: key order and every number kept as written.
            let body = crate::statefile::with_serial(&old, serial)
                .map_err(|e| anyhow::anyhow!("version {id}: {e}"))?;
            let md5 = base64::engine::general_purpose::STANDARD.encode(Md5::digest(&body));
            let post = format!("{base}?ID={}", info.id);
            let request = self
                .http
                .post(&post)
                .header("Content-Type", "application/json")
                .header("Content-MD5", md5)
                .body(body);
            self.send(request, &base).await?;
            anyhow::Ok(serial)
        }
        .await;
        let unlock = reqwest::Method::from_bytes(b"UNLOCK").expect("valid method");
        let unlocked = self
            .send(
                self.http
                    .request(unlock, &base)
                    .header("Content-Type", "application/json")
                    .body(lock_body),
                &base,
            )
            .await;
        let serial = written.context("restore failed; the state was not changed")?;
        unlocked
            .context("restored, but releasing the lock failed; run `terraform force-unlock`")?;
        Ok(serial)
    }

    fn credentials(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.credentials {
            Some(Credentials::Basic(user, password)) => request.basic_auth(user, Some(password)),
            Some(Credentials::Bearer(token)) => request.bearer_auth(token),
            None => request,
        }
    }

    /// The locks held on `backend`, oldest first.
    pub async fn locks(&self, backend: &str) -> anyhow::Result<Vec<crate::backend::HeldLock>> {
        let url = format!("{}/ui/api/backends/{backend}/locks", self.server);
        let response = self.send(self.http.get(&url), &url).await?;
        Ok(response.json().await?)
    }

    /// `backend`'s audit records matching `query` (`GET /audit/{backend}`).
    pub async fn audit(
        &self,
        backend: &str,
        query: &[(&str, String)],
    ) -> anyhow::Result<crate::protocol::AuditAnswer> {
        let url = format!("{}/audit/{backend}", self.server);
        let response = self.send(self.http.get(&url).query(query), &url).await?;
        Ok(response.json().await?)
    }

    /// Seal `workspace`'s state and kept versions again under the
    /// backend's sealing key (`from_backend`: the name they were bound to
    /// before a rename); what was done, or would be with `dry_run`.
    pub async fn reseal(
        &self,
        backend: &str,
        workspace: &str,
        from_backend: Option<&str>,
        dry_run: bool,
    ) -> anyhow::Result<crate::resealing::ResealReport> {
        let url = format!("{}/reseal", self.state_url(backend, workspace));
        let mut query = vec![("dry_run", dry_run.to_string())];
        if let Some(old) = from_backend {
            query.push(("from_backend", old.to_string()));
        }
        let response = self.send(self.http.post(&url).query(&query), &url).await?;
        Ok(response.json().await?)
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
        let response = self.credentials(request).send().await.with_context(|| {
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

/// The lock `state restore` takes.
fn restore_lock_info(version: &str) -> LockInfo {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    crate::backend::own_lock(
        "wasmstate-state-restore",
        format!("restoring version {version}"),
        format!("{user}@{host}"),
    )
}

/// A version's time for people: RFC 3339, UTC, to the millisecond.
pub fn format_unix_ms(ms: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| ms.to_string())
}
