//! Who wrote the newest states of each workspace, kept in memory as records
//! are written (and read back from the log at start), so listing versions
//! never searches the log.

use super::{Operation, Record};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// Writes remembered per workspace (the host keeps 10 versions by default).
pub const PER_WORKSPACE: usize = 32;
/// Workspaces remembered at once; past it, the least recently written is
/// forgotten.
const MAX_WORKSPACES: usize = 10_000;

/// One acknowledged write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// The serial it wrote.
    pub serial: u64,
    /// When, in milliseconds since the Unix epoch.
    pub unix_ms: i128,
    /// Who.
    pub caller: String,
}

/// The newest writes of each workspace.
#[derive(Debug, Default)]
pub struct Writers {
    /// Per workspace: when it was last noted (a counter), its writes.
    workspaces: HashMap<(String, String), (u64, VecDeque<Write>)>,
    /// The workspaces by when they were last noted, for eviction.
    by_use: BTreeMap<u64, (String, String)>,
    clock: u64,
    read_back: u64,
}

impl Writers {
    /// Remember `record` if it is a write (or restore) that stored a state.
    /// `recent`: written now; otherwise read back from the log at start,
    /// and never counted as more recent than what was written since.
    pub fn note(&mut self, record: &Record, recent: bool) {
        let wrote = matches!(record.operation, Operation::Write | Operation::Restore)
            && record.status < 300
            && record.result == "ok";
        let (Some(after), true) = (&record.after, wrote) else {
            return;
        };
        let Some(unix_ms) = unix_ms(&record.time) else {
            return;
        };
        let key = (record.backend.clone(), record.workspace.clone());
        let known = self.workspaces.contains_key(&key);
        if !known
            && self.workspaces.len() >= MAX_WORKSPACES
            && let Some((_, oldest)) = self.by_use.pop_first()
        {
            self.workspaces.remove(&oldest);
        }
        // Read back at start: older than anything noted since (a use of 0
        // and below, counting down).
        let used = match (recent, known) {
            (false, true) => None,
            (false, false) => {
                self.read_back += 1;
                Some(u64::MAX / 2 - self.read_back)
            }
            (true, _) => {
                self.clock += 1;
                Some(u64::MAX / 2 + self.clock)
            }
        };
        let entry = self.workspaces.entry(key.clone()).or_default();
        if let Some(used) = used {
            self.by_use.remove(&entry.0);
            entry.0 = used;
            self.by_use.insert(used, key);
        }
        let writes = &mut entry.1;
        // Kept oldest first by time: the log read at start may arrive
        // after the newest writes.
        let at = writes.partition_point(|w| w.unix_ms <= unix_ms);
        writes.insert(
            at,
            Write {
                serial: after.serial,
                unix_ms,
                caller: record.caller.clone(),
            },
        );
        if writes.len() > PER_WORKSPACE {
            writes.pop_front();
        }
    }

    /// The writes of `backend`/`workspace` remembered, oldest first.
    pub fn of(&self, backend: &str, workspace: &str) -> Vec<Write> {
        self.workspaces
            .get(&(backend.to_string(), workspace.to_string()))
            .map(|(_, writes)| writes.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// A record's time in milliseconds since the Unix epoch.
pub fn unix_ms(time: &str) -> Option<i128> {
    let at =
        time::OffsetDateTime::parse(time, &time::format_description::well_known::Rfc3339).ok()?;
    Some(at.unix_timestamp_nanos() / 1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::StateVersion;

    fn write(workspace: &str, serial: u64, time: &str, result: &str) -> Record {
        Record {
            time: time.into(),
            replica: "r".into(),
            caller: format!("writer-{serial}"),
            claims: Default::default(),
            backend: "b".into(),
            workspace: workspace.into(),
            operation: Operation::Write,
            before: None,
            after: Some(StateVersion {
                lineage: None,
                serial,
            }),
            lock: None,
            holder: None,
            status: 200,
            result: result.into(),
        }
    }

    impl Writers {
        fn note_now(&mut self, record: &Record) {
            self.note(record, true)
        }
    }

    #[test]
    fn only_stored_writes_are_kept_in_time_order_and_bounded() {
        let mut writers = Writers::default();
        writers.note_now(&write("w", 2, "2026-11-25T10:00:02Z", "ok"));
        writers.note_now(&write("w", 1, "2026-11-25T10:00:01Z", "ok"));
        // A retried write already stored: its caller wrote nothing.
        writers.note_now(&write("w", 2, "2026-11-25T10:00:03Z", "unchanged"));
        let serials: Vec<u64> = writers.of("b", "w").iter().map(|w| w.serial).collect();
        assert_eq!(serials, [1, 2]);
        for n in 0..100 {
            writers.note_now(&write("w", 10 + n, "2026-11-25T11:00:00Z", "ok"));
        }
        let kept = writers.of("b", "w");
        assert_eq!(kept.len(), PER_WORKSPACE);
        assert_eq!(kept.last().unwrap().serial, 109);
        assert!(writers.of("b", "other").is_empty());
    }

    #[test]
    fn the_least_recently_written_workspace_goes_first_and_old_records_count_as_old() {
        let mut writers = Writers::default();
        let at = "2026-11-25T10:00:00Z";
        for n in 0..MAX_WORKSPACES {
            writers.note_now(&write(&format!("w{n}"), 1, at, "ok"));
        }
        // w0 written again: now the most recent.
        writers.note_now(&write("w0", 2, at, "ok"));
        writers.note_now(&write("new", 1, at, "ok"));
        assert!(writers.of("b", "w1").is_empty(), "the least recent goes");
        assert_eq!(writers.of("b", "w0").len(), 2);
        // A workspace read back from the log goes before any written now.
        writers.note(&write("from-the-log", 1, at, "ok"), false);
        writers.note_now(&write("newer", 1, at, "ok"));
        assert!(writers.of("b", "from-the-log").is_empty());
        assert_eq!(writers.workspaces.len(), MAX_WORKSPACES);
        assert_eq!(writers.by_use.len(), MAX_WORKSPACES);
    }
}
