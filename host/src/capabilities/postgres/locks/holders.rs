//! Who holds an advisory key, as `pg_locks` tells it.

use super::{APPLICATION, CREATION_KEY};
use crate::capabilities::postgres::{Holder, POOL_APPLICATION, PgError};
use tokio_postgres::{Client, GenericClient};

/// A session other than a wasmstate lock session holding advisory lock
/// `key` or the creation key: a native Terraform client, or a wasmstate
/// replica's write that holds the keys for its transaction (an unlocked
/// write, [`super::LockSession::may_change`]), each told as what it is.
/// A native client is reported first when both hold one of the two keys.
pub(super) async fn native_holder(
    client: &impl GenericClient,
    key: i64,
) -> Result<Option<Holder>, PgError> {
    let row = client
        .query_opt(
            "SELECT * FROM (
             SELECT l.pid, (l.objid::bigint | (l.classid::bigint << 32))::bigint AS k,
                    a.client_addr::text AS addr, a.application_name = $4 AS ours
             FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND l.classid = (($1::bigint >> 32) & 4294967295)::bigint::oid
               AND l.objid = ($1::bigint & 4294967295)::bigint::oid
               AND a.application_name <> $3
             UNION ALL
             SELECT l.pid, -1, a.client_addr::text, a.application_name = $4
             FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND l.classid = 4294967295::bigint::oid AND l.objid = 4294967295::bigint::oid
               AND a.application_name <> $3 AND $2
             ) h ORDER BY ours LIMIT 1",
            &[
                &key,
                &(key != CREATION_KEY),
                &APPLICATION,
                &POOL_APPLICATION,
            ],
        )
        .await?;
    Ok(row.map(|r| {
        let pid: i32 = r.get(0);
        let k: i64 = r.get(1);
        let from: Option<String> = r.get(2);
        let ours: bool = r.get(3);
        if ours {
            // Held for one transaction only: a retry finds it free.
            return Holder::Native(format!(
                "a write through a wasmstate replica holds advisory lock {k} for its transaction \
                 (database session {pid}); retry in a moment"
            ));
        }
        let what = if k == CREATION_KEY {
            "locked for workspace creation"
        } else {
            "locked"
        };
        Holder::Native(format!(
            "{what} by a Terraform pg backend client (database session {pid}{}, advisory lock {k}); it is released when that client unlocks or ends",
            from.map(|f| format!(" from {f}")).unwrap_or_default()
        ))
    }))
}

/// Whether the session `holder` (`pid@backend_start`) holds advisory lock
/// `key`: what "alive" means for a lock's holder (`pg_locks` is readable by
/// every role, unlike other roles' `pg_stat_activity` details).
pub(super) async fn holds(client: &Client, holder: &str, key: i64) -> Result<bool, PgError> {
    let Some(Ok(pid)) = holder.split_once('@').map(|(pid, _)| pid.parse::<i32>()) else {
        return Ok(false);
    };
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_locks l
               WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.pid = $1
                 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                 AND l.classid = (($2::bigint >> 32) & 4294967295)::bigint::oid
                 AND l.objid = ($2::bigint & 4294967295)::bigint::oid)",
            &[&pid, &key],
        )
        .await?
        .get(0))
}
