//! PostgreSQL, lent to a guest in the layout of Terraform's `pg` backend.
//!
//! A backend's `conn_str` (its password included) leaves the guest's
//! configuration for the host ([`PgGrant::take`]). The host runs its own
//! statements on `<schema>.states` only: the guest names rows, never SQL.
//! Locks are Terraform's session-level advisory locks ([`locks`]), held by
//! one long-lived session per backend and replica and recorded in
//! `<schema>.wasmstate_locks`, so that a lock taken through one replica is
//! reported and released through any other, and native `terraform`
//! clients and wasmstate clients block each other.

pub mod locks;
mod schema;

use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::Client;

/// Keys of a backend's `config` table the host takes: the connection
/// string holds the password.
pub const CREDENTIAL_KEYS: &[&str] = &["conn_str"];

/// Idle connections kept per backend for reads and writes.
const MAX_IDLE: usize = 4;
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a backend is granted: one database, one schema.
#[derive(Clone, PartialEq, Eq)]
pub struct PgGrant {
    /// `conn_str`, parsed (its password included).
    pub config: tokio_postgres::Config,
    /// `schema_name` (default `terraform_remote_state`).
    pub schema: String,
    /// `skip_schema_creation`, `skip_table_creation`, `skip_index_creation`.
    pub skip: schema::Skip,
    /// TLS for the connections (`sslmode` other than `disable`).
    pub tls: bool,
}

impl std::fmt::Debug for PgGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgGrant")
            .field("hosts", &self.config.get_hosts())
            .field("dbname", &self.config.get_dbname())
            .field("user", &self.config.get_user())
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

pub use schema::Skip;

impl PgGrant {
    /// The grant of a backend whose guest's config names `conn_str` (or
    /// `PG_CONN_STR`, as Terraform reads it): the connection string leaves
    /// `guest_config`; `schema_name` and the `skip_*` settings are read and
    /// left. `None` when `grant` is false (not a postgres guest).
    pub fn take(
        grant: bool,
        guest_config: &mut Vec<(String, String)>,
    ) -> Result<Option<PgGrant>, String> {
        if !grant {
            return Ok(None);
        }
        let mut conn_str = None;
        guest_config.retain(|(key, value)| {
            let ours = CREDENTIAL_KEYS.contains(&key.as_str());
            if ours {
                conn_str = Some(value.clone());
            }
            !ours
        });
        let conn_str = conn_str
            .or_else(|| std::env::var("PG_CONN_STR").ok().filter(|v| !v.is_empty()))
            .ok_or("conn_str: required (e.g. conn_str = { env = \"PG_CONN_STR\" }, \"postgres://user@db.example.com/terraform\")")?;
        let mut config: tokio_postgres::Config = conn_str
            .parse()
            .map_err(|e| format!("conn_str: not a PostgreSQL connection string: {e}"))?;
        config.application_name("wasmstate");
        config.connect_timeout(CONNECT_TIMEOUT);
        let setting = |name: &str| {
            guest_config
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let schema = setting("schema_name").unwrap_or("terraform_remote_state".into());
        let flag = |name: &str| setting(name).is_some_and(|v| v == "true");
        // Like lib/pq, which Terraform uses: TLS unless told otherwise.
        let tls = !matches!(
            config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Disable
        );
        if tls && !conn_str.contains("sslmode") {
            config.ssl_mode(tokio_postgres::config::SslMode::Require);
        }
        Ok(Some(PgGrant {
            config,
            schema,
            skip: Skip {
                schema: flag("skip_schema_creation"),
                table: flag("skip_table_creation"),
                index: flag("skip_index_creation"),
            },
            tls,
        }))
    }
}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PgError {
    /// The database could not be reached, or the call timed out.
    Unavailable(String),
    /// A malformed argument.
    InvalidInput(String),
    /// Anything else.
    Internal(String),
}

impl From<tokio_postgres::Error> for PgError {
    fn from(e: tokio_postgres::Error) -> Self {
        if e.is_closed() || e.as_db_error().is_none() {
            PgError::Unavailable(format!("PostgreSQL: {e}"))
        } else {
            PgError::Internal(format!("PostgreSQL: {e}"))
        }
    }
}

/// Who holds a workspace's lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// A wasmstate client: its lock info, as JSON.
    Wasmstate(serde_json::Value),
    /// A native `terraform` client: what is known of it.
    Native(String),
}

/// One backend's database: its grant, idle connections and lock session.
pub struct PgStore {
    grant: PgGrant,
    backend: Arc<str>,
    /// Itself, for the lock sweep's task.
    me: std::sync::Weak<PgStore>,
    idle: std::sync::Mutex<Vec<Client>>,
    prepared: tokio::sync::OnceCell<()>,
    locks: locks::LockSession,
}

impl PgStore {
    /// The store of `backend` for `grant`; nothing is connected yet.
    pub fn new(backend: &str, grant: &PgGrant) -> Arc<PgStore> {
        Arc::new_cyclic(|me| PgStore {
            grant: grant.clone(),
            backend: Arc::from(backend),
            me: me.clone(),
            idle: std::sync::Mutex::default(),
            prepared: tokio::sync::OnceCell::new(),
            locks: locks::LockSession::default(),
        })
    }

    /// `"schema".table`, quoted.
    fn table(&self, table: &str) -> String {
        format!("{}.{table}", schema::quote(&self.grant.schema))
    }

    /// A connection from the idle ones, or a new one; the schema and
    /// tables made once per store.
    async fn checkout(&self) -> Result<Client, PgError> {
        let idle = self.idle.lock().expect("not poisoned").pop();
        let client = match idle {
            Some(client) if !client.is_closed() => client,
            _ => connect(&self.grant, "wasmstate").await?,
        };
        self.prepared
            .get_or_try_init(|| schema::prepare(&client, &self.grant))
            .await?;
        Ok(client)
    }

    fn give_back(&self, client: Client) {
        let mut idle = self.idle.lock().expect("not poisoned");
        if idle.len() < MAX_IDLE && !client.is_closed() {
            idle.push(client);
        }
    }

    /// The names of the rows of `states`, sorted.
    pub async fn list_names(&self) -> Result<Vec<String>, PgError> {
        let client = self.checkout().await?;
        let sql = format!("SELECT name FROM {} ORDER BY name", self.table("states"));
        let rows = client.query(&sql, &[]).await?;
        self.give_back(client);
        Ok(rows.iter().map(|r| r.get::<_, String>(0)).collect())
    }

    /// Row `name`'s data, if there is such a row (Terraform's Get).
    pub async fn read(&self, name: &str) -> Result<Option<String>, PgError> {
        let client = self.checkout().await?;
        let sql = format!("SELECT data FROM {} WHERE name = $1", self.table("states"));
        let row = client.query_opt(&sql, &[&name]).await?;
        self.give_back(client);
        Ok(row.and_then(|r| r.get::<_, Option<String>>(0)))
    }

    /// Set row `name` to `data` (Terraform's Put) or delete it (`None`),
    /// only while the lock rule of [`locks::LockSession::may_change`]
    /// holds; in one transaction with that check, so a lock taken or
    /// released meanwhile waits for it.
    pub async fn change(
        &self,
        name: &str,
        data: Option<&str>,
        lock_id: Option<&str>,
    ) -> Result<Option<locks::Refusal>, PgError> {
        let mut client = self.checkout().await?;
        let result = async {
            let tx = client.transaction().await?;
            if let Some(refusal) = self.locks.may_change(self, &tx, name, lock_id).await? {
                return Ok(Some(refusal));
            }
            match data {
                // Terraform's own statement, so both write rows alike.
                Some(data) => {
                    let sql = format!(
                        "INSERT INTO {t} (name, data) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET data = $2 WHERE {t}.name = $1",
                        t = self.table("states")
                    );
                    tx.execute(&sql, &[&name, &data]).await?;
                }
                None => {
                    let sql = format!("DELETE FROM {} WHERE name = $1", self.table("states"));
                    tx.execute(&sql, &[&name]).await?;
                }
            }
            tx.commit().await?;
            Ok(None)
        }
        .await;
        if result.is_ok() {
            self.give_back(client);
        }
        result
    }

    /// Insert row `name` with `data` unless one exists; whether inserted.
    pub async fn create(&self, name: &str, data: &str) -> Result<bool, PgError> {
        let client = self.checkout().await?;
        let sql = format!(
            "INSERT INTO {} (name, data) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
            self.table("states")
        );
        let inserted = client.execute(&sql, &[&name, &data]).await?;
        self.give_back(client);
        Ok(inserted == 1)
    }

    /// The backend's name, for log lines.
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// Lock `name` for `info` (JSON with Terraform's field names).
    pub async fn lock(
        &self,
        name: &str,
        info: serde_json::Value,
    ) -> Result<Option<Holder>, PgError> {
        self.checkout().await.map(|c| self.give_back(c))?;
        self.locks.lock(self, name, info).await
    }

    /// Who holds `name`'s lock.
    pub async fn holder(&self, name: &str) -> Result<Option<Holder>, PgError> {
        self.checkout().await.map(|c| self.give_back(c))?;
        self.locks.holder(self, name).await
    }

    /// Release `name`'s lock if held with `id` (any wasmstate lock when
    /// `force`).
    pub async fn unlock(
        &self,
        name: &str,
        id: &str,
        force: bool,
    ) -> Result<Option<Holder>, PgError> {
        self.checkout().await.map(|c| self.give_back(c))?;
        self.locks.unlock(self, name, id, force).await
    }
}

/// A new connection to `grant`'s database as `application`, its driver
/// spawned (it ends with the connection).
async fn connect(grant: &PgGrant, application: &str) -> Result<Client, PgError> {
    let mut config = grant.config.clone();
    config.application_name(application);
    if grant.tls {
        let tls = tokio_postgres_rustls::MakeRustlsConnect::new((*super::tls_client()).clone());
        let (client, connection) = config.connect(tls).await?;
        tokio::spawn(connection);
        Ok(client)
    } else {
        let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        Ok(client)
    }
}
