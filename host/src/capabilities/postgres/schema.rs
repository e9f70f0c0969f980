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
/// statements, and `wasmstate_locks`. Each only where it is missing, so a
/// role without CREATE rights works on tables made beforehand; replicas
/// starting together may race on a CREATE, and the loser's "already
/// exists" is success.
pub async fn prepare(client: &Client, grant: &PgGrant) -> Result<(), PgError> {
    let schema = quote(&grant.schema);
    let exists = |what: String| async move {
        let found: bool = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&what])
            .await?
            .get(0);
        Ok::<_, PgError>(found)
    };
    if !grant.skip.schema {
        let found: i64 = client
            .query_one(
                "SELECT count(1) FROM information_schema.schemata WHERE schema_name = $1",
                &[&grant.schema],
            )
            .await?
            .get(0);
        if found == 0 {
            create(client, &format!("CREATE SCHEMA IF NOT EXISTS {schema}")).await?;
        }
    }
    if !grant.skip.table && !exists(format!("{schema}.states")).await? {
        create(
            client,
            &format!(
                "CREATE SEQUENCE IF NOT EXISTS public.global_states_id_seq AS bigint;
                 CREATE TABLE IF NOT EXISTS {schema}.states (
                     id bigint NOT NULL DEFAULT nextval('public.global_states_id_seq') PRIMARY KEY,
                     name text UNIQUE,
                     data text)"
            ),
        )
        .await?;
    }
    if !grant.skip.index && !exists(format!("{schema}.states_by_name")).await? {
        create(
            client,
            &format!("CREATE UNIQUE INDEX IF NOT EXISTS states_by_name ON {schema}.states (name)"),
        )
        .await?;
    }
    // Terraform's pg backend never reads it; wasmstate's replicas share it.
    if !exists(format!("{schema}.wasmstate_locks")).await? {
        create(
            client,
            &format!(
                "CREATE TABLE IF NOT EXISTS {schema}.wasmstate_locks (
                     name text PRIMARY KEY,
                     key bigint NOT NULL,
                     info jsonb NOT NULL,
                     holder text NOT NULL,
                     created timestamptz NOT NULL DEFAULT now())"
            ),
        )
        .await
        .map_err(|e| match e {
            PgError::Internal(why) => PgError::Internal(format!(
                "{why}; a role that may not create tables needs {schema}.wasmstate_locks made beforehand (see the postgres guest in operating.md)"
            )),
            other => other,
        })?;
    }
    Ok(())
}

/// Run a CREATE; another replica's CREATE of the same object winning the
/// race is success.
async fn create(client: &Client, sql: &str) -> Result<(), PgError> {
    use tokio_postgres::error::SqlState;
    match client.batch_execute(sql).await {
        Ok(()) => Ok(()),
        Err(e)
            if e.code().is_some_and(|c| {
                [
                    SqlState::UNIQUE_VIOLATION,
                    SqlState::DUPLICATE_TABLE,
                    SqlState::DUPLICATE_OBJECT,
                    SqlState::DUPLICATE_SCHEMA,
                ]
                .contains(c)
            }) =>
        {
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}
