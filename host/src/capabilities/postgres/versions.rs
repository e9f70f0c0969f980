//! The versions of each state, kept in `<schema>.wasmstate_state_versions`
//! beside Terraform's `states` (which Terraform's `pg` backend alone reads):
//! each written in the transaction of the write or delete that made it, so
//! a version exists exactly when its change committed, and every replica on
//! the database lists, reads and judges the same ones.
//!
//! A version holds what `states.data` held after the change (a sealed
//! envelope under encryption), copied inside the database. A delete keeps
//! the versions before it and adds a version of 0 bytes, as an S3 delete
//! marker: the host's rollback check starts afresh after it, and a state
//! pushed again is a new life on every replica. Each change keeps the
//! newest `history` versions of its name, deleting older ones in its own
//! transaction.

use super::schema::VERSIONS;
use super::{PgError, PgStore};
use tokio_postgres::Transaction;
use tokio_postgres::types::Type;

/// What a version records of the state it keeps, besides its bytes: read
/// from the state as written (its clear fields, sealed or not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    /// `serial`, where the state has one in clear.
    pub serial: Option<i64>,
    /// `lineage`, likewise.
    pub lineage: Option<String>,
    /// The state's size in bytes (the `data` column may hold it encoded).
    pub bytes: i64,
    /// sha256 of the state's bytes, hex: what an operator compares a
    /// version with a file by.
    pub digest: String,
}

impl Meta {
    /// The record of `state`: its serial and lineage from its first bytes
    /// (Terraform writes them first) or a sealed envelope's last, else
    /// from the whole of a small state; nothing more of a big one is read.
    pub fn of(state: &[u8]) -> Meta {
        use crate::statefile::{PREFIX_BYTES, version_in_prefix, version_of_envelope};
        let prefix = &state[..state.len().min(PREFIX_BYTES)];
        let (lineage, serial) =
            match version_in_prefix(prefix).or_else(|| version_of_envelope(state)) {
                Some((lineage, serial)) => (Some(lineage), Some(serial)),
                None if state.len() <= PREFIX_BYTES => {
                    #[derive(serde::Deserialize, Default)]
                    struct Clear {
                        serial: Option<u64>,
                        lineage: Option<String>,
                    }
                    let clear: Clear = serde_json::from_slice(state).unwrap_or_default();
                    (clear.lineage.filter(|l| !l.is_empty()), clear.serial)
                }
                None => (None, None),
            };
        Meta {
            serial: serial.and_then(|s| i64::try_from(s).ok()),
            lineage,
            bytes: i64::try_from(state.len()).unwrap_or(i64::MAX),
            digest: crate::digest::sha256_hex(state),
        }
    }
}

/// One kept version, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// Its id (the table's `id`), as text.
    pub id: String,
    /// Its serial, when the state had one in clear.
    pub serial: Option<u64>,
    /// When its change ran, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// The state's size; 0 for a delete.
    pub bytes: u64,
}

impl PgStore {
    /// How many versions of each name this store keeps now: the backend's
    /// `history`, or 0 without the table (a role that may not create it).
    pub(super) fn keeping(&self) -> i64 {
        match self.prepared.get() {
            Some(tables) if tables.versions => i64::try_from(self.keep()).unwrap_or(i64::MAX),
            _ => 0,
        }
    }

    /// In `tx`, after row `name` was set (`written`: its record) or
    /// deleted (`None`; only where a row was): record the version, then
    /// keep only the newest ones. The data is copied from the row inside
    /// the database, never sent twice.
    pub(super) async fn record_version(
        &self,
        tx: &Transaction<'_>,
        name: &str,
        written: Option<&Meta>,
    ) -> Result<(), PgError> {
        let keep = self.keeping();
        if keep == 0 {
            return Ok(());
        }
        let versions = self.table(VERSIONS);
        // One statement: the insert in a WITH, the prune after it. The
        // prune does not see the row its WITH inserts (one snapshot), so
        // it keeps `keep - 1` of the older ones.
        let prune = format!(
            "DELETE FROM {versions} WHERE name = $1 AND id <= (
                 SELECT id FROM {versions} WHERE name = $1 ORDER BY id DESC OFFSET $2 LIMIT 1)"
        );
        let older = keep - 1;
        match written {
            Some(meta) => {
                let sql = format!(
                    "WITH kept AS (
                         INSERT INTO {versions} (name, serial, lineage, created_at, bytes, digest, data)
                         SELECT name, $3, $4, clock_timestamp(), $5, $6, data FROM {} WHERE name = $1)
                     {prune}",
                    self.table("states")
                );
                // Typed: parsed, bound and run in one round trip.
                let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 6] = [
                    (&name, Type::TEXT),
                    (&older, Type::INT8),
                    (&meta.serial, Type::INT8),
                    (&meta.lineage, Type::TEXT),
                    (&meta.bytes, Type::INT8),
                    (&meta.digest, Type::TEXT),
                ];
                tx.execute_typed(&sql, &params)
                    .await
                    .map_err(|e| not_granted(e, &versions))?;
            }
            None => {
                let sql = format!(
                    "WITH kept AS (
                         INSERT INTO {versions} (name, created_at, bytes) VALUES ($1, clock_timestamp(), 0))
                     {prune}"
                );
                tx.execute_typed(&sql, &[(&name, Type::TEXT), (&older, Type::INT8)])
                    .await
                    .map_err(|e| not_granted(e, &versions))?;
            }
        }
        Ok(())
    }

    /// The kept versions of `name`, newest first; `None` when this store
    /// keeps none. Makes nothing: the host lists `default` at start, and
    /// making Terraform's schema and tables then could race a native
    /// `terraform init` making them (PostgreSQL's `IF NOT EXISTS` does not
    /// stop two at once; Terraform does not retry). A table not made yet
    /// holds no versions; the first change makes it.
    pub async fn list_versions(&self, name: &str) -> Result<Option<Vec<Kept>>, PgError> {
        let keep = i64::try_from(self.keep()).unwrap_or(i64::MAX);
        if keep == 0 || self.prepared.get().is_some_and(|tables| !tables.versions) {
            return Ok(None);
        }
        let client = self.connection().await?;
        let versions = self.table(VERSIONS);
        // Not made yet: the first change makes it where this role may
        // (into the schema, or the database when the schema is missing
        // too); where it may not, that change keeps none here, so say so
        // now: the host then keeps them per replica from the first write,
        // not "in the storage" where none would be.
        let row = client
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL,
                        coalesce((SELECT has_schema_privilege(oid, 'CREATE') FROM pg_namespace
                                  WHERE nspname = $2),
                                 has_database_privilege(current_database(), 'CREATE'))",
                &[&versions, &self.grant.schema],
            )
            .await?;
        let (made, may_make): (bool, bool) = (row.get(0), row.get(1));
        if !made {
            self.give_back(client);
            return Ok(may_make.then(Vec::new));
        }
        let sql = format!(
            "SELECT id, serial, (extract(epoch FROM created_at) * 1000)::bigint, bytes
             FROM {versions} WHERE name = $1 ORDER BY id DESC LIMIT $2"
        );
        let rows = client.query(&sql, &[&name, &keep]).await?;
        self.give_back(client);
        let kept = rows
            .iter()
            .map(|row| {
                let (id, serial, ms, bytes): (i64, Option<i64>, i64, i64) =
                    (row.get(0), row.get(1), row.get(2), row.get(3));
                Kept {
                    id: id.to_string(),
                    serial: serial.and_then(|s| u64::try_from(s).ok()),
                    created_unix_ms: u64::try_from(ms).unwrap_or(0),
                    bytes: u64::try_from(bytes).unwrap_or(0),
                }
            })
            .collect();
        Ok(Some(kept))
    }

    /// The data of version `id` of `name`, under [`PgStore::read`]'s rule
    /// (`admit` asked before each fetch); `None` when there is no such
    /// version, it is a delete, or `id` is none of this table's.
    pub async fn read_version(
        &self,
        name: &str,
        id: &str,
        admit: impl FnMut(usize) -> Result<(), PgError>,
    ) -> Result<Option<String>, PgError> {
        let Some(id) = id
            .parse::<i64>()
            .ok()
            .filter(|_| id.bytes().all(|b| b.is_ascii_digit()))
        else {
            return Ok(None);
        };
        let sql = format!(
            "SELECT octet_length(data), CASE WHEN octet_length(data) <= $3 THEN data END
             FROM {} WHERE name = $1 AND id = $2",
            self.table(VERSIONS)
        );
        self.fetch(&sql, &[&name, &id], name, admit).await
    }
}

/// `e`, saying what to do where this role may not use the versions table
/// (made beforehand by another role, without grants): the change it was
/// part of rolled back, so the state is as it was.
fn not_granted(e: tokio_postgres::Error, versions: &str) -> PgError {
    if e.code() != Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) {
        return e.into();
    }
    PgError::Internal(format!(
        "PostgreSQL: this role may not keep versions in {versions}, so nothing was written: grant \
         it SELECT, INSERT and DELETE on that table and USAGE on its id sequence (see the postgres \
         guest in operating.md), or set the backend's history = 0"
    ))
}

#[cfg(test)]
mod tests {
    use super::Meta;

    #[test]
    fn a_version_records_the_clear_fields_of_plain_and_sealed_states() {
        let plain = br#"{"version":4,"serial":7,"lineage":"l-1","resources":[]}"#;
        let meta = Meta::of(plain);
        assert_eq!(
            (meta.serial, meta.lineage.as_deref(), meta.bytes),
            (Some(7), Some("l-1"), plain.len() as i64)
        );
        assert_eq!(meta.digest, crate::digest::sha256_hex(plain));
        // A sealed envelope keeps them after its ciphertext.
        let sealed = br#"{"wasmstate_encrypted":1,"ciphertext":"AAAA","serial":9,"lineage":"l-2"}"#;
        let meta = Meta::of(sealed);
        assert_eq!(
            (meta.serial, meta.lineage.as_deref()),
            (Some(9), Some("l-2"))
        );
        // Neither: nothing made up.
        let meta = Meta::of(b"\x00\x01 not a state");
        assert_eq!((meta.serial, meta.lineage), (None, None));
    }
}
