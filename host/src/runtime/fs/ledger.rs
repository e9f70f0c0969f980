//! The disk quota's side of [`GuestFs`]: each change that grows or frees
//! space, charged before it happens and credited once it did, measured,
//! made and settled under the quota's lock ([`DirQuota::changes`]) so that
//! another instance of the backend cannot change what was measured in
//! between.

use super::{GuestFs, borrow, creates_new, io_error, open};
use crate::runtime::quota::{DirQuota, ENTRY_BYTES, Identity};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::task::{Context, Poll, Wake, Waker};
use wasmtime::component::Resource;
use wasmtime_wasi::p2::FsError;
use wasmtime_wasi::p2::FsResult;
use wasmtime_wasi::p2::bindings::filesystem::types::{self, HostDescriptor};

/// Most bytes one positional write under a quota writes.
const MAX_WRITE: usize = 1 << 20;

/// What a removal (unlink, or a rename over an existing name) frees,
/// measured before it.
#[derive(Default)]
pub(super) struct Removal {
    /// The name's entry, credited once it happened.
    entry: u64,
    /// A file that loses its last name, and its size: credited then, or,
    /// if something still holds it open, when the last holder lets go.
    file: Option<(Identity, u64)>,
}

/// Run one of wasmtime-wasi's filesystem calls to its end on this thread.
///
/// The sandbox lets file I/O block its thread
/// (`allow_blocking_current_thread`), so these calls finish on their first
/// poll; that is what lets them run under the quota's lock, which is never
/// held across a suspension. Should one not finish (a wasmtime-wasi that
/// moved it to a blocking pool), it is waited for here, not dropped half
/// done.
pub(super) fn inline<F: Future>(call: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let mut call = pin!(call);
    if let Poll::Ready(done) = call.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        return done;
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    loop {
        if let Poll::Ready(done) = call.as_mut().poll(&mut Context::from_waker(&waker)) {
            return done;
        }
        std::thread::park();
    }
}

/// A call that adds one entry (a directory, a symlink, a hard link),
/// charged the entry. Under the lock: a link made between another
/// instance's count of a file's names and its removal would leave that
/// removal credited for bytes still on disk.
pub(super) fn new_entry(
    quota: Option<&Arc<DirQuota>>,
    refused: &AtomicBool,
    call: impl Future<Output = FsResult<()>>,
) -> FsResult<()> {
    let Some(quota) = quota else {
        return inline(call);
    };
    let _changes = quota.changes();
    quota.charge(ENTRY_BYTES, refused).map_err(FsError::from)?;
    let done = inline(call);
    if done.is_err() {
        quota.credit(ENTRY_BYTES);
    }
    done
}

/// A directory's removal, credited its entry once it happened (under the
/// lock, like every change to names).
pub(super) fn entry_removed(
    quota: Option<&Arc<DirQuota>>,
    call: impl Future<Output = FsResult<()>>,
) -> FsResult<()> {
    let Some(quota) = quota else {
        return inline(call);
    };
    let _changes = quota.changes();
    inline(call)?;
    quota.credit(ENTRY_BYTES);
    Ok(())
}

impl GuestFs<'_> {
    pub(super) fn charge(&self, bytes: u64) -> FsResult<()> {
        match self.quota {
            Some(q) => q.charge(bytes, self.refused).map_err(FsError::from),
            None => Ok(()),
        }
    }

    pub(super) fn credit(&self, bytes: u64) {
        if let Some(q) = self.quota {
            q.credit(bytes);
        }
    }

    /// A positional write, charged what it grows the file by; at most
    /// [`MAX_WRITE`] of it (a short write, which WASI allows), so the lock
    /// is held briefly.
    pub(super) fn write_charged(
        &mut self,
        quota: &DirQuota,
        file: &std::fs::File,
        fd: Resource<types::Descriptor>,
        mut buf: Vec<u8>,
        offset: types::Filesize,
    ) -> FsResult<types::Filesize> {
        buf.truncate(MAX_WRITE);
        let _changes = quota.changes();
        let before = file.metadata().map_err(io_error)?.len();
        let end = offset.saturating_add(buf.len() as u64);
        let growth = end.saturating_sub(before);
        self.charge(growth)?;
        let written = inline(HostDescriptor::write(&mut self.fs, fd, buf, offset));
        // A short or failed write grew the file less than charged.
        quota.credit_unmade(file, before, growth);
        written
    }

    /// A `set-size`: charged what it grows, credited what it frees.
    pub(super) fn set_size_charged(
        &mut self,
        quota: &DirQuota,
        file: &std::fs::File,
        fd: Resource<types::Descriptor>,
        size: types::Filesize,
    ) -> FsResult<()> {
        let _changes = quota.changes();
        let before = file.metadata().map_err(io_error)?.len();
        self.charge(size.saturating_sub(before))?;
        let done = inline(HostDescriptor::set_size(&mut self.fs, fd, size));
        match done {
            Ok(()) => self.credit(before.saturating_sub(size)),
            Err(_) => self.credit(size.saturating_sub(before)),
        }
        done
    }

    /// An `open-at`: a FIFO or device refused ([`open`]), a new file
    /// charged its entry, a truncated one credited its bytes, and the file
    /// entered in the register of open files (all under the quota's lock,
    /// so a removal by another instance cannot come between the open and
    /// the register).
    pub(super) fn open_charged(
        &mut self,
        quota: &DirQuota,
        fd: Resource<types::Descriptor>,
        path_flags: types::PathFlags,
        path: String,
        oflags: types::OpenFlags,
        flags: types::DescriptorFlags,
    ) -> FsResult<Resource<types::Descriptor>> {
        let _changes = quota.changes();
        // The look serves the charge of a new entry and the credit of a
        // truncated file, nothing else (the open refuses FIFOs and devices
        // itself): none for a plain open, nor for a create-new one, which
        // finds nothing there or fails (crediting the entry back).
        let changes_size = oflags.intersects(types::OpenFlags::CREATE | types::OpenFlags::TRUNCATE);
        let existing = match creates_new(oflags) || !changes_size {
            true => None,
            false => inline(HostDescriptor::stat_at(
                &mut self.fs,
                borrow(&fd),
                path_flags,
                path.clone(),
            ))
            .ok(),
        };
        let creates = oflags.contains(types::OpenFlags::CREATE) && existing.is_none();
        if creates {
            self.charge(ENTRY_BYTES)?;
        }
        let opened = open::open_at(&mut self.fs, &fd, path_flags, &path, oflags, flags);
        let opened = match opened {
            Ok(opened) => opened,
            Err(e) => {
                if creates {
                    self.credit(ENTRY_BYTES);
                }
                return Err(e);
            }
        };
        if oflags.contains(types::OpenFlags::TRUNCATE)
            && let Some(st) = existing
        {
            self.credit(st.size);
        }
        if let Some(file) = self.file_of(&opened)?
            && let Some(identity) = self.identity_of(&opened)
        {
            quota
                .open_files()
                .opened(self.files.holder(opened.rep()), identity, file);
        }
        Ok(opened)
    }

    /// A `rename-at`: credited what the name it replaces freed.
    pub(super) fn rename_charged(
        &mut self,
        quota: &DirQuota,
        fd: Resource<types::Descriptor>,
        old_path: String,
        new_fd: Resource<types::Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        let _changes = quota.changes();
        // A rename between two names of one file (the same name, or two
        // hard links) succeeds and changes nothing: it frees nothing.
        let from = self.identity_at(&fd, &old_path);
        let same_file = from.is_some() && from == self.identity_at(&new_fd, &new_path);
        let replaced = match same_file {
            true => Removal::default(),
            false => self.freed_by_removing(&new_fd, &new_path),
        };
        inline(HostDescriptor::rename_at(
            &mut self.fs,
            fd,
            old_path,
            new_fd,
            new_path,
        ))?;
        self.removed(quota, replaced);
        Ok(())
    }

    /// An `unlink-file-at`: credited what it freed.
    pub(super) fn unlink_charged(
        &mut self,
        quota: &DirQuota,
        fd: Resource<types::Descriptor>,
        path: String,
    ) -> FsResult<()> {
        let _changes = quota.changes();
        let freed = self.freed_by_removing(&fd, &path);
        inline(HostDescriptor::unlink_file_at(&mut self.fs, fd, path))?;
        self.removed(quota, freed);
        Ok(())
    }

    /// What removing `path` would free (measured under the quota's
    /// lock, so no write changes it before the removal): its entry, and
    /// when it is a file no other name points at, its bytes.
    fn freed_by_removing(&mut self, fd: &Resource<types::Descriptor>, path: &str) -> Removal {
        let stat = inline(HostDescriptor::stat_at(
            &mut self.fs,
            borrow(fd),
            types::PathFlags::empty(),
            path.to_string(),
        ));
        match stat {
            Ok(st) if st.type_ == types::DescriptorType::RegularFile && st.link_count <= 1 => {
                Removal {
                    entry: ENTRY_BYTES,
                    file: self.identity_at(fd, path).map(|id| (id, st.size)),
                }
            }
            Ok(_) => Removal {
                entry: ENTRY_BYTES,
                file: None,
            },
            Err(_) => Removal::default(),
        }
    }

    /// The identity (device and inode) of what `path` names, if anything.
    fn identity_at(&mut self, fd: &Resource<types::Descriptor>, path: &str) -> Option<Identity> {
        inline(HostDescriptor::metadata_hash_at(
            &mut self.fs,
            borrow(fd),
            types::PathFlags::empty(),
            path.to_string(),
        ))
        .ok()
        .map(|h| (h.upper, h.lower))
    }

    /// Settle a removal that happened: credit its entry, and the bytes of
    /// a file nothing holds open any more (one still held is credited when
    /// the last holder lets go: [`crate::runtime::quota::OpenFiles`]).
    fn removed(&mut self, quota: &DirQuota, removal: Removal) {
        self.credit(removal.entry);
        if let Some((identity, size)) = removal.file
            && !quota.open_files().removed_if_held(identity)
        {
            self.credit(size);
        }
    }

    /// The identity of the file `fd` is, for the register of open files.
    pub(super) fn identity_of(&mut self, fd: &Resource<types::Descriptor>) -> Option<Identity> {
        inline(HostDescriptor::metadata_hash(&mut self.fs, borrow(fd)))
            .ok()
            .map(|h| (h.upper, h.lower))
    }
}
