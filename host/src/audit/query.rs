//! Searching the log: what `GET /audit/{backend}`, the console's audit page
//! and `wasmstate audit` ask for.

use super::{AuditLog, Operation, Record};
use serde::Deserialize;
use std::io::BufRead;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// The most records one query answers.
pub const MAX_LIMIT: usize = 1000;
const DEFAULT_LIMIT: usize = 100;

/// Which records a query wants; every field set must match.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Filter {
    /// Only this workspace.
    #[serde(default)]
    pub workspace: Option<String>,
    /// Only this operation (`write`, `force-unlock`…).
    #[serde(default)]
    pub operation: Option<String>,
    /// Only callers whose name contains this (`alice`, `oidc:github`).
    #[serde(default)]
    pub caller: Option<String>,
    /// Only at or after this time: RFC 3339, or a day (`2026-11-24`).
    #[serde(default)]
    pub since: Option<String>,
    /// Only at or before this time: RFC 3339, or a day (the whole day).
    #[serde(default)]
    pub until: Option<String>,
    /// Only refused changes (`true`): answered 4xx or 5xx.
    #[serde(default)]
    pub refused: Option<bool>,
    /// At most this many records, newest first (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// A filter checked: its times parsed, its operation known.
struct Checked<'a> {
    filter: &'a Filter,
    operation: Option<Operation>,
    since: Option<OffsetDateTime>,
    until: Option<OffsetDateTime>,
}

impl Filter {
    fn check(&self) -> Result<Checked<'_>, String> {
        let operation = self
            .operation
            .as_deref()
            .filter(|o| !o.is_empty())
            .map(|o| {
                Operation::parse(o).ok_or_else(|| {
                    let names: Vec<&str> = Operation::ALL.iter().map(|o| o.name()).collect();
                    format!("operation {o:?} is not one of {}", names.join(", "))
                })
            })
            .transpose()?;
        Ok(Checked {
            filter: self,
            operation,
            since: parse_time(self.since.as_deref(), false)?,
            until: parse_time(self.until.as_deref(), true)?,
        })
    }

    /// How many records the query answers at most.
    pub fn limit(&self) -> usize {
        self.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT)
    }
}

/// `text` as a time: RFC 3339, or a day (its start, or with `end` its
/// last instant).
fn parse_time(text: Option<&str>, end: bool) -> Result<Option<OffsetDateTime>, String> {
    let Some(text) = text.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    if let Ok(at) = OffsetDateTime::parse(text, &Rfc3339) {
        return Ok(Some(at));
    }
    let start = OffsetDateTime::parse(&format!("{text}T00:00:00Z"), &Rfc3339)
        .map_err(|_| format!("{text:?} is not a time: write 2026-11-24 or 2026-11-24T09:00:00Z"))?;
    Ok(Some(match end {
        false => start,
        true => start + time::Duration::DAY - time::Duration::NANOSECOND,
    }))
}

impl Checked<'_> {
    fn matches(&self, backend: &str, record: &Record) -> bool {
        let f = self.filter;
        let at = || OffsetDateTime::parse(&record.time, &Rfc3339).ok();
        record.backend == backend
            && f.workspace
                .as_deref()
                .filter(|w| !w.is_empty())
                .is_none_or(|w| record.workspace == w)
            && self.operation.is_none_or(|o| record.operation == o)
            && f.caller
                .as_deref()
                .is_none_or(|c| record.caller.contains(c))
            && f.refused.is_none_or(|r| r == (record.status >= 400))
            && self.since.is_none_or(|s| at().is_some_and(|t| t >= s))
            && self.until.is_none_or(|u| at().is_some_and(|t| t <= u))
    }
}

/// Searches read the whole trail (up to `max_mib`, parsing every line):
/// this many run at once in the whole server…
pub const SEARCHES: usize = 2;
/// …and another waits this long for its turn, then is answered 503.
const SEARCH_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Why a search did not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SearchError {
    /// The filter is not one (400): what to write instead.
    Bad(String),
    /// Other searches held every turn (503): retry.
    Busy,
    /// The trail could not be read (500).
    Failed(String),
}

impl AuditLog {
    /// [`AuditLog::query`] off the async workers, [`SEARCHES`] at a time in
    /// the whole server: one that waited [`SEARCH_WAIT`] for its turn is
    /// [`SearchError::Busy`].
    pub async fn search(
        self: &std::sync::Arc<Self>,
        backend: &str,
        filter: Filter,
    ) -> Result<Vec<Record>, SearchError> {
        filter.check().map_err(SearchError::Bad)?;
        let turn = tokio::time::timeout(SEARCH_WAIT, self.searches.clone().acquire_owned())
            .await
            .map_err(|_| SearchError::Busy)?
            .map_err(|_| SearchError::Busy)?;
        let (log, backend) = (self.clone(), backend.to_string());
        // The turn goes with the work: a caller who disconnects drops this
        // future, not the blocking read, which holds its turn to the end.
        tokio::task::spawn_blocking(move || {
            let found = log.query(&backend, &filter);
            drop(turn);
            found
        })
        .await
        .map_err(|e| SearchError::Failed(format!("reading the audit trail stopped: {e}")))?
        .map_err(SearchError::Failed)
    }

    /// `backend`'s records matching `filter`, newest first. Reads the
    /// files from disk (blocking): call it off the async workers
    /// ([`AuditLog::search`]). Holds at most `limit` records of one file
    /// and twice that in all, whatever the trail holds.
    pub fn query(&self, backend: &str, filter: &Filter) -> Result<Vec<Record>, String> {
        let checked = filter.check()?;
        let limit = filter.limit();
        let mut found: Vec<Record> = Vec::new();
        // Each sequence (a replica's records of no backend, the backend's
        // changes, its other records) newest first, up to the limit; each
        // merged in by time (written fixed-width, so text sorts).
        for files in self.sequences_of(backend) {
            let mut from_sequence: Vec<Record> = Vec::new();
            for path in files {
                let file = match std::fs::File::open(&path) {
                    Ok(file) => file,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
                };
                // Each file is oldest first: only its newest matches that
                // can still be answered are kept.
                let room = limit - from_sequence.len();
                let mut matched = std::collections::VecDeque::with_capacity(room.min(64));
                let lines = std::io::BufReader::new(file)
                    .split(b'\n')
                    .map_while(Result::ok)
                    // A line torn by a crash or a full disk is skipped.
                    .filter_map(|line| serde_json::from_slice::<Record>(&line).ok())
                    .filter(|record| checked.matches(backend, record));
                for record in lines {
                    if matched.len() == room {
                        matched.pop_front();
                    }
                    matched.push_back(record);
                }
                from_sequence.extend(matched.into_iter().rev());
                if from_sequence.len() >= limit {
                    break;
                }
            }
            found.extend(from_sequence);
            found.sort_by(|a, b| b.time.cmp(&a.time));
            found.truncate(limit);
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::AuditSettings;

    fn settings() -> AuditSettings {
        AuditSettings {
            replica: "r1".into(),
            ..AuditSettings::default()
        }
    }

    fn record(workspace: &str, operation: Operation, time: &str, status: u16) -> Record {
        Record {
            time: time.into(),
            replica: "r1".into(),
            caller: "oidc:github:repo:acme/infra".into(),
            claims: Default::default(),
            backend: "prod".into(),
            workspace: workspace.into(),
            operation,
            before: None,
            after: None,
            lock: None,
            holder: None,
            status,
            result: "ok".into(),
        }
    }

    #[tokio::test]
    async fn a_query_filters_and_answers_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::open(dir.path(), settings()).unwrap();
        for (workspace, op, time, status) in [
            ("a", Operation::Write, "2026-11-23T10:00:00.000Z", 200),
            ("a", Operation::ForceUnlock, "2026-11-24T09:00:00.000Z", 200),
            ("b", Operation::Write, "2026-11-24T23:59:59.999Z", 409),
            ("a", Operation::Write, "2026-11-25T00:00:00.000Z", 200),
        ] {
            log.append(record(workspace, op, time, status)).await;
        }
        let all = log.query("prod", &Filter::default()).unwrap();
        let times: Vec<&str> = all.iter().map(|r| &r.time[..10]).collect();
        assert_eq!(
            times,
            ["2026-11-25", "2026-11-24", "2026-11-24", "2026-11-23"]
        );
        assert!(log.query("dev", &Filter::default()).unwrap().is_empty());

        let tuesday = Filter {
            since: Some("2026-11-24".into()),
            until: Some("2026-11-24".into()),
            ..Filter::default()
        };
        assert_eq!(log.query("prod", &tuesday).unwrap().len(), 2);
        let unlocks = Filter {
            operation: Some("force-unlock".into()),
            caller: Some("oidc:github".into()),
            ..Filter::default()
        };
        let found = log.query("prod", &unlocks).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].operation, Operation::ForceUnlock);
        let refused = Filter {
            refused: Some(true),
            ..Filter::default()
        };
        assert_eq!(log.query("prod", &refused).unwrap()[0].status, 409);
        let one = Filter {
            workspace: Some("a".into()),
            limit: Some(1),
            ..Filter::default()
        };
        assert_eq!(
            log.query("prod", &one).unwrap()[0].time,
            "2026-11-25T00:00:00.000Z"
        );
    }

    /// Searches past the ones under way wait their bounded turn, then are
    /// told to retry: many callers cannot each make the server read the
    /// whole trail at once.
    #[tokio::test]
    async fn searches_past_the_ones_under_way_are_told_to_retry() {
        let dir = tempfile::tempdir().unwrap();
        let log = std::sync::Arc::new(AuditLog::open(dir.path(), settings()).unwrap());
        log.append(record(
            "a",
            Operation::Write,
            "2026-11-25T00:00:00.000000Z",
            200,
        ))
        .await;
        // Written (the writer thread answered): the wait below on a paused
        // clock.
        tokio::time::pause();
        let under_way = log.searches.acquire_many(SEARCHES as u32).await.unwrap();
        let started = tokio::time::Instant::now();
        let busy = log.search("prod", Filter::default()).await;
        assert_eq!(busy, Err(SearchError::Busy));
        assert!(started.elapsed() >= SEARCH_WAIT);
        drop(under_way);
        assert_eq!(
            log.search("prod", Filter::default()).await.unwrap().len(),
            1
        );
    }

    #[test]
    fn a_bad_filter_says_what_to_write() {
        let log = AuditLog::disabled();
        let bad = Filter {
            operation: Some("drop".into()),
            ..Filter::default()
        };
        assert!(
            log.query("prod", &bad)
                .unwrap_err()
                .contains("force-unlock")
        );
        let bad = Filter {
            since: Some("tuesday".into()),
            ..Filter::default()
        };
        assert!(log.query("prod", &bad).unwrap_err().contains("2026-11-24"));
    }
}
