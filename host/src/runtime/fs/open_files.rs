//! The files one instance holds open, so the disk quota credits a removed
//! file only when its bytes are really freed.
//!
//! A file removed (unlinked, or replaced by a rename) while a descriptor
//! still holds it keeps its bytes on disk until the last descriptor
//! closes. Crediting them at the removal let a guest write a file, keep it
//! open, remove it (credited), write another, and so on past its quota;
//! or shrink the removed file through its descriptor and be credited a
//! second time. So a removal of an open file credits only its entry; its
//! bytes are credited as they are really freed: as it shrinks (as for any
//! file), and what is left when its last descriptor here closes (or the
//! instance ends).

use crate::runtime::quota::DirQuota;
use std::sync::Arc;

/// A file's identity (device and inode, hashed as WASI's metadata hash).
pub type Identity = (u64, u64);

/// One open descriptor of a file.
struct Open {
    /// The descriptor's handle in the instance's resource table.
    rep: u32,
    identity: Identity,
    file: Arc<std::fs::File>,
    /// Its file no longer has a name here: its bytes are owed a credit.
    removed: bool,
}

/// The open files of one instance (only tracked under a quota).
#[derive(Default)]
pub struct OpenFiles {
    open: Vec<Open>,
    quota: Option<Arc<DirQuota>>,
}

impl OpenFiles {
    /// Track files for `quota`.
    pub fn new(quota: Option<Arc<DirQuota>>) -> Self {
        OpenFiles {
            open: Vec::new(),
            quota,
        }
    }

    /// Descriptor `rep` now holds `file`.
    pub fn opened(&mut self, rep: u32, identity: Identity, file: Arc<std::fs::File>) {
        self.open.push(Open {
            rep,
            identity,
            file,
            removed: false,
        });
    }

    /// Whether a descriptor here holds the file `identity`.
    pub fn holds(&self, identity: Identity) -> bool {
        self.open.iter().any(|o| o.identity == identity)
    }

    /// The file `identity` lost its last name while held open.
    pub fn removed(&mut self, identity: Identity) {
        for open in self.open.iter_mut().filter(|o| o.identity == identity) {
            open.removed = true;
        }
    }

    /// Descriptor `rep` closed: a removed file's bytes are credited once
    /// no descriptor here holds it any more.
    pub fn closed(&mut self, rep: u32) {
        let Some(index) = self.open.iter().position(|o| o.rep == rep) else {
            return;
        };
        let closed = self.open.swap_remove(index);
        if closed.removed && !self.holds(closed.identity) {
            self.credit_bytes_of(&closed.file);
        }
    }

    fn credit_bytes_of(&self, file: &std::fs::File) {
        if let (Some(quota), Ok(meta)) = (&self.quota, file.metadata()) {
            quota.credit(meta.len());
        }
    }
}

impl Drop for OpenFiles {
    /// The instance ended with removed files still open: they close now.
    fn drop(&mut self) {
        let mut credited: Vec<Identity> = Vec::new();
        for open in self.open.iter().filter(|o| o.removed) {
            if !credited.contains(&open.identity) {
                credited.push(open.identity);
                self.credit_bytes_of(&open.file);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn a_removed_file_is_credited_once_when_its_last_descriptor_closes() {
        let dir = tempfile::tempdir().unwrap();
        let quota = DirQuota::measure(dir.path(), 1 << 20).unwrap();
        quota.charge(1000, &AtomicBool::new(false)).unwrap();
        let used = quota.used();
        let path = dir.path().join("f");
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(&[0u8; 1000]).unwrap();
        let file = Arc::new(file);
        let mut files = OpenFiles::new(Some(quota.clone()));
        files.opened(1, (1, 2), file.clone());
        files.opened(2, (1, 2), file.clone());
        files.removed((1, 2));
        files.closed(1);
        assert_eq!(quota.used(), used, "credited while still held open");
        files.closed(2);
        assert_eq!(quota.used(), used - 1000);
        files.closed(2);
        assert_eq!(quota.used(), used - 1000, "credited twice");
    }

    #[test]
    fn an_instance_ending_with_a_removed_file_open_credits_it() {
        let dir = tempfile::tempdir().unwrap();
        let quota = DirQuota::measure(dir.path(), 1 << 20).unwrap();
        quota.charge(500, &AtomicBool::new(false)).unwrap();
        let used = quota.used();
        let mut file = std::fs::File::create(dir.path().join("f")).unwrap();
        file.write_all(&[0u8; 500]).unwrap();
        let mut files = OpenFiles::new(Some(quota.clone()));
        files.opened(7, (3, 4), Arc::new(file));
        files.removed((3, 4));
        drop(files);
        assert_eq!(quota.used(), used - 500);
    }
}
