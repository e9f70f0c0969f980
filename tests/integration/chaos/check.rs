//! The promise, checked over a recorded history. Each rule names what it
//! would take to break it; an operation with no answer may or may not have
//! taken effect, and every rule allows both. The rules only ever compare
//! operations whose real-time order is certain (one ended before the
//! other began), so a report is a real violation, never a race of the
//! checker's own.

use super::history::{Event, NO_WORKSPACE, Op, Outcome, Seen};
use std::collections::{BTreeMap, HashSet};

/// One violation, with the events that show it.
#[derive(Debug)]
pub struct Anomaly {
    /// What was broken, in one line.
    pub what: String,
    /// The events involved, as indexes into the history.
    pub events: Vec<usize>,
}

/// What the storage under test promises, where guests differ.
#[derive(Debug, Clone, Copy)]
pub struct Promises {
    /// The storage keeps the history every replica reads, so every
    /// replica reaches the same verdict on a state pushed again
    /// ([`super::rules`]).
    pub history_shared: bool,
    /// A workspace delete takes the workspace's lock itself, so it never
    /// ends a lock a client was granted. False for a guest built before
    /// it did: its delete removed a lock granted while it ran.
    pub delete_keeps_locks: bool,
}

impl Promises {
    /// The strictest: what the first-party guests promise today.
    pub const ALL: Promises = Promises {
        history_shared: true,
        delete_keeps_locks: true,
    };
}

/// Every violation in `events` (a whole run's history), on storage that
/// promises everything ([`Promises::ALL`]).
#[cfg(test)]
pub fn check(events: &[Event]) -> Vec<Anomaly> {
    check_with(events, Promises::ALL)
}

/// Every violation in `events` (a whole run's history) on storage that
/// promises `promises`.
pub fn check_with(events: &[Event], promises: Promises) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    let mut by_workspace: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
    for event in events {
        by_workspace
            .entry(&event.workspace)
            .or_default()
            .push(event);
    }
    // When hosts were killed: a kill ends a host's PostgreSQL sessions
    // and the advisory locks they held for wasmstate's clients.
    let kills: Vec<u64> = events
        .iter()
        .filter(|e| e.op == Op::Fault(true))
        .map(|e| e.start)
        .collect();
    for (workspace, events) in &by_workspace {
        if *workspace == NO_WORKSPACE {
            continue;
        }
        torn_or_unknown_states(events, &mut anomalies);
        older_states(events, &mut anomalies);
        lost_writes(events, &mut anomalies);
        super::locks::check(events, &kills, promises, &mut anomalies);
        super::rules::other_lineages(events, &mut anomalies);
        super::rules::races(events, &mut anomalies);
        super::rules::refusals(
            events,
            &overridden(events),
            promises.history_shared,
            &mut anomalies,
        );
    }
    anomalies
}

fn seen(event: &Event) -> Option<&Seen> {
    match (&event.op, &event.outcome) {
        (Op::Get, Outcome::Answered(200, Some(seen))) => Some(seen),
        _ => None,
    }
}

/// The deletes (of the workspace, or of its state by an administrator)
/// that may have taken effect, to ask whether one
/// did between two operations in O(log deletes): the rules ask it for
/// pairs of operations, and a scan of the history per pair made a two-
/// minute run's check take hours.
pub(super) struct Deletes {
    /// Start times, ascending.
    starts: Vec<u64>,
    /// `latest_end[i]`: the latest end among the first `i + 1` deletes.
    latest_end: Vec<u64>,
}

impl Deletes {
    pub(super) fn new(events: &[&Event]) -> Deletes {
        let mut spans: Vec<(u64, u64)> = events
            .iter()
            .filter(|d| matches!(d.op, Op::DeleteWorkspace | Op::DeleteState(_)))
            .filter(|d| d.outcome.may_have_applied())
            .map(|d| (d.start, d.end))
            .collect();
        spans.sort();
        let mut latest = 0;
        let latest_end = spans
            .iter()
            .map(|&(_, end)| {
                latest = latest.max(end);
                latest
            })
            .collect();
        Deletes {
            starts: spans.iter().map(|&(start, _)| start).collect(),
            latest_end,
        }
    }

    /// A delete that may have taken effect after `after` did and before
    /// `before` did (it ended after `after` began and began before
    /// `before` ended): what came before it may be gone.
    pub(super) fn between(&self, after: &Event, before: &Event) -> bool {
        let began_before = self.starts.partition_point(|&start| start < before.end);
        began_before > 0 && self.latest_end[began_before - 1] > after.start
    }
}

/// How long after a forced write ended a request begun before it may still
/// write: a backend's default deadline (`timeout_ms`) and the host's grace.
const FORCED_WRITE_LINGER_MICROS: u64 = 11_000_000;

/// Writes under a lock that a force-unlock may have broken while they ran
/// (the force-unlock ended after the lock was granted, or after an
/// unlocked write began and the server locked for it, and began before
/// the write was answered). A force-unlock hands the state to someone else
/// while its holder may still be writing, as it does with Terraform's own
/// backends: such a write may land after a newer one, and a newer one may
/// land over it. The promise is kept for every other write.
pub(super) fn overridden(events: &[&Event]) -> HashSet<usize> {
    let forced: Vec<&Event> = events
        .iter()
        .copied()
        .filter(|e| e.op == Op::ForceUnlock && e.outcome.may_have_applied())
        .collect();
    let mut grants = std::collections::HashMap::new();
    for e in events {
        if let (Op::Lock(id), true) = (&e.op, e.outcome.is(200)) {
            grants.entry(id.as_str()).or_insert(e.start);
        }
    }
    let granted = |id: &str| grants.get(id).copied();
    events
        .iter()
        .filter_map(|post| {
            let Op::Post(w) = &post.op else { return None };
            // Its own lock, or (sent without one) the lock the server took
            // for it while it ran.
            let since = match w.lock_id.as_deref() {
                Some(id) => granted(id)?,
                None => post.start,
            };
            forced
                .iter()
                .any(|f| f.end > since && f.start < post.end)
                .then_some(post.index)
        })
        .collect()
}

fn digest_of<'a>(events: &[&'a Event], indexes: &HashSet<usize>) -> HashSet<&'a str> {
    events
        .iter()
        .filter(|e| indexes.contains(&e.index))
        .filter_map(|e| match &e.op {
            Op::Post(w) => Some(w.digest.as_str()),
            _ => None,
        })
        .collect()
}

/// (d) Every state a GET returns is one a client sent whole; a body cut
/// short by its client never is. A workspace created through the API may
/// also hold Terraform's empty state (nothing in it), which no client here
/// writes.
fn torn_or_unknown_states(events: &[&Event], anomalies: &mut Vec<Anomaly>) {
    let whole: HashSet<&str> = events
        .iter()
        .filter_map(|e| match &e.op {
            Op::Post(w) => Some(w.digest.as_str()),
            _ => None,
        })
        .collect();
    let first_create = events
        .iter()
        .filter(|e| e.op == Op::CreateWorkspace)
        .filter(|e| e.outcome.is(201) || e.outcome.may_have_applied())
        .map(|e| e.start)
        .min();
    for get in events {
        let Some(seen) = seen(get) else { continue };
        if seen.blank && first_create.is_some_and(|start| start < get.end) {
            continue;
        }
        if !whole.contains(seen.digest.as_str()) {
            let partial = events
                .iter()
                .find(|e| matches!(&e.op, Op::PartialPost(w) if w.digest == seen.digest));
            let what = match partial {
                Some(_) => "a GET returned a state whose body its client never finished sending",
                None => "a GET returned a state no client wrote (torn or invented)",
            };
            anomalies.push(Anomaly {
                what: what.into(),
                events: std::iter::once(get.index)
                    .chain(partial.map(|p| p.index))
                    .collect(),
            });
        }
    }
}

/// (b) No older state comes back: a GET never returns a lower serial of a
/// lineage than a write acknowledged, or a read answered, before it began
/// (unless the workspace was deleted in between).
fn older_states(events: &[&Event], anomalies: &mut Vec<Anomaly>) {
    let deletes = Deletes::new(events);
    let overridden = overridden(events);
    // Each forced state, by digest, with when its write last ended.
    let mut forced_ends = std::collections::HashMap::new();
    for e in events.iter().filter(|e| overridden.contains(&e.index)) {
        if let Op::Post(w) = &e.op {
            let end = forced_ends.entry(w.digest.as_str()).or_insert(e.end);
            *end = (*end).max(e.end);
        }
    }
    for get in events {
        let Some(now) = seen(get) else { continue };
        if forced_ends.contains_key(now.digest.as_str()) {
            continue;
        }
        // A write whose lock was forced open may be landed over, so having
        // read it promises nothing about what a request already under way
        // when it landed writes next (a re-seal writes back the state it
        // read, serial and all). Only such a request: one begun before the
        // forced write ended lasts at most its deadline.
        let promised = |e: &&&Event| {
            !overridden.contains(&e.index)
                && !seen(e).is_some_and(|s| {
                    forced_ends
                        .get(s.digest.as_str())
                        .is_some_and(|&end| get.start < end + FORCED_WRITE_LINGER_MICROS)
                })
        };
        for before in events.iter().filter(|e| e.end < get.start).filter(promised) {
            let (lineage, serial) = match (&before.op, &before.outcome) {
                (Op::Post(w), outcome) if outcome.is(200) => (&w.lineage, w.serial),
                _ => match seen(before) {
                    Some(s) => (&s.lineage, s.serial),
                    None => continue,
                },
            };
            if *lineage == now.lineage && serial > now.serial && !deletes.between(before, get) {
                anomalies.push(Anomaly {
                    what: format!(
                        "an older state came back: serial {} of {lineage} after serial {serial} was {}",
                        now.serial,
                        if matches!(before.op, Op::Post(_)) { "acknowledged" } else { "read" }
                    ),
                    events: vec![before.index, get.index],
                });
            }
        }
    }
}

/// (a) No acknowledged write is lost: a GET that begins after a POST was
/// answered 200 returns that state, or a later one of its lineage; never
/// nothing, another state of the same serial, or another lineage (unless
/// the workspace was deleted in between).
fn lost_writes(events: &[&Event], anomalies: &mut Vec<Anomaly>) {
    let deletes = Deletes::new(events);
    let overridden = overridden(events);
    let forced_states = digest_of(events, &overridden);
    for post in events {
        let (Op::Post(written), true) = (&post.op, post.outcome.is(200)) else {
            continue;
        };
        if overridden.contains(&post.index) {
            continue;
        }
        for get in events
            .iter()
            .filter(|g| g.op == Op::Get && g.start > post.end)
        {
            if deletes.between(post, get) {
                continue;
            }
            let what = match &get.outcome {
                Outcome::Answered(404, _) => "an acknowledged write is gone: GET answered 404",
                Outcome::Answered(200, Some(now))
                    if now.digest == written.digest
                        || forced_states.contains(now.digest.as_str()) =>
                {
                    continue;
                }
                Outcome::Answered(200, Some(now)) if now.lineage != written.lineage => {
                    "an acknowledged write was replaced by another lineage"
                }
                Outcome::Answered(200, Some(now)) if now.serial == written.serial => {
                    "an acknowledged write was replaced by another state of the same serial"
                }
                // Older serials: reported by `older_states`; newer: fine.
                _ => continue,
            };
            anomalies.push(Anomaly {
                what: what.into(),
                events: vec![post.index, get.index],
            });
        }
    }
}

#[cfg(test)]
mod tests {
    //! Each rule fails on a history that breaks it, and passes the same
    //! history with the break taken out.

    use super::super::history::Written;
    use super::*;

    fn event(index: usize, start: u64, end: u64, op: Op, outcome: Outcome) -> Event {
        Event {
            index,
            client: index,
            host: 0,
            workspace: "w".into(),
            op,
            start,
            end,
            outcome,
        }
    }

    /// A POST of `serial` under lock "a".
    fn locked(serial: u64, digest: &str) -> Op {
        Op::Post(Written {
            lineage: "l".into(),
            serial,
            digest: digest.into(),
            lock_id: Some("a".into()),
            shape: "",
        })
    }

    fn post(serial: u64, digest: &str) -> Op {
        Op::Post(Written {
            lineage: "l".into(),
            serial,
            digest: digest.into(),
            lock_id: None,
            shape: "",
        })
    }

    fn got(serial: u64, digest: &str) -> Outcome {
        Outcome::Answered(
            200,
            Some(Seen {
                lineage: "l".into(),
                serial,
                digest: digest.into(),
                blank: false,
            }),
        )
    }

    const OK: Outcome = Outcome::Answered(200, None);

    #[test]
    fn two_writes_of_one_serial_both_acknowledged_is_a_lost_write() {
        let history = [
            event(0, 0, 10, post(2, "a"), OK),
            event(1, 5, 15, post(2, "b"), OK),
            event(2, 20, 30, Op::Get, got(2, "b")),
        ];
        let found = check(&history);
        assert!(
            found.iter().any(|a| a.what.contains("same serial")),
            "{found:?}"
        );
        let guarded = [
            event(0, 0, 10, post(2, "a"), OK),
            event(1, 5, 15, post(2, "b"), Outcome::Answered(409, None)),
            event(2, 20, 30, Op::Get, got(2, "a")),
        ];
        assert!(check(&guarded).is_empty());
    }

    #[test]
    fn an_older_serial_after_a_newer_one_is_caught_unless_deleted() {
        let history = [
            event(0, 0, 10, post(1, "a"), OK),
            event(1, 11, 20, post(2, "b"), OK),
            event(2, 30, 40, Op::Get, got(1, "a")),
        ];
        let found = check(&history);
        assert!(
            found.iter().any(|a| a.what.contains("older state")),
            "{found:?}"
        );
        let deleted = [
            event(0, 0, 10, post(1, "a"), OK),
            event(1, 11, 20, post(2, "b"), OK),
            event(2, 21, 22, Op::DeleteWorkspace, OK),
            event(3, 23, 24, post(1, "a"), OK),
            event(4, 30, 40, Op::Get, got(1, "a")),
        ];
        assert!(check(&deleted).is_empty(), "{:?}", check(&deleted));
    }

    #[test]
    fn an_unanswered_write_may_or_may_not_show() {
        let history = [
            event(0, 0, 10, post(1, "a"), OK),
            event(1, 11, 20, post(2, "b"), Outcome::Unknown("killed".into())),
            event(2, 30, 40, Op::Get, got(2, "b")),
            event(3, 41, 50, Op::Get, got(2, "b")),
        ];
        assert!(check(&history).is_empty());
        let lost = [
            event(0, 0, 10, post(1, "a"), OK),
            event(1, 30, 40, Op::Get, Outcome::Answered(404, None)),
        ];
        assert!(check(&lost)[0].what.contains("gone"));
    }

    #[test]
    fn a_write_whose_lock_was_forced_open_may_land_either_way() {
        let raced = |force_end| {
            [
                event(0, 0, 5, Op::Lock("a".into()), OK),
                event(1, 6, 7, Op::ForceUnlock, OK),
                event(2, 6, force_end, locked(2, "a"), OK),
                event(3, 8, 12, post(2, "b"), OK),
                event(4, 20, 30, Op::Get, got(2, "b")),
            ]
        };
        // The force-unlock came while the holder was writing: not a loss.
        assert!(check(&raced(10)).is_empty(), "{:?}", check(&raced(10)));
        let clean = [
            event(0, 0, 5, Op::Lock("a".into()), OK),
            event(2, 6, 7, locked(2, "a"), OK),
            event(3, 8, 12, post(2, "b"), OK),
            event(4, 20, 30, Op::Get, got(2, "b")),
        ];
        assert!(!check(&clean).is_empty());
    }

    #[test]
    fn reading_a_forced_write_promises_nothing_about_what_follows_it_closely() {
        // Serial 2 landed under a lock forced open while it ran; it was
        // read, then the state before it (serial 1, written back by the
        // next lock's holder, as a re-seal does) came back.
        let history = |force: bool, last_get: u64| {
            let mut events = vec![
                event(0, 0, 5, post(1, "one"), OK),
                event(1, 6, 7, Op::Lock("a".into()), OK),
                event(3, 8, 12, locked(2, "two"), OK),
                event(4, 13, 14, Op::Get, got(2, "two")),
                event(5, last_get, last_get + 10, Op::Get, got(1, "one")),
            ];
            if force {
                events.insert(2, event(2, 9, 10, Op::ForceUnlock, OK));
            }
            events
        };
        assert!(check(&history(true, 20)).is_empty());
        // Without the force-unlock both the write and the read bind.
        assert!(!check(&history(false, 20)).is_empty());
        // Long after it (past any deadline) the read binds again: storage
        // handing back the older state then is a rollback.
        assert!(!check(&history(true, FORCED_WRITE_LINGER_MICROS + 100)).is_empty());
    }

    #[test]
    fn a_state_nobody_finished_sending_is_torn() {
        let partial = Op::PartialPost(Written {
            lineage: "l".into(),
            serial: 2,
            digest: "half".into(),
            lock_id: None,
            shape: "",
        });
        let history = [
            event(0, 0, 10, partial, Outcome::Unknown("client hung up".into())),
            event(1, 20, 30, Op::Get, got(2, "half")),
        ];
        assert!(check(&history)[0].what.contains("never finished"));
    }

    #[test]
    fn overlapping_holders_are_caught_and_force_unlock_ends_a_hold() {
        let lock = |id: &str| Op::Lock(id.into());
        let history = [
            event(0, 0, 10, lock("a"), OK),
            event(1, 5, 15, lock("b"), OK),
            event(2, 20, 30, Op::Unlock("a".into()), OK),
        ];
        assert!(check(&history)[0].what.contains("two holders"));
        let forced = [
            event(0, 0, 10, lock("a"), OK),
            event(1, 11, 12, Op::ForceUnlock, OK),
            event(2, 13, 15, lock("b"), OK),
            event(
                3,
                20,
                30,
                Op::Unlock("a".into()),
                Outcome::Answered(409, None),
            ),
        ];
        assert!(check(&forced).is_empty());
    }

    #[test]
    fn deletes_between_agrees_with_a_scan_of_every_delete() {
        let mut rng = super::super::clients::Rng::new(7);
        let mut history = Vec::new();
        for index in 0..300 {
            let start = rng.below(1000) as u64;
            let end = start + rng.below(50) as u64;
            let op = if rng.below(5) == 0 {
                Op::DeleteWorkspace
            } else {
                Op::Get
            };
            history.push(event(index, start, end, op, OK));
        }
        let events: Vec<&Event> = history.iter().collect();
        let deletes = Deletes::new(&events);
        let scan = |after: &Event, before: &Event| {
            events
                .iter()
                .any(|d| d.op == Op::DeleteWorkspace && d.end > after.start && d.start < before.end)
        };
        for after in &history {
            for before in history.iter().step_by(7) {
                assert_eq!(deletes.between(after, before), scan(after, before));
            }
        }
    }
}
