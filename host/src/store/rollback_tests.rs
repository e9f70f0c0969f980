//! The rollback marks' judge, stamps and bounds.

use super::*;

/// A rename's moved history raises a fresh start (a read of the new
/// name before the move) but never lowers what this host saw.
#[test]
fn adopted_history_replaces_a_fresh_start_and_never_lowers_a_mark() {
    let marks = RollbackMarks::default();
    marks.start_fresh("w");
    marks.adopt("w", Some("a"), 0, 3);
    assert_eq!(
        marks.read("w", Some("a"), 0, 2, marks.read_start()),
        Err(Rollback {
            newest: 3,
            earlier_life: false
        })
    );
    marks.wrote("v", Some("a"), 0, 9);
    marks.adopt("v", Some("a"), 0, 3);
    marks.adopt("v", Some("b"), 0, 30);
    assert_eq!(
        marks.read("v", Some("a"), 0, 8, marks.read_start()),
        Err(Rollback {
            newest: 9,
            earlier_life: false
        })
    );
}

#[test]
fn an_older_serial_of_the_same_lineage_is_refused() {
    let marks = RollbackMarks::default();
    marks.wrote("w", Some("a"), 0, 5);
    let start = marks.read_start();
    assert_eq!(
        marks.read("w", Some("a"), 0, 4, start),
        Err(Rollback {
            newest: 5,
            earlier_life: false
        })
    );
    assert_eq!(marks.read("w", Some("a"), 0, 5, start), Ok(()));
    assert_eq!(marks.read("w", Some("a"), 0, 6, start), Ok(()));
    assert!(
        marks
            .read("w", Some("a"), 0, 5, marks.read_start())
            .is_err()
    );
}

#[test]
fn a_new_lineage_starts_over() {
    let marks = RollbackMarks::default();
    marks.wrote("w", Some("a"), 0, 40);
    // workspace delete + new on another replica: lineage b, serial 1.
    assert_eq!(marks.read("w", Some("b"), 0, 1, marks.read_start()), Ok(()));
    assert!(
        marks
            .read("w", Some("b"), 0, 0, marks.read_start())
            .is_err()
    );
    marks.forget("w");
    assert!(
        marks.knows("w"),
        "a deleted workspace does not go back to the history"
    );
    assert_eq!(marks.read("w", Some("b"), 0, 0, marks.read_start()), Ok(()));
    assert!(marks.read("w", Some("b"), 0, 0, marks.read_start()).is_ok());
}

#[test]
fn a_read_racing_a_write_is_not_a_rollback() {
    let marks = RollbackMarks::default();
    marks.wrote("w", Some("a"), 0, 5);
    let start = marks.read_start();
    // A write of serial 6 finishes while the read (of 5) is under way.
    marks.wrote("w", Some("a"), 0, 6);
    assert_eq!(marks.read("w", Some("a"), 0, 5, start), Ok(()));
    // And the late read does not lower the mark.
    assert!(
        marks
            .read("w", Some("a"), 0, 5, marks.read_start())
            .is_err()
    );
}

#[test]
fn reads_only_raise_marks_and_writes_set_them() {
    let marks = RollbackMarks::default();
    marks.wrote("w", Some("a"), 0, 9);
    assert_eq!(
        marks.read("w", Some("a"), 0, 12, marks.read_start()),
        Ok(())
    );
    assert!(
        marks
            .read("w", Some("a"), 0, 9, marks.read_start())
            .is_err()
    );
    // A force push back to serial 3 through this host: its new newest.
    marks.wrote("w", Some("a"), 0, 3);
    assert_eq!(marks.read("w", Some("a"), 0, 3, marks.read_start()), Ok(()));
    // A seed never lowers what this host has seen.
    marks.seed("w", Some("a"), 0, 1);
    assert!(
        marks
            .read("w", Some("a"), 0, 2, marks.read_start())
            .is_err()
    );
}

#[test]
fn a_read_that_began_before_a_delete_does_not_undo_it() {
    let marks = RollbackMarks::default();
    marks.wrote("w", Some("a"), 0, 40);
    let start = marks.read_start();
    marks.forget("w");
    // The read saw serial 40 of the deleted state.
    assert_eq!(marks.read("w", Some("a"), 0, 40, start), Ok(()));
    // A backup of serial 5 pushed after the delete is not a rollback.
    assert_eq!(marks.read("w", Some("a"), 0, 5, marks.read_start()), Ok(()));
}

/// Issue 47, security 4: the number of marks is capped; the mark
/// changed longest ago makes room, and the newest stay.
#[test]
fn marks_are_capped_and_the_oldest_makes_room() {
    let gauge = Gauge::default();
    let marks = RollbackMarks {
        cap: 100,
        ..RollbackMarks::counted_in(gauge.clone())
    };
    marks.wrote("kept", Some("a"), 0, 9);
    for i in 0..2_000 {
        marks.wrote(&format!("w{i}"), Some("a"), 0, 1);
        marks.forget(&format!("d{i}"));
    }
    assert_eq!(marks.len(), 100);
    assert_eq!(gauge.get(), 100);
    assert!(!marks.knows("kept"), "the oldest made room");
    assert!(marks.knows("d1999") && marks.knows("w1999"));
    assert!(
        marks
            .read("w1999", Some("a"), 0, 0, marks.read_start())
            .is_err()
    );
    // A write of a workspace already kept takes no room.
    marks.wrote("w1999", Some("a"), 0, 2);
    assert_eq!(marks.len(), 100);
    // The default cap is the documented one.
    assert_eq!(RollbackMarks::default().cap, MAX_MARKS);
}

/// Issue 47, data 4: a seed from the storage's history replaces the
/// mark as a restart would, but never one this host set after the
/// read began.
#[test]
fn a_reseed_replaces_a_mark_as_a_restart_would() {
    let marks = RollbackMarks::default();
    marks.wrote("w", Some("L"), 0, 40);
    let start = marks.read_start();
    // Another replica deleted it and pushed serial 5: the history
    // shows the delete, so the state's life began again.
    assert!(marks.read("w", Some("L"), 0, 5, start).is_err());
    assert!(marks.reseed("w", &Seed::Fresh, start));
    assert_eq!(marks.read("w", Some("L"), 0, 5, start), Ok(()));
    assert!(
        marks
            .read("w", Some("L"), 0, 4, marks.read_start())
            .is_err()
    );
    // A history that still holds serial 40 of the same life keeps the
    // refusal.
    let start = marks.read_start();
    assert!(marks.reseed("w", &Seed::At(Some("L".into()), 0, 40), start));
    assert!(marks.read("w", Some("L"), 0, 5, start).is_err());
    // An unknown seed changes nothing; a write after the read began wins.
    assert!(!marks.reseed("w", &Seed::Unknown, start));
    marks.wrote("w", Some("L"), 0, 41);
    assert!(!marks.reseed("w", &Seed::Fresh, start));
    assert!(
        marks
            .read("w", Some("L"), 0, 40, marks.read_start())
            .is_err()
    );
}

/// Issue 47, data 4: within a lineage, a later life is accepted and
/// replaces the mark whatever its serial; the same life at a lower
/// serial, or an earlier life at any serial, is a rollback.
#[test]
fn a_later_life_starts_over_and_an_earlier_one_is_a_rollback() {
    let marks = RollbackMarks::default();
    marks.wrote("w", Some("L"), 100, 40);
    // The same life, a lower serial: refused as today.
    assert_eq!(
        marks.read("w", Some("L"), 100, 39, marks.read_start()),
        Err(Rollback {
            newest: 40,
            earlier_life: false
        })
    );
    // A later life (deleted and pushed again elsewhere): accepted.
    assert_eq!(
        marks.read("w", Some("L"), 200, 5, marks.read_start()),
        Ok(())
    );
    // ... and now the mark: the old life's serial 40 is a rollback.
    assert_eq!(
        marks.read("w", Some("L"), 100, 40, marks.read_start()),
        Err(Rollback {
            newest: 5,
            earlier_life: true
        })
    );
    // An envelope without a stamp (started 0) is the earliest life.
    assert!(
        marks
            .read("w", Some("L"), 0, 99, marks.read_start())
            .is_err()
    );
    assert!(
        marks
            .read("w", Some("L"), 200, 4, marks.read_start())
            .is_err()
    );
    assert_eq!(
        marks.read("w", Some("L"), 200, 6, marks.read_start()),
        Ok(())
    );
    // Another lineage still replaces the mark whatever its stamp.
    assert_eq!(marks.read("w", Some("M"), 1, 1, marks.read_start()), Ok(()));
    // Seeds compare the same way.
    marks.seed("s", Some("L"), 100, 40);
    assert!(
        marks
            .read("s", Some("L"), 50, 41, marks.read_start())
            .is_err()
    );
    assert_eq!(
        marks.read("s", Some("L"), 150, 1, marks.read_start()),
        Ok(())
    );
}

/// A write carries the life of the stored state the newest read here
/// found when it is of the same lineage; else (no state, another
/// lineage, a delete here, force pushes) a new life is stamped, after
/// every life this host knows.
#[test]
fn a_write_carries_the_stored_life_or_stamps_a_later_one() {
    let marks = RollbackMarks::default();
    // Unknown here: the host's clock.
    let before = now_ns();
    let stamp = marks.stamp("w", true);
    assert!(stamp.started_for(Some("L")) >= before);
    // A read found L started at 100: a write of L carries it, M does not.
    marks.wrote("w", Some("L"), 100, 3);
    let start = marks.read_start();
    assert_eq!(marks.read("w", Some("L"), 100, 4, start), Ok(()));
    let stamp = marks.stamp("w", true);
    assert_eq!(stamp.started_for(Some("L")), 100);
    assert!(stamp.started_for(Some("M")) >= before);
    assert!(marks.stamp("w", false).started_for(Some("L")) >= before);
    // A later read found no state (deleted elsewhere): a new life,
    // and an earlier read finishing late does not undo that.
    let early = marks.read_start();
    marks.absent("w", marks.read_start());
    assert_eq!(marks.read("w", Some("L"), 100, 4, early), Ok(()));
    assert!(marks.stamp("w", true).started_for(Some("L")) >= before);
    // A life known here with a clock ahead of this host's: the new
    // life is stamped after it all the same.
    let ahead = now_ns() + 3_600_000_000_000;
    marks.wrote("w", Some("L"), ahead, 40);
    marks.forget("w");
    assert_eq!(marks.stamp("w", true).started_for(Some("L")), ahead + 1);
    // A re-seal keeps the stamp it is given.
    assert_eq!(Stamp::keep(7).started_for(Some("L")), 7);
    // Absent names get no mark from a read.
    marks.absent("nothing", marks.read_start());
    assert!(!marks.knows("nothing"));
}

/// A mark's size does not grow with the lineage it remembers (a
/// client chooses the lineage; marks live as long as the host).
#[test]
fn a_mark_holds_a_digest_of_any_lineage() {
    // A lineage digest, the one last read, stamps and counters.
    assert!(
        std::mem::size_of::<Mark>() <= 160,
        "{}",
        std::mem::size_of::<Mark>()
    );
    let marks = RollbackMarks::default();
    let long = "l".repeat(1 << 20);
    marks.wrote("w", Some(&long), 0, 5);
    // What is kept is 32 bytes, whatever the lineage's length (a kept
    // lineage would hold its megabyte here).
    let kept = marks
        .marks()
        .get("w")
        .and_then(|m| m.lineage.map(|l| l.len()));
    assert_eq!(kept, Some(32));
    assert!(
        marks
            .read("w", Some(&long), 0, 4, marks.read_start())
            .is_err()
    );
    assert!(marks.read("w", Some("l"), 0, 4, marks.read_start()).is_ok());
}
