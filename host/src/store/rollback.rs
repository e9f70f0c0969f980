//! With encryption on, the seal proves a state is ours but not that it is
//! the newest: storage could hand back an older envelope. [`RollbackMarks`]
//! remember, per workspace, the newest `(lineage, started, serial)` this
//! host wrote or read, and refuse an older state of the same lineage.
//!
//! `started` is when the state's current life on storage began (Unix ns,
//! bound in its envelope): a write that replaces a stored state of the
//! same lineage carries the stored one's forward; a write onto a workspace
//! without a state (new, or after a delete), or of another lineage, stamps
//! the host's clock ([`RollbackMarks::stamp`]). Envelopes without it count
//! as started 0. So within a lineage, a read is judged by `(started,
//! serial)`: a later `started` is a new life (a state deleted and pushed
//! again through another replica, where storage keeps no history to tell):
//! accepted, it replaces the mark; the same `started` and a lower serial,
//! or an earlier `started` (an old life replayed), is a rollback.
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
//!
//! They are bounded: a name with no state gets no mark (a caller looping
//! random names holds nothing here), and at most [`MAX_MARKS`] are kept per
//! backend. The one changed longest ago makes room; a workspace whose mark
//! was dropped starts again as after a restart (from the history).

use super::seed::Seed;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Most marks kept per backend: about 300 bytes each (a name of at most
/// 90 bytes, two digests, stamps and a serial), so at most a few MiB of
/// host memory.
pub const MAX_MARKS: usize = 10_000;

/// The newest state seen of each workspace of one backend.
#[derive(Debug)]
pub struct RollbackMarks {
    marks: Mutex<HashMap<String, Mark>>,
    /// Counts mark updates: a read notes it before asking storage, so a
    /// mark set later is known to be newer than the read.
    clock: AtomicU64,
    /// Numbers reads (and this host's writes and deletes) in the order
    /// they began, so the stored state the newest of them saw is known.
    tickets: AtomicU64,
    /// Most marks kept ([`MAX_MARKS`]; smaller in tests).
    cap: usize,
    /// How many are kept now, for `/metrics`.
    count: Gauge,
}

impl Default for RollbackMarks {
    fn default() -> Self {
        RollbackMarks::counted_in(Gauge::default())
    }
}

#[derive(Debug, Clone)]
struct Mark {
    /// A digest, not the lineage: a state's lineage is as long as its
    /// writer made it, and a mark is kept per workspace for the host's life.
    lineage: Option<LineageDigest>,
    /// When the life of the newest state began (also kept once deleted:
    /// a life started here later is stamped after it).
    started: u64,
    serial: u64,
    set_at: u64,
    /// The state was deleted here: whatever comes next starts over, and
    /// older records (the host's history) are not consulted.
    deleted: bool,
    /// What storage held as the newest read (or write, or delete) here
    /// that began last found it: the life a write carries forward.
    seen: Option<Seen>,
}

/// The stored state a read found, for the next write's stamp.
#[derive(Debug, Clone, Copy)]
struct Seen {
    ticket: u64,
    /// Its lineage and `started`; `None`: there was no state.
    stored: Option<(Option<LineageDigest>, u64)>,
}

/// When a read began, in [`RollbackMarks`]' clock, and its ticket.
#[derive(Debug, Clone, Copy)]
pub struct ReadStart(u64, u64);

/// A newest state already seen, for a refusal's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollback {
    /// The serial seen before.
    pub newest: u64,
    /// The state read is of an earlier life of its lineage than the one
    /// seen before (whatever its serial).
    pub earlier_life: bool,
}

/// What `started` a state about to be sealed gets: its stored
/// predecessor's, when that is of the same lineage, else `fresh`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    carry: Option<(Option<LineageDigest>, u64)>,
    fresh: u64,
}

impl Stamp {
    /// Exactly `started` (a re-seal keeps the state's life).
    pub fn keep(started: u64) -> Stamp {
        Stamp {
            carry: None,
            fresh: started,
        }
    }

    /// No stamp: started 0, as before envelopes carried one.
    pub fn none() -> Stamp {
        Stamp::keep(0)
    }

    /// The `started` of a state of `lineage`.
    pub fn started_for(&self, lineage: Option<&str>) -> u64 {
        match self.carry {
            Some((stored, started)) if stored == digest(lineage) => started,
            _ => self.fresh,
        }
    }
}

/// The host's clock in Unix nanoseconds (1 before 1970: never 0).
fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(1)
        .max(1)
}

impl RollbackMarks {
    /// Marks whose number `count` reports (`wasmstate_rollback_marks`).
    pub fn counted_in(count: Gauge) -> Self {
        RollbackMarks {
            marks: Mutex::default(),
            clock: AtomicU64::new(0),
            tickets: AtomicU64::new(0),
            cap: MAX_MARKS,
            count,
        }
    }

    /// How many marks are kept now.
    pub fn len(&self) -> usize {
        self.marks().len()
    }

    /// Whether no mark is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keep `mark` for `workspace`; at the cap, the mark changed longest
    /// ago makes room (its workspace starts again from the history, as
    /// after a restart). Scanning for it is linear, but only a workspace
    /// new to this host, at the cap, pays it.
    fn insert(&self, marks: &mut HashMap<String, Mark>, workspace: &str, mark: Mark) {
        if let Some(kept) = marks.get_mut(workspace) {
            *kept = mark;
            return;
        }
        if marks.len() >= self.cap.max(1) {
            let oldest = marks
                .iter()
                .min_by_key(|(_, m)| m.set_at)
                .map(|(name, _)| name.clone());
            if let Some(oldest) = oldest {
                marks.remove(&oldest);
            }
        }
        marks.insert(workspace.to_string(), mark);
        self.count
            .set(i64::try_from(marks.len()).unwrap_or(i64::MAX));
    }

    fn marks(&self) -> std::sync::MutexGuard<'_, HashMap<String, Mark>> {
        self.marks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Note the time before a read asks storage.
    pub fn read_start(&self) -> ReadStart {
        ReadStart(self.clock.load(Ordering::Acquire), self.ticket())
    }

    fn ticket(&self) -> u64 {
        self.tickets.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Note what storage held for `workspace` as a read begun at `start`
    /// found it (`stored`: lineage and `started`; `None`: no state), unless
    /// a read, write or delete here that began later already noted. A
    /// workspace without a mark gets none (no memory for absent names).
    fn saw(
        marks: &mut HashMap<String, Mark>,
        workspace: &str,
        ticket: u64,
        stored: Option<(Option<LineageDigest>, u64)>,
    ) {
        if let Some(mark) = marks.get_mut(workspace)
            && mark.seen.is_none_or(|seen| seen.ticket < ticket)
        {
            mark.seen = Some(Seen { ticket, stored });
        }
    }

    /// A read begun at `start` found no state of `workspace`.
    pub fn absent(&self, workspace: &str, start: ReadStart) {
        Self::saw(&mut self.marks(), workspace, start.1, None);
    }

    /// A read begun at `start` found a state of `workspace` that is not
    /// judged (it has no serial): noted for the next write's stamp only.
    pub fn saw_unjudged(
        &self,
        workspace: &str,
        lineage: Option<&str>,
        started: u64,
        start: ReadStart,
    ) {
        Self::saw(
            &mut self.marks(),
            workspace,
            start.1,
            Some((digest(lineage), started)),
        );
    }

    /// The `started` for the next write of `workspace` here: carried from
    /// the stored state the newest read found, when of the same lineage
    /// (`carry`; never with `allow_force_push`, whose writes go back on
    /// purpose), else a new life's: the host's clock, but after every
    /// life this host knows of the workspace, so a replica whose clock is
    /// behind still starts a life after the one it read or deleted.
    pub fn stamp(&self, workspace: &str, carry: bool) -> Stamp {
        let marks = self.marks();
        let mark = marks.get(workspace);
        let seen = mark.and_then(|m| m.seen).and_then(|s| s.stored);
        let known = mark
            .map(|m| m.started.max(seen.map_or(0, |s| s.1)))
            .unwrap_or(0);
        Stamp {
            carry: seen.filter(|_| carry),
            fresh: now_ns().max(known.saturating_add(1)),
        }
    }

    /// Whether this host has seen `workspace` (a state, or its deletion).
    pub fn knows(&self, workspace: &str) -> bool {
        self.marks().contains_key(workspace)
    }

    /// Judge a state read (begun at `start`) of `workspace` with `lineage`,
    /// `started` and `serial`: `Err` when it is older than a state of the
    /// same lineage seen before the read began (an earlier life, or a
    /// lower serial of the same life). Otherwise it becomes the mark when
    /// it is newer (a later life replaces it whatever its serial).
    pub fn read(
        &self,
        workspace: &str,
        lineage: Option<&str>,
        started: u64,
        serial: u64,
        start: ReadStart,
    ) -> Result<(), Rollback> {
        let mut marks = self.marks();
        if let Some(mark) = marks.get(workspace) {
            if mark.set_at > start.0 {
                // Set by a change that finished after this read began (a
                // write, a delete): the read may have seen what that change
                // replaced, which must neither be refused nor become the mark.
                Self::saw(
                    &mut marks,
                    workspace,
                    start.1,
                    Some((digest(lineage), started)),
                );
                return Ok(());
            }
            if !mark.deleted
                && mark.lineage == digest(lineage)
                && (started, serial) < (mark.started, mark.serial)
            {
                return Err(Rollback {
                    newest: mark.serial,
                    earlier_life: started < mark.started,
                });
            }
        }
        self.raise(&mut marks, workspace, lineage, started, serial);
        Self::saw(
            &mut marks,
            workspace,
            start.1,
            Some((digest(lineage), started)),
        );
        Ok(())
    }

    /// Record a state this host wrote: the mark is set to it exactly (a
    /// force push may go back on purpose; this host's writes to a
    /// workspace run one at a time).
    pub fn wrote(&self, workspace: &str, lineage: Option<&str>, started: u64, serial: u64) {
        let set_at = self.tick();
        let lineage = digest(lineage);
        let mark = Mark {
            lineage,
            started,
            serial,
            set_at,
            deleted: false,
            seen: Some(Seen {
                ticket: self.ticket(),
                stored: Some((lineage, started)),
            }),
        };
        self.insert(&mut self.marks(), workspace, mark);
    }

    /// Start from a version kept elsewhere (the host's history after a
    /// restart), unless this host has seen the workspace since.
    pub fn seed(&self, workspace: &str, lineage: Option<&str>, started: u64, serial: u64) {
        let mut marks = self.marks();
        if !marks.contains_key(workspace) {
            self.raise(&mut marks, workspace, lineage, started, serial);
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
        started: u64,
        serial: u64,
    ) {
        let kept = marks.get(workspace);
        if let Some(mark) = kept
            && !mark.deleted
            && mark.lineage == digest(lineage)
            && (mark.started, mark.serial) >= (started, serial)
        {
            return;
        }
        let set_at = self.tick();
        let mark = Mark {
            lineage: digest(lineage),
            started,
            serial,
            set_at,
            deleted: false,
            seen: kept.and_then(|m| m.seen),
        };
        self.insert(marks, workspace, mark);
    }

    /// A renamed backend's kept versions were moved in (`reseal
    /// --from-backend`), the newest at `lineage` and `serial`: the mark
    /// rises to it, replacing a fresh start (reads of the new name before
    /// the move opened nothing and knew nothing), but never lowers or
    /// replaces a mark of a state this host saw under the new name.
    pub fn adopt(&self, workspace: &str, lineage: Option<&str>, started: u64, serial: u64) {
        let mut marks = self.marks();
        // A live mark of another lineage is a state seen here: kept.
        if let Some(mark) = marks.get(workspace)
            && !mark.deleted
            && mark.lineage != digest(lineage)
        {
            return;
        }
        self.raise(&mut marks, workspace, lineage, started, serial);
    }

    /// Start afresh where a history holds no state of the workspace's
    /// current life, unless this host has seen it since: the next state
    /// read becomes the mark, as after a delete here.
    pub fn start_fresh(&self, workspace: &str) {
        let set_at = self.tick();
        let mut marks = self.marks();
        if !marks.contains_key(workspace) {
            self.insert(&mut marks, workspace, Mark::fresh(set_at, 0, None));
        }
    }

    /// Start `workspace` again from `seed` (from the storage's history),
    /// as a restart would, for the read that began at `start`: the mark is
    /// replaced, whatever it was, unless this host changed it after the
    /// read began (that change is newer than both). `false` when nothing
    /// was replaced (that, or an unknown seed).
    pub fn reseed(&self, workspace: &str, seed: &Seed, start: ReadStart) -> bool {
        let mut marks = self.marks();
        if marks.get(workspace).is_some_and(|m| m.set_at > start.0) {
            return false;
        }
        // Set "at" the read's start: the read is judged against it.
        let kept = marks.get(workspace);
        let seen = kept.and_then(|m| m.seen);
        let mark = match seed {
            Seed::At(lineage, started, serial) => Mark {
                lineage: digest(lineage.as_deref()),
                started: *started,
                serial: *serial,
                set_at: start.0,
                deleted: false,
                seen,
            },
            Seed::Fresh => Mark::fresh(start.0, kept.map_or(0, |m| m.started), seen),
            Seed::Unknown => return false,
        };
        self.insert(&mut marks, workspace, mark);
        true
    }

    /// Forget `workspace`'s states: it was deleted, a new one may start
    /// over (with any lineage and serial).
    pub fn forget(&self, workspace: &str) {
        let set_at = self.tick();
        let seen = Seen {
            ticket: self.ticket(),
            stored: None,
        };
        let mut marks = self.marks();
        let started = marks.get(workspace).map_or(0, |m| m.started);
        self.insert(
            &mut marks,
            workspace,
            Mark::fresh(set_at, started, Some(seen)),
        );
    }
}

impl Mark {
    /// Whatever comes next starts over; `started`: the life that ended,
    /// kept so a life begun here later is stamped after it.
    fn fresh(set_at: u64, started: u64, seen: Option<Seen>) -> Mark {
        Mark {
            lineage: None,
            started,
            serial: 0,
            set_at,
            deleted: true,
            seen,
        }
    }
}

/// SHA-256 of a lineage.
type LineageDigest = [u8; 32];

fn digest(lineage: Option<&str>) -> Option<LineageDigest> {
    use sha2::{Digest, Sha256};
    lineage.map(|l| Sha256::digest(l.as_bytes()).into())
}

#[cfg(test)]
#[path = "rollback_tests.rs"]
mod tests;
