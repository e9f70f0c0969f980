//! A disk quota per granted directory (`disk_quota_mib`), held within a
//! request: every way a guest can grow what its directory holds goes
//! through a ledger shared by all instances of the backend, and a growth
//! past the quota fails inside the guest with "no space" (ENOSPC, WASI's
//! `insufficient-space`) before a byte is written.
//!
//! The guest's filesystem ([`super::fs`]) charges the ledger before every
//! growth: `write`, `set-size`, writes through file output streams,
//! `open-at` (a new file, or a truncation), `create-directory-at`,
//! `symlink-at`, `link-at`; and credits it when `rename-at`,
//! `unlink-file-at` or `remove-directory-at` free space. A file counts its
//! size; each directory entry counts [`ENTRY_BYTES`], so a flood of empty
//! files or directories is bounded too. Usage is measured by walking the
//! directory when the backend loads and kept current from then on.
//!
//! Several instances of a backend run at once, so a charge or credit that
//! depends on a size measured before the change (a write's growth, a
//! truncation's or removal's freed bytes) is measured, made and settled
//! under the quota's lock ([`DirQuota::changes`]): two instances
//! truncating one file cannot both be credited its size, nor a write land
//! past a truncation it measured before.

mod open_files;

pub use open_files::{Holder, Identity, InstanceFiles, OpenFiles};

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use wasmtime_wasi::p2::bindings::filesystem::types::ErrorCode;

/// What one directory entry (a file's or directory's name and inode)
/// counts against the quota, whatever its size.
pub const ENTRY_BYTES: u64 = 4096;

/// One backend directory's quota and its current use, shared by every
/// instance of the backend.
#[derive(Debug)]
pub struct DirQuota {
    /// A reload may change it; the count carries over.
    limit: AtomicU64,
    used: AtomicU64,
    /// Set when a growth was refused; the runtime reads and clears it to
    /// answer the request with 507.
    refusals: AtomicU64,
    /// Held through every change whose charge or credit depends on what
    /// was measured before it.
    changes: Mutex<()>,
    /// The backend's open files; held briefly, never through I/O.
    open: Mutex<OpenFiles>,
}

impl DirQuota {
    /// A quota of `limit` bytes on `dir`, whose current use is measured now.
    pub fn measure(dir: &Path, limit: u64) -> std::io::Result<Arc<DirQuota>> {
        Ok(Arc::new(DirQuota {
            limit: AtomicU64::new(limit),
            used: AtomicU64::new(usage(dir)?),
            refusals: AtomicU64::new(0),
            changes: Mutex::default(),
            open: Mutex::default(),
        }))
    }

    /// Take the lock for one change measured before it is made (see the
    /// module's doc). Held only by code that does not suspend, so never
    /// across an `.await`; taken on the async workers only with the
    /// instance's turn held (so a backend's waiters are within its share
    /// of the cores), otherwise on the blocking pool.
    pub fn changes(&self) -> MutexGuard<'_, ()> {
        // A panic under the lock left the count as consistent as any
        // single change does; refusing every later change would be worse.
        self.changes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The backend's register of open files. Taken after [`Self::changes`]
    /// when both are, and held only for its own bookkeeping, so closing a
    /// file never waits for another instance's write.
    pub fn open_files(&self) -> MutexGuard<'_, OpenFiles> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Set the count to what `dir` holds now, plus the removed files still
    /// held open (which a walk cannot see). Exact: no change runs while
    /// the walk does, nor does any holder let go.
    fn measure_again(&self, dir: &Path) -> std::io::Result<()> {
        let _changes = self.changes();
        let open = self.open_files();
        let now = usage(dir)? + open.removed_bytes();
        self.used.store(now, Ordering::Release);
        Ok(())
    }

    /// A change charged `growth` over `before` bytes failed or fell short:
    /// credit what `file` did not grow by (none, if it cannot be told).
    pub fn credit_unmade(&self, file: &std::fs::File, before: u64, growth: u64) {
        let after = file.metadata().map_or(before + growth, |m| m.len());
        self.credit(growth.saturating_sub(after.saturating_sub(before)));
    }

    /// `holder` let go of its file: credit what that freed.
    pub fn release(&self, holder: Holder) {
        let freed = self.open_files().closed(holder);
        self.credit(freed);
    }

    /// The quota in bytes.
    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Bytes counted against it now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Growths refused so far.
    pub fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::Relaxed)
    }

    /// Charge `bytes`, or refuse with no space (and set `refused`).
    pub fn charge(&self, bytes: u64, refused: &AtomicBool) -> Result<(), ErrorCode> {
        if bytes == 0 {
            return Ok(());
        }
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|n| *n <= self.limit())
            })
            .map(drop)
            .map_err(|_| {
                self.refusals.fetch_add(1, Ordering::Relaxed);
                refused.store(true, Ordering::Relaxed);
                ErrorCode::InsufficientSpace
            })
    }

    /// Give back `bytes` (a file shrank or went away).
    pub fn credit(&self, bytes: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(bytes))
            });
    }
}

/// The quotas of the directories the server serves, one per directory
/// (by device and inode, so a symlink or bind mount is the same one) for
/// as long as anything uses it: a reload's backend takes over the quota
/// (its lock and open files) that requests still running on the backend
/// it replaces hold, instead of a second one that cannot see the files
/// they hold open.
#[derive(Debug, Default)]
pub struct DirQuotas(Mutex<HashMap<(u64, u64), Weak<DirQuota>>>);

impl DirQuotas {
    /// The quota of `dir`, now of `limit` bytes: the one in use (measured
    /// again, so a reload picks up what an operator removed by hand), or
    /// one measured now.
    pub fn of(&self, dir: &Path, limit: u64) -> std::io::Result<Arc<DirQuota>> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(dir)?;
        let key = (meta.dev(), meta.ino());
        let mut quotas = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        quotas.retain(|_, q| q.strong_count() > 0);
        if let Some(quota) = quotas.get(&key).and_then(Weak::upgrade) {
            quota.limit.store(limit, Ordering::Relaxed);
            quota.measure_again(dir)?;
            return Ok(quota);
        }
        let quota = DirQuota::measure(dir, limit)?;
        quotas.insert(key, Arc::downgrade(&quota));
        Ok(quota)
    }
}

impl crate::metrics::Usage for DirQuota {
    fn used(&self) -> u64 {
        DirQuota::used(self)
    }
    fn limit(&self) -> u64 {
        DirQuota::limit(self)
    }
}

/// What is under `dir`, counted as the quota counts: file sizes plus
/// [`ENTRY_BYTES`] per entry, a file with several names (hard links) its
/// size once, as `link-at` charges only the new entry. Symlinks are not
/// followed.
pub fn usage(dir: &Path) -> std::io::Result<u64> {
    usage_of(dir, &mut std::collections::HashSet::new())
}

fn usage_of(dir: &Path, seen: &mut std::collections::HashSet<(u64, u64)>) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    for entry in entries {
        // Another host sharing the directory may remove what the listing
        // just named (a temp file renamed, a write marker, a workspace
        // deleted): gone, it holds nothing. A host that failed its start
        // on it instead (seen in the fault-injection run) left a replica
        // down while another deleted a workspace.
        let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
        let path = match entry {
            Ok(entry) => entry.path(),
            Err(e) if gone(&e) => continue,
            Err(e) => return Err(e),
        };
        let meta = match path.symlink_metadata() {
            Ok(meta) => meta,
            Err(e) if gone(&e) => continue,
            Err(e) => return Err(e),
        };
        total += ENTRY_BYTES;
        if meta.is_dir() {
            total += usage_of(&path, seen)?;
        } else if meta.is_file() && seen.insert((meta.dev(), meta.ino())) {
            total += meta.len();
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_sizes_and_entries() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("ws")).unwrap();
        std::fs::write(dir.path().join("ws/terraform.tfstate"), vec![0u8; 10_000]).unwrap();
        assert_eq!(usage(dir.path()).unwrap(), 2 * ENTRY_BYTES + 10_000);
        assert_eq!(usage(&dir.path().join("missing")).unwrap(), 0);
    }

    #[test]
    fn what_another_host_removes_during_the_walk_counts_as_gone() {
        let dir = tempfile::tempdir().unwrap();
        for ws in 0..50 {
            let ws = dir.path().join(format!("ws{ws}"));
            std::fs::create_dir(&ws).unwrap();
            std::fs::write(ws.join("terraform.tfstate"), b"{}").unwrap();
        }
        // Workspaces deleted while the walks run: every walk answers.
        let deleting = {
            let root = dir.path().to_path_buf();
            std::thread::spawn(move || {
                for ws in 0..50 {
                    std::fs::remove_dir_all(root.join(format!("ws{ws}"))).unwrap();
                }
            })
        };
        while !deleting.is_finished() {
            usage(dir.path()).expect("a walk beside deletes");
        }
        deleting.join().unwrap();
        assert_eq!(usage(dir.path()).unwrap(), 0);
    }

    #[test]
    fn a_file_with_two_names_counts_its_size_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), vec![0u8; 10_000]).unwrap();
        std::fs::hard_link(dir.path().join("a"), dir.path().join("b")).unwrap();
        assert_eq!(usage(dir.path()).unwrap(), 2 * ENTRY_BYTES + 10_000);
    }

    #[test]
    fn a_directory_keeps_one_quota_while_it_is_in_use_measured_again_on_reload() {
        let dir = tempfile::tempdir().unwrap();
        let quotas = DirQuotas::default();
        let first = quotas.of(dir.path(), 100_000).unwrap();
        std::fs::write(dir.path().join("a"), vec![0u8; 1000]).unwrap();
        // A file removed while a request holds it open: still on disk.
        let held = Arc::new(std::fs::File::create(dir.path().join("b")).unwrap());
        held.set_len(500).unwrap();
        first.open_files().opened((1, 1), (7, 7), held.clone());
        std::fs::remove_file(dir.path().join("b")).unwrap();
        assert!(first.open_files().removed_if_held((7, 7)));
        let again = quotas.of(&dir.path().join("."), 200_000).unwrap();
        assert!(
            Arc::ptr_eq(&first, &again),
            "a second quota for one directory"
        );
        assert_eq!(
            (again.used(), first.limit()),
            (ENTRY_BYTES + 1000 + 500, 200_000)
        );
        first.release((1, 1));
        assert_eq!(first.used(), ENTRY_BYTES + 1000);
        drop((first, again));
        std::fs::remove_file(dir.path().join("a")).unwrap();
        assert_eq!(
            quotas.of(dir.path(), 100).unwrap().used(),
            0,
            "measured afresh"
        );
    }

    #[test]
    fn the_ledger_refuses_past_the_limit_and_takes_credit_back() {
        let dir = tempfile::tempdir().unwrap();
        let quota = DirQuota::measure(dir.path(), 100).unwrap();
        let refused = AtomicBool::new(false);
        assert!(quota.charge(60, &refused).is_ok());
        assert_eq!(
            quota.charge(41, &refused),
            Err(ErrorCode::InsufficientSpace)
        );
        assert!(refused.load(Ordering::Relaxed));
        assert_eq!((quota.used(), quota.refusals()), (60, 1));
        quota.credit(30);
        assert!(quota.charge(70, &refused).is_ok());
        assert_eq!(quota.used(), 100);
    }
}
