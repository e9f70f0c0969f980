//! PostgreSQL, lent to a guest in the layout of Terraform's `pg` backend.
//!
//! A backend's `conn_str` (its password included) leaves the guest's
//! configuration for the host ([`PgGrant::take`]). The host runs its own
//! statements on `<schema>.states` only: the guest names rows, never SQL.
//! Locks are Terraform's session-level advisory locks ([`locks`]), held by
//! one long-lived session per backend and replica and recorded in
//! `<schema>.wasmstate_locks`, so that a lock taken through one replica is
//! reported and released through any other, and native `terraform`
//! clients and wasmstate clients block each other. Each change also keeps
//! a version in `<schema>.wasmstate_state_versions`, in its own
//! transaction ([`versions`]).

pub mod conditional;
pub mod encoding;
pub mod locks;
pub mod metadata;
mod read;
mod schema;
mod tls;
pub mod versions;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio_postgres::Client;

/// Keys of a backend's `config` table the host takes: the connection
/// string holds the password.
pub const CREDENTIAL_KEYS: &[&str] = &["conn_str"];

/// Idle connections kept per backend for reads and writes.
const MAX_IDLE: usize = 4;
/// How many bytes of a state the first statement of a read fetches, its
/// size admitted beforehand: a small state (most are) comes in one round
/// trip, a larger one after its own size has been admitted.
const FIRST_FETCH: i32 = 64 * 1024;
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The application name of the connections that read and write states
/// (a lock session's is [`locks`]' own).
const POOL_APPLICATION: &str = "wasmstate";

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
    /// Whether `other` keeps its rows where this grant does: the same
    /// hosts, ports, database and schema (what a rotated password or
    /// another connection setting leaves as it is).
    pub fn same_place(&self, other: &PgGrant) -> bool {
        let database = |c: &tokio_postgres::Config| {
            (
                c.get_hosts().to_vec(),
                c.get_ports().to_vec(),
                c.get_dbname().or(c.get_user()).map(str::to_owned),
            )
        };
        self.schema == other.schema && database(&self.config) == database(&other.config)
    }

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
        let (conn_str, root_cert) = tls::settings(&conn_str)?;
        let root_certs = root_cert
            .map(|path| {
                std::fs::read(&path)
                    .map_err(|e| format!("conn_str: sslrootcert {}: {e}", path.display()))
            })
            .transpose()?;
        let mut config: tokio_postgres::Config = conn_str
            .parse()
            .map_err(|e| format!("conn_str: not a PostgreSQL connection string: {e}"))?;
        config.application_name(POOL_APPLICATION);
        config.connect_timeout(CONNECT_TIMEOUT);
        let setting = |name: &str| super::setting(guest_config, name);
        let schema = setting("schema_name").unwrap_or("terraform_remote_state".into());
        let flag = |name: &str| setting(name).is_some_and(|v| v == "true");
        // Like lib/pq, which Terraform uses: TLS unless `sslmode=disable`,
        // and never a fall back to plain text. tokio-postgres' own default
        // (and `sslmode=prefer`) falls back, so `prefer` becomes `require`.
        // The mode is the parsed one: whatever a password or another value
        // holds (the word "sslmode" included) cannot change it.
        use tokio_postgres::config::SslMode;
        let tls = !matches!(config.get_ssl_mode(), SslMode::Disable);
        if matches!(config.get_ssl_mode(), SslMode::Prefer) {
            config.ssl_mode(SslMode::Require);
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
pub struct PgStores(Arc<Registry>);

/// The store in use for each backend, as a store that goes finds its
/// successor ([`locks::LockSession::linger`]).
type Registry = std::sync::Mutex<std::collections::HashMap<String, std::sync::Weak<PgStore>>>;

impl PgStores {
    /// The store of `backend` for `grant`: the one in use when its grant
    /// is the same, else a new one; from now on keeping `history` versions
    /// of each state (the backend's setting, which a reload may change).
    pub fn of(&self, backend: &str, grant: &PgGrant, history: usize) -> Arc<PgStore> {
        let mut stores = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        stores.retain(|_, store| store.strong_count() > 0);
        let replaced = stores.get(backend).and_then(std::sync::Weak::upgrade);
        if let Some(store) = &replaced
            && store.grant == *grant
        {
            store.keep.store(history, Ordering::Relaxed);
            return store.clone();
        }
        let store = PgStore::new(backend, grant);
        store.keep.store(history, Ordering::Relaxed);
        *store
            .registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::downgrade(&self.0);
        stores.insert(backend.to_string(), Arc::downgrade(&store));
        if replaced.is_some() {
            // The replaced store's locks stay with its session until they
            // are released, if this one keeps its rows in the same place
            // ([`locks::LockSession::linger`]); this one
            // starts its sweep now, not at its first request, so a lock
            // whose session is lost meanwhile is taken over in seconds.
            store.start_early();
        }
        // The map first: a replaced store that goes with `replaced` looks
        // its successor up in it.
        drop(stores);
        drop(replaced);
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
    /// Made once per store: which of wasmstate's optional tables are there.
    prepared: tokio::sync::OnceCell<schema::Tables>,
    /// Versions kept of each state (the backend's `history`).
    keep: AtomicUsize,
    locks: locks::LockSession,
    /// The stores of every backend, when this one was made by them.
    registry: std::sync::Mutex<std::sync::Weak<Registry>>,
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // The store now in use for this backend, if any: whether it keeps
        // its locks in the same place decides what becomes of this one's.
        // (`try_lock`: a store can go while [`PgStores::of`] holds the map.)
        let registry = std::mem::take(
            self.registry
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let successor = registry.upgrade().and_then(|registry| {
            let stores = registry.try_lock().ok()?;
            stores.get(&*self.backend)?.upgrade()
        });
        let successor = successor.map(|next| next.grant.same_place(&self.grant));
        self.locks.linger(&self.backend, &self.grant, successor);
    }
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
            keep: AtomicUsize::new(0),
            locks: locks::LockSession::default(),
            registry: std::sync::Mutex::default(),
        })
    }

    /// Versions kept of each state: the backend's `history`.
    fn keep(&self) -> usize {
        self.keep.load(Ordering::Relaxed)
    }

    /// `"schema".table`, quoted.
    fn table(&self, table: &str) -> String {
        format!("{}.{table}", schema::quote(&self.grant.schema))
    }

    /// A connection from the idle ones, or a new one; the schema and
    /// tables made once per store.
    async fn checkout(&self) -> Result<Client, PgError> {
        let client = self.connection().await?;
        self.prepared
            .get_or_try_init(|| schema::prepare(&client, &self.grant))
            .await?;
        self.locks.start_sweep(self);
        Ok(client)
    }

    /// A connection from the idle ones, or a new one, with nothing made.
    async fn connection(&self) -> Result<Client, PgError> {
        let idle = self.idle.lock().expect("not poisoned").pop();
        match idle {
            Some(client) if !client.is_closed() => Ok(client),
            _ => connect(&self.grant, POOL_APPLICATION).await,
        }
    }

    /// Connect, make the tables and start the lock sweep now, in a task.
    fn start_early(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let me = self.me.clone();
        runtime.spawn(async move {
            let Some(store) = me.upgrade() else {
                return;
            };
            match store.checkout().await {
                Ok(client) => store.give_back(client),
                Err(e) => {
                    tracing::warn!(backend = %store.backend, "postgres: connecting after a reload: {e:?}")
                }
            }
        });
    }

    fn give_back(&self, client: Client) {
        let mut idle = self.idle.lock().expect("not poisoned");
        if idle.len() < MAX_IDLE && !client.is_closed() {
            idle.push(client);
        }
    }

    /// The names of the rows of `states` no longer than `max_name` bytes
    /// (longer ones are no workspace's), sorted. `admit` is asked for the
    /// bytes of each name before it is kept (the caller charges them to
    /// its memory budgets, and may refuse): the rows come as a stream, so
    /// no more is held than was admitted.
    pub async fn list_names(
        &self,
        max_name: usize,
        mut admit: impl FnMut(usize) -> Result<(), PgError>,
    ) -> Result<Vec<String>, PgError> {
        use futures_util::TryStreamExt as _;
        let client = self.checkout().await?;
        let sql = format!(
            "SELECT name FROM {} WHERE octet_length(name) <= $1 ORDER BY name",
            self.table("states")
        );
        let max_name = i32::try_from(max_name).unwrap_or(i32::MAX);
        let rows = client.query_raw(sql.as_str(), [max_name]).await?;
        let mut rows = std::pin::pin!(rows);
        let mut names = Vec::new();
        while let Some(row) = rows.try_next().await? {
            let name: String = row.get(0);
            admit(name.len() + std::mem::size_of::<String>())?;
            names.push(name);
        }
        self.give_back(client);
        Ok(names)
    }

    /// Set row `name` to `data` (Terraform's Put; with the record of the
    /// state it holds) if the row is as `expect` says, or delete it
    /// (`None`, with its workspace's metadata), only while the lock rule of
    /// [`locks::LockSession::may_change`] holds; in one transaction with
    /// those checks, so a lock taken or released meanwhile waits for it,
    /// and with the version it makes ([`versions`]), so a version is kept
    /// exactly when its change committed.
    pub async fn change(
        &self,
        name: &str,
        data: Option<(&str, &versions::Meta)>,
        lock_id: Option<&str>,
        expect: &conditional::Expect,
    ) -> Result<Option<locks::Refusal>, PgError> {
        // A delete under a lock drives the lock session (it takes and
        // releases advisory keys): to completion in a task of its own, as
        // the lock operations, so that a request that gives up cannot
        // leave the server holding a key the session never recorded, or
        // the session recording one the server released.
        if data.is_none()
            && let Some(id) = lock_id
        {
            let (name, id) = (name.to_string(), id.to_string());
            let any = conditional::Expect::Any;
            return self
                .locking(move |store| async move {
                    store.change_now(&name, None, Some(&id), &any).await
                })
                .await;
        }
        self.change_now(name, data, lock_id, expect).await
    }

    /// [`PgStore::change`], in the caller's future.
    async fn change_now(
        &self,
        name: &str,
        data: Option<(&str, &versions::Meta)>,
        lock_id: Option<&str>,
        expect: &conditional::Expect,
    ) -> Result<Option<locks::Refusal>, PgError> {
        // A delete under a lock moves the lock onto the creation key
        // ([`locks::Session::keep_through_delete`]) through this replica's
        // lock session, held from before the transaction to after it, so
        // that its sweep cannot release that key between the take and the
        // commit. (No transaction waits for the session: this is the only
        // path that holds both, and it takes the session first.)
        let mut session = match (data, lock_id) {
            (None, Some(_)) => Some(self.locks.session(self).await?),
            _ => None,
        };
        let mut client = self.checkout().await?;
        let result = async {
            let tx = client.transaction().await?;
            if let Some(refusal) = self.locks.may_change(self, &tx, name, lock_id).await? {
                return Ok(Some(refusal));
            }
            if let Some(guard) = session.as_mut()
                && let Some(refusal) = guard
                    .as_mut()
                    .expect("connected")
                    .keep_through_delete(&tx, name)
                    .await?
            {
                return Ok(Some(refusal));
            }
            match data {
                Some((data, meta)) => {
                    if !self.put(&tx, name, data, expect).await? {
                        return Ok(Some(locks::Refusal::Changed));
                    }
                    self.record_version(&tx, name, Some(meta)).await?;
                }
                None => {
                    let sql = format!("DELETE FROM {} WHERE name = $1", self.table("states"));
                    // A delete of nothing (a retry) marks nothing. Without
                    // its row the workspace is gone (Terraform lists rows),
                    // and so is its metadata.
                    if tx.execute(&sql, &[&name]).await? > 0 {
                        self.record_version(&tx, name, None).await?;
                        self.remove_metadata(&tx, name).await?;
                    }
                }
            }
            tx.commit().await?;
            Ok(None)
        }
        .await;
        if result.is_ok() {
            self.give_back(client);
        }
        if let Some(session) = session.as_mut().and_then(|guard| guard.as_mut())
            && let Err(e) = session.release_unneeded().await
        {
            // The sweep releases them in a second.
            tracing::warn!(backend = %self.backend, "postgres: releasing keys after a delete: {e:?}");
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
        let tls = tokio_postgres_rustls::MakeRustlsConnect::new(tls::config(grant)?);
        let (client, connection) = config.connect(tls).await?;
        tokio::spawn(connection);
        Ok(client)
    } else {
        let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        Ok(client)
    }
}

#[cfg(test)]
mod tests {
    use super::PgGrant;

    fn grant(conn_str: &str, schema: &str) -> PgGrant {
        let mut config = vec![
            ("conn_str".to_string(), conn_str.to_string()),
            ("schema_name".to_string(), schema.to_string()),
        ];
        PgGrant::take(true, &mut config).unwrap().unwrap()
    }

    /// A replaced store's session keeps its keys only for a successor that
    /// finds the same rows: a rotated password or another setting keeps
    /// the place; another database, host, port or schema does not.
    #[test]
    fn only_the_same_database_and_schema_is_the_same_place() {
        let base = grant("postgres://u:old@db:5432/tf?sslmode=disable", "s");
        let same = |conn: &str, schema: &str| base.same_place(&grant(conn, schema));
        assert!(same("postgres://u:new@db:5432/tf?sslmode=disable", "s"));
        assert!(same(
            "postgres://u:old@db:5432/tf?sslmode=disable&keepalives_idle=120",
            "s"
        ));
        assert!(!same("postgres://u:old@db:5432/tf?sslmode=disable", "t"));
        assert!(!same("postgres://u:old@db:5432/other?sslmode=disable", "s"));
        assert!(!same("postgres://u:old@db2:5432/tf?sslmode=disable", "s"));
        assert!(!same("postgres://u:old@db:5433/tf?sslmode=disable", "s"));
    }
}
