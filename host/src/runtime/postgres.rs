//! The WIT `postgres` interface for guests, on top of the host's postgres
//! capability ([`crate::capabilities::postgres`]): every call is refused
//! without a grant, and stops at the request's deadline.

use super::bindings::wasmstate::backend::postgres as wit;
use super::bindings::wasmstate::backend::types::LockInfo;
use super::chunks::{StateSink, StateSource};
use super::sandbox::Sandbox;
use crate::capabilities::postgres::{Holder, PgError, PgStore, locks::Refusal};
use std::sync::Arc;
use wasmtime::component::Resource;

impl From<PgError> for wit::PgError {
    fn from(e: PgError) -> Self {
        match e {
            PgError::Unavailable(m) => wit::PgError::Unavailable(m),
            PgError::InvalidInput(m) => wit::PgError::InvalidInput(m),
            PgError::Internal(m) => wit::PgError::Internal(m),
        }
    }
}

/// Terraform's lock info JSON (`ID`, `Operation`, …) as the contract's
/// record; missing fields are empty.
fn lock_info(json: &serde_json::Value) -> LockInfo {
    let field = |name: &str| {
        json.get(name)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    LockInfo {
        id: field("ID"),
        operation: field("Operation"),
        info: field("Info"),
        who: field("Who"),
        version: field("Version"),
        created: field("Created"),
        path: field("Path"),
    }
}

fn lock_json(info: &LockInfo) -> serde_json::Value {
    serde_json::json!({
        "ID": info.id,
        "Operation": info.operation,
        "Info": info.info,
        "Who": info.who,
        "Version": info.version,
        "Created": info.created,
        "Path": info.path,
    })
}

fn holder(h: Holder) -> wit::Holder {
    match h {
        Holder::Wasmstate(json) => wit::Holder::Wasmstate(lock_info(&json)),
        Holder::Native(what) => wit::Holder::Native(what),
    }
}

fn refused(r: Refusal) -> wit::Refused {
    match r {
        Refusal::Held(h) => wit::Refused::Held(holder(h)),
        Refusal::NotLocked => wit::Refused::NotLocked,
    }
}

/// How a state that is not UTF-8 text (never one of Terraform's, which
/// are JSON) is kept in the `data` column: base64 after this prefix, which
/// no JSON document starts with.
const BINARY_PREFIX: &str = "wasmstate-base64:";

/// `bytes` as the `data` column keeps them: Terraform's states as they
/// are, anything else (not UTF-8, holding a NUL, or beginning like an
/// encoded state) encoded.
fn as_text(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    use base64::Engine as _;
    match std::str::from_utf8(bytes) {
        // PostgreSQL's text holds no NUL.
        Ok(text) if !text.starts_with(BINARY_PREFIX) && !text.contains('\0') => text.into(),
        _ => format!(
            "{BINARY_PREFIX}{}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        )
        .into(),
    }
}

/// The state a `data` column holds.
fn from_text(data: &str) -> Result<std::borrow::Cow<'_, [u8]>, wit::PgError> {
    use base64::Engine as _;
    match data.strip_prefix(BINARY_PREFIX) {
        None => Ok(data.as_bytes().into()),
        Some(encoded) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map(Into::into)
            .map_err(|e| wit::PgError::Internal(format!("an encoded state is not base64: {e}"))),
    }
}

impl Sandbox {
    /// The backend's database, or the refusal a guest without one gets.
    fn database(&self) -> Result<Arc<PgStore>, wit::PgError> {
        self.postgres.clone().ok_or_else(|| {
            tracing::warn!(backend = %self.backend, "postgres call refused: the backend has no database");
            wit::PgError::Denied(format!(
                "backend {:?} has no database; the operator must give it a conn_str",
                self.backend
            ))
        })
    }
}

/// Run `call` until `deadline` (the request's).
async fn until<T>(
    deadline: std::time::Instant,
    call: impl Future<Output = Result<T, PgError>>,
) -> Result<T, wit::PgError> {
    match tokio::time::timeout_at(deadline.into(), call).await {
        Ok(result) => result.map_err(Into::into),
        Err(_) => Err(wit::PgError::Unavailable(
            "the database did not answer before the request's deadline".into(),
        )),
    }
}

impl wit::Host for Sandbox {
    async fn list_names(&mut self) -> Result<Vec<String>, wit::PgError> {
        let db = self.database()?;
        until(self.core.deadline(), db.list_names()).await
    }

    async fn read_into(
        &mut self,
        name: String,
        into: Resource<StateSink>,
    ) -> Result<Option<u64>, wit::PgError> {
        let db = self.database()?;
        let Some(data) = until(self.core.deadline(), db.read(&name)).await? else {
            return Ok(None);
        };
        let bytes = from_text(&data)?;
        self.charge_capability_sink(&into, bytes.len())
            .map_err(wit::PgError::Internal)?;
        let sink = self
            .table
            .get_mut(&into)
            .map_err(|e| wit::PgError::Internal(format!("bad resource handle: {e}")))?;
        sink.write(&bytes);
        Ok(Some(bytes.len() as u64))
    }

    async fn write(
        &mut self,
        name: String,
        state: Resource<StateSource>,
        lock_id: Option<String>,
    ) -> Result<Option<wit::Refused>, wit::PgError> {
        let db = self.database()?;
        // The host's copy of the body, not the guest's (it never held it).
        let bytes = self
            .table
            .get(&state)
            .map_err(|e| wit::PgError::Internal(format!("bad resource handle: {e}")))?
            .bytes()
            .clone();
        let text = as_text(&bytes);
        let outcome = db.change(&name, Some(&text), lock_id.as_deref());
        Ok(until(self.core.deadline(), outcome).await?.map(refused))
    }

    async fn delete(
        &mut self,
        name: String,
        lock_id: Option<String>,
    ) -> Result<Option<wit::Refused>, wit::PgError> {
        let db = self.database()?;
        let outcome = db.change(&name, None, lock_id.as_deref());
        Ok(until(self.core.deadline(), outcome).await?.map(refused))
    }

    async fn create(&mut self, name: String, data: String) -> Result<bool, wit::PgError> {
        let db = self.database()?;
        until(self.core.deadline(), db.create(&name, &data)).await
    }

    async fn lock(
        &mut self,
        name: String,
        info: LockInfo,
    ) -> Result<Option<wit::Holder>, wit::PgError> {
        let db = self.database()?;
        let taken = db.lock(&name, lock_json(&info));
        Ok(until(self.core.deadline(), taken).await?.map(holder))
    }

    async fn lock_holder(&mut self, name: String) -> Result<Option<wit::Holder>, wit::PgError> {
        let db = self.database()?;
        Ok(until(self.core.deadline(), db.holder(&name))
            .await?
            .map(holder))
    }

    async fn unlock(
        &mut self,
        name: String,
        id: String,
        force: bool,
    ) -> Result<Option<wit::Holder>, wit::PgError> {
        let db = self.database()?;
        let released = db.unlock(&name, &id, force);
        Ok(until(self.core.deadline(), released).await?.map(holder))
    }
}
