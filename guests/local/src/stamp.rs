//! The pure half of the compare-and-swap (free of host calls, so it is
//! tested natively): what a file's storage version is made of, when a
//! stored file is as a write expects, and the clock rules of the write
//! marker.
//!
//! ## Why a version is identity + modification time + size
//!
//! WASI gives a file no inode number and no change counter. What it gives:
//! `metadata-hash` (wasmtime hashes the device and inode numbers), the
//! modification time in nanoseconds, and the size. Every write here creates
//! a new file and renames it over the old one, so the identity alone would
//! change with every write, except that a filesystem reuses the inode
//! number of the file a rename just unlinked (ext4 does, often at once):
//! write A replaced by B replaced by C may give C the inode A had. The
//! modification time closes that gap: each writer sets the new file's
//! modification time, under the write marker, to the clock's time but
//! always past the file it replaces ([`next_modified`]), so the times of
//! one path's successive files strictly increase and no two of them share
//! a version, whatever inode each got. The size costs nothing and catches
//! an edit in place by some other program within one clock tick.
//!
//! The identity hash depends on the Rust library the host was built with,
//! so two hosts of different builds may name one file differently: the only
//! effect is a spurious `false` (a refused write), never a wrong success.

use wasmstate_guest::Expect;

/// A time in nanoseconds since the Unix epoch.
pub type Nanos = u128;

/// One second in [`Nanos`].
pub const SECOND: Nanos = 1_000_000_000;

/// How much later than the file it replaces a new file's modification time
/// is set, at least: a microsecond, so that a filesystem keeping times in
/// microseconds still sees them increase.
pub const MIN_STEP: Nanos = 1_000;

/// What one stored file is: its identity, modification time and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// The host's hash of the file's device and inode numbers.
    pub identity: u64,
    /// Its modification time.
    pub modified: Nanos,
    /// Its size in bytes.
    pub size: u64,
}

impl Stamp {
    /// The opaque version the contract hands out and compares.
    pub fn version(&self) -> String {
        format!(
            "{:016x}.{}.{:09}.{}",
            self.identity,
            self.modified / SECOND,
            self.modified % SECOND,
            self.size
        )
    }
}

/// What is stored, as the contract sees it: a zero-byte file is no state
/// (and no metadata), so it is absent.
pub fn stored(stamp: Option<Stamp>) -> Option<Stamp> {
    stamp.filter(|s| s.size > 0)
}

/// Whether the stored file (`None`: nothing stored) is as `expect` says.
pub fn matches(expect: &Expect, current: Option<&Stamp>) -> bool {
    match (expect, current) {
        (Expect::Any, _) | (Expect::Absent, None) => true,
        (Expect::Absent, Some(_)) | (Expect::Version(_), None) => false,
        (Expect::Version(version), Some(stamp)) => *version == stamp.version(),
    }
}

/// The modification time for a file about to replace `current` (`None`:
/// nothing there): the clock's `now`, or just past `current`'s time when
/// the clock is not past it (two writes within a clock tick, a clock set
/// back, a file touched into the future).
pub fn next_modified(now: Nanos, current: Option<Nanos>) -> Nanos {
    match current {
        Some(current) => now.max(current + MIN_STEP),
        None => now,
    }
}

/// Further steps past the replaced file's time, tried in turn when the
/// filesystem stored a new file's time no later than it (it dropped the
/// [`MIN_STEP`]): a millisecond, a second (ext3, ext4 with small inodes,
/// some NFS servers), two seconds (FAT).
pub const COARSER_STEPS: [Nanos; 3] = [1_000_000, SECOND, 2 * SECOND];

/// A write marker older than this was left by a writer that stopped (a
/// killed process, a deadline): a live writer holds one for a few calls,
/// and gives up before [`HOLD_LIMIT`].
pub const STALE_AFTER: Nanos = 6 * SECOND;

/// A writer that held the marker this long does not rename any more (it
/// answers "unavailable"): [`STALE_AFTER`] minus this is the margin the
/// rule relies on (a writer paused longer than 4 s between its last
/// check and its rename, or hosts whose clocks differ by more).
pub const HOLD_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a writer waits for another's marker before answering
/// "unavailable": past [`STALE_AFTER`], so that a marker a killed writer
/// left behind is cleared within one request (under the host's default
/// 10 s deadline).
pub const WAIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(8);

/// Whether a marker last modified at `modified` is debris at `now`. A
/// marker from the future (another host's clock ahead) is not.
pub fn is_stale(modified: Nanos, now: Nanos) -> bool {
    now.saturating_sub(modified) >= STALE_AFTER
}

/// How long to wait before the `attempt`-th look at a marker someone else
/// holds: from a tenth of a millisecond (a live writer holds it for a few
/// calls), doubling to 20 ms.
pub fn pause(attempt: u32) -> std::time::Duration {
    let micros = 100u64 << attempt.min(8);
    std::time::Duration::from_micros(micros.min(20_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(identity: u64, modified: Nanos, size: u64) -> Stamp {
        Stamp {
            identity,
            modified,
            size,
        }
    }

    #[test]
    fn a_version_names_identity_time_and_size() {
        let s = stamp(0xabc, 1_700_000_000 * SECOND + 42, 1234);
        assert_eq!(s.version(), "0000000000000abc.1700000000.000000042.1234");
        // Each part changes the version.
        assert_ne!(s.version(), stamp(0xabd, s.modified, 1234).version());
        assert_ne!(s.version(), stamp(0xabc, s.modified + 1, 1234).version());
        assert_ne!(s.version(), stamp(0xabc, s.modified, 1235).version());
    }

    #[test]
    fn expectations() {
        let s = stamp(1, 2, 3);
        assert!(matches(&Expect::Any, None));
        assert!(matches(&Expect::Any, Some(&s)));
        assert!(matches(&Expect::Absent, None));
        assert!(!matches(&Expect::Absent, Some(&s)));
        assert!(matches(&Expect::Version(s.version()), Some(&s)));
        assert!(!matches(&Expect::Version(s.version()), None));
        let other = stamp(1, 2 + MIN_STEP, 3);
        assert!(!matches(&Expect::Version(s.version()), Some(&other)));
        assert!(!matches(&Expect::Version("garbage".into()), Some(&s)));
    }

    #[test]
    fn an_empty_file_is_nothing_stored() {
        assert_eq!(stored(Some(stamp(1, 2, 0))), None);
        assert_eq!(stored(Some(stamp(1, 2, 5))), Some(stamp(1, 2, 5)));
        assert_eq!(stored(None), None);
    }

    #[test]
    fn successive_files_have_increasing_times_whatever_the_clock() {
        // The clock ahead: its time.
        assert_eq!(next_modified(10 * SECOND, Some(SECOND)), 10 * SECOND);
        // Two writes within one clock reading, or the clock set back:
        // still later than the file replaced.
        assert_eq!(next_modified(SECOND, Some(SECOND)), SECOND + MIN_STEP);
        assert_eq!(
            next_modified(SECOND, Some(5 * SECOND)),
            5 * SECOND + MIN_STEP
        );
        assert_eq!(next_modified(7, None), 7);
        // So a reused inode with the same size never repeats a version.
        let first = stamp(9, SECOND, 100);
        let again = stamp(9, next_modified(SECOND, Some(first.modified)), 100);
        assert_ne!(first.version(), again.version());
    }

    #[test]
    fn coarser_steps_grow_to_a_fat_filesystems_two_seconds() {
        assert!(COARSER_STEPS.windows(2).all(|w| w[0] < w[1]));
        assert!(COARSER_STEPS[0] > MIN_STEP);
        assert_eq!(*COARSER_STEPS.last().unwrap(), 2 * SECOND);
    }

    #[test]
    fn markers_go_stale_after_six_seconds_never_from_the_future() {
        let t = 1_700_000_000 * SECOND;
        assert!(!is_stale(t, t));
        assert!(!is_stale(t, t + STALE_AFTER - 1));
        assert!(is_stale(t, t + STALE_AFTER));
        assert!(!is_stale(t + SECOND, t));
        // The margin between giving up and being broken is four seconds.
        assert_eq!(STALE_AFTER - HOLD_LIMIT.as_nanos(), 4 * SECOND);
        assert!(WAIT_LIMIT.as_nanos() > STALE_AFTER);
    }

    #[test]
    fn pauses_start_short_and_stay_bounded() {
        assert_eq!(pause(0).as_micros(), 100);
        assert_eq!(pause(1).as_micros(), 200);
        assert_eq!(pause(30).as_millis(), 20);
        let total: u128 = (0..50).map(|a| pause(a).as_micros()).sum();
        assert!(total < 2_000_000, "{total}");
    }
}
