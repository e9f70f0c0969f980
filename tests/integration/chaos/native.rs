//! A native Terraform client beside wasmstate on the same storage: it
//! takes and releases the workspace locks exactly as Terraform's own
//! backend does, straight on the storage, and records them in the history
//! as a lock holder of its own (host [`NATIVE`]). wasmstate promises that
//! its locks and a native client's exclude each other, so the checker's
//! rule of one holder at a time counts the native one too.
//!
//! It only locks: under encryption a state it wrote in the clear would be
//! refused by every host (as it must), so its "apply" is the time it holds
//! the lock.

use super::history::{NATIVE, Op, Outcome, Recorder};
use crate::common::Rng;
use std::time::{Duration, Instant};

/// Which native backend, and where its storage is.
#[derive(Clone)]
pub enum Native {
    /// Terraform's `backend "pg"`: session-level advisory locks on the
    /// workspace row's id, on `-1` while it has no row (client.go Lock).
    Pg {
        /// The database, as `conn_str`.
        conn_str: String,
        /// `schema_name` (Terraform's default `terraform_remote_state`).
        schema: String,
    },
    /// Terraform's `backend "s3"` with `use_lockfile = true`: the lock is
    /// `<state key>.tflock`, put with `If-None-Match: *`, deleted to unlock.
    S3LockFile {
        /// The S3 endpoint (moto, not the fault proxy: the native client
        /// is not under test).
        s3: String,
        bucket: String,
        /// The state key (`key`), under `env:/<workspace>/`.
        key: String,
    },
}

/// How a native client holds a lock.
enum Held {
    /// The advisory key, on this session.
    Pg(i64),
    /// The lock object's URL and the ETag of the lock file it wrote.
    S3(String, String),
}

/// The storage side of a native client.
enum Session {
    Pg {
        runtime: tokio::runtime::Runtime,
        client: tokio_postgres::Client,
        schema: String,
    },
    S3 {
        http: reqwest::blocking::Client,
        s3: String,
        bucket: String,
        key: String,
    },
}

impl Session {
    fn open(native: &Native) -> Result<Session, String> {
        match native {
            Native::Pg { conn_str, schema } => {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                let (client, connection) = runtime
                    .block_on(tokio_postgres::connect(conn_str, tokio_postgres::NoTls))
                    .map_err(|e| format!("native pg client cannot connect: {e}"))?;
                // Driven whenever the runtime runs a query: one session,
                // as one `terraform` process's lock is.
                runtime.spawn(async move {
                    let _ = connection.await;
                });
                Ok(Session::Pg {
                    runtime,
                    client,
                    schema: schema.clone(),
                })
            }
            Native::S3LockFile { s3, bucket, key } => Ok(Session::S3 {
                http: reqwest::blocking::Client::builder()
                    .timeout(Duration::from_secs(30))
                    .build()
                    .unwrap(),
                s3: s3.clone(),
                bucket: bucket.clone(),
                key: key.clone(),
            }),
        }
    }

    /// Terraform's Lock: `Ok(Some)` held, `Ok(None)` held by someone else,
    /// `Err` the storage failed (or, for pg, has no table yet).
    fn lock(&self, workspace: &str, id: &str) -> Result<Option<Held>, String> {
        match self {
            Session::Pg {
                runtime,
                client,
                schema,
            } => runtime.block_on(async {
                let e = |e: tokio_postgres::Error| e.to_string();
                // client.go: the row's key and the creation key at once.
                let rows = client
                    .query(
                        &format!(
                            "SELECT states.id, pg_try_advisory_lock(states.id), pg_try_advisory_lock(-1) \
                             FROM {schema}.states WHERE states.name = $1"
                        ),
                        &[&workspace],
                    )
                    .await
                    .map_err(e)?;
                let unlock = |key: i64| async move {
                    client
                        .query("SELECT pg_advisory_unlock($1)", &[&key])
                        .await
                        .map(|_| ())
                };
                let Some(row) = rows.first() else {
                    // No row: the workspace is being created; key -1 alone.
                    let row = client
                        .query_one("SELECT pg_try_advisory_lock(-1)", &[])
                        .await
                        .map_err(e)?;
                    return Ok(row.get::<_, bool>(0).then_some(Held::Pg(-1)));
                };
                let (key, row_locked, create_locked): (i64, bool, bool) =
                    (row.get(0), row.get(1), row.get(2));
                if !row_locked {
                    // "Workspace is already locked".
                    if create_locked {
                        unlock(-1).await.map_err(e)?;
                    }
                    return Ok(None);
                }
                if !create_locked {
                    // "already locked for workspace creation".
                    unlock(key).await.map_err(e)?;
                    return Ok(None);
                }
                unlock(-1).await.map_err(e)?;
                Ok(Some(Held::Pg(key)))
            }),
            Session::S3 {
                http,
                s3,
                bucket,
                key,
            } => {
                let url = format!("{s3}/{bucket}/env:/{workspace}/{key}.tflock");
                let answer = http
                    .put(&url)
                    .header("If-None-Match", "*")
                    .header("Content-Type", "application/json")
                    .header("Authorization", moto_auth())
                    .body(crate::common::lock_info(id, "native@terraform"))
                    .send()
                    .map_err(|e| e.to_string())?;
                let etag = answer
                    .headers()
                    .get("ETag")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                match answer.status().as_u16() {
                    200 => Ok(Some(Held::S3(url, etag))),
                    409 | 412 => Ok(None),
                    status => Err(format!("PUT lock file: {status}")),
                }
            }
        }
    }

    /// Terraform's Unlock: release what it holds, whatever the answer.
    fn unlock(&self, held: &Held) -> Result<(), String> {
        match (self, held) {
            (
                Session::Pg {
                    runtime, client, ..
                },
                Held::Pg(key),
            ) => runtime
                .block_on(client.query("SELECT pg_advisory_unlock($1)", &[key]))
                .map(|_| ())
                .map_err(|e| e.to_string()),
            // Terraform reads the lock file and deletes it only if the ID
            // is its own (client.go unlockWithFile); the same, made one
            // step with `If-Match` on what it wrote, so the model has no
            // check-then-delete race of Terraform's own: a lock file a
            // force-unlock removed and someone else wrote since is theirs.
            (Session::S3 { http, .. }, Held::S3(url, etag)) => http
                .delete(url)
                .header("If-Match", etag.as_str())
                .header("Authorization", moto_auth())
                .send()
                .map(|_| ())
                .map_err(|e| e.to_string()),
            _ => unreachable!("a lock is released by the kind of session that took it"),
        }
    }
}

/// An `Authorization` header moto accepts for S3 (it does not verify
/// signatures).
fn moto_auth() -> &'static str {
    "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0"
}

/// Take and release locks on random workspaces until `until`, holding
/// each for 30–230 ms, as `terraform apply` runs one after another would;
/// every lock taken and released is recorded as client `client` on host
/// [`NATIVE`]. Returns how many locks it held.
pub fn hold_along(
    native: &Native,
    client: usize,
    recorder: &Recorder,
    mut rng: Rng,
    workspaces: &[String],
    until: Instant,
) -> usize {
    let session = Session::open(native).unwrap_or_else(|e| panic!("{e}"));
    let mut held_count = 0;
    let mut n = 0;
    while Instant::now() < until {
        let workspace = &workspaces[rng.below(workspaces.len())];
        n += 1;
        let id = format!("native-{n}");
        let mut held = None;
        let mut failed = false;
        let op = Op::NativeLock(id.clone(), matches!(native, Native::S3LockFile { .. }));
        recorder.record(client, NATIVE, workspace, op, || {
            match session.lock(workspace, &id) {
                Ok(Some(got)) => {
                    held = Some(got);
                    Outcome::Answered(200, None)
                }
                Ok(None) => Outcome::Answered(423, None),
                Err(why) => {
                    failed = true;
                    Outcome::Unknown(why)
                }
            }
        });
        // The workload's pace (an apply's length, the time between two),
        // not a wait for anything.
        if let Some(held) = held {
            held_count += 1;
            std::thread::sleep(Duration::from_millis(30 + rng.below(200) as u64));
            recorder.record(client, NATIVE, workspace, Op::Unlock(id), || match session
                .unlock(&held)
            {
                Ok(()) => Outcome::Answered(200, None),
                Err(why) => Outcome::Unknown(why),
            });
        }
        let pause = if failed {
            200
        } else {
            20 + rng.below(130) as u64
        };
        std::thread::sleep(Duration::from_millis(pause));
    }
    held_count
}
