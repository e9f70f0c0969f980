//! The filesystem a guest sees: wasmtime-wasi's `wasi:filesystem/types`,
//! with the host's two bounds in front of it.
//!
//! - **Cores.** File I/O runs inline on the guest threads (half a small
//!   read's latency, measured), so it occupies a core the way wasm does:
//!   every filesystem call, and every blocking read or write through a
//!   file stream, holds the instance's turn ([`super::turns`]), except
//!   `sync`, which waits for the disk on the blocking pool (inline when it
//!   is the server's only guest call: [`sync`]). Only files and
//!   directories open: a FIFO or device would block a worker for ever. A
//!   backend whose guests spin in file I/O keeps at most its share of the
//!   guest threads, as one spinning in wasm does. (A file call never waits on
//!   another guest, so holding a turn through it cannot deadlock.)
//! - **Disk.** Every growth is charged to the directory's quota
//!   ([`super::quota`]) before it happens; a refusal is "no space"
//!   (ENOSPC, WASI's `insufficient-space`) inside the guest. A change
//!   whose charge or credit depends on a size measured before it is
//!   measured, made and settled under the quota's lock ([`ledger`]).
//!
//! Every other method is passed through unchanged. File streams are this
//! module's own: writes charged the same way ([`streams`]), reads made
//! here, holding the turn ([`input`]).

mod input;
mod ledger;
mod open;
mod streams;
mod sync;

use super::quota::{DirQuota, Holder, Identity, InstanceFiles};
use super::sandbox::Sandbox;
use super::turns::Core;
use input::GuestInput;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use streams::{GuestOutput, Target};
use sync::{Flush, sync_off_the_turn};
use wasmtime::component::{HasData, Resource};
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemCtxView};
use wasmtime_wasi::p2::bindings::filesystem::types::{
    self, ErrorCode, HostDescriptor, HostDirectoryEntryStream,
};
use wasmtime_wasi::p2::{DynInputStream, DynOutputStream, FsError, FsResult};

/// Linux's ENOSPC: what a guest sees as `insufficient-space`.
pub(super) const ENOSPC: i32 = 28;

/// Whether file calls run on the guest's own thread (wasmtime-wasi's
/// `allow_blocking_current_thread`): always, see the module's comment.
pub(super) const FILE_IO_INLINE: bool = true;

/// The filesystem interface of one sandbox.
pub struct GuestFs<'a> {
    fs: WasiFilesystemCtxView<'a>,
    quota: Option<&'a Arc<DirQuota>>,
    refused: &'a Arc<AtomicBool>,
    core: &'a Core,
    files: &'a InstanceFiles,
}

/// The `HasData` marker for linking [`GuestFs`].
pub struct GuestFsData;

impl HasData for GuestFsData {
    type Data<'a> = GuestFs<'a>;
}

/// The getter the linker calls for every filesystem call.
pub fn guest_fs(sandbox: &mut Sandbox) -> GuestFs<'_> {
    GuestFs {
        fs: WasiFilesystemCtxView {
            ctx: sandbox.wasi.filesystem(),
            table: &mut sandbox.table,
        },
        quota: sandbox.quota.as_ref(),
        refused: &sandbox.quota_refused,
        core: &sandbox.core,
        files: &sandbox.open_files,
    }
}

/// Add this `wasi:filesystem/types` to `linker`, in place of wasmtime-wasi's
/// (call after `wasmtime_wasi::p2::add_to_linker_async`).
pub fn add_to_linker(linker: &mut wasmtime::component::Linker<Sandbox>) -> anyhow::Result<()> {
    linker.allow_shadowing(true);
    let added = types::add_to_linker::<Sandbox, GuestFsData>(linker, guest_fs);
    linker.allow_shadowing(false);
    Ok(added?)
}

fn io_error(e: std::io::Error) -> FsError {
    ErrorCode::from(e).into()
}

fn borrow(fd: &Resource<types::Descriptor>) -> Resource<types::Descriptor> {
    Resource::new_borrow(fd.rep())
}

/// What a path may be for wasmtime-wasi to open it: a file, a
/// directory, or a symbolic link (followed or refused by the open itself).
fn refuse_special_type(found: types::DescriptorType) -> FsResult<()> {
    use types::DescriptorType as Type;
    match found {
        Type::RegularFile | Type::Directory | Type::SymbolicLink => Ok(()),
        _ => Err(ErrorCode::Unsupported.into()),
    }
}

/// Whether an open creates a new file or fails: it finds nothing there
/// (not even a symbolic link, which `O_EXCL` refuses), so a quota's look
/// before it is spared.
fn creates_new(oflags: types::OpenFlags) -> bool {
    oflags.contains(types::OpenFlags::CREATE | types::OpenFlags::EXCLUSIVE)
}

impl GuestFs<'_> {
    fn file_of(&self, fd: &Resource<types::Descriptor>) -> FsResult<Option<Arc<std::fs::File>>> {
        Ok(match self.fs.table.get(fd)? {
            Descriptor::File(f) => Some(f.file.clone()),
            Descriptor::Dir(_) => None,
        })
    }

    /// The file `fd` is, when this descriptor may write it: only such a
    /// write or `set-size` is charged (one that will fail is passed on to
    /// fail as it does without a quota, charged nothing).
    fn writable_file_of(
        &self,
        fd: &Resource<types::Descriptor>,
    ) -> FsResult<Option<Arc<std::fs::File>>> {
        Ok(match self.fs.table.get(fd)? {
            Descriptor::File(f)
                if !f.perms.write_not_permitted()
                    && f.open_mode.contains(wasmtime_wasi::OpenMode::WRITE) =>
            {
                Some(f.file.clone())
            }
            _ => None,
        })
    }

    /// What a stream on the file `fd` takes in the register of open files
    /// (a stream keeps its file on disk as a descriptor does); entered
    /// once the stream is in the table.
    fn stream_hold(
        &mut self,
        fd: &Resource<types::Descriptor>,
        file: Option<&Arc<std::fs::File>>,
    ) -> Option<StreamHold> {
        let (quota, file) = (self.quota?.clone(), file?.clone());
        Some(StreamHold {
            identity: self.identity_of(fd)?,
            holder: self.files.stream_holder(),
            quota,
            file,
        })
    }

    /// Put this module's output stream in place of wasmtime-wasi's (made
    /// only for its checks) for a file.
    fn replace_output(
        &mut self,
        stream: Resource<DynOutputStream>,
        file: Option<Arc<std::fs::File>>,
        position: Option<u64>,
        hold: Option<StreamHold>,
    ) -> FsResult<Resource<DynOutputStream>> {
        let Some(file) = file else {
            return Ok(stream);
        };
        let _checked: DynOutputStream = self.fs.table.delete(stream)?;
        let target = Target {
            file,
            // Charged even if the file's identity could not be taken.
            quota: self.quota.cloned(),
            holder: hold.as_ref().map(|h| h.holder),
            refused: self.refused.clone(),
        };
        let own: DynOutputStream = Box::new(GuestOutput::new(target, position, self.core.clone()));
        let pushed = self.fs.table.push(own)?;
        if let Some(hold) = hold {
            hold.enter();
        }
        Ok(pushed)
    }
}

/// A stream's place in the register of open files, before it is entered.
struct StreamHold {
    quota: Arc<DirQuota>,
    holder: Holder,
    identity: Identity,
    file: Arc<std::fs::File>,
}

impl StreamHold {
    /// Who lets go when the stream is dropped.
    fn owner(&self) -> (Arc<DirQuota>, Holder) {
        (self.quota.clone(), self.holder)
    }

    /// Enter it, once the stream is in the table (a stream that never got
    /// there must not be left holding the file).
    fn enter(self) {
        self.quota
            .open_files()
            .opened(self.holder, self.identity, self.file);
    }
}

impl types::Host for GuestFs<'_> {
    fn convert_error_code(&mut self, err: FsError) -> wasmtime::Result<ErrorCode> {
        types::Host::convert_error_code(&mut self.fs, err)
    }

    fn filesystem_error_code(
        &mut self,
        err: Resource<wasmtime::Error>,
    ) -> wasmtime::Result<Option<ErrorCode>> {
        types::Host::filesystem_error_code(&mut self.fs, err)
    }
}

impl HostDescriptor for GuestFs<'_> {
    async fn write(
        &mut self,
        fd: Resource<types::Descriptor>,
        buf: Vec<u8>,
        offset: types::Filesize,
    ) -> FsResult<types::Filesize> {
        self.core.hold().await.map_err(FsError::trap)?;
        match (self.quota, self.writable_file_of(&fd)?) {
            (Some(quota), Some(file)) if !buf.is_empty() => {
                self.write_charged(quota, &file, fd, buf, offset)
            }
            _ => HostDescriptor::write(&mut self.fs, fd, buf, offset).await,
        }
    }

    async fn set_size(
        &mut self,
        fd: Resource<types::Descriptor>,
        size: types::Filesize,
    ) -> FsResult<()> {
        self.core.hold().await.map_err(FsError::trap)?;
        match (self.quota, self.writable_file_of(&fd)?) {
            (Some(quota), Some(file)) => self.set_size_charged(quota, &file, fd, size),
            _ => HostDescriptor::set_size(&mut self.fs, fd, size).await,
        }
    }

    fn write_via_stream(
        &mut self,
        fd: Resource<types::Descriptor>,
        offset: types::Filesize,
    ) -> FsResult<Resource<DynOutputStream>> {
        let file = self.file_of(&fd)?;
        let hold = self.stream_hold(&fd, file.as_ref());
        let stream = HostDescriptor::write_via_stream(&mut self.fs, fd, offset)?;
        self.replace_output(stream, file, Some(offset), hold)
    }

    fn append_via_stream(
        &mut self,
        fd: Resource<types::Descriptor>,
    ) -> FsResult<Resource<DynOutputStream>> {
        let file = self.file_of(&fd)?;
        let hold = self.stream_hold(&fd, file.as_ref());
        let stream = HostDescriptor::append_via_stream(&mut self.fs, fd)?;
        self.replace_output(stream, file, None, hold)
    }

    async fn open_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path_flags: types::PathFlags,
        path: String,
        oflags: types::OpenFlags,
        flags: types::DescriptorFlags,
    ) -> FsResult<Resource<types::Descriptor>> {
        self.core.hold().await.map_err(FsError::trap)?;
        // Never a FIFO or a device, and never a wait for one ([`open`]).
        match self.quota {
            Some(quota) => self.open_charged(quota, fd, path_flags, path, oflags, flags),
            None => open::open_at(&mut self.fs, &fd, path_flags, &path, oflags, flags),
        }
    }

    async fn create_directory_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path: String,
    ) -> FsResult<()> {
        self.core.hold().await.map_err(FsError::trap)?;
        ledger::new_entry(
            self.quota,
            self.refused,
            HostDescriptor::create_directory_at(&mut self.fs, fd, path),
        )
    }

    async fn symlink_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        src_path: String,
        dest_path: String,
    ) -> FsResult<()> {
        self.core.hold().await.map_err(FsError::trap)?;
        ledger::new_entry(
            self.quota,
            self.refused,
            HostDescriptor::symlink_at(&mut self.fs, fd, src_path, dest_path),
        )
    }

    async fn link_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        old_path_flags: types::PathFlags,
        old_path: String,
        new_descriptor: Resource<types::Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        self.core.hold().await.map_err(FsError::trap)?;
        ledger::new_entry(
            self.quota,
            self.refused,
            HostDescriptor::link_at(
                &mut self.fs,
                fd,
                old_path_flags,
                old_path,
                new_descriptor,
                new_path,
            ),
        )
    }

    async fn rename_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        old_path: String,
        new_fd: Resource<types::Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        self.core.hold().await.map_err(FsError::trap)?;
        match self.quota {
            Some(quota) => self.rename_charged(quota, fd, old_path, new_fd, new_path),
            None => HostDescriptor::rename_at(&mut self.fs, fd, old_path, new_fd, new_path).await,
        }
    }

    async fn unlink_file_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path: String,
    ) -> FsResult<()> {
        self.core.hold().await.map_err(FsError::trap)?;
        match self.quota {
            Some(quota) => self.unlink_charged(quota, fd, path),
            None => HostDescriptor::unlink_file_at(&mut self.fs, fd, path).await,
        }
    }

    async fn remove_directory_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path: String,
    ) -> FsResult<()> {
        self.core.hold().await.map_err(FsError::trap)?;
        ledger::entry_removed(
            self.quota,
            HostDescriptor::remove_directory_at(&mut self.fs, fd, path),
        )
    }

    // Everything below changes nothing the quota counts.

    async fn advise(
        &mut self,
        fd: Resource<types::Descriptor>,
        offset: types::Filesize,
        len: types::Filesize,
        advice: types::Advice,
    ) -> FsResult<()> {
        self.core.hold().await.map_err(FsError::trap)?;
        HostDescriptor::advise(&mut self.fs, fd, offset, len, advice).await
    }

    async fn sync_data(&mut self, fd: Resource<types::Descriptor>) -> FsResult<()> {
        let target = self.sync_target(&fd)?;
        sync_off_the_turn(target, Flush::Data, self.core).await
    }

    async fn get_flags(
        &mut self,
        fd: Resource<types::Descriptor>,
    ) -> FsResult<types::DescriptorFlags> {
        self.core.hold().await.map_err(FsError::trap)?;
        HostDescriptor::get_flags(&mut self.fs, fd).await
    }

    async fn get_type(
        &mut self,
        fd: Resource<types::Descriptor>,
    ) -> FsResult<types::DescriptorType> {
        self.core.hold().await.map_err(FsError::trap)?;
        HostDescriptor::get_type(&mut self.fs, fd).await
    }

    async fn set_times(
        &mut self,
        fd: Resource<types::Descriptor>,
        atim: types::NewTimestamp,
        mtim: types::NewTimestamp,
    ) -> FsResult<()> {
        self.core.hold().await.map_err(FsError::trap)?;
        HostDescriptor::set_times(&mut self.fs, fd, atim, mtim).await
    }

    async fn read(
        &mut self,
        fd: Resource<types::Descriptor>,
        len: types::Filesize,
        offset: types::Filesize,
    ) -> FsResult<(Vec<u8>, bool)> {
        self.core.hold().await.map_err(FsError::trap)?;
        HostDescriptor::read(&mut self.fs, fd, len, offset).await
    }

    async fn read_directory(
        &mut self,
        fd: Resource<types::Descriptor>,
    ) -> FsResult<Resource<types::DirectoryEntryStream>> {
        self.core.hold().await.map_err(FsError::trap)?;
        HostDescriptor::read_directory(&mut self.fs, fd).await
    }

    async fn sync(&mut self, fd: Resource<types::Descriptor>) -> FsResult<()> {
        let target = self.sync_target(&fd)?;
        sync_off_the_turn(target, Flush::All, self.core).await
    }

    async fn stat(&mut self, fd: Resource<types::Descriptor>) -> FsResult<types::DescriptorStat> {
        self.core.hold().await.map_err(FsError::trap)?;
        HostDescriptor::stat(&mut self.fs, fd).await
    }

    async fn stat_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path_flags: types::PathFlags,
        path: String,
    ) -> FsResult<types::DescriptorStat> {
        self.core.hold().await.map_err(FsError::trap)?;
        HostDescriptor::stat_at(&mut self.fs, fd, path_flags, path).await
    }

    async fn set_times_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path_flags: types::PathFlags,
        path: String,
        atim: types::NewTimestamp,
        mtim: types::NewTimestamp,
    ) -> FsResult<()> {
        self.core.hold().await.map_err(FsError::trap)?;
        if !path_flags.contains(types::PathFlags::SYMLINK_FOLLOW) {
            // wasmtime-wasi sets them by path without opening anything.
            return HostDescriptor::set_times_at(&mut self.fs, fd, path_flags, path, atim, mtim)
                .await;
        }
        if let Descriptor::Dir(d) = self.fs.table.get(&fd)?
            && d.perms.write_not_permitted()
        {
            return Err(ErrorCode::NotPermitted.into());
        }
        // Following a link, wasmtime-wasi would open the target (blocking,
        // on a FIFO): open it as every open is, then set the times on it.
        let flags = (types::OpenFlags::empty(), types::DescriptorFlags::empty());
        match open::open_at(&mut self.fs, &fd, path_flags, &path, flags.0, flags.1) {
            Ok(target) => {
                let set = HostDescriptor::set_times(&mut self.fs, borrow(&target), atim, mtim);
                let set = set.await;
                HostDescriptor::drop(&mut self.fs, target).map_err(FsError::trap)?;
                set
            }
            // A file we own but may not read (an operator's mode 000):
            // wasmtime-wasi's way reaches it without reading; only a file
            // or a directory is let through to it.
            Err(e) if matches!(e.downcast_ref(), Some(ErrorCode::Access)) => {
                let found =
                    HostDescriptor::stat_at(&mut self.fs, borrow(&fd), path_flags, path.clone())
                        .await?;
                refuse_special_type(found.type_)?;
                HostDescriptor::set_times_at(&mut self.fs, fd, path_flags, path, atim, mtim).await
            }
            Err(e) => Err(e),
        }
    }

    fn drop(&mut self, fd: Resource<types::Descriptor>) -> wasmtime::Result<()> {
        let holder = self.files.holder(fd.rep());
        let dropped = HostDescriptor::drop(&mut self.fs, fd);
        if let Some(quota) = self.quota {
            quota.release(holder);
        }
        dropped
    }

    async fn readlink_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path: String,
    ) -> FsResult<String> {
        self.core.hold().await.map_err(FsError::trap)?;
        HostDescriptor::readlink_at(&mut self.fs, fd, path).await
    }

    fn read_via_stream(
        &mut self,
        fd: Resource<types::Descriptor>,
        offset: types::Filesize,
    ) -> FsResult<Resource<DynInputStream>> {
        let file = self.file_of(&fd)?;
        let hold = self.stream_hold(&fd, file.as_ref());
        // wasmtime-wasi's stream, made only for its checks (a directory is
        // `is-directory`), then this module's in its place.
        let stream = HostDescriptor::read_via_stream(&mut self.fs, fd, offset)?;
        let Some(file) = file else {
            return Ok(stream);
        };
        let _checked: DynInputStream = self.fs.table.delete(stream)?;
        let wrapped: DynInputStream = Box::new(GuestInput::new(
            file,
            offset,
            self.core.clone(),
            hold.as_ref().map(StreamHold::owner),
        ));
        let pushed = self.fs.table.push(wrapped)?;
        if let Some(hold) = hold {
            hold.enter();
        }
        Ok(pushed)
    }

    async fn is_same_object(
        &mut self,
        a: Resource<types::Descriptor>,
        b: Resource<types::Descriptor>,
    ) -> wasmtime::Result<bool> {
        self.core.hold().await.map_err(FsError::trap)?;
        HostDescriptor::is_same_object(&mut self.fs, a, b).await
    }

    async fn metadata_hash(
        &mut self,
        fd: Resource<types::Descriptor>,
    ) -> FsResult<types::MetadataHashValue> {
        self.core.hold().await.map_err(FsError::trap)?;
        HostDescriptor::metadata_hash(&mut self.fs, fd).await
    }

    async fn metadata_hash_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path_flags: types::PathFlags,
        path: String,
    ) -> FsResult<types::MetadataHashValue> {
        self.core.hold().await.map_err(FsError::trap)?;
        HostDescriptor::metadata_hash_at(&mut self.fs, fd, path_flags, path).await
    }
}

impl HostDirectoryEntryStream for GuestFs<'_> {
    async fn read_directory_entry(
        &mut self,
        stream: Resource<types::DirectoryEntryStream>,
    ) -> FsResult<Option<types::DirectoryEntry>> {
        self.core.hold().await.map_err(FsError::trap)?;
        loop {
            match HostDirectoryEntryStream::read_directory_entry(
                &mut self.fs,
                Resource::new_borrow(stream.rep()),
            )
            .await
            {
                // wasmtime-wasi asks each entry's type as it lists, so an
                // entry another request removed in between (a temporary
                // file, a workspace deleted) failed the whole listing: it
                // is skipped, as a listing a moment later would not show it.
                Err(e) if matches!(e.downcast_ref(), Some(ErrorCode::NoEntry)) => continue,
                other => return other,
            }
        }
    }

    fn drop(&mut self, stream: Resource<types::DirectoryEntryStream>) -> wasmtime::Result<()> {
        HostDirectoryEntryStream::drop(&mut self.fs, stream)
    }
}
