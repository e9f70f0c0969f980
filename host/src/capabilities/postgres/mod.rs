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
    /// `sslrootcert`: more roots (PEM) to verify the server with.
    pub root_certs: Option<Vec<u8>>,
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
        let taken = super::take_settings(guest_config, CREDENTIAL_KEYS);
        let conn_str = super::setting(&taken, "conn_str")
            .or_else(|| std::env::var("PG_CONN_STR").ok().filter(|v| !v.is_empty()))
            .ok_or("conn_str: required (e.g. conn_str = { env = \"PG_CONN_STR\" }, \"postgres://user@db.example.com/terraform\")")?;
        let (conn_str, root_cert) = tls_settings(&conn_str)?;
        let root_certs = root_cert
            .map(|path| {
                std::fs::read(&path)
                    .map_err(|e| format!("conn_str: sslrootcert {}: {e}", path.display()))
            })
            .transpose()?;
        let mut config: tokio_postgres::Config = conn_str
            .parse()
            .map_err(|e| format!("conn_str: not a PostgreSQL connection string: {e}"))?;
        config.application_name("wasmstate");
        config.connect_timeout(CONNECT_TIMEOUT);
        let setting = |name: &str| super::setting(guest_config, name);
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
            root_certs,
        }))
    }
}

/// `conn_str` as tokio-postgres reads it, and its `sslrootcert`: libpq's
/// `sslmode=verify-ca` / `verify-full` become `require` (the host always
/// verifies the server's certificate), `sslrootcert` is read by the host.
/// Client certificates are refused with a message.
fn tls_settings(conn_str: &str) -> Result<(String, Option<std::path::PathBuf>), String> {
    let mut root = None;
    let mut keep = |key: &str, value: &str| -> Result<Option<String>, String> {
        match key {
            "sslrootcert" => {
                root = Some(std::path::PathBuf::from(value));
                Ok(None)
            }
            "sslcert" | "sslkey" | "sslpassword" => Err(format!(
                "conn_str: {key}: client certificates are not supported yet; use a password"
            )),
            "sslmode" if matches!(value, "verify-ca" | "verify-full") => Ok(Some("require".into())),
            _ => Ok(Some(value.to_string())),
        }
    };
    if conn_str.starts_with("postgres://") || conn_str.starts_with("postgresql://") {
        let mut url = url::Url::parse(conn_str)
            .map_err(|e| format!("conn_str: not a PostgreSQL URL: {e}"))?;
        let pairs: Vec<(String, String)> = url.query_pairs().into_owned().collect();
        let mut kept = Vec::new();
        for (k, v) in pairs {
            if let Some(v) = keep(&k, &v)? {
                kept.push((k, v));
            }
        }
        url.set_query(None);
        if !kept.is_empty() {
            url.query_pairs_mut().extend_pairs(kept);
        }
        return Ok((url.to_string(), root));
    }
    // key=value words; a quoted value (with spaces) is left as written.
    if conn_str.contains('\'') {
        return Ok((conn_str.to_string(), None));
    }
    let mut words = Vec::new();
    for word in conn_str.split_whitespace() {
        let (k, v) = word.split_once('=').unwrap_or((word, ""));
        if let Some(v) = keep(k, v)? {
            words.push(format!("{k}={v}"));
        }
    }
    Ok((words.join(" "), root))
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

/// One store per backend and grant, kept across reloads: a reload must not
/// end the lock session that holds the backend's locks (its advisory
/// locks would be free until another session took them over).
#[derive(Default)]
pub struct PgStores(std::sync::Mutex<std::collections::HashMap<String, std::sync::Weak<PgStore>>>);

impl PgStores {
    /// The store of `backend` for `grant`: the one in use when its grant
    /// is the same, else a new one.
    pub fn of(&self, backend: &str, grant: &PgGrant) -> Arc<PgStore> {
        let mut stores = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        stores.retain(|_, store| store.strong_count() > 0);
        if let Some(store) = stores.get(backend).and_then(std::sync::Weak::upgrade)
            && store.grant == *grant
        {
            return store;
        }
        let store = PgStore::new(backend, grant);
        stores.insert(backend.to_string(), Arc::downgrade(&store));
        store
    }
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
        self.locks.start_sweep(self);
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

    /// Run a lock operation to completion in a task of its own: a
    /// request that gives up (its deadline) must not stop it between
    /// taking a key and recording it.
    async fn locking<T: Send + 'static, F>(
        &self,
        op: impl FnOnce(Arc<PgStore>) -> F + Send + 'static,
    ) -> Result<T, PgError>
    where
        F: Future<Output = Result<T, PgError>> + Send + 'static,
    {
        self.checkout().await.map(|c| self.give_back(c))?;
        let store = self
            .me
            .upgrade()
            .ok_or_else(|| PgError::Unavailable("the backend is being reloaded; retry".into()))?;
        tokio::spawn(op(store))
            .await
            .map_err(|e| PgError::Internal(format!("lock task: {e}")))?
    }

    /// Lock `name` for `info` (JSON with Terraform's field names).
    pub async fn lock(
        &self,
        name: &str,
        info: serde_json::Value,
    ) -> Result<Option<Holder>, PgError> {
        let name = name.to_string();
        self.locking(move |store| async move { store.locks.lock(&store, &name, info).await })
            .await
    }

    /// Who holds `name`'s lock.
    pub async fn holder(&self, name: &str) -> Result<Option<Holder>, PgError> {
        let name = name.to_string();
        self.locking(move |store| async move { store.locks.holder(&store, &name).await })
            .await
    }

    /// Release `name`'s lock if held with `id` (any wasmstate lock when
    /// `force`).
    pub async fn unlock(
        &self,
        name: &str,
        id: &str,
        force: bool,
    ) -> Result<Option<Holder>, PgError> {
        let (name, id) = (name.to_string(), id.to_string());
        self.locking(
            move |store| async move { store.locks.unlock(&store, &name, &id, force).await },
        )
        .await
    }
}

/// A new connection to `grant`'s database as `application`, its driver
/// spawned (it ends with the connection).
async fn connect(grant: &PgGrant, application: &str) -> Result<Client, PgError> {
    let mut config = grant.config.clone();
    config.application_name(application);
    if grant.tls {
        let tls = tokio_postgres_rustls::MakeRustlsConnect::new(tls_config(grant)?);
        let (client, connection) = config.connect(tls).await?;
        tokio::spawn(connection);
        Ok(client)
    } else {
        let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        Ok(client)
    }
}

/// The TLS configuration of `grant`'s connections: the host's, plus its
/// `sslrootcert`.
fn tls_config(grant: &PgGrant) -> Result<tokio_rustls::rustls::ClientConfig, PgError> {
    use tokio_rustls::rustls::pki_types::{CertificateDer, pem::PemObject};
    let Some(pem) = &grant.root_certs else {
        return Ok((*super::tls_client()).clone());
    };
    let mut roots = tokio_rustls::rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.into(),
    };
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| PgError::Internal(format!("sslrootcert: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| PgError::Internal(format!("sslrootcert: {e}")))?;
    }
    tokio_rustls::rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map(|b| b.with_root_certificates(roots).with_no_client_auth())
    .map_err(|e| PgError::Internal(format!("TLS: {e}")))
}

#[cfg(test)]
mod tests {
    use super::tls_settings;

    #[test]
    fn libpq_tls_settings_become_what_the_host_verifies() {
        let (url, root) = tls_settings(
            "postgres://u:p@db.example.com:5432/tf?sslmode=verify-full&sslrootcert=/etc/ca.pem&application_name=x",
        )
        .unwrap();
        assert_eq!(
            url,
            "postgres://u:p@db.example.com:5432/tf?sslmode=require&application_name=x"
        );
        assert_eq!(root.unwrap().to_str(), Some("/etc/ca.pem"));
        let (words, root) =
            tls_settings("host=db user=u sslmode=verify-ca sslrootcert=ca.pem").unwrap();
        assert_eq!(words, "host=db user=u sslmode=require");
        assert!(root.is_some());
        assert!(tls_settings("host=db sslcert=c.pem sslkey=k.pem").is_err());
        let (plain, root) = tls_settings("postgres://u@127.0.0.1/tf?sslmode=disable").unwrap();
        assert_eq!(
            (plain.as_str(), root),
            ("postgres://u@127.0.0.1/tf?sslmode=disable", None)
        );
    }
}
