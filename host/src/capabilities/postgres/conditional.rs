//! Contract 0.3.0 on `states`: a row's head without its data, and writes
//! conditional on the row's version, checked in the write's own
//! transaction.
//!
//! A row's version is its `xmin`: the id of the transaction that wrote the
//! row as it is now. Every UPDATE or INSERT makes a new row version with a
//! new `xmin` (Terraform's own `INSERT … ON CONFLICT DO UPDATE` included,
//! and a delete and re-insert too), and one transaction writes a row at
//! most once here and in Terraform, so two different contents never share
//! one. Freezing keeps `xmin` (PostgreSQL 9.4 and later); a dump and
//! restore changes it, which makes a pending conditional write answer
//! "changed" once, never overwrite. It could only repeat after 2³²
//! transactions between a head and its write. The check runs in the
//! UPDATE's WHERE: a concurrent writer's commit makes PostgreSQL re-check
//! it on the new row version, so of two writers expecting one version
//! exactly one changes the row, on any replicas.

use super::encoding::{BINARY_PREFIX, prefix_from_stored, stored_prefix_len};
use super::{PgError, PgStore};
use tokio_postgres::Transaction;
use tokio_postgres::types::Type;

/// Which row a conditional write may replace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Whatever is there.
    Any,
    /// Only no row, or one with no data (NULL or empty): no state.
    Absent,
    /// Only the row at this version ([`RowHead::version`]).
    Version(String),
}

/// What [`PgStore::head`] knows of a row without its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowHead {
    /// The row's `xmin`, as text.
    pub version: String,
    /// The state's size in bytes (decoded, as a read hands it out).
    pub size: u64,
    /// md5 of those bytes, lowercase hex.
    pub md5: String,
    /// The state's first bytes (decoded), at most what was asked for.
    pub prefix: Vec<u8>,
}

impl PgStore {
    /// Row `name`'s head and its state's first `want` bytes, in one
    /// statement: size and digest are computed by the database, so the
    /// data never leaves it. `None` when there is no row or it holds no
    /// state (what [`Expect::Absent`] matches). `admit` is asked for the
    /// bytes fetched before they are.
    pub async fn head(
        &self,
        name: &str,
        want: usize,
        mut admit: impl FnMut(usize) -> Result<(), PgError>,
    ) -> Result<Option<RowHead>, PgError> {
        let fetch = stored_prefix_len(want);
        admit(fetch)?;
        let fetch = i32::try_from(fetch).unwrap_or(i32::MAX);
        let marker = BINARY_PREFIX.len() as i32;
        let sql = format!(
            "SELECT s.xmin::text, octet_length(r.raw)::bigint, md5(r.raw),
                    substring(convert_to(s.data, 'UTF8') FROM 1 FOR $2)
             FROM {} s CROSS JOIN LATERAL (SELECT CASE WHEN left(s.data, $4) = $3
                 THEN decode(substr(s.data, $4 + 1), 'base64')
                 ELSE convert_to(s.data, 'UTF8') END AS raw) r
             WHERE s.name = $1 AND s.data <> ''",
            self.table("states")
        );
        let client = self.checkout().await?;
        // Typed: parsed, bound and run in one round trip.
        let row = client
            .query_typed_opt(
                &sql,
                &[
                    (&name, Type::TEXT),
                    (&fetch, Type::INT4),
                    (&BINARY_PREFIX, Type::TEXT),
                    (&marker, Type::INT4),
                ],
            )
            .await?;
        self.give_back(client);
        let Some(row) = row else {
            return Ok(None);
        };
        let (version, size, md5, stored): (String, i64, String, Vec<u8>) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        Ok(Some(RowHead {
            version,
            size: u64::try_from(size).unwrap_or(0),
            md5,
            prefix: prefix_from_stored(&stored, want)?,
        }))
    }

    /// In `tx`, set row `name`'s data to `data` if the row is as `expect`
    /// says; whether it was (nothing is written otherwise).
    pub(super) async fn put(
        &self,
        tx: &Transaction<'_>,
        name: &str,
        data: &str,
        expect: &Expect,
    ) -> Result<bool, PgError> {
        let t = self.table("states");
        let changed = match expect {
            // Terraform's own statement, so both write rows alike.
            Expect::Any => {
                let sql = format!(
                    "INSERT INTO {t} (name, data) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET data = $2 WHERE {t}.name = $1"
                );
                tx.execute_typed(&sql, &[(&name, Type::TEXT), (&data, Type::TEXT)])
                    .await?
            }
            Expect::Absent => {
                let sql = format!(
                    "INSERT INTO {t} (name, data) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET data = $2
                     WHERE {t}.data IS NULL OR {t}.data = ''"
                );
                tx.execute_typed(&sql, &[(&name, Type::TEXT), (&data, Type::TEXT)])
                    .await?
            }
            // Not a transaction id: no row has it.
            Expect::Version(v) if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) => 0,
            Expect::Version(v) => {
                let sql = format!(
                    "UPDATE {t} SET data = $2 WHERE name = $1 AND xmin::text = $3 AND data <> ''"
                );
                tx.execute_typed(
                    &sql,
                    &[(&name, Type::TEXT), (&data, Type::TEXT), (v, Type::TEXT)],
                )
                .await?
            }
        };
        Ok(changed > 0)
    }
}
