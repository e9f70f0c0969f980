//! With encryption on, the seal proves a state is ours but not that it is
//! the newest: storage could hand back an older envelope. [`RollbackMarks`]
//! remember, per workspace, the newest `(lineage, serial)` this host wrote
//! or read, and refuse an older serial of the same lineage.
//!
//! What the marks must never do is refuse a legitimate state:
//! - a new lineage (`terraform workspace delete` + `new`, a state deleted
//!   and started again) replaces the mark instead of comparing with it;
//! - a read that raced a write on this host may return the state the write
//!   replaced: the mark it is compared with is one set before the read
//!   began, so it is not a rollback;
//! - marks only rise within a lineage (a late update never lowers one);
//! - they are kept per backend across reloads (a SIGHUP does not forget).
//!
//! They are per host: another replica's writes are seen as they are read.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The newest state seen of each workspace of one backend.
#[derive(Debug, Default)]
pub struct RollbackMarks {
    marks: Mutex<HashMap<String, Mark>>,
    /// Counts mark updates: a read notes it before asking storage, so a
    /// mark set later is known to be newer than the read.
    clock: AtomicU64,
}

#[derive(Debug, Clone)]
struct Mark {
    /// A digest, not the lineage: a state's lineage is as long as its
    /// writer made it, and a mark is kept per workspace for the host's life.
    lineage: Option<LineageDigest>,
    serial: u64,
    set_at: u64,
    /// The state was deleted here: whatever comes next starts over, and
    /// older records (the host's history) are not consulted.
    deleted: bool,
}

/// When a read began, in [`RollbackMarks`]' clock.
#[derive(Debug, Clone, Copy)]
pub struct ReadStart(u64);

/// A newest state already seen, for a refusal's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollback {
    /// The serial seen before.
    pub newest: u64,
}

impl RollbackMarks {
    fn marks(&self) -> std::sync::MutexGuard<'_, HashMap<String, Mark>> {
        self.marks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Note the time before a read asks storage.
    pub fn read_start(&self) -> ReadStart {
        ReadStart(self.clock.load(Ordering::Acquire))
    }

    /// Whether this host has seen `workspace` (a state, or its deletion).
    pub fn knows(&self, workspace: &str) -> bool {
        self.marks().contains_key(workspace)
    }

    /// Judge a state read (begun at `start`) of `workspace` with `lineage`
    /// and `serial`: `Err` when it is older than a state of the same
    /// lineage seen before the read began. Otherwise it becomes the mark
    /// when it is newer.
    pub fn read(
        &self,
        workspace: &str,
        lineage: Option<&str>,
        serial: u64,
        start: ReadStart,
    ) -> Result<(), Rollback> {
        let mut marks = self.marks();
        if let Some(mark) = marks.get(workspace) {
            if mark.set_at > start.0 {
                // Set by a change that finished after this read began (a
                // write, a delete): the read may have seen what that change
                // replaced, which must neither be refused nor become the mark.
                return Ok(());
            }
            if !mark.deleted && mark.lineage == digest(lineage) && serial < mark.serial {
                return Err(Rollback {
                    newest: mark.serial,
                });
            }
        }
        self.raise(&mut marks, workspace, lineage, serial);
        Ok(())
    }

    /// Record a state this host wrote: the mark is set to it exactly (a
    /// force push may go back on purpose; this host's writes to a
    /// workspace run one at a time).
    pub fn wrote(&self, workspace: &str, lineage: Option<&str>, serial: u64) {
        let set_at = self.tick();
        self.marks().insert(
            workspace.to_string(),
            Mark {
                lineage: digest(lineage),
                serial,
                set_at,
                deleted: false,
            },
        );
    }

    /// Start from a version kept elsewhere (the host's history after a
    /// restart), unless this host has seen the workspace since.
    pub fn seed(&self, workspace: &str, lineage: Option<&str>, serial: u64) {
        let mut marks = self.marks();
        if !marks.contains_key(workspace) {
            self.raise(&mut marks, workspace, lineage, serial);
        }
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::AcqRel) + 1
    }

    fn raise(
        &self,
        marks: &mut HashMap<String, Mark>,
        workspace: &str,
        lineage: Option<&str>,
        serial: u64,
    ) {
        if let Some(mark) = marks.get(workspace)
            && !mark.deleted
            && mark.lineage == digest(lineage)
            && mark.serial >= serial
        {
            return;
        }
        let set_at = self.tick();
        marks.insert(
            workspace.to_string(),
            Mark {
                lineage: digest(lineage),
                serial,
                set_at,
                deleted: false,
            },
        );
    }

    /// A renamed backend's kept versions were moved in (`reseal
    /// --from-backend`), the newest at `lineage` and `serial`: the mark
    /// rises to it, replacing a fresh start (reads of the new name before
    /// the move opened nothing and knew nothing), but never lowers or
    /// replaces a mark of a state this host saw under the new name.
    pub fn adopt(&self, workspace: &str, lineage: Option<&str>, serial: u64) {
        let mut marks = self.marks();
        // A live mark of another lineage is a state seen here: kept.
        if let Some(mark) = marks.get(workspace)
            && !mark.deleted
            && mark.lineage != digest(lineage)
        {
            return;
        }
        self.raise(&mut marks, workspace, lineage, serial);
    }

    /// Start afresh where a history holds no state of the workspace's
    /// current life, unless this host has seen it since: the next state
    /// read becomes the mark, as after a delete here.
    pub fn start_fresh(&self, workspace: &str) {
        let set_at = self.tick();
        self.marks().entry(workspace.to_string()).or_insert(Mark {
            lineage: None,
            serial: 0,
            set_at,
            deleted: true,
        });
    }

    /// Forget `workspace`'s states: it was deleted, a new one may start
    /// over (with any lineage and serial).
    pub fn forget(&self, workspace: &str) {
        let set_at = self.tick();
        self.marks().insert(
            workspace.to_string(),
            Mark {
                lineage: None,
                serial: 0,
                set_at,
                deleted: true,
            },
        );
    }
}

/// SHA-256 of a lineage.
type LineageDigest = [u8; 32];

fn digest(lineage: Option<&str>) -> Option<LineageDigest> {
    use sha2::{Digest, Sha256};
    lineage.map(|l| Sha256::digest(l.as_bytes()).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rename's moved history raises a fresh start (a read of the new
    /// name before the move) but never lowers what this host saw.
    #[test]
    fn adopted_history_replaces_a_fresh_start_and_never_lowers_a_mark() {
        let marks = RollbackMarks::default();
        marks.start_fresh("w");
        marks.adopt("w", Some("a"), 3);
        assert_eq!(
            marks.read("w", Some("a"), 2, marks.read_start()),
            Err(Rollback { newest: 3 })
        );
        marks.wrote("v", Some("a"), 9);
        marks.adopt("v", Some("a"), 3);
        marks.adopt("v", Some("b"), 30);
        assert_eq!(
            marks.read("v", Some("a"), 8, marks.read_start()),
            Err(Rollback { newest: 9 })
        );
    }

    #[test]
    fn an_older_serial_of_the_same_lineage_is_refused() {
        let marks = RollbackMarks::default();
        marks.wrote("w", Some("a"), 5);
        let start = marks.read_start();
        assert_eq!(
            marks.read("w", Some("a"), 4, start),
            Err(Rollback { newest: 5 })
        );
        assert_eq!(marks.read("w", Some("a"), 5, start), Ok(()));
        assert_eq!(marks.read("w", Some("a"), 6, start), Ok(()));
        assert!(marks.read("w", Some("a"), 5, marks.read_start()).is_err());
    }

    #[test]
    fn a_new_lineage_starts_over() {
        let marks = RollbackMarks::default();
        marks.wrote("w", Some("a"), 40);
        // workspace delete + new on another replica: lineage b, serial 1.
        assert_eq!(marks.read("w", Some("b"), 1, marks.read_start()), Ok(()));
        assert!(marks.read("w", Some("b"), 0, marks.read_start()).is_err());
        marks.forget("w");
        assert!(
            marks.knows("w"),
            "a deleted workspace does not go back to the history"
        );
        assert_eq!(marks.read("w", Some("b"), 0, marks.read_start()), Ok(()));
        assert!(marks.read("w", Some("b"), 0, marks.read_start()).is_ok());
    }

    #[test]
    fn a_read_racing_a_write_is_not_a_rollback() {
        let marks = RollbackMarks::default();
        marks.wrote("w", Some("a"), 5);
        let start = marks.read_start();
        // A write of serial 6 finishes while the read (of 5) is under way.
        marks.wrote("w", Some("a"), 6);
        assert_eq!(marks.read("w", Some("a"), 5, start), Ok(()));
        // And the late read does not lower the mark.
        assert!(marks.read("w", Some("a"), 5, marks.read_start()).is_err());
    }

    #[test]
    fn reads_only_raise_marks_and_writes_set_them() {
        let marks = RollbackMarks::default();
        marks.wrote("w", Some("a"), 9);
        assert_eq!(marks.read("w", Some("a"), 12, marks.read_start()), Ok(()));
        assert!(marks.read("w", Some("a"), 9, marks.read_start()).is_err());
        // A force push back to serial 3 through this host: its new newest.
        marks.wrote("w", Some("a"), 3);
        assert_eq!(marks.read("w", Some("a"), 3, marks.read_start()), Ok(()));
        // A seed never lowers what this host has seen.
        marks.seed("w", Some("a"), 1);
        assert!(marks.read("w", Some("a"), 2, marks.read_start()).is_err());
    }

    #[test]
    fn a_read_that_began_before_a_delete_does_not_undo_it() {
        let marks = RollbackMarks::default();
        marks.wrote("w", Some("a"), 40);
        let start = marks.read_start();
        marks.forget("w");
        // The read saw serial 40 of the deleted state.
        assert_eq!(marks.read("w", Some("a"), 40, start), Ok(()));
        // A backup of serial 5 pushed after the delete is not a rollback.
        assert_eq!(marks.read("w", Some("a"), 5, marks.read_start()), Ok(()));
    }

    /// A mark's size does not grow with the lineage it remembers (a
    /// client chooses the lineage; marks live as long as the host).
    #[test]
    fn a_mark_holds_a_digest_of_any_lineage() {
        assert!(
            std::mem::size_of::<Mark>() <= 64,
            "{}",
            std::mem::size_of::<Mark>()
        );
        let marks = RollbackMarks::default();
        let long = "l".repeat(1 << 20);
        marks.wrote("w", Some(&long), 5);
        // What is kept is 32 bytes, whatever the lineage's length (a kept
        // lineage would hold its megabyte here).
        let kept = marks
            .marks()
            .get("w")
            .and_then(|m| m.lineage.map(|l| l.len()));
        assert_eq!(kept, Some(32));
        assert!(marks.read("w", Some(&long), 4, marks.read_start()).is_err());
        assert!(marks.read("w", Some("l"), 4, marks.read_start()).is_ok());
    }
}
