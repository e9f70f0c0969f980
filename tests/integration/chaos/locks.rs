//! (c) Never two lock holders at once, a native Terraform client beside
//! wasmstate counted as one; and while a lock is surely held, no write or
//! delete from anyone else is accepted.

use super::check::{Anomaly, Promises};
use super::history::{Event, Op};

/// How long after a host was killed its PostgreSQL sessions' advisory
/// locks may stay free before another replica's sweep (every second)
/// takes them over: a native client may take one in between, as it may
/// when a holder's `terraform` process dies. The wasmstate holder's writes
/// are refused from then on (the key is not its session's), so no state
/// is lost; this is the one overlap the rule allows.
const KILL_TAKEOVER_MICROS: u64 = 5_000_000;

/// When one holder surely held the lock: from its LOCK's answer to the
/// start of whatever may have released it first.
#[derive(Debug)]
pub(super) struct Span {
    /// Its LOCK's start and end (the grant came in between).
    asked: u64,
    from: u64,
    to: u64,
    /// Its LOCK event.
    index: usize,
    id: String,
    /// Taken by a native Terraform client.
    native: bool,
    /// A native lock a force-unlock through wasmstate releases (an S3
    /// lock file); a pg advisory lock only its own session releases.
    yields: bool,
}

/// Every holder's span in one workspace's `events`, sorted by `from`;
/// `delete_keeps_locks`: no workspace delete ends one (the delete takes
/// the lock itself).
pub(super) fn spans(events: &[&Event], delete_keeps_locks: bool) -> Vec<Span> {
    let mut spans = Vec::new();
    for lock in events.iter().filter(|e| e.outcome.is(200)) {
        let (id, native, yields) = match &lock.op {
            Op::Lock(id) => (id, false, true),
            Op::NativeLock(id, yields) => (id, true, *yields),
            _ => continue,
        };
        // Anything that may have released it after it was granted (its
        // effect can follow the grant's) ends the span, at the earliest
        // when it began. A native client's lock is its own: wasmstate's
        // workspace delete is refused while it is held, and its
        // force-unlock reaches only a lock file. A workspace delete takes
        // the lock itself, so it is refused while one is held and a lock
        // granted while it runs is taken after it; a guest built before
        // that removed a lock granted while its delete ran.
        let released = events
            .iter()
            .filter(|e| e.end > lock.start)
            .filter(|e| match &e.op {
                Op::Unlock(other) => other == id,
                Op::ForceUnlock => yields && e.outcome.may_have_applied(),
                Op::DeleteWorkspace => {
                    !delete_keeps_locks && !native && e.outcome.may_have_applied()
                }
                _ => false,
            })
            .map(|e| e.start.max(lock.end))
            .min()
            .unwrap_or(u64::MAX);
        if released > lock.end {
            spans.push(Span {
                asked: lock.start,
                from: lock.end,
                to: released,
                index: lock.index,
                id: id.clone(),
                native,
                yields,
            });
        }
    }
    spans.sort_by_key(|s| (s.from, s.index));
    spans
}

/// Both rules over one workspace's `events`; `kills` are when hosts were
/// killed (any workspace).
pub(super) fn check(
    events: &[&Event],
    kills: &[u64],
    promises: Promises,
    anomalies: &mut Vec<Anomaly>,
) {
    let spans = spans(events, promises.delete_keeps_locks);
    double_holders(&spans, kills, anomalies);
    writes_under_another_lock(events, &spans, anomalies);
}

/// A pg native client's lock overlapping a wasmstate holder's, taken
/// shortly after a host was killed since that holder's grant: the killed
/// host's session had the key (see [`KILL_TAKEOVER_MICROS`]).
fn taken_while_a_host_was_down(a: &Span, b: &Span, kills: &[u64]) -> bool {
    let (native, ours) = match (a.native, b.native) {
        (true, false) => (a, b),
        (false, true) => (b, a),
        _ => return false,
    };
    !native.yields
        && kills.iter().any(|&kill| {
            kill >= ours.asked && kill <= native.from && native.from - kill <= KILL_TAKEOVER_MICROS
        })
}

fn double_holders(spans: &[Span], kills: &[u64], anomalies: &mut Vec<Anomaly>) {
    for (i, span) in spans.iter().enumerate() {
        for other in &spans[i + 1..] {
            // Sorted by start: every later span that begins before this
            // one ends overlaps it.
            if other.from >= span.to {
                break;
            }
            if taken_while_a_host_was_down(span, other, kills) {
                continue;
            }
            let who = match (span.native, other.native) {
                (false, false) => "",
                _ => ": a native Terraform client and a wasmstate client",
            };
            anomalies.push(Anomaly {
                what: format!("the lock was granted to two holders at once{who}"),
                events: vec![span.index, other.index],
            });
        }
    }
}

/// An acknowledged write or state delete that began and ended while
/// another holder surely held the lock, sent without its ID.
fn writes_under_another_lock(events: &[&Event], spans: &[Span], anomalies: &mut Vec<Anomaly>) {
    for write in events.iter().filter(|e| e.outcome.is(200)) {
        let sent_with = match &write.op {
            Op::Post(w) => w.lock_id.as_deref(),
            Op::DeleteState(id) => id.as_deref(),
            _ => continue,
        };
        // Spans seldom overlap (that is the other rule's anomaly): the few
        // latest begun before the write are the ones that can hold it.
        let begun = spans.partition_point(|s| s.from < write.start);
        for span in spans[..begun].iter().rev().take(3) {
            if span.to > write.end && sent_with != Some(span.id.as_str()) {
                let holder = if span.native {
                    "a native Terraform client"
                } else {
                    "another client"
                };
                anomalies.push(Anomaly {
                    what: format!(
                        "a {} was accepted while {holder} held the lock",
                        if matches!(write.op, Op::Post(_)) {
                            "write"
                        } else {
                            "state delete"
                        }
                    ),
                    events: vec![span.index, write.index],
                });
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::check::check;
    use super::super::history::{Event, NATIVE, NO_WORKSPACE, Op, Outcome, Written};

    fn event(index: usize, host: usize, start: u64, end: u64, op: Op) -> Event {
        Event {
            index,
            client: index,
            host,
            workspace: "w".into(),
            op,
            start,
            end,
            outcome: Outcome::Answered(200, None),
        }
    }

    fn kill(index: usize, at: u64) -> Event {
        Event {
            workspace: NO_WORKSPACE.into(),
            ..event(index, 0, at, at + 1, Op::Fault(true))
        }
    }

    #[test]
    fn a_native_pg_holder_beside_a_wasmstate_holder_is_two_holders() {
        let pg = |id: &str| Op::NativeLock(id.into(), false);
        let history = [
            event(0, 0, 0, 10, Op::Lock("a".into())),
            // The state deleted under the lock, then the native client's
            // lock on key -1 granted too.
            event(1, 0, 11, 12, Op::DeleteState(Some("a".into()))),
            event(2, NATIVE, 13, 15, pg("native-1")),
            event(3, NATIVE, 20, 21, Op::Unlock("native-1".into())),
            event(4, 0, 30, 31, Op::Unlock("a".into())),
        ];
        let found = check(&history);
        assert!(
            found.iter().any(|a| a.what.contains("native Terraform")),
            "{found:?}"
        );
        // A force-unlock through wasmstate cannot release a pg lock, so
        // the next wasmstate holder overlaps it; it does delete an S3
        // lock file, which ends that native hold.
        let forced = |yields: bool| {
            [
                event(0, NATIVE, 0, 10, Op::NativeLock("native-1".into(), yields)),
                event(1, 1, 11, 12, Op::ForceUnlock),
                event(2, 0, 13, 14, Op::Lock("b".into())),
                event(3, NATIVE, 20, 21, Op::Unlock("native-1".into())),
                event(4, 0, 30, 31, Op::Unlock("b".into())),
            ]
        };
        assert!(!check(&forced(false)).is_empty());
        assert!(
            check(&forced(true)).is_empty(),
            "{:?}",
            check(&forced(true))
        );
        // …and a native lock taken after the native released is fine.
        let after = [
            event(0, NATIVE, 0, 10, pg("native-1")),
            event(1, NATIVE, 11, 12, Op::Unlock("native-1".into())),
            event(2, 0, 13, 14, Op::Lock("a".into())),
        ];
        assert!(check(&after).is_empty(), "{:?}", check(&after));
        // A host killed just before: its session's keys were free.
        let mut killed = history.to_vec();
        killed.push(kill(9, 12));
        assert!(check(&killed).is_empty(), "{:?}", check(&killed));
    }

    #[test]
    fn a_workspace_delete_ends_no_lock_unless_the_guest_predates_that() {
        use super::super::check::{Promises, check_with};
        // "a" granted while the delete ran, then "b" granted too: the
        // delete removed "a"'s lock file.
        let history = [
            event(0, 0, 0, 10, Op::DeleteWorkspace),
            event(1, 1, 2, 5, Op::Lock("a".into())),
            event(2, 2, 20, 21, Op::Lock("b".into())),
            event(3, 1, 30, 31, Op::Unlock("a".into())),
        ];
        let found = check(&history);
        assert!(
            found.iter().any(|a| a.what.contains("two holders")),
            "{found:?}"
        );
        let before = Promises {
            delete_keeps_locks: false,
            ..Promises::ALL
        };
        assert!(check_with(&history, before).is_empty());
    }

    #[test]
    fn a_write_under_another_holders_lock_is_caught() {
        let post = |lock_id: Option<&str>| {
            Op::Post(Written {
                lineage: "l".into(),
                serial: 1,
                digest: "d".into(),
                lock_id: lock_id.map(str::to_string),
                shape: "",
            })
        };
        let history = |lock_id| {
            [
                event(0, NATIVE, 0, 10, Op::NativeLock("native-1".into(), true)),
                event(1, 0, 11, 12, post(lock_id)),
                event(2, NATIVE, 20, 21, Op::Unlock("native-1".into())),
            ]
        };
        let found = check(&history(None));
        assert!(
            found.iter().any(|a| a.what.contains("write was accepted")),
            "{found:?}"
        );
        let own = [
            event(0, 0, 0, 10, Op::Lock("a".into())),
            event(1, 0, 11, 12, post(Some("a"))),
            event(2, 0, 20, 21, Op::Unlock("a".into())),
        ];
        assert!(check(&own).is_empty(), "{:?}", check(&own));
    }
}
