//! Rules for the seams issue 47 found between features that each passed
//! their own tests:
//!
//! - (e) a state of another lineage is never accepted over a stored one
//!   (OpenTofu-encrypted and legacy format-3 states included: the guard
//!   cannot see into them, which is no reason to take them for empty);
//! - (f) no host refuses a state it should serve: with encryption on, a
//!   host that answers 500 because the state "is not sealed" (a workspace
//!   created through the API) or is "older than" one it saw (a state
//!   deleted and a backup of it pushed again, through another replica) is
//!   stuck on a state the history allows.

use super::check::{Anomaly, Deletes};
use super::history::{Event, Op, Outcome};
use std::collections::HashSet;

/// Two unlocked writers racing from one serial (`race` POSTs of one
/// client, lineage and serial, sent at once through two hosts) both
/// answered 200: the guard let two states of one serial in, and one was
/// lost, unless a delete (of the state or the workspace) that may have
/// taken effect ran while they did, so the second found no state.
pub(super) fn races(events: &[&Event], anomalies: &mut Vec<Anomaly>) {
    let racers: Vec<&Event> = events
        .iter()
        .copied()
        .filter(|e| matches!(&e.op, Op::Post(w) if w.shape == "race") && e.outcome.is(200))
        .collect();
    let deletes: Vec<&Event> = events
        .iter()
        .copied()
        .filter(|e| matches!(e.op, Op::DeleteWorkspace | Op::DeleteState(_)))
        .filter(|e| e.outcome.may_have_applied())
        .collect();
    for (i, a) in racers.iter().enumerate() {
        for b in &racers[i + 1..] {
            let (Op::Post(wa), Op::Post(wb)) = (&a.op, &b.op) else {
                continue;
            };
            let paired = a.client == b.client
                && (wa.lineage.as_str(), wa.serial) == (wb.lineage.as_str(), wb.serial)
                && a.start < b.end
                && b.start < a.end;
            if !paired {
                continue;
            }
            let (from, to) = (a.start.min(b.start), a.end.max(b.end));
            if deletes.iter().any(|d| d.start < to && d.end > from) {
                continue;
            }
            anomalies.push(Anomaly {
                what: format!(
                    "two unlocked writers racing from one serial were both acknowledged: {}#{} twice, no delete between",
                    wa.lineage, wa.serial
                ),
                events: vec![a.index, b.index],
            });
        }
    }
}

/// (e) A POST answered 200 whose lineage differs from that of a POST
/// answered 200 before it began, with no delete in between: the first
/// one's state (never empty: every client writes something) was replaced.
pub(super) fn other_lineages(events: &[&Event], anomalies: &mut Vec<Anomaly>) {
    let deletes = Deletes::new(events);
    let mut acknowledged: Vec<(&Event, &str)> = events
        .iter()
        .filter(|e| e.outcome.is(200))
        .filter_map(|e| match &e.op {
            Op::Post(w) => Some((*e, w.lineage.as_str())),
            _ => None,
        })
        .collect();
    acknowledged.sort_by_key(|(e, _)| (e.end, e.index));
    for &(post, lineage) in &acknowledged {
        let before = acknowledged.partition_point(|(e, _)| e.end < post.start);
        // The latest acknowledged before it: if it was of this lineage,
        // anything older was that one's to answer for.
        let Some(&(stored, stored_lineage)) = acknowledged[..before].last() else {
            continue;
        };
        if stored_lineage != lineage && !deletes.between(stored, post) {
            anomalies.push(Anomaly {
                what: format!(
                    "a state of another lineage was accepted over a stored one: {lineage} over {stored_lineage} (a 409 is due)"
                ),
                events: vec![stored.index, post.index],
            });
        }
    }
}

/// What a host says when it refuses a state with encryption on.
const REFUSED: &str = "encryption: ";

/// (f) A 500 whose text is the host refusing to open the state. Storage
/// here never rolls back and no one writes an unsealed state, so the one
/// refusal that can be right is of a state written under a lock that was
/// forced open while it ran, which may land over a newer one: "storage
/// returned serial S" where such a write of serial S began before.
///
/// Unless `history_shared` (the storage keeps the history every replica
/// reads), one more is documented (docs/guarantees.md, "Not yet
/// promised"): a replica that served serial N of a lineage cannot see a
/// delete made through another, so after the state was deleted and serial
/// S < N of that lineage pushed again it refuses S "older than serial N".
/// Only that exact sequence is let through.
pub(super) fn refusals(
    events: &[&Event],
    overridden: &HashSet<usize>,
    history_shared: bool,
    anomalies: &mut Vec<Anomaly>,
) {
    let forced_serials: Vec<(u64, u64)> = events
        .iter()
        .filter(|e| overridden.contains(&e.index))
        .filter_map(|e| match &e.op {
            Op::Post(w) => Some((w.serial, e.start)),
            _ => None,
        })
        .collect();
    for event in events {
        let Outcome::Failed(500, said) = &event.outcome else {
            continue;
        };
        let Some(at) = said.find(REFUSED) else {
            continue;
        };
        let number_after = |words: &str| {
            said.split(words)
                .nth(1)
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|serial| serial.parse::<u64>().ok())
        };
        let returned = number_after("storage returned serial ");
        let newest = number_after("older than serial ");
        let explained = returned.is_some_and(|serial| {
            forced_serials
                .iter()
                .any(|&(s, start)| s == serial && start < event.end)
        }) || (!history_shared
            && returned
                .zip(newest)
                .is_some_and(|(s, n)| pushed_again_lower(events, event, s, n)));
        if !explained {
            let why: String = said[at + REFUSED.len()..].chars().take(160).collect();
            anomalies.push(Anomaly {
                what: format!(
                    "host {} refused a state the history allows: {why}",
                    event.host
                ),
                events: vec![event.index],
            });
        }
    }
}

/// Whether, before `refusal` ended, some lineage had serial `newest`
/// acknowledged or read, then a delete may have applied, then serial
/// `older` of that lineage may have been written.
fn pushed_again_lower(events: &[&Event], refusal: &Event, older: u64, newest: u64) -> bool {
    fn state(e: &Event) -> Option<(&str, u64)> {
        match (&e.op, &e.outcome) {
            (Op::Post(w), outcome) if outcome.is(200) => Some((w.lineage.as_str(), w.serial)),
            (Op::Get, Outcome::Answered(200, Some(seen))) => {
                Some((seen.lineage.as_str(), seen.serial))
            }
            _ => None,
        }
    }
    let deletes: Vec<&&Event> = events
        .iter()
        .filter(|d| matches!(d.op, Op::DeleteWorkspace | Op::DeleteState(_)))
        .filter(|d| d.outcome.may_have_applied() && d.start < refusal.end)
        .collect();
    events
        .iter()
        .filter(|e| e.start < refusal.end)
        .filter_map(|e| Some((e, state(e)?)))
        .filter(|(_, (_, serial))| *serial == newest)
        .any(|(seen, (lineage, _))| {
            deletes.iter().filter(|d| d.end > seen.start).any(|d| {
                events.iter().any(|p| {
                    matches!(&p.op, Op::Post(w) if w.lineage == lineage && w.serial == older)
                        && p.outcome.may_have_applied()
                        && p.end > d.start
                        && p.start < refusal.end
                })
            })
        })
}

#[cfg(test)]
mod tests {
    use super::super::check::check;
    use super::super::history::{Event, Op, Outcome, Seen, Written};

    fn event(index: usize, start: u64, end: u64, op: Op, outcome: Outcome) -> Event {
        Event {
            index,
            client: index,
            host: index % 3,
            workspace: "w".into(),
            op,
            start,
            end,
            outcome,
        }
    }

    fn post(lineage: &str, serial: u64, digest: &str, shape: &'static str) -> Op {
        Op::Post(Written {
            lineage: lineage.into(),
            serial,
            digest: digest.into(),
            lock_id: None,
            shape,
        })
    }

    const OK: Outcome = Outcome::Answered(200, None);

    #[test]
    fn two_racers_from_one_serial_both_acknowledged_are_caught_unless_a_delete_ran() {
        let racer = |index, start, end, digest, outcome| Event {
            client: 7,
            ..event(index, start, end, post("l", 2, digest, "race"), outcome)
        };
        let both = [racer(0, 0, 10, "a", OK), racer(1, 1, 12, "b", OK)];
        let found = check(&both);
        assert!(
            found.iter().any(|a| a.what.contains("both acknowledged")),
            "{found:?}"
        );
        let one_each = [
            racer(0, 0, 10, "a", OK),
            racer(1, 1, 12, "b", Outcome::Answered(409, None)),
        ];
        assert!(check(&one_each).is_empty(), "{:?}", check(&one_each));
        let deleted = [
            racer(0, 0, 10, "a", OK),
            event(1, 4, 6, Op::DeleteWorkspace, OK),
            racer(2, 1, 12, "b", OK),
        ];
        assert!(
            !check(&deleted)
                .iter()
                .any(|a| a.what.contains("both acknowledged")),
            "{:?}",
            check(&deleted)
        );
    }

    #[test]
    fn a_second_lineage_accepted_over_an_opaque_state_is_caught() {
        let history = [
            event(0, 0, 10, post("la", 1, "a", "opaque"), OK),
            event(1, 20, 30, post("lb", 1, "b", ""), OK),
        ];
        let found = check(&history);
        assert!(
            found.iter().any(|a| a.what.contains("another lineage")),
            "{found:?}"
        );
        // Refused, as it must be; or accepted after the state was deleted.
        let refused = [
            event(0, 0, 10, post("la", 1, "a", "opaque"), OK),
            event(
                1,
                20,
                30,
                post("lb", 1, "b", ""),
                Outcome::Answered(409, None),
            ),
        ];
        assert!(check(&refused).is_empty());
        let deleted = [
            event(0, 0, 10, post("la", 1, "a", "opaque"), OK),
            event(1, 12, 14, Op::DeleteState(Some("x".into())), OK),
            event(2, 20, 30, post("lb", 1, "b", ""), OK),
        ];
        assert!(check(&deleted).is_empty(), "{:?}", check(&deleted));
    }

    #[test]
    fn a_replica_refusing_a_state_pushed_again_after_a_delete_is_caught() {
        let refusal = Outcome::Failed(
            500,
            "backend \"chaos\": encryption: state of \"w\": storage returned serial 1, older than serial 2 of the same lineage written or read here before; refused as a rollback".into(),
        );
        let got = |serial, digest: &str| {
            Outcome::Answered(
                200,
                Some(Seen {
                    lineage: "l".into(),
                    serial,
                    digest: digest.into(),
                    blank: false,
                }),
            )
        };
        let history = |second_read: Outcome| {
            [
                event(0, 0, 10, post("l", 1, "one", ""), OK),
                event(1, 11, 20, post("l", 2, "two", ""), OK),
                event(2, 21, 22, Op::Get, got(2, "two")),
                event(3, 23, 24, Op::DeleteState(Some("a".into())), OK),
                event(4, 25, 26, post("l", 1, "one", "re-push"), OK),
                event(5, 27, 28, Op::Get, got(1, "one")),
                event(6, 29, 30, Op::Get, second_read),
            ]
        };
        let found = check(&history(refusal.clone()));
        assert!(
            found.iter().any(|a| a.what.contains("refused a state")),
            "{found:?}"
        );
        // Where the storage keeps no history, exactly this is documented
        // (a replica cannot see the delete); a refusal without a delete
        // and a push of the older serial before it is not.
        use super::super::check::{Promises, check_with};
        let unshared = Promises {
            history_shared: false,
            ..Promises::ALL
        };
        assert!(check_with(&history(refusal.clone()), unshared).is_empty());
        let mut no_delete = history(refusal.clone()).to_vec();
        no_delete.remove(3);
        assert!(
            check_with(&no_delete, unshared)
                .iter()
                .any(|a| a.what.contains("refused a state"))
        );
        // Served by every replica: the history is clean.
        assert!(
            check(&history(got(1, "one"))).is_empty(),
            "{:?}",
            check(&history(got(1, "one")))
        );
        // A workspace created through the API that no host can open.
        let unsealed = [
            event(0, 0, 10, Op::CreateWorkspace, Outcome::Answered(201, None)),
            event(1, 11, 20, Op::Get, Outcome::Failed(500, "backend \"chaos\": encryption: state of \"w\": storage returned a state that is not sealed".into())),
        ];
        assert!(!check(&unsealed).is_empty());
        // Terraform's empty state in it is fine to read.
        let blank = Outcome::Answered(
            200,
            Some(Seen {
                lineage: "x".into(),
                serial: 1,
                digest: "empty".into(),
                blank: true,
            }),
        );
        let created = [
            event(0, 0, 10, Op::CreateWorkspace, Outcome::Answered(201, None)),
            event(1, 11, 20, Op::Get, blank.clone()),
        ];
        assert!(check(&created).is_empty(), "{:?}", check(&created));
        let invented = [event(1, 11, 20, Op::Get, blank)];
        assert!(!check(&invented).is_empty());
    }
}
