//! Files in the directory the operator granted this guest (seen at
//! [`GRANTED_DIR`]), through WASI's descriptor calls.
//!
//! Why not `std::fs`: under WASI preview 2, `std::fs` reads and writes
//! through streams, which the host serves in small chunks on a thread pool.
//! [`Dir`] reads up to 64 KiB and writes a whole buffer per host call, run
//! inline — a 100 KiB state reads about three times faster. The API mirrors
//! `std::fs` and returns `std::io::Result`, so `?` and `ErrorKind` work as
//! usual.
//!
//! Paths are relative to the directory and may not leave it (`..` and
//! absolute paths are refused by the host).

use std::io::{Error as IoError, ErrorKind, Result};
use wasip2::filesystem::preopens;
use wasip2::filesystem::types::{
    Descriptor, DescriptorFlags, DescriptorType, ErrorCode, OpenFlags, PathFlags,
};

/// Where the host mounts a backend's granted directory inside the guest.
pub const GRANTED_DIR: &str = "/data";

/// The most bytes asked for in one read call; the host caps each at 64 KiB.
const READ_CHUNK: u64 = 1 << 20;
/// The least asked for: enough to find a file's end in one call.
const SMALL_READ: u64 = 4 << 10;
/// The first buffer for copying into a new file, grown 4x at a time (to
/// [`READ_CHUNK`]) while the source fills it.
const SMALL_WRITE: usize = 16 << 10;

/// A directory handle.
pub struct Dir {
    fd: Descriptor,
}

fn io_error(code: ErrorCode, what: &str, path: &str) -> IoError {
    let kind = match code {
        ErrorCode::NoEntry => ErrorKind::NotFound,
        ErrorCode::Exist => ErrorKind::AlreadyExists,
        ErrorCode::Access | ErrorCode::NotPermitted | ErrorCode::ReadOnly => {
            ErrorKind::PermissionDenied
        }
        ErrorCode::WouldBlock => ErrorKind::WouldBlock,
        ErrorCode::Busy => ErrorKind::ResourceBusy,
        ErrorCode::Interrupted => ErrorKind::Interrupted,
        ErrorCode::NotDirectory => ErrorKind::NotADirectory,
        ErrorCode::IsDirectory => ErrorKind::IsADirectory,
        ErrorCode::NotEmpty => ErrorKind::DirectoryNotEmpty,
        ErrorCode::InsufficientSpace | ErrorCode::Quota => ErrorKind::StorageFull,
        ErrorCode::Unsupported => ErrorKind::Unsupported,
        _ => ErrorKind::Other,
    };
    IoError::new(kind, format!("{what} {path:?}: {code:?}"))
}

/// An error once a create-new open succeeded, which a caller must not
/// take for the open's own "it exists" or "no such directory": retried
/// with another name or once the directory is made, the write would start
/// from a source already partly read.
fn after_open(e: IoError) -> IoError {
    match e.kind() {
        ErrorKind::AlreadyExists | ErrorKind::NotFound => IoError::other(e.to_string()),
        _ => e,
    }
}

/// With `sync`, flush the new file at `path` to stable storage.
fn sync_new(file: &Descriptor, path: &str, sync: bool) -> Result<()> {
    if sync {
        file.sync()
            .map_err(|e| after_open(io_error(e, "syncing", path)))?;
    }
    Ok(())
}

impl Dir {
    /// The directory the operator granted this backend. Fails with a message
    /// for the operator when none was granted.
    pub fn granted() -> Result<Dir> {
        preopens::get_directories()
            .into_iter()
            .find(|(_, path)| path == GRANTED_DIR)
            .map(|(fd, _)| Dir { fd })
            .ok_or_else(|| {
                IoError::new(
                    ErrorKind::NotFound,
                    format!(
                        "no directory is granted to this guest at {GRANTED_DIR}: \
                         set `dir` in the backend's config"
                    ),
                )
            })
    }

    /// This directory's WASI descriptor, for the calls [`Dir`] has no
    /// method for (a file's identity or times, a read of its first bytes).
    pub fn descriptor(&self) -> &Descriptor {
        &self.fd
    }

    fn open(&self, path: &str, open: OpenFlags, flags: DescriptorFlags) -> Result<Descriptor> {
        self.fd
            .open_at(PathFlags::empty(), path, open, flags)
            .map_err(|e| io_error(e, "opening", path))
    }

    /// Open `path` for reading; `None` when it does not exist.
    fn open_existing(&self, path: &str) -> Result<Option<Descriptor>> {
        match self.open(path, OpenFlags::empty(), DescriptorFlags::READ) {
            Ok(file) => Ok(Some(file)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Hand every chunk of `file` from `offset` to `each`, in order, to
    /// its end.
    fn read_chunks(
        file: &Descriptor,
        path: &str,
        size: u64,
        mut offset: u64,
        mut each: impl FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        loop {
            // Ask for what the file holds, not a whole chunk: the host
            // sets aside what is asked for, and a lock file is a few
            // hundred bytes. Past the size, a small read finds the end.
            let want = size.saturating_sub(offset).clamp(SMALL_READ, READ_CHUNK);
            let (chunk, eof) = file
                .read(want, offset)
                .map_err(|e| io_error(e, "reading", path))?;
            each(&chunk)?;
            offset += chunk.len() as u64;
            if eof || chunk.is_empty() {
                return Ok(());
            }
        }
    }

    /// The whole file, or `None` when it does not exist. Made for small
    /// files (a lock is a few hundred bytes): the first read asks for
    /// 4 KiB, and only a file that fills it is asked its size, to read the
    /// rest in as few calls as it takes (a host call less per small file
    /// than asking first).
    pub fn read(&self, path: &str) -> Result<Option<Vec<u8>>> {
        let Some(file) = self.open_existing(path)? else {
            return Ok(None);
        };
        let (mut bytes, eof) = file
            .read(SMALL_READ, 0)
            .map_err(|e| io_error(e, "reading", path))?;
        if eof || bytes.is_empty() {
            return Ok(Some(bytes));
        }
        let size = match bytes.len() as u64 == SMALL_READ {
            true => file.stat().map(|s| s.size).unwrap_or(0),
            // Short: most likely the end, which the next read confirms
            // (a short read alone proves nothing on every filesystem).
            false => 0,
        };
        let offset = bytes.len() as u64;
        Self::read_chunks(&file, path, size, offset, |chunk| {
            bytes.extend_from_slice(chunk);
            Ok(())
        })?;
        Ok(Some(bytes))
    }

    /// Copy the file into `out` chunk by chunk, never holding it whole;
    /// `false` when it does not exist.
    pub fn read_to(&self, path: &str, out: &mut dyn std::io::Write) -> Result<bool> {
        let Some(file) = self.open_existing(path)? else {
            return Ok(false);
        };
        let size = file.stat().map(|s| s.size).unwrap_or(0);
        Self::read_chunks(&file, path, size, 0, |chunk| out.write_all(chunk))?;
        Ok(true)
    }

    /// Copy the file into the state `out` without it passing through this
    /// guest's memory: the host copies from the file's stream (a read
    /// that stops early, wanting only a prefix, stops the copy too).
    /// `false` when it does not exist.
    pub fn read_to_state(&self, path: &str, out: &mut crate::StateWriter<'_>) -> Result<bool> {
        let Some(file) = self.open_existing(path)? else {
            return Ok(false);
        };
        let stream = file
            .read_via_stream(0)
            .map_err(|e| io_error(e, "reading", path))?;
        out.copy_from(&stream)
            .map_err(|e| IoError::other(format!("reading {path}: {e}")))?;
        Ok(true)
    }

    /// Create `path`, which must not exist, holding `bytes`; with `sync`,
    /// flushed to stable storage before returning.
    pub fn create_new(&self, path: &str, bytes: &[u8], sync: bool) -> Result<()> {
        self.create_new_from(path, &mut &bytes[..], sync)
    }

    /// Create `path`, which must not exist, holding the rest of `state`;
    /// with `sync`, flushed to stable storage before returning. The host
    /// copies the state into the file's stream ([`StateReader::copy_to`]):
    /// the bytes never pass through this guest's memory, which the host
    /// must otherwise clean after the request, and a 100 KiB state is one
    /// host call instead of a read and a write per chunk. A copy that fails
    /// part way leaves a partial file behind: the caller removes it.
    ///
    /// [`StateReader::copy_to`]: crate::StateReader::copy_to
    pub fn create_new_from_state(
        &self,
        path: &str,
        state: &mut crate::StateReader<'_>,
        sync: bool,
    ) -> Result<()> {
        let file = self.create_new_file(path)?;
        let stream = file
            .write_via_stream(0)
            .map_err(|e| after_open(io_error(e, "writing", path)))?;
        let copied = state.copy_to(&stream);
        // The stream is a child of the file: let it go before the file.
        drop(stream);
        copied.map_err(|e| IoError::other(format!("writing {path:?}: {e}")))?;
        sync_new(&file, path, sync)
    }

    /// Create `path`, which must not exist, holding what `source` yields to
    /// its end, copied in chunks; with `sync`, flushed to stable storage
    /// before returning.
    pub fn create_new_from(
        &self,
        path: &str,
        source: &mut dyn std::io::Read,
        sync: bool,
    ) -> Result<()> {
        let file = self.create_new_file(path)?;
        // Small first, growing while the source fills it: every page of
        // it is memory the host must clean after the request, and most
        // files written are a lock or a small state.
        let mut buffer = vec![0u8; SMALL_WRITE];
        let mut offset = 0u64;
        loop {
            let filled = match source.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(after_open(e)),
            };
            let mut written = 0usize;
            while written < filled {
                let n = file
                    .write(&buffer[written..filled], offset)
                    .map_err(|e| after_open(io_error(e, "writing", path)))?;
                if n == 0 {
                    return Err(IoError::new(
                        ErrorKind::WriteZero,
                        format!("writing {path:?}"),
                    ));
                }
                written += n as usize;
                offset += n;
            }
            if filled == buffer.len() && buffer.len() < READ_CHUNK as usize {
                buffer.resize(buffer.len() * 4, 0);
            }
        }
        sync_new(&file, path, sync)
    }

    /// A new file at `path`, which must not exist, open for writing.
    fn create_new_file(&self, path: &str) -> Result<Descriptor> {
        self.open(
            path,
            OpenFlags::CREATE | OpenFlags::EXCLUSIVE,
            DescriptorFlags::WRITE,
        )
    }

    /// Flush directory `path` (`"."` for this one) to stable storage: its
    /// entries, so a rename, link or new file inside it survives a power
    /// loss (a file's own sync does not cover the name pointing at it).
    pub fn sync_dir(&self, path: &str) -> Result<()> {
        let synced = if path == "." {
            self.fd.sync()
        } else {
            self.open(path, OpenFlags::DIRECTORY, DescriptorFlags::READ)?
                .sync()
        };
        synced.map_err(|e| io_error(e, "syncing directory", path))
    }

    /// Modification time of `path` in seconds since the epoch; `None` when
    /// it does not exist or the clock is unknown.
    pub fn modified_secs(&self, path: &str) -> Result<Option<u64>> {
        match self.fd.stat_at(PathFlags::empty(), path) {
            Ok(stat) => Ok(stat.data_modification_timestamp.map(|t| t.seconds)),
            Err(ErrorCode::NoEntry) => Ok(None),
            Err(e) => Err(io_error(e, "inspecting", path)),
        }
    }

    /// Atomically replace `to` with `from`.
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.fd
            .rename_at(from, &self.fd, to)
            .map_err(|e| io_error(e, "renaming to", to))
    }

    /// Make `to` another name of `from`; fails with `AlreadyExists` when
    /// `to` exists, atomically — the basis of exclusive locks.
    pub fn hard_link(&self, from: &str, to: &str) -> Result<()> {
        self.fd
            .link_at(PathFlags::empty(), from, &self.fd, to)
            .map_err(|e| io_error(e, "linking", to))
    }

    /// Remove a file.
    pub fn remove_file(&self, path: &str) -> Result<()> {
        self.fd
            .unlink_file_at(path)
            .map_err(|e| io_error(e, "removing", path))
    }

    /// Create a directory.
    pub fn create_dir(&self, path: &str) -> Result<()> {
        self.fd
            .create_directory_at(path)
            .map_err(|e| io_error(e, "creating directory", path))
    }

    /// Directory `path` inside this one, as a [`Dir`] of its own
    /// (`NotFound` when it does not exist). Worth it for several calls in
    /// one directory: the host resolves a path of one name with one system
    /// call, and a path of two with an open of its parent and a close more
    /// for every look, link, rename or removal. Its [`sync_dir`]`(".")` is
    /// a flush of the descriptor itself. A symbolic link to a directory
    /// beneath this one is followed, as it is where it stands in a longer
    /// path.
    ///
    /// [`sync_dir`]: Dir::sync_dir
    pub fn open_dir(&self, path: &str) -> Result<Dir> {
        self.fd
            .open_at(
                PathFlags::SYMLINK_FOLLOW,
                path,
                OpenFlags::DIRECTORY,
                DescriptorFlags::READ,
            )
            .map(|fd| Dir { fd })
            .map_err(|e| io_error(e, "opening", path))
    }

    /// Whether `path` is a directory.
    pub fn is_dir(&self, path: &str) -> bool {
        self.fd
            .stat_at(PathFlags::empty(), path)
            .is_ok_and(|s| s.type_ == DescriptorType::Directory)
    }

    /// Names of the entries of `path` (`"."` for this directory), with
    /// whether each is a directory.
    pub fn list(&self, path: &str) -> Result<Vec<(String, bool)>> {
        let dir = if path == "." {
            None
        } else {
            Some(self.open(path, OpenFlags::DIRECTORY, DescriptorFlags::READ)?)
        };
        let fd = dir.as_ref().unwrap_or(&self.fd);
        let stream = fd
            .read_directory()
            .map_err(|e| io_error(e, "listing", path))?;
        let mut entries = Vec::new();
        while let Some(entry) = stream
            .read_directory_entry()
            .map_err(|e| io_error(e, "listing", path))?
        {
            entries.push((entry.name, entry.type_ == DescriptorType::Directory));
        }
        Ok(entries)
    }

    /// Remove a directory and everything in it.
    pub fn remove_dir_all(&self, path: &str) -> Result<()> {
        for (name, is_dir) in self.list(path)? {
            let child = format!("{path}/{name}");
            if is_dir {
                self.remove_dir_all(&child)?;
            } else {
                self.remove_file(&child)?;
            }
        }
        self.remove_dir(path)
    }

    /// Remove the empty directory `path` (`DirectoryNotEmpty` while
    /// anything is in it).
    pub fn remove_dir(&self, path: &str) -> Result<()> {
        self.fd
            .remove_directory_at(path)
            .map_err(|e| io_error(e, "removing directory", path))
    }
}
