//! The WIT `postgres` interface for guests, on top of the host's postgres
//! capability ([`crate::capabilities::postgres`]): every call is refused
//! without a grant, and stops at the request's deadline.

use super::bindings::wasmstate::backend::postgres as wit;
use super::bindings::wasmstate::backend::types::LockInfo;
use super::chunks::{StateSink, StateSource};
use super::limits::{Budget, WASM_PAGE};
use super::sandbox::Sandbox;
use crate::backend::MAX_METADATA_BYTES;
use crate::capabilities::postgres::conditional::Expect;
use crate::capabilities::postgres::encoding::{as_text, from_text};
use crate::capabilities::postgres::versions::Meta;
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
        Refusal::Changed => wit::Refused::Changed,
    }
}

fn expectation(expect: wit::Expect) -> Expect {
    match expect {
        wit::Expect::Any => Expect::Any,
        wit::Expect::Absent => Expect::Absent,
        wit::Expect::Version(v) => Expect::Version(v),
    }
}

/// Most bytes of workspace names one listing holds: what the host lifts
/// back from a guest's listing at most (`MAX_LIST_BYTES` of the guest
/// calls).
const MAX_NAMES_BYTES: usize = 16 << 20;

/// Bytes the host holds during one call for a guest (a state fetched from
/// the database, the names of a listing), charged to the backend's and the
/// server's memory budgets before they are fetched, as the bodies the host
/// reads for a guest are, and given back when the call ends.
struct Held {
    budgets: [Budget; 2],
    permits: Vec<tokio::sync::OwnedSemaphorePermit>,
    bytes: usize,
    most: usize,
}

impl Held {
    fn new(budgets: &[Budget; 2], most: usize) -> Self {
        Held {
            budgets: budgets.clone(),
            permits: Vec::new(),
            bytes: 0,
            most,
        }
    }

    /// Charge `more` bytes (whole pages, as the budgets count), or say why
    /// not; nothing is charged for a refusal.
    fn admit(&mut self, more: usize) -> Result<(), PgError> {
        let after = self.bytes.saturating_add(more);
        if after > self.most {
            return Err(PgError::Internal(format!(
                "the database's answer is larger than the {} MiB this server holds for one call",
                self.most >> 20
            )));
        }
        let page = WASM_PAGE as usize;
        let pages = (after.div_ceil(page) - self.bytes.div_ceil(page)) as u64;
        let mut taken = Vec::new();
        for budget in &self.budgets {
            match budget.take_owned(pages) {
                Some(permit) => taken.extend(permit),
                None => {
                    return Err(PgError::Unavailable(
                        "the database's answer is past the guest memory budget; retry when fewer requests are running"
                            .into(),
                    ));
                }
            }
        }
        self.permits.extend(taken);
        self.bytes = after;
        Ok(())
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
        let mut held = Held::new(&self.outbound.budgets, MAX_NAMES_BYTES);
        let max_name = wasmstate_types::names::MAX_NAME_LEN;
        let names = db.list_names(max_name, |bytes| held.admit(bytes));
        until(self.core.deadline(), names).await
    }

    async fn read_into(
        &mut self,
        name: String,
        into: Resource<StateSink>,
    ) -> Result<Option<u64>, wit::PgError> {
        let db = self.database()?;
        // The fetched text, charged while it is held (the sink's copy is
        // charged below, as every host copy into a sink is).
        let mut held = Held::new(&self.outbound.budgets, usize::MAX);
        let read = db.read(&name, |bytes| held.admit(bytes));
        let Some(data) = until(self.core.deadline(), read).await? else {
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

    async fn head(
        &mut self,
        name: String,
        prefix: Resource<StateSink>,
    ) -> Result<Option<wit::RowHead>, wit::PgError> {
        let db = self.database()?;
        // The fetched beginning, charged while it is held (the sink's copy
        // is charged below, as every host copy into a sink is).
        let mut held = Held::new(&self.outbound.budgets, usize::MAX);
        let want = crate::statefile::PREFIX_BYTES;
        let head = db.head(&name, want, |bytes| held.admit(bytes));
        let Some(head) = until(self.core.deadline(), head).await? else {
            return Ok(None);
        };
        self.charge_capability_sink(&prefix, head.prefix.len())
            .map_err(wit::PgError::Internal)?;
        let sink = self
            .table
            .get_mut(&prefix)
            .map_err(|e| wit::PgError::Internal(format!("bad resource handle: {e}")))?;
        sink.write(&head.prefix);
        Ok(Some(wit::RowHead {
            version: head.version,
            size: head.size,
            digest: format!("md5:{}", head.md5),
        }))
    }

    async fn write(
        &mut self,
        name: String,
        state: Resource<StateSource>,
        lock_id: Option<String>,
        expect: wit::Expect,
    ) -> Result<Option<wit::Refused>, wit::PgError> {
        let db = self.database()?;
        // The host's copy of the body, not the guest's (it never held it).
        let bytes = self
            .table
            .get(&state)
            .map_err(|e| wit::PgError::Internal(format!("bad resource handle: {e}")))?
            .bytes()
            .clone();
        // Its record for the version the write keeps (a digest of a big
        // state is work for a blocking thread, not for this one).
        let meta = {
            let bytes = bytes.clone();
            tokio::task::spawn_blocking(move || Meta::of(&bytes))
                .await
                .map_err(|e| wit::PgError::Internal(format!("reading the state's record: {e}")))?
        };
        let text = as_text(&bytes);
        let expect = expectation(expect);
        let outcome = db.change(&name, Some((&text, &meta)), lock_id.as_deref(), &expect);
        Ok(until(self.core.deadline(), outcome).await?.map(refused))
    }

    async fn delete(
        &mut self,
        name: String,
        lock_id: Option<String>,
    ) -> Result<Option<wit::Refused>, wit::PgError> {
        let db = self.database()?;
        let outcome = db.change(&name, None, lock_id.as_deref(), &Expect::Any);
        Ok(until(self.core.deadline(), outcome).await?.map(refused))
    }

    async fn create(&mut self, name: String, data: String) -> Result<bool, wit::PgError> {
        let db = self.database()?;
        until(self.core.deadline(), db.create(&name, &data)).await
    }

    async fn list_versions(
        &mut self,
        name: String,
    ) -> Result<Option<Vec<wit::KeptVersion>>, wit::PgError> {
        let db = self.database()?;
        let listed = until(self.core.deadline(), db.list_versions(&name)).await?;
        Ok(listed.map(|kept| {
            kept.into_iter()
                .map(|v| wit::KeptVersion {
                    id: v.id,
                    serial: v.serial,
                    created_unix_ms: v.created_unix_ms,
                    bytes: v.bytes,
                })
                .collect()
        }))
    }

    async fn read_version(
        &mut self,
        name: String,
        id: String,
        into: Resource<StateSink>,
    ) -> Result<bool, wit::PgError> {
        let db = self.database()?;
        // As `read_into`: the fetched text charged while it is held.
        let mut held = Held::new(&self.outbound.budgets, usize::MAX);
        let read = db.read_version(&name, &id, |bytes| held.admit(bytes));
        let Some(data) = until(self.core.deadline(), read).await? else {
            return Ok(false);
        };
        let bytes = from_text(&data)?;
        self.charge_capability_sink(&into, bytes.len())
            .map_err(wit::PgError::Internal)?;
        let sink = self
            .table
            .get_mut(&into)
            .map_err(|e| wit::PgError::Internal(format!("bad resource handle: {e}")))?;
        sink.write(&bytes);
        Ok(true)
    }

    async fn read_metadata(&mut self, name: String) -> Result<Option<wit::Metadata>, wit::PgError> {
        let db = self.database()?;
        let found = until(self.core.deadline(), db.read_metadata(&name)).await?;
        Ok(found.map(|m| wit::Metadata {
            content: m.content,
            version: m.version,
        }))
    }

    async fn write_metadata(
        &mut self,
        name: String,
        content: Option<String>,
        expect: wit::Expect,
    ) -> Result<bool, wit::PgError> {
        let db = self.database()?;
        if let Some(content) = &content
            && content.len() > MAX_METADATA_BYTES
        {
            return Err(wit::PgError::InvalidInput(format!(
                "workspace metadata is {} bytes, more than the {} KiB kept",
                content.len(),
                MAX_METADATA_BYTES >> 10
            )));
        }
        let expect = expectation(expect);
        let written = db.write_metadata(&name, content.as_deref(), &expect);
        until(self.core.deadline(), written).await
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

#[cfg(test)]
mod tests {
    use super::{Held, WASM_PAGE};
    use crate::runtime::limits::Budget;

    /// What a call holds is charged to both budgets before it is held,
    /// refused past either (or past the call's own most), and given back
    /// when the call ends.
    #[test]
    fn fetched_bytes_are_charged_to_the_budgets_while_held() {
        let page = WASM_PAGE as usize;
        let (backend, server) = (Budget::new(8 * WASM_PAGE), Budget::new(100 * WASM_PAGE));
        let budgets = [backend.clone(), server.clone()];
        {
            let mut held = Held::new(&budgets, 64 * page);
            held.admit(100).unwrap();
            held.admit(100).unwrap();
            assert_eq!(backend.used_bytes(), WASM_PAGE, "names share pages");
            held.admit(5 * page).unwrap();
            assert_eq!(backend.used_bytes(), 6 * WASM_PAGE);
            assert_eq!(server.used_bytes(), 6 * WASM_PAGE);
            // Past the backend's share: refused, and nothing more charged.
            assert!(held.admit(4 * page).is_err());
            assert_eq!(backend.used_bytes(), 6 * WASM_PAGE);
            assert_eq!(server.used_bytes(), 6 * WASM_PAGE);
        }
        assert_eq!(backend.used_bytes(), 0, "given back with the call");
        assert_eq!(server.used_bytes(), 0);
        let mut capped = Held::new(&budgets, 2 * page);
        assert!(capped.admit(3 * page).is_err());
        assert_eq!(backend.used_bytes(), 0);
    }
}
