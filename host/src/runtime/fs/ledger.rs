//! The disk quota's side of [`GuestFs`]: what each change charges before
//! it happens and credits once it did.

use super::{GuestFs, borrow, open_files};
use crate::runtime::quota::ENTRY_BYTES;
use wasmtime::component::Resource;
use wasmtime_wasi::p2::FsError;
use wasmtime_wasi::p2::FsResult;
use wasmtime_wasi::p2::bindings::filesystem::types::{self, HostDescriptor};

/// What a removal (unlink, or a rename over an existing name) frees.
#[derive(Default)]
pub(super) struct Removal {
    /// Credited as soon as it happened.
    pub(super) credit: u64,
    /// A file this instance holds open, whose bytes are owed at its close.
    pub(super) held_open: Option<open_files::Identity>,
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

    /// What removing `path` would free: its size and entry when it is a
    /// file no other name points at, its entry when it is anything else.
    /// A file this instance holds open frees only its entry now; its bytes
    /// are owed when its last descriptor closes ([`OpenFiles`]), which
    /// [`Removal::done`] arranges once the removal happened.
    pub(super) async fn freed_by_removing(
        &mut self,
        fd: &Resource<types::Descriptor>,
        path: &str,
    ) -> Removal {
        if self.quota.is_none() {
            return Removal::default();
        }
        let stat = HostDescriptor::stat_at(
            &mut self.fs,
            borrow(fd),
            types::PathFlags::empty(),
            path.to_string(),
        )
        .await;
        match stat {
            Ok(st) if st.type_ == types::DescriptorType::RegularFile && st.link_count <= 1 => {
                let identity = self.identity_at(fd, path).await;
                match identity.filter(|id| self.open_files.holds(*id)) {
                    Some(held) => Removal {
                        credit: ENTRY_BYTES,
                        held_open: Some(held),
                    },
                    None => Removal {
                        credit: st.size + ENTRY_BYTES,
                        held_open: None,
                    },
                }
            }
            Ok(_) => Removal {
                credit: ENTRY_BYTES,
                held_open: None,
            },
            Err(_) => Removal::default(),
        }
    }

    /// The identity (device and inode) of what `path` names, if anything.
    pub(super) async fn identity_at(
        &mut self,
        fd: &Resource<types::Descriptor>,
        path: &str,
    ) -> Option<open_files::Identity> {
        HostDescriptor::metadata_hash_at(
            &mut self.fs,
            borrow(fd),
            types::PathFlags::empty(),
            path.to_string(),
        )
        .await
        .ok()
        .map(|h| (h.upper, h.lower))
    }

    /// Settle a removal that happened: credit what it freed now, and owe
    /// the bytes of a file still held open until it closes.
    pub(super) fn removed(&mut self, removal: Removal) {
        self.credit(removal.credit);
        if let Some(identity) = removal.held_open {
            self.open_files.removed(identity);
        }
    }
}
