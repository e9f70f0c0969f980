//! Keeping a lock held where a native client would look for it when its
//! workspace's row goes, and when the store holding it goes.

use super::{CREATION_KEY, LockSession, Refusal, SWEEP_EVERY, Session, native_holder};
use crate::capabilities::postgres::{POOL_APPLICATION, PgError, PgGrant};
use std::time::Duration;
use tokio_postgres::Client;

impl Session {
    /// Before the row of `name` is deleted under its lock, in `tx` (which
    /// holds the lock's row `FOR SHARE`, [`LockSession::may_change`]): a
    /// native client that finds no row locks `-1`, so the lock moves onto
    /// `-1`, taken by this session, before the row goes. The key it had
    /// was the deleted row's id, which no client asks for again; it is
    /// released once no row names it (here after the commit, or by the
    /// holding replica's sweep). `-1` then stays held until the unlock,
    /// whatever rows are written meanwhile: a native client finding the
    /// new row tries its id and `-1` both, as it does behind a native
    /// holder that created the workspace.
    ///
    /// Refused while another client holds `-1` (a workspace being created
    /// somewhere in the database): the row stays, and so does the lock.
    pub(in crate::capabilities::postgres) async fn keep_through_delete(
        &mut self,
        tx: &tokio_postgres::Transaction<'_>,
        name: &str,
    ) -> Result<Option<Refusal>, PgError> {
        let key: i64 = tx
            .query_one(
                &format!("SELECT key FROM {} WHERE name = $1", self.table),
                &[&name],
            )
            .await?
            .get(0);
        if key == CREATION_KEY {
            // Its holder holds -1 already, which no row change affects.
            return Ok(None);
        }
        if !self.try_lock(CREATION_KEY).await? {
            return match native_holder(&self.client, CREATION_KEY).await? {
                Some(native) => Ok(Some(Refusal::Held(native))),
                None => Err(PgError::Unavailable(
                    "another workspace of this database is locked while it has no state \
                     (PostgreSQL advisory lock -1, as Terraform's pg backend takes it); \
                     this state can be deleted under its lock once that lock is released; retry"
                        .into(),
                )),
            };
        }
        tx.execute(
            &format!(
                "UPDATE {} SET key = $2, holder = $3 WHERE name = $1",
                self.table
            ),
            &[&name, &CREATION_KEY, &self.me],
        )
        .await?;
        Ok(None)
    }

    /// Release every key this session holds that no row names it the
    /// holder of (after a delete under a lock: the deleted row's id, or
    /// `-1` when the delete did not commit).
    pub(in crate::capabilities::postgres) async fn release_unneeded(
        &mut self,
    ) -> Result<(), PgError> {
        for key in self.mine.clone() {
            self.release_if_unneeded(key).await?;
        }
        Ok(())
    }
}

impl LockSession {
    /// Its store is going (a reload gave the backend another grant, or
    /// removed it). Dropped with its store, the session would free every
    /// key at once, and native clients could take them while wasmstate's
    /// clients still hold the locks; so, when it holds keys, it is kept in
    /// a task of its own:
    ///
    /// - `successor` keeps its rows in the same place (`Some(true)`: the
    ///   same database and schema, as a rotated password leaves them), or
    ///   no store replaced this one (`None`: the backend was removed, or
    ///   its reload failed): the session releases each key once no row
    ///   names it (an unlock through any replica or the new store), for at
    ///   most [`LINGER_MOST`]; then it lets go of the rest, and says which
    ///   locks (the successor's sweep takes them over within a second);
    /// - the successor keeps its rows elsewhere (`Some(false)`): no unlock
    ///   through it can reach these rows, so the keys are released now and
    ///   the log names the locks left in the old table;
    /// - the connection is lost: the server may still hold the keys (a
    ///   half-open connection), so that session is ended from a new one.
    pub(in crate::capabilities::postgres) fn linger(
        &mut self,
        backend: &str,
        grant: &PgGrant,
        successor: Option<bool>,
    ) {
        let Some(mut session) = self.inner.get_mut().take() else {
            return;
        };
        if session.mine.is_empty() {
            return;
        }
        // Outside a runtime (the server is ending) the keys go with it.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (backend, grant) = (backend.to_string(), grant.clone());
        runtime.spawn(async move {
            if session.client.is_closed() {
                return end_lost(&backend, &grant, &session.me).await;
            }
            if successor == Some(false) {
                let why = "the backend now keeps its states in another database or schema";
                return session.let_go(&backend, why, "").await;
            }
            tracing::info!(
                backend = %backend,
                keys = session.mine.len(),
                "postgres: the lock session of the replaced store keeps its locks until they are released"
            );
            let until = tokio::time::Instant::now() + LINGER_MOST;
            while !session.mine.is_empty()
                && !session.client.is_closed()
                && tokio::time::Instant::now() < until
            {
                tokio::time::sleep(SWEEP_EVERY).await;
                if let Err(e) = session.release_unneeded().await {
                    tracing::warn!(backend = %backend, "postgres lock sweep (replaced store): {e:?}");
                }
            }
            if session.mine.is_empty() {
                return;
            }
            if session.client.is_closed() {
                return end_lost(&backend, &grant, &session.me).await;
            }
            let why = format!(
                "the store it served was replaced or removed {} min ago",
                LINGER_MOST.as_secs() / 60
            );
            let next = if successor.is_some() {
                "; the backend's store now in use takes them over within a second"
            } else {
                ""
            };
            session.let_go(&backend, &why, next).await;
        });
    }
}

/// How long the lock session of a replaced store keeps the keys its rows
/// name at most.
pub const LINGER_MOST: Duration = Duration::from_secs(3600);

impl Session {
    /// End the session (its keys go with it), saying in the log which
    /// locks its rows still record and why they are let go.
    async fn let_go(self, backend: &str, why: &str, next: &str) {
        let names = self
            .client
            .query(
                &format!(
                    "SELECT name FROM {} WHERE holder = $1 ORDER BY name",
                    self.table
                ),
                &[&self.me],
            )
            .await
            .map(|rows| {
                rows.iter()
                    .map(|r| r.get::<_, String>(0))
                    .collect::<Vec<_>>()
            });
        let names = match names {
            Ok(names) if names.is_empty() => "none".to_string(),
            Ok(names) => names.join(", "),
            Err(e) => format!("unknown ({e})"),
        };
        tracing::error!(
            backend = %backend,
            "postgres: {why}: the lock session of the store that went releases its advisory locks {:?}; \
             the locks still recorded in {} ({names}) no longer keep native Terraform clients out{next}; \
             unlock them (force-unlock, or delete their rows) once their runs have ended",
            self.mine,
            self.table,
        );
    }
}

/// A lock session's connection was lost while it held keys: end it at
/// the server (a role may end its own sessions), which may still hold
/// them for a half-open connection.
async fn end_lost(backend: &str, grant: &PgGrant, me: &str) {
    let ended = async {
        let client = crate::capabilities::postgres::connect(grant, POOL_APPLICATION).await?;
        end_session(&client, me).await
    };
    if let Err(e) = ended.await {
        tracing::error!(
            backend = %backend,
            "postgres: the lock session {me} of a replaced store was lost, and ending it failed ({e:?}); its advisory locks stay until the server notices"
        );
    }
}

/// End session `me` (`pid@backend_start`) at the server, if it is still
/// there.
pub(super) async fn end_session(client: &Client, me: &str) -> Result<(), PgError> {
    let Some((pid, start)) = me.split_once('@') else {
        return Ok(());
    };
    let Ok(pid) = pid.parse::<i32>() else {
        return Ok(());
    };
    client
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1 AND backend_start::text = $2",
            &[&pid, &start],
        )
        .await?;
    Ok(())
}
