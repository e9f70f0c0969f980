//! Each workspace's metadata (the TFE door's tags, terraform version,
//! creation time), kept in `<schema>.wasmstate_workspace_metadata` so that
//! every replica on the database agrees on it; Terraform's pg backend never
//! reads that table. A row's `version` is the id of the transaction that
//! wrote it (`txid_current()`, 64 bits, never reused), so a version seen
//! once never comes back, not even after the metadata was removed and
//! written again. Each call is one statement: its check and its change are
//! one step.

use super::conditional::Expect;
use super::schema::{METADATA, USABLE, metadata_unusable};
use super::{PgError, PgStore};

/// One workspace's metadata as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The document.
    pub content: String,
    /// Its version, as text.
    pub version: String,
}

impl PgStore {
    /// Workspace `name`'s metadata. Makes nothing (the host may ask at
    /// start, when making Terraform's schema could race a native
    /// `terraform init`): a table not made yet holds none, and the first
    /// write makes it. [`PgError::InvalidInput`] saying so when this role
    /// may neither make nor use the table: the host then keeps metadata
    /// per replica.
    pub async fn read_metadata(&self, name: &str) -> Result<Option<Stored>, PgError> {
        let client = self.connection().await?;
        let table = self.table(METADATA);
        match self.prepared.get() {
            Some(tables) if !tables.metadata => {
                self.give_back(client);
                return Err(PgError::InvalidInput(metadata_unusable(&self.grant.schema)));
            }
            Some(_) => {}
            None => {
                let row = client
                    .query_one(
                        &format!(
                            "SELECT ({USABLE}),
                                    coalesce((SELECT has_schema_privilege(oid, 'CREATE')
                                              FROM pg_namespace WHERE nspname = $2),
                                             has_database_privilege(current_database(), 'CREATE'))"
                        ),
                        &[&table, &self.grant.schema],
                    )
                    .await?;
                let (usable, may_make): (Option<bool>, bool) = (row.get(0), row.get(1));
                match usable {
                    Some(true) => {}
                    None if may_make => {
                        self.give_back(client);
                        return Ok(None);
                    }
                    _ => {
                        self.give_back(client);
                        return Err(PgError::InvalidInput(metadata_unusable(&self.grant.schema)));
                    }
                }
            }
        }
        let sql = format!("SELECT content, version::text FROM {table} WHERE name = $1");
        let row = client
            .query_opt(&sql, &[&name])
            .await
            .map_err(|e| self.not_usable(e))?;
        self.give_back(client);
        Ok(row.map(|row| Stored {
            content: row.get(0),
            version: row.get(1),
        }))
    }

    /// Set (`Some`) or remove (`None`) workspace `name`'s metadata if it is
    /// as `expect` says, in one statement; whether it was (nothing changed
    /// otherwise). Removing metadata that is not there succeeds.
    pub async fn write_metadata(
        &self,
        name: &str,
        content: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, PgError> {
        let client = self.checkout().await?;
        if !self.prepared.get().is_some_and(|tables| tables.metadata) {
            self.give_back(client);
            return Err(PgError::InvalidInput(metadata_unusable(&self.grant.schema)));
        }
        let t = self.table(METADATA);
        // A version that is no transaction id matches no row.
        let version = match expect {
            Expect::Version(text) => match text.parse::<i64>() {
                Ok(v) if v.to_string() == *text => Some(v),
                _ => {
                    self.give_back(client);
                    return Ok(false);
                }
            },
            _ => None,
        };
        let result = match (content, expect) {
            (Some(content), Expect::Any) => {
                let sql = format!(
                    "INSERT INTO {t} (name, content, version) VALUES ($1, $2, txid_current())
                     ON CONFLICT (name) DO UPDATE SET content = $2, version = txid_current()"
                );
                client.execute(&sql, &[&name, &content]).await.map(|_| true)
            }
            (Some(content), Expect::Absent) => {
                let sql = format!(
                    "INSERT INTO {t} (name, content, version) VALUES ($1, $2, txid_current())
                     ON CONFLICT (name) DO NOTHING"
                );
                client
                    .execute(&sql, &[&name, &content])
                    .await
                    .map(|n| n == 1)
            }
            (Some(content), Expect::Version(_)) => {
                let sql = format!(
                    "UPDATE {t} SET content = $2, version = txid_current() WHERE name = $1 AND version = $3"
                );
                client
                    .execute(&sql, &[&name, &content, &version])
                    .await
                    .map(|n| n == 1)
            }
            (None, Expect::Any) => {
                let sql = format!("DELETE FROM {t} WHERE name = $1");
                client.execute(&sql, &[&name]).await.map(|_| true)
            }
            (None, Expect::Absent) => {
                let sql = format!("SELECT NOT EXISTS (SELECT 1 FROM {t} WHERE name = $1)");
                client.query_one(&sql, &[&name]).await.map(|r| r.get(0))
            }
            (None, Expect::Version(_)) => {
                let sql = format!("DELETE FROM {t} WHERE name = $1 AND version = $2");
                client
                    .execute(&sql, &[&name, &version])
                    .await
                    .map(|n| n == 1)
            }
        };
        let result = result.map_err(|e| self.not_usable(e))?;
        self.give_back(client);
        Ok(result)
    }

    /// `e`, saying what to do where this role may not use the metadata
    /// table (made beforehand by another role, without grants).
    fn not_usable(&self, e: tokio_postgres::Error) -> PgError {
        if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) {
            return PgError::InvalidInput(metadata_unusable(&self.grant.schema));
        }
        e.into()
    }

    /// In `tx`, which deleted row `name`: remove its metadata too, where
    /// it is kept (a workspace of Terraform's pg backend is its row).
    pub(super) async fn remove_metadata(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        name: &str,
    ) -> Result<(), PgError> {
        if !self.prepared.get().is_some_and(|tables| tables.metadata) {
            return Ok(());
        }
        let sql = format!("DELETE FROM {} WHERE name = $1", self.table(METADATA));
        tx.execute(&sql, &[&name])
            .await
            .map_err(|e| self.not_usable(e))?;
        Ok(())
    }
}
