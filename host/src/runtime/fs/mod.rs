//! The filesystem a guest sees: wasmtime-wasi's `wasi:filesystem/types`,
//! with the host's two bounds in front of it.
//!
//! - **Cores.** File I/O runs inline on the guest threads (half a small
//!   read's latency, measured), so it occupies a core the way wasm does:
//!   every filesystem call, and every blocking read or write through a
//!   file stream, holds the instance's turn ([`super::turns`]). A backend
//!   whose guests spin in file I/O keeps at most its share of the guest
//!   threads, as one spinning in wasm does. (A file call never waits on
//!   another guest, so holding a turn through it cannot deadlock.)
//! - **Disk.** Every growth is charged to the directory's quota
//!   ([`super::quota`]) before it happens; a refusal is "no space"
//!   (ENOSPC, WASI's `insufficient-space`) inside the guest.
//!
//! Every other method is passed through unchanged. File streams are
//! wrapped the same way ([`streams`]).

mod ledger;
mod open_files;
mod streams;

pub use open_files::OpenFiles;

use super::quota::{DirQuota, ENTRY_BYTES};
use super::sandbox::Sandbox;
use super::turns::Core;
use ledger::Removal;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use streams::{GuestInput, GuestOutput};
use wasmtime::component::{HasData, Resource};
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemCtxView};
use wasmtime_wasi::p2::bindings::filesystem::types::{
    self, ErrorCode, HostDescriptor, HostDirectoryEntryStream,
};
use wasmtime_wasi::p2::{DynInputStream, DynOutputStream, FsError, FsResult};

/// Linux's ENOSPC: what a guest sees as `insufficient-space`.
pub(super) const ENOSPC: i32 = 28;

/// The filesystem interface of one sandbox.
pub struct GuestFs<'a> {
    fs: WasiFilesystemCtxView<'a>,
    quota: Option<&'a Arc<DirQuota>>,
    refused: &'a Arc<AtomicBool>,
    core: &'a Core,
    open_files: &'a mut OpenFiles,
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
        open_files: &mut sandbox.open_files,
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

impl GuestFs<'_> {
    fn file_of(&self, fd: &Resource<types::Descriptor>) -> FsResult<Option<Arc<std::fs::File>>> {
        Ok(match self.fs.table.get(fd)? {
            Descriptor::File(f) => Some(f.file.clone()),
            Descriptor::Dir(_) => None,
        })
    }

    async fn exists(
        &mut self,
        fd: &Resource<types::Descriptor>,
        flags: types::PathFlags,
        path: &str,
    ) -> Option<types::DescriptorStat> {
        HostDescriptor::stat_at(&mut self.fs, borrow(fd), flags, path.to_string())
            .await
            .ok()
    }

    fn wrap_output(
        &mut self,
        stream: Resource<DynOutputStream>,
        file: Option<Arc<std::fs::File>>,
        position: Option<u64>,
    ) -> FsResult<Resource<DynOutputStream>> {
        let Some(file) = file else {
            return Ok(stream);
        };
        let inner: DynOutputStream = self.fs.table.delete(stream)?;
        let wrapped: DynOutputStream = Box::new(GuestOutput {
            inner,
            file,
            position,
            quota: self.quota.cloned(),
            refused: self.refused.clone(),
            core: self.core.clone(),
        });
        Ok(self.fs.table.push(wrapped)?)
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
        let (Some(_), Some(file)) = (self.quota, self.file_of(&fd)?) else {
            return HostDescriptor::write(&mut self.fs, fd, buf, offset).await;
        };
        let before = file.metadata().map_err(io_error)?.len();
        let end = offset.saturating_add(buf.len() as u64);
        let growth = end.saturating_sub(before);
        self.charge(growth)?;
        match HostDescriptor::write(&mut self.fs, fd, buf, offset).await {
            Ok(written) => {
                // A short write grew the file less than charged.
                let after = file.metadata().map_or(end.max(before), |m| m.len());
                self.credit(growth.saturating_sub(after.saturating_sub(before)));
                Ok(written)
            }
            Err(e) => {
                let after = file.metadata().map_or(before, |m| m.len());
                self.credit(growth.saturating_sub(after.saturating_sub(before)));
                Err(e)
            }
        }
    }

    async fn set_size(
        &mut self,
        fd: Resource<types::Descriptor>,
        size: types::Filesize,
    ) -> FsResult<()> {
        self.core.hold().await.map_err(FsError::trap)?;
        let (Some(_), Some(file)) = (self.quota, self.file_of(&fd)?) else {
            return HostDescriptor::set_size(&mut self.fs, fd, size).await;
        };
        let before = file.metadata().map_err(io_error)?.len();
        self.charge(size.saturating_sub(before))?;
        match HostDescriptor::set_size(&mut self.fs, fd, size).await {
            Ok(()) => {
                self.credit(before.saturating_sub(size));
                Ok(())
            }
            Err(e) => {
                self.credit(size.saturating_sub(before));
                Err(e)
            }
        }
    }

    fn write_via_stream(
        &mut self,
        fd: Resource<types::Descriptor>,
        offset: types::Filesize,
    ) -> FsResult<Resource<DynOutputStream>> {
        let file = self.file_of(&fd)?;
        let stream = HostDescriptor::write_via_stream(&mut self.fs, fd, offset)?;
        self.wrap_output(stream, file, Some(offset))
    }

    fn append_via_stream(
        &mut self,
        fd: Resource<types::Descriptor>,
    ) -> FsResult<Resource<DynOutputStream>> {
        let file = self.file_of(&fd)?;
        let stream = HostDescriptor::append_via_stream(&mut self.fs, fd)?;
        self.wrap_output(stream, file, None)
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
        if self.quota.is_none() {
            return HostDescriptor::open_at(&mut self.fs, fd, path_flags, path, oflags, flags)
                .await;
        }
        let existing = self.exists(&fd, path_flags, &path).await;
        let creates = oflags.contains(types::OpenFlags::CREATE) && existing.is_none();
        if creates {
            self.charge(ENTRY_BYTES)?;
        }
        match HostDescriptor::open_at(&mut self.fs, fd, path_flags, path, oflags, flags).await {
            Ok(opened) => {
                if oflags.contains(types::OpenFlags::TRUNCATE)
                    && let Some(st) = existing
                {
                    self.credit(st.size);
                }
                if let Some(file) = self.file_of(&opened)?
                    && let Ok(hash) =
                        HostDescriptor::metadata_hash(&mut self.fs, borrow(&opened)).await
                {
                    self.open_files
                        .opened(opened.rep(), (hash.upper, hash.lower), file);
                }
                Ok(opened)
            }
            Err(e) => {
                if creates {
                    self.credit(ENTRY_BYTES);
                }
                Err(e)
            }
        }
    }

    async fn create_directory_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path: String,
    ) -> FsResult<()> {
        self.core.hold().await.map_err(FsError::trap)?;
        self.charge(ENTRY_BYTES)?;
        let done = HostDescriptor::create_directory_at(&mut self.fs, fd, path).await;
        if done.is_err() {
            self.credit(ENTRY_BYTES);
        }
        done
    }

    async fn symlink_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        src_path: String,
        dest_path: String,
    ) -> FsResult<()> {
        self.core.hold().await.map_err(FsError::trap)?;
        self.charge(ENTRY_BYTES)?;
        let done = HostDescriptor::symlink_at(&mut self.fs, fd, src_path, dest_path).await;
        if done.is_err() {
            self.credit(ENTRY_BYTES);
        }
        done
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
        self.charge(ENTRY_BYTES)?;
        let done = HostDescriptor::link_at(
            &mut self.fs,
            fd,
            old_path_flags,
            old_path,
            new_descriptor,
            new_path,
        )
        .await;
        if done.is_err() {
            self.credit(ENTRY_BYTES);
        }
        done
    }

    async fn rename_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        old_path: String,
        new_fd: Resource<types::Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        self.core.hold().await.map_err(FsError::trap)?;
        // A rename between two names of one file (the same name, or two
        // hard links) succeeds and changes nothing: it frees nothing.
        let same_file = self.quota.is_some() && {
            let from = self.identity_at(&fd, &old_path).await;
            from.is_some() && from == self.identity_at(&new_fd, &new_path).await
        };
        let replaced = match same_file {
            true => Removal::default(),
            false => self.freed_by_removing(&new_fd, &new_path).await,
        };
        HostDescriptor::rename_at(&mut self.fs, fd, old_path, new_fd, new_path).await?;
        self.removed(replaced);
        Ok(())
    }

    async fn unlink_file_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path: String,
    ) -> FsResult<()> {
        self.core.hold().await.map_err(FsError::trap)?;
        let freed = self.freed_by_removing(&fd, &path).await;
        HostDescriptor::unlink_file_at(&mut self.fs, fd, path).await?;
        self.removed(freed);
        Ok(())
    }

    async fn remove_directory_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path: String,
    ) -> FsResult<()> {
        self.core.hold().await.map_err(FsError::trap)?;
        HostDescriptor::remove_directory_at(&mut self.fs, fd, path).await?;
        self.credit(ENTRY_BYTES);
        Ok(())
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
        self.core.hold().await.map_err(FsError::trap)?;
        HostDescriptor::sync_data(&mut self.fs, fd).await
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
        self.core.hold().await.map_err(FsError::trap)?;
        HostDescriptor::sync(&mut self.fs, fd).await
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
        HostDescriptor::set_times_at(&mut self.fs, fd, path_flags, path, atim, mtim).await
    }

    fn drop(&mut self, fd: Resource<types::Descriptor>) -> wasmtime::Result<()> {
        let rep = fd.rep();
        let dropped = HostDescriptor::drop(&mut self.fs, fd);
        self.open_files.closed(rep);
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
        let stream = HostDescriptor::read_via_stream(&mut self.fs, fd, offset)?;
        let inner: DynInputStream = self.fs.table.delete(stream)?;
        let wrapped: DynInputStream = Box::new(GuestInput {
            inner,
            core: self.core.clone(),
        });
        Ok(self.fs.table.push(wrapped)?)
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
        HostDirectoryEntryStream::read_directory_entry(&mut self.fs, stream).await
    }

    fn drop(&mut self, stream: Resource<types::DirectoryEntryStream>) -> wasmtime::Result<()> {
        HostDirectoryEntryStream::drop(&mut self.fs, stream)
    }
}
