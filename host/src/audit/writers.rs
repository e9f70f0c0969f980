//! Who wrote the newest states of each workspace, kept in memory as records
//! are written (and read back from the log at start), so listing versions
//! never searches the log.

use super::{Operation, Record};
use std::collections::{HashMap, VecDeque};

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
    clock: u64,
}

impl Writers {
    /// Remember `record` if it is a write (or restore) that stored a state.
    pub fn note(&mut self, record: &Record) {
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
        if !self.workspaces.contains_key(&key) && self.workspaces.len() >= MAX_WORKSPACES {
            let oldest = self
                .workspaces
                .iter()
                .min_by_key(|(_, (used, _))| *used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                self.workspaces.remove(&oldest);
            }
        }
        self.clock += 1;
        let (used, writes) = self.workspaces.entry(key).or_default();
        *used = self.clock;
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

    #[test]
    fn only_stored_writes_are_kept_in_time_order_and_bounded() {
        let mut writers = Writers::default();
        writers.note(&write("w", 2, "2026-11-25T10:00:02Z", "ok"));
        writers.note(&write("w", 1, "2026-11-25T10:00:01Z", "ok"));
        // A retried write already stored: its caller wrote nothing.
        writers.note(&write("w", 2, "2026-11-25T10:00:03Z", "unchanged"));
        let serials: Vec<u64> = writers.of("b", "w").iter().map(|w| w.serial).collect();
        assert_eq!(serials, [1, 2]);
        for n in 0..100 {
            writers.note(&write("w", 10 + n, "2026-11-25T11:00:00Z", "ok"));
        }
        let kept = writers.of("b", "w");
        assert_eq!(kept.len(), PER_WORKSPACE);
        assert_eq!(kept.last().unwrap().serial, 109);
        assert!(writers.of("b", "other").is_empty());
    }
}
