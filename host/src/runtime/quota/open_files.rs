//! The files every instance of a backend holds open, so the disk quota
//! credits a removed file only when its bytes are really freed.
//!
//! A file removed (unlinked, or replaced by a rename) while a descriptor
//! still holds it keeps its bytes on disk until the last descriptor
//! closes. Crediting them at the removal let a guest write a file, keep it
//! open, remove it (credited), write another, and so on past its quota;
//! or shrink the removed file through its descriptor and be credited a
//! second time. So a removal of an open file credits only its entry; its
//! bytes are credited as they are really freed: as it shrinks (as for any
//! file), and what is left when its last descriptor closes (or the last
//! instance holding it ends).
//!
//! The register is the backend's, not one instance's: a file one request
//! holds open and another removes stays on disk just the same. It lives in
//! its own lock ([`super::DirQuota::open_files`]), held briefly: a
//! removal marks the file after it happened, so a holder letting go at
//! the same moment either sees the mark (and credits the bytes) or is
//! gone before it (and the removal credits them).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A file's identity (device and inode, hashed as WASI's metadata hash).
pub type Identity = (u64, u64);

/// One holder of a file: the instance, and its descriptor's handle in
/// that instance's resource table (below 2^32) or its stream's number
/// (from 2^32 up).
pub type Holder = (u64, u64);

/// One file some descriptors hold.
#[derive(Debug)]
struct Held {
    file: Arc<std::fs::File>,
    descriptors: u32,
    /// It no longer has a name: its bytes are owed a credit.
    removed: bool,
}

/// The open files of one backend's instances (only tracked under a quota).
#[derive(Debug, Default)]
pub struct OpenFiles {
    descriptors: HashMap<Holder, Identity>,
    files: HashMap<Identity, Held>,
}

impl OpenFiles {
    /// Descriptor `holder` now holds `file`.
    pub fn opened(&mut self, holder: Holder, identity: Identity, file: Arc<std::fs::File>) {
        if let Some(earlier) = self.descriptors.insert(holder, identity) {
            // A handle is reused only after its descriptor closed.
            self.release(earlier);
        }
        self.files
            .entry(identity)
            .or_insert(Held {
                file,
                descriptors: 0,
                removed: false,
            })
            .descriptors += 1;
    }

    /// Whether anything holds the file `identity`.
    pub fn holds(&self, identity: Identity) -> bool {
        self.files.contains_key(&identity)
    }

    /// The file `identity` lost its last name: if something still holds
    /// it, its bytes are owed when the last holder lets go (true);
    /// otherwise they were freed now (false).
    pub fn removed_if_held(&mut self, identity: Identity) -> bool {
        match self.files.get_mut(&identity) {
            Some(held) => {
                held.removed = true;
                true
            }
            None => false,
        }
    }

    /// The bytes of the removed files something still holds open.
    pub fn removed_bytes(&self) -> u64 {
        self.files
            .values()
            .filter(|f| f.removed)
            .map(|f| f.file.metadata().map_or(0, |m| m.len()))
            .sum()
    }

    /// Descriptor `holder` closed; the bytes to credit (a removed file's,
    /// once nothing holds it any more).
    pub fn closed(&mut self, holder: Holder) -> u64 {
        match self.descriptors.remove(&holder) {
            Some(identity) => self.release(identity),
            None => 0,
        }
    }

    /// Instance `instance` ended with descriptors still open: they close
    /// now. The bytes to credit. (Its streams let go by themselves, when
    /// the last write they started has finished: one may still be running
    /// on the blocking pool, and what it writes is owed with the file.)
    pub fn instance_ended(&mut self, instance: u64) -> u64 {
        let holders: Vec<Holder> = self
            .descriptors
            .keys()
            .filter(|(i, key)| *i == instance && *key < FIRST_STREAM)
            .copied()
            .collect();
        holders.into_iter().map(|h| self.closed(h)).sum()
    }

    fn release(&mut self, identity: Identity) -> u64 {
        let Some(held) = self.files.get_mut(&identity) else {
            return 0;
        };
        held.descriptors -= 1;
        if held.descriptors > 0 {
            return 0;
        }
        let held = self.files.remove(&identity).expect("looked up above");
        match held.removed {
            true => held.file.metadata().map_or(0, |m| m.len()),
            false => 0,
        }
    }
}

/// One instance's name in its backend's register of open files; when the
/// instance ends, whatever it still held closes.
pub struct InstanceFiles {
    quota: Option<Arc<super::DirQuota>>,
    instance: u64,
    streams: AtomicU64,
}

/// The first key of a stream's holder (descriptors' handles are below).
const FIRST_STREAM: u64 = 1 << 32;

/// Numbers instances.
static INSTANCES: AtomicU64 = AtomicU64::new(0);

impl InstanceFiles {
    /// A new instance of a backend with `quota`.
    pub fn new(quota: Option<Arc<super::DirQuota>>) -> Self {
        InstanceFiles {
            quota,
            instance: INSTANCES.fetch_add(1, Ordering::Relaxed),
            streams: AtomicU64::new(FIRST_STREAM),
        }
    }

    /// Who descriptor `rep` of this instance is, in the register.
    pub fn holder(&self, rep: u32) -> Holder {
        (self.instance, rep.into())
    }

    /// A holder for a new file stream of this instance: it lets go when
    /// the stream is dropped, or else when the instance ends.
    pub fn stream_holder(&self) -> Holder {
        (self.instance, self.streams.fetch_add(1, Ordering::Relaxed))
    }
}

impl Drop for InstanceFiles {
    fn drop(&mut self) {
        if let Some(quota) = &self.quota {
            let freed = quota.open_files().instance_ended(self.instance);
            quota.credit(freed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::DirQuota;
    use super::*;
    use std::io::Write;
    use std::sync::atomic::AtomicBool;

    fn file_of(dir: &std::path::Path, name: &str, bytes: usize) -> Arc<std::fs::File> {
        let mut file = std::fs::File::create(dir.join(name)).unwrap();
        file.write_all(&vec![0u8; bytes]).unwrap();
        Arc::new(file)
    }

    #[test]
    fn a_removed_file_is_credited_once_when_its_last_descriptor_closes() {
        let dir = tempfile::tempdir().unwrap();
        let file = file_of(dir.path(), "f", 1000);
        let mut files = OpenFiles::default();
        files.opened((1, 1), (1, 2), file.clone());
        files.opened((1, 2), (1, 2), file.clone());
        assert!(files.removed_if_held((1, 2)));
        assert_eq!(files.closed((1, 1)), 0, "credited while still held open");
        assert_eq!(files.closed((1, 2)), 1000);
        assert_eq!(files.closed((1, 2)), 0, "credited twice");
    }

    #[test]
    fn a_file_another_instance_holds_is_credited_when_that_one_closes_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = file_of(dir.path(), "f", 700);
        let mut files = OpenFiles::default();
        files.opened((1, 5), (3, 4), file.clone());
        files.opened((2, 5), (3, 4), file);
        assert!(files.holds((3, 4)));
        assert!(files.removed_if_held((3, 4)));
        assert_eq!(files.instance_ended(2), 0, "instance 1 still holds it");
        assert_eq!(files.instance_ended(1), 700);
        assert!(!files.holds((3, 4)));
        assert!(!files.removed_if_held((3, 4)), "no one holds it: freed now");
    }

    #[test]
    fn an_instance_ending_with_a_removed_file_open_credits_it() {
        let dir = tempfile::tempdir().unwrap();
        let quota = DirQuota::measure(dir.path(), 1 << 20).unwrap();
        quota.charge(500, &AtomicBool::new(false)).unwrap();
        let used = quota.used();
        let instance = InstanceFiles::new(Some(quota.clone()));
        let file = file_of(dir.path(), "f", 500);
        quota
            .open_files()
            .opened(instance.holder(7), (3, 4), file.clone());
        assert!(quota.open_files().removed_if_held((3, 4)));
        drop(instance);
        assert_eq!(quota.used(), used - 500);
    }
}
