//! wasmstate guest: Terraform state in PostgreSQL, the layout of
//! Terraform's `backend "pg"` (`internal/backend/remote-state/pg`):
//!
//! - one row per workspace in `<schema_name>.states (id, name, data)`,
//!   `default` included (it has no row until its first write);
//! - locks: Terraform's session-level advisory locks on the row's id
//!   (`-1` while the workspace has no row), which the host holds for
//!   wasmstate's clients and records in `<schema_name>.wasmstate_locks`, so
//!   that native `terraform` clients and wasmstate's replicas all exclude
//!   each other.
//!
//! The guest only names rows: the host holds the connection string (its
//! password), runs the statements and holds the locks (the `postgres`
//! capability). A native client's lock cannot be force-unlocked here: it
//! ends when that client unlocks or its session ends.
//!
//! - history: every write and delete keeps a version in
//!   `<schema_name>.wasmstate_state_versions`, in its own transaction (the
//!   host's `postgres` capability), the newest `history` of each workspace;
//!   Terraform's pg backend never reads that table. Every replica on the
//!   database lists, reads and restores the same versions.
//!
//! - contract 0.3.0: `head` is one statement (the row's version, the
//!   state's size and md5 computed by the database, its first bytes); a
//!   conditional write checks the row's version in the write's own
//!   transaction, with the lock check and the history copy, so of two
//!   writers expecting one version exactly one writes, on any replicas.
//!   The version is the row's `xmin`, which Terraform's own writes change
//!   too, so a native `terraform` writing in between is seen.
//! - workspace metadata: rows of `<schema_name>.wasmstate_workspace_metadata`
//!   (made by the host, never read by Terraform), removed with the
//!   workspace's row.
//!
//! Settings, named as Terraform's: `conn_str` (taken by the host),
//! `schema_name`, `skip_schema_creation`, `skip_table_creation`,
//! `skip_index_creation`.

use wasmstate_guest::postgres::{self, Holder, Refused};
use wasmstate_guest::{
    Backend, Config, Error, Expect, Head, LockInfo, Metadata, StateReader, StateWriter, Version,
    register_backend,
};

const DEFAULT: &str = "default";

struct Pg;

/// A refused write or delete as the contract's error.
fn refusal(refused: Refused) -> Error {
    match refused {
        Refused::Held(holder) => Error::locked(holder.into_lock_info()),
        Refused::NotLocked => Error::lock_mismatch(None),
        // Only a conditional write expects a version; this one did not.
        Refused::Changed => Error::Internal("the row changed under an unconditional write".into()),
    }
}

/// An empty state as Terraform writes one for a new workspace: version 4,
/// serial 1, a fresh lineage (a random UUID).
fn empty_state() -> String {
    let mut b = wasmstate_guest::random_bytes(16);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    let lineage = format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    );
    // An old terraform_version, so any Terraform reads it.
    serde_json::json!({
        "version": 4,
        "terraform_version": "1.0.0",
        "serial": 1,
        "lineage": lineage,
        "outputs": {},
        "resources": [],
        "check_results": null,
    })
    .to_string()
}

impl Backend for Pg {
    fn new(config: &Config) -> Result<Self, Error> {
        config.reject_unknown(&[
            "schema_name",
            "skip_schema_creation",
            "skip_table_creation",
            "skip_index_creation",
        ])?;
        Ok(Pg)
    }

    fn read_into(&self, ws: &str, out: &mut StateWriter<'_>) -> Result<bool, Error> {
        // A row with no data is no state.
        Ok(postgres::read_into(ws, out)?.is_some_and(|size| size > 0))
    }

    fn write_from(
        &self,
        ws: &str,
        state: &mut StateReader<'_>,
        lock_id: Option<&str>,
    ) -> Result<(), Error> {
        match postgres::write(ws, state, lock_id)? {
            None => Ok(()),
            Some(refused) => Err(refusal(refused)),
        }
    }

    /// One statement: the data stays in the database.
    fn head(&self, ws: &str, prefix: &mut StateWriter<'_>) -> Result<Option<Head>, Error> {
        Ok(postgres::head(ws, prefix)?.map(|row| Head {
            version: row.version,
            size: row.size,
            digest: Some(row.digest),
        }))
    }

    /// The row's version checked in the write's transaction, after the
    /// lock rule.
    fn write_if(
        &self,
        ws: &str,
        state: &mut StateReader<'_>,
        lock_id: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, Error> {
        match postgres::write_if(ws, state, lock_id, expect)? {
            None => Ok(true),
            Some(Refused::Changed) => Ok(false),
            Some(refused) => Err(refusal(refused)),
        }
    }

    fn read_metadata(&self, ws: &str) -> Result<Option<Metadata>, Error> {
        Ok(postgres::read_metadata(ws)?)
    }

    fn write_metadata(
        &self,
        ws: &str,
        content: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, Error> {
        Ok(postgres::write_metadata(ws, content, expect)?)
    }

    fn delete(&self, ws: &str, lock_id: Option<&str>) -> Result<(), Error> {
        match postgres::delete(ws, lock_id)? {
            None => Ok(()),
            Some(refused) => Err(refusal(refused)),
        }
    }

    fn lock(&self, ws: &str, info: &LockInfo) -> Result<(), Error> {
        match postgres::lock(ws, info)? {
            None => Ok(()),
            // Locking again with the holder's own id: a retried request.
            Some(Holder::Wasmstate(holder)) if holder.id == info.id => Ok(()),
            Some(holder) => Err(Error::locked(holder.into_lock_info())),
        }
    }

    fn unlock(&self, ws: &str, id: &str) -> Result<(), Error> {
        match postgres::unlock(ws, id, false)? {
            None => Ok(()),
            Some(holder) => Err(Error::lock_mismatch(Some(holder.into_lock_info()))),
        }
    }

    fn current_lock(&self, ws: &str) -> Result<Option<LockInfo>, Error> {
        Ok(postgres::lock_holder(ws)?.map(Holder::into_lock_info))
    }

    /// Releases a wasmstate client's lock; a native client's is reported
    /// as held (it ends with its database session).
    fn force_unlock(&self, ws: &str) -> Result<Option<LockInfo>, Error> {
        let holder = postgres::lock_holder(ws)?;
        match holder {
            None => Ok(None),
            Some(Holder::Native(what)) => Err(Error::locked(Holder::Native(what).into_lock_info())),
            // Only the lock that was read: one taken since stays.
            Some(Holder::Wasmstate(info)) => match postgres::unlock(ws, &info.id, false)? {
                None => Ok(Some(info)),
                Some(other) => Err(Error::locked(other.into_lock_info())),
            },
        }
    }

    /// As Terraform lists them: `default` first, then every row's name.
    fn list_workspaces(&self) -> Result<Vec<String>, Error> {
        let mut names = vec![DEFAULT.to_string()];
        names.extend(
            postgres::list_names()?
                .into_iter()
                .filter(|n| n != DEFAULT && wasmstate_guest::validate_workspace_name(n).is_ok()),
        );
        Ok(names)
    }

    /// As Terraform creates a workspace: a row with an empty state.
    fn create_workspace(&self, ws: &str) -> Result<bool, Error> {
        Ok(postgres::create(ws, &empty_state())?)
    }

    /// The versions the host keeps in the database; `None` with the
    /// backend's `history = 0`.
    fn list_versions(&self, ws: &str) -> Result<Option<Vec<Version>>, Error> {
        Ok(postgres::list_versions(ws)?)
    }

    fn read_version_into(
        &self,
        ws: &str,
        id: &str,
        out: &mut StateWriter<'_>,
    ) -> Result<bool, Error> {
        Ok(postgres::read_version_into(ws, id, out)?)
    }

    /// Keeps the workspace's versions, as storage with object versions
    /// does: the delete is one of them (0 bytes), after which the rollback
    /// check starts afresh. The host removes the workspace's metadata in
    /// the delete's transaction.
    fn delete_workspace(&self, ws: &str) -> Result<(), Error> {
        if !postgres::list_names()?.iter().any(|n| n == ws) {
            return Err(Error::NotFound);
        }
        match postgres::delete(ws, None)? {
            None => Ok(()),
            Some(refused) => Err(refusal(refused)),
        }
    }
}

register_backend!(Pg);
