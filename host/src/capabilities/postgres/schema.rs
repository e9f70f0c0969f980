//! The schema and tables, made as Terraform's pg backend makes them
//! (unless told to skip), plus the table of wasmstate's locks.

use super::{PgError, PgGrant};
use tokio_postgres::Client;

/// Terraform's `skip_*_creation` settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skip {
    /// `skip_schema_creation`.
    pub schema: bool,
    /// `skip_table_creation`.
    pub table: bool,
    /// `skip_index_creation`.
    pub index: bool,
}

/// `name` as a quoted identifier (as lib/pq's `QuoteIdentifier`).
pub fn quote(name: &str) -> String {
    let name = name.split('\0').next().unwrap_or_default();
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Make what Terraform's pg backend makes at init (backend.go), with its
/// statements, and `wasmstate_locks`.
pub async fn prepare(client: &Client, grant: &PgGrant) -> Result<(), PgError> {
    let schema = quote(&grant.schema);
    if !grant.skip.schema {
        let found: i64 = client
            .query_one(
                "SELECT count(1) FROM information_schema.schemata WHERE schema_name = $1",
                &[&grant.schema],
            )
            .await?
            .get(0);
        if found == 0 {
            client
                .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
                .await?;
        }
    }
    if !grant.skip.table {
        client
            .batch_execute(&format!(
                "CREATE SEQUENCE IF NOT EXISTS public.global_states_id_seq AS bigint;
                 CREATE TABLE IF NOT EXISTS {schema}.states (
                     id bigint NOT NULL DEFAULT nextval('public.global_states_id_seq') PRIMARY KEY,
                     name text UNIQUE,
                     data text)"
            ))
            .await?;
    }
    if !grant.skip.index {
        client
            .batch_execute(&format!(
                "CREATE UNIQUE INDEX IF NOT EXISTS states_by_name ON {schema}.states (name)"
            ))
            .await?;
    }
    // Terraform's pg backend never reads it; wasmstate's replicas share it.
    client
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {schema}.wasmstate_locks (
                 name text PRIMARY KEY,
                 key bigint NOT NULL,
                 info jsonb NOT NULL,
                 holder text NOT NULL,
                 created timestamptz NOT NULL DEFAULT now())"
        ))
        .await?;
    Ok(())
}
