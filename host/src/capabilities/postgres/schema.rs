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

/// The table of kept versions, beside `states`: Terraform's pg backend
/// never reads it.
pub const VERSIONS: &str = "wasmstate_state_versions";

/// The table of workspace metadata, beside `states`: Terraform's pg
/// backend never reads it.
pub const METADATA: &str = "wasmstate_workspace_metadata";

/// Which of wasmstate's optional tables a store may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tables {
    /// [`VERSIONS`] is there.
    pub versions: bool,
    /// [`METADATA`] is there and this role may read and write it.
    pub metadata: bool,
}

/// Make what Terraform's pg backend makes at init (backend.go), with its
/// statements, `wasmstate_locks`, [`VERSIONS`] and [`METADATA`]. Each only
/// where it is missing, so a role without CREATE rights works on tables
/// made beforehand; replicas starting together may race on a CREATE, and
/// the loser's "already exists" is success. Which optional tables are
/// there: a role that may not create one (a deployment from before it)
/// keeps working without it, its history or metadata then kept by each
/// replica, as a warning says.
pub async fn prepare(client: &Client, grant: &PgGrant) -> Result<Tables, PgError> {
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
    let versions =
        exists(format!("{schema}.{VERSIONS}")).await? || make_versions(client, grant).await?;
    let metadata = prepare_metadata(client, grant).await?;
    Ok(Tables { versions, metadata })
}

/// Make [`VERSIONS`]; whether it is there now.
async fn make_versions(client: &Client, grant: &PgGrant) -> Result<bool, PgError> {
    let schema = quote(&grant.schema);
    // `id` orders the versions of a name (a sequence, not a clock: replicas'
    // clocks may disagree); `bytes` is the state's own size (`data` may hold
    // it encoded), 0 with no `data` for a delete.
    let sql = format!(
        "CREATE TABLE IF NOT EXISTS {schema}.{VERSIONS} (
             id bigserial PRIMARY KEY,
             name text NOT NULL,
             serial bigint,
             lineage text,
             created_at timestamptz NOT NULL DEFAULT now(),
             bytes bigint NOT NULL,
             digest text,
             data text);
         CREATE INDEX IF NOT EXISTS {VERSIONS}_by_name ON {schema}.{VERSIONS} (name, id)"
    );
    match client.batch_execute(&sql).await {
        Ok(()) => Ok(true),
        Err(e) if raced(&e) => Ok(true),
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) => {
            tracing::warn!(
                schema = %grant.schema,
                "postgres: this role may not create {schema}.{VERSIONS}, so each replica keeps \
                 versions in its own data directory; make the table beforehand (see the postgres \
                 guest in operating.md) so every replica sees every version"
            );
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Make [`METADATA`] where it is missing; whether this role may use it.
/// `version` is the writing transaction's id (`txid_current()`: 64 bits,
/// never reused), so a version seen once never comes back, not even after
/// the metadata was removed and written again.
async fn prepare_metadata(client: &Client, grant: &PgGrant) -> Result<bool, PgError> {
    let schema = quote(&grant.schema);
    let table = format!("{schema}.{METADATA}");
    let usable = |row: tokio_postgres::Row| row.get::<_, Option<bool>>(0);
    let found = usable(client.query_one(USABLE, &[&table]).await?);
    let usable = match found {
        Some(usable) => usable,
        None => {
            let sql = format!(
                "CREATE TABLE IF NOT EXISTS {table} (
                     name text PRIMARY KEY,
                     content text NOT NULL,
                     version bigint NOT NULL)"
            );
            match client.batch_execute(&sql).await {
                Ok(()) => true,
                Err(e) if raced(&e) => true,
                Err(e)
                    if e.code()
                        == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) =>
                {
                    false
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    if !usable {
        tracing::warn!(schema = %grant.schema, "postgres: {}", metadata_unusable(&grant.schema));
    }
    Ok(usable)
}

/// Whether the table named by `$1` is there (`NULL`: it is not) and this
/// role may read and write it. (`has_table_privilege` with several
/// privileges answers whether any is held: each is asked alone.)
pub const USABLE: &str = "SELECT CASE WHEN to_regclass($1) IS NULL THEN NULL ELSE
        has_table_privilege(to_regclass($1), 'SELECT')
        AND has_table_privilege(to_regclass($1), 'INSERT')
        AND has_table_privilege(to_regclass($1), 'UPDATE')
        AND has_table_privilege(to_regclass($1), 'DELETE') END";

/// What an operator reads when this role may not make or use [`METADATA`].
pub fn metadata_unusable(schema: &str) -> String {
    let table = format!("{}.{METADATA}", quote(schema));
    format!(
        "this database role may not create or use {table}, so workspace metadata is not kept \
         in the database; make the table beforehand and grant this role SELECT, INSERT, UPDATE \
         and DELETE on it (see the postgres guest in operating.md)"
    )
}

/// Whether a CREATE failed because another replica's CREATE of the same
/// object won the race.
fn raced(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    e.code().is_some_and(|c| {
        [
            SqlState::UNIQUE_VIOLATION,
            SqlState::DUPLICATE_TABLE,
            SqlState::DUPLICATE_OBJECT,
            SqlState::DUPLICATE_SCHEMA,
        ]
        .contains(c)
    })
}

/// Run a CREATE; another replica's CREATE of the same object winning the
/// race is success.
async fn create(client: &Client, sql: &str) -> Result<(), PgError> {
    match client.batch_execute(sql).await {
        Err(e) if !raced(&e) => Err(e.into()),
        _ => Ok(()),
    }
}
