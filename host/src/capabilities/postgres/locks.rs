//! Locks that Terraform's pg backend and wasmstate's replicas all honour.
//!
//! Terraform locks a workspace with a session-level advisory lock on its
//! row's id (on `-1` while the workspace has no row, which also blocks
//! every other lock taker: "locked for workspace creation"), and stores
//! nothing else. A wasmstate lock is the same advisory lock, held by one
//! long-lived session per backend and replica (application name
//! `wasmstate-lock`), plus a row in `wasmstate_locks` (name, key, lock
//! info, holding session). The row is the lock for wasmstate: any replica
//! reads it to report the holder and deletes it to unlock. The advisory
//! lock is what native clients see; each replica keeps it exactly while a
//! row says its session holds it:
//!
//! - unlocking through another replica deletes the row; the holding
//!   replica's sweep (every second) sees it gone and releases the key;
//! - a replica that died lost its session and so its advisory locks; every
//!   replica that serves the backend sweeps every second, and the first to
//!   see a row whose holder does not hold its key (in `pg_locks`, which
//!   every role may read) takes the key, then the row;
//! - a write under a lock is accepted only while the row's holder holds
//!   its key, and an unlocked write takes the keys for its transaction, so
//!   neither can slip past a lock another client holds;
//! - the key follows the workspace's row as a native client's attempt
//!   would: a lock is taken on the key looked up, then the lookup is made
//!   again (a row deleted or created between the two starts it over), and
//!   a delete under the lock moves the lock onto `-1` before the row goes
//!   ([`Session::keep_through_delete`]), where it stays whatever rows are
//!   written next (a native client that finds a row tries its id and
//!   `-1`, so `-1` alone keeps it out, as it does behind a native holder);
//! - a store that goes away (a reload that changed its `conn_str`) leaves
//!   its session holding the keys rows still name until each row goes, for
//!   an hour at most, when its successor keeps its rows in the same
//!   database and schema; else it lets them go at once and logs which
//!   locks it leaves ([`LockSession::linger`]).
//!
//! Lock operations run to completion in a task of their own: a request
//! that gives up mid-way cannot leave a key held that no row accounts for.

mod holders;
mod moves;

use holders::{holds, native_holder};
pub use moves::LINGER_MOST;

use super::{Holder, PgError, PgStore};
use std::collections::HashSet;
use std::time::Duration;
use tokio_postgres::{Client, GenericClient};

/// The key Terraform's pg backend locks while a workspace has no row.
const CREATION_KEY: i64 = -1;
/// The application name of the sessions that hold wasmstate's locks.
const APPLICATION: &str = "wasmstate-lock";
/// How often a replica releases keys whose rows are gone.
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// How long a lock taker waits for a key another replica is releasing.
const RELEASE_WAIT: &str = "3s";

/// One backend's lock-holding session on this replica.
#[derive(Default)]
pub struct LockSession {
    inner: tokio::sync::Mutex<Option<Session>>,
    sweeping: std::sync::atomic::AtomicBool,
}

/// Whether the session `holder` (`pid@…`) holds advisory lock `key`, as
/// SQL over a row `w` of `wasmstate_locks`.
const HOLDER_HOLDS_KEY: &str = "EXISTS (SELECT 1 FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = ((w.key >> 32) & 4294967295)::bigint::oid
      AND l.objid = (w.key & 4294967295)::bigint::oid
      AND l.pid = split_part(w.holder, '@', 1)::int)";

pub(super) struct Session {
    client: Client,
    /// `pid@backend_start`: this session, as rows name their holder.
    me: String,
    /// Advisory keys this session holds (each once).
    mine: HashSet<i64>,
    /// `wasmstate_locks`, quoted with its schema.
    table: String,
}

/// A row of `wasmstate_locks`.
struct LockRow {
    key: i64,
    info: serde_json::Value,
    holder: String,
}

fn lock_id(info: &serde_json::Value) -> &str {
    info.get("ID").and_then(|v| v.as_str()).unwrap_or_default()
}

impl LockSession {
    /// The session, connected (again, if it was lost: its locks went with
    /// it, and rows naming it are taken over like a dead replica's).
    pub(super) async fn session(
        &self,
        store: &PgStore,
    ) -> Result<tokio::sync::MutexGuard<'_, Option<Session>>, PgError> {
        let mut guard = self.inner.lock().await;
        if guard.as_ref().is_none_or(|s| s.client.is_closed()) {
            let previous = guard.take().map(|s| s.me);
            // Keepalives, so a connection that died on the way is noticed
            // in seconds, not hours: its keys would be stranded meanwhile.
            let mut grant = store.grant.clone();
            grant
                .config
                .keepalives(true)
                .keepalives_idle(Duration::from_secs(10))
                .keepalives_interval(Duration::from_secs(5))
                .keepalives_retries(3)
                .tcp_user_timeout(Duration::from_secs(30));
            let client = super::connect(&grant, APPLICATION).await?;
            let me: String = client
                .query_one(
                    "SELECT pg_backend_pid()::text || '@' || backend_start::text FROM pg_stat_activity WHERE pid = pg_backend_pid()",
                    &[],
                )
                .await?
                .get(0);
            // A session this replica lost may still be alive at the server
            // (a half-open connection), holding keys nobody will release:
            // end it (a role may end its own sessions), so its rows are
            // taken over.
            if let Some(previous) = previous {
                let _ = moves::end_session(&client, &previous).await;
            }
            *guard = Some(Session {
                client,
                me,
                mine: HashSet::new(),
                table: store.table("wasmstate_locks"),
            });
        }
        Ok(guard)
    }

    /// Lock `name` for `info`: `None` when taken, else who holds it.
    pub async fn lock(
        &self,
        store: &PgStore,
        name: &str,
        info: serde_json::Value,
    ) -> Result<Option<Holder>, PgError> {
        let mut guard = self.session(store).await?;
        let session = guard.as_mut().expect("connected");
        session.lock(store, name, &info).await
    }

    /// Who holds `name`'s lock, if anyone.
    pub async fn holder(&self, store: &PgStore, name: &str) -> Result<Option<Holder>, PgError> {
        let mut guard = self.session(store).await?;
        let session = guard.as_mut().expect("connected");
        if let Some(row) = session.row(store, name).await? {
            session.keep_alive(store, name, &row).await?;
            return Ok(Some(Holder::Wasmstate(row.info)));
        }
        let key = key_of(&session.client, store, name).await?;
        native_holder(&session.client, key).await
    }

    /// Release `name`'s lock if held with `id` (any wasmstate lock when
    /// `force`): `None` when released or not held, else who holds it.
    pub async fn unlock(
        &self,
        store: &PgStore,
        name: &str,
        id: &str,
        force: bool,
    ) -> Result<Option<Holder>, PgError> {
        let mut guard = self.session(store).await?;
        let session = guard.as_mut().expect("connected");
        let Some(row) = session.row(store, name).await? else {
            let key = key_of(&session.client, store, name).await?;
            return native_holder(&session.client, key).await;
        };
        if lock_id(&row.info) != id && !force {
            return Ok(Some(Holder::Wasmstate(row.info)));
        }
        // Only the lock that was read: a new one taken meanwhile stays.
        let deleted = session
            .client
            .execute(
                &format!(
                    "DELETE FROM {} WHERE name = $1 AND info = $2",
                    store.table("wasmstate_locks")
                ),
                &[&name, &row.info],
            )
            .await?;
        if deleted == 0 {
            return Ok(session
                .row(store, name)
                .await?
                .map(|r| Holder::Wasmstate(r.info)));
        }
        if row.holder == session.me {
            session.release_if_unneeded(row.key).await?;
        }
        // Otherwise the holding replica's sweep releases the key.
        Ok(None)
    }

    /// Whether a write or delete of `name` under `lock_id` may go ahead in
    /// transaction `tx` (which then holds the lock's row until it ends, so
    /// the lock cannot change under the write): `None` if so, else why not.
    pub async fn may_change(
        &self,
        store: &PgStore,
        tx: &tokio_postgres::Transaction<'_>,
        name: &str,
        lock: Option<&str>,
    ) -> Result<Option<Refusal>, PgError> {
        // Typed statements: each parsed, bound and run in one round trip.
        use tokio_postgres::types::Type;
        let row = tx
            .query_typed_opt(
                &format!(
                    "SELECT w.info, {HOLDER_HOLDS_KEY} FROM {} w WHERE w.name = $1 FOR SHARE",
                    store.table("wasmstate_locks")
                ),
                &[(&name, Type::TEXT)],
            )
            .await?;
        let row: Option<(serde_json::Value, bool)> = row.map(|r| (r.get(0), r.get(1)));
        match (row, lock) {
            (Some((info, held)), Some(id)) if lock_id(&info) == id => {
                if held {
                    return Ok(None);
                }
                // Its replica stopped and no other has taken the key over
                // yet (or a native client took it meanwhile): not a lock
                // to write under until the sweep settles it.
                let key = key_of(tx, store, name).await?;
                match native_holder(tx, key).await? {
                    Some(native) => Ok(Some(Refusal::Held(native))),
                    None => Err(PgError::Unavailable(format!(
                        "the lock of {name} is being taken over after its replica stopped; retry"
                    ))),
                }
            }
            (Some((info, _)), _) => Ok(Some(Refusal::Held(Holder::Wasmstate(info)))),
            (None, Some(_)) => Ok(Some(Refusal::NotLocked)),
            (None, None) => {
                // The keys for this transaction, looked up and taken in one
                // statement: a lock anyone holds (or takes before the
                // commit) and this write exclude each other. Shared: other
                // unlocked writes, of this workspace or any other, go
                // ahead together, ordered by the row's own locking (a
                // conditional write re-checks its version on the row a
                // concurrent one committed), instead of one being told the
                // workspace is locked.
                let row = tx
                    .query_typed_one(
                        &format!(
                            "SELECT k, pg_try_advisory_xact_lock_shared(k)
                                 AND (k = {CREATION_KEY} OR pg_try_advisory_xact_lock_shared({CREATION_KEY}))
                             FROM (SELECT coalesce((SELECT id FROM {} WHERE name = $1), {CREATION_KEY}) AS k) keys",
                            store.table("states")
                        ),
                        &[(&name, Type::TEXT)],
                    )
                    .await?;
                let (key, free): (i64, bool) = (row.get(0), row.get(1));
                if free {
                    return Ok(None);
                }
                Ok(Some(Refusal::Held(
                    native_holder(tx, key).await?.unwrap_or(Holder::Native(
                        "a lock is being taken or released; retry".into(),
                    )),
                )))
            }
        }
    }

    /// Start this replica's sweep of `store`'s locks, once: every second
    /// while the store lives.
    pub fn start_sweep(&self, store: &PgStore) {
        use std::sync::atomic::Ordering;
        if self.sweeping.swap(true, Ordering::SeqCst) {
            return;
        }
        let weak = store.me.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SWEEP_EVERY).await;
                let Some(store) = weak.upgrade() else {
                    return;
                };
                if let Err(e) = store.locks.sweep(&store).await {
                    tracing::warn!(backend = %store.backend, "postgres lock sweep: {e:?}");
                }
            }
        });
    }

    /// Release keys whose rows are gone; take over rows whose holding
    /// session died. Whether this replica still holds a key.
    async fn sweep(&self, store: &PgStore) -> Result<bool, PgError> {
        let mut guard = self.session(store).await?;
        let session = guard.as_mut().expect("connected");
        for key in session.mine.clone() {
            session.release_if_unneeded(key).await?;
        }
        let rows = session
            .client
            .query(
                &format!(
                    "SELECT name, key, info, holder FROM {}",
                    store.table("wasmstate_locks")
                ),
                &[],
            )
            .await?;
        for row in rows {
            let lock = LockRow {
                key: row.get(1),
                info: row.get(2),
                holder: row.get(3),
            };
            let name: String = row.get(0);
            session.keep_alive(store, &name, &lock).await?;
        }
        Ok(!session.mine.is_empty())
    }
}

/// Why a write or delete did not happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Someone else holds the lock.
    Held(Holder),
    /// A lock id was given, but nobody holds the lock.
    NotLocked,
    /// The row is not as the write expected ([`super::conditional::Expect`]).
    Changed,
}

impl Session {
    async fn row(&self, store: &PgStore, name: &str) -> Result<Option<LockRow>, PgError> {
        let row = self
            .client
            .query_opt(
                &format!(
                    "SELECT key, info, holder FROM {} WHERE name = $1",
                    store.table("wasmstate_locks")
                ),
                &[&name],
            )
            .await?;
        Ok(row.map(|r| LockRow {
            key: r.get(0),
            info: r.get(1),
            holder: r.get(2),
        }))
    }

    async fn try_lock(&mut self, key: i64) -> Result<bool, PgError> {
        if self.mine.contains(&key) {
            return Ok(true);
        }
        let got: bool = self
            .client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&key])
            .await?
            .get(0);
        if got {
            self.mine.insert(key);
        }
        Ok(got)
    }

    /// Release `key` unless a row says this session holds it.
    async fn release_if_unneeded(&mut self, key: i64) -> Result<(), PgError> {
        if !self.mine.contains(&key) {
            return Ok(());
        }
        let needed: bool = self
            .client
            .query_one(
                &format!(
                    "SELECT EXISTS (SELECT 1 FROM {} WHERE key = $1 AND holder = $2)",
                    self.table
                ),
                &[&key, &self.me],
            )
            .await?
            .get(0);
        if !needed {
            self.client
                .query_one("SELECT pg_advisory_unlock($1)", &[&key])
                .await?;
            self.mine.remove(&key);
        }
        Ok(())
    }

    /// A row whose holder does not hold its key (its session died, or a
    /// request gave up between taking the row and the key): this session
    /// takes the key, then the row.
    async fn keep_alive(
        &mut self,
        store: &PgStore,
        name: &str,
        row: &LockRow,
    ) -> Result<(), PgError> {
        if row.holder == self.me && self.mine.contains(&row.key) {
            return Ok(());
        }
        if row.holder != self.me && holds(&self.client, &row.holder, row.key).await? {
            return Ok(());
        }
        let had = self.mine.contains(&row.key);
        if !self.try_lock(row.key).await? {
            tracing::error!(
                backend = %store.backend,
                "the lock of {name} outlived its replica, and another client took advisory lock {} meanwhile; writes under the lock are refused until that client lets go",
                row.key
            );
            return Ok(());
        }
        let updated = self
            .client
            .execute(
                &format!(
                    "UPDATE {} SET holder = $3 WHERE name = $1 AND holder = $2",
                    store.table("wasmstate_locks")
                ),
                &[&name, &row.holder, &self.me],
            )
            .await?;
        if updated == 0 && !had {
            self.release_if_unneeded(row.key).await?;
        }
        Ok(())
    }

    async fn lock(
        &mut self,
        store: &PgStore,
        name: &str,
        info: &serde_json::Value,
    ) -> Result<Option<Holder>, PgError> {
        for _ in 0..3 {
            if let Some(row) = self.row(store, name).await? {
                self.keep_alive(store, name, &row).await?;
                return Ok(Some(Holder::Wasmstate(row.info)));
            }
            let key = key_of(&self.client, store, name).await?;
            let had = self.mine.contains(&key);
            if !self.try_lock(key).await? {
                if let Some(native) = native_holder(&self.client, key).await? {
                    return Ok(Some(native));
                }
                if key == CREATION_KEY {
                    return Ok(Some(Holder::Native(
                        "a workspace of this database (this one or another) is being created through another wasmstate replica; retry when it is written".into(),
                    )));
                }
                // Another replica is releasing it (its row is gone).
                self.wait_for(key).await?;
            }
            // As Terraform: a workspace being created anywhere blocks.
            if key != CREATION_KEY && !self.mine.contains(&CREATION_KEY) {
                if !self.try_lock(CREATION_KEY).await? {
                    if !had {
                        self.release_if_unneeded(key).await?;
                    }
                    return Ok(Some(
                        native_holder(&self.client, CREATION_KEY)
                            .await?
                            .unwrap_or(Holder::Native(
                                "a workspace is being created; retry".into(),
                            )),
                    ));
                }
                self.release_if_unneeded(CREATION_KEY).await?;
            }
            // Lock, then verify: the row looked up may have been deleted
            // meanwhile (its id is then nobody's key: a native client
            // takes -1) or created (a native client tries its id). While
            // this key is held no unlocked change can move the row (it
            // takes the same keys), so a lookup that still agrees stays
            // true until the lock's row is in.
            if key_of(&self.client, store, name).await? != key {
                if !had {
                    self.release_if_unneeded(key).await?;
                }
                continue;
            }
            let inserted = self
                .client
                .execute(
                    &format!(
                        "INSERT INTO {} (name, key, info, holder) VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO NOTHING",
                        store.table("wasmstate_locks")
                    ),
                    &[&name, &key, info, &self.me],
                )
                .await?;
            if inserted == 1 {
                return Ok(None);
            }
            // Another replica's lock won the row: look again.
            self.release_if_unneeded(key).await?;
        }
        Err(PgError::Unavailable(format!(
            "the lock of {name} keeps changing; retry"
        )))
    }

    /// Wait (briefly) for `key`, which another wasmstate session is
    /// releasing; queued behind it, so no native client can slip between.
    async fn wait_for(&mut self, key: i64) -> Result<(), PgError> {
        self.client
            .batch_execute(&format!("SET lock_timeout = '{RELEASE_WAIT}'"))
            .await?;
        let waited = self
            .client
            .query_one("SELECT pg_advisory_lock($1)", &[&key])
            .await;
        self.client.batch_execute("RESET lock_timeout").await?;
        match waited {
            Ok(_) => {
                self.mine.insert(key);
                Ok(())
            }
            Err(_) => Err(PgError::Unavailable(
                "a lock another replica is releasing was not released in time; retry".into(),
            )),
        }
    }
}

/// The advisory key of `name`: its row's id, or `-1` without a row.
async fn key_of(client: &impl GenericClient, store: &PgStore, name: &str) -> Result<i64, PgError> {
    let row = client
        .query_opt(
            &format!("SELECT id FROM {} WHERE name = $1", store.table("states")),
            &[&name],
        )
        .await?;
    Ok(row.map_or(CREATION_KEY, |r| r.get(0)))
}
