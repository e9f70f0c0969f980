//! Reads of a state's data (from `states`, or a kept version), each
//! fetch's size admitted to the caller's memory budgets before its bytes
//! are fetched.

use super::{FIRST_FETCH, PgError, PgStore};

impl PgStore {
    /// Row `name`'s data, if there is such a row with data (Terraform's
    /// Get). `admit` is asked for the size of each fetch before the bytes
    /// are fetched (the caller charges them to its memory budgets, and may
    /// refuse): a state too large for them never reaches the host. The
    /// size and the data are read in one statement, so a state that grew
    /// in between is not fetched past what was admitted.
    pub async fn read(
        &self,
        name: &str,
        admit: impl FnMut(usize) -> Result<(), PgError>,
    ) -> Result<Option<String>, PgError> {
        let sql = format!(
            "SELECT octet_length(data), CASE WHEN octet_length(data) <= $2 THEN data END FROM {} WHERE name = $1",
            self.table("states")
        );
        self.fetch(&sql, &[&name], name, admit).await
    }

    /// The data `sql` selects by `key` as (its size, the data when no
    /// larger than the last parameter, which follows `key`), fetched under
    /// [`PgStore::read`]'s rule; `None` without a row, or with no data.
    pub(super) async fn fetch(
        &self,
        sql: &str,
        key: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        name: &str,
        mut admit: impl FnMut(usize) -> Result<(), PgError>,
    ) -> Result<Option<String>, PgError> {
        let client = self.checkout().await?;
        let mut admitted = FIRST_FETCH;
        admit(FIRST_FETCH as usize)?;
        for _ in 0..3 {
            let mut params = key.to_vec();
            params.push(&admitted);
            let Some(row) = client.query_opt(sql, &params).await? else {
                self.give_back(client);
                return Ok(None);
            };
            let (size, data): (Option<i32>, Option<String>) = (row.get(0), row.get(1));
            match (size, data) {
                (Some(size), None) => {
                    admit(size.max(0) as usize)?;
                    admitted = size;
                }
                // A row with no data (NULL) is no state.
                (_, data) => {
                    self.give_back(client);
                    return Ok(data);
                }
            }
        }
        Err(PgError::Unavailable(format!(
            "the state of {name} kept growing while it was read; retry"
        )))
    }
}
