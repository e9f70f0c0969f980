//! `open-at` without blocking: wasmtime-wasi's open, with `O_NONBLOCK`
//! and the kind of what opened checked on the open descriptor.
//!
//! Opening a FIFO for reading blocks until a writer comes, and file calls
//! run inline on a worker, where no deadline reaches them. A look at the
//! path before the open (as this host did) costs three system calls per
//! open and leaves a window: a file swapped for a FIFO between the look and
//! the open still blocks the worker. With `O_NONBLOCK` the open itself
//! never waits (a FIFO opens at once for reading, fails with `ENXIO` for
//! writing), and the `fstat` wasmtime-wasi makes anyway after every open
//! tells what was opened: anything but a file or a directory is closed and
//! refused, `unsupported` as before. A file under a lease held elsewhere
//! (an NFS delegation, a Samba oplock) answers `would-block` instead of
//! waiting for the lease's break, which is what a worker wants. A file
//! opened is set back to blocking I/O (Linux's own filesystems ignore the
//! flag on files; a FUSE one may not).
//!
//! What is refused is opened first, which the look before did not do. A
//! FIFO's writer waiting for a reader is let go; a device node opened has
//! whatever effect its driver gives an open (`O_NOCTTY` keeps a terminal
//! from becoming the server's). Device nodes exist only where an operator
//! made them or granted a directory holding some: a guest cannot make one.
//!
//! The rules are wasmtime-wasi 48's `Dir::open_at`, which is crate-private:
//! the same mapping of flags, the same permission checks, the same
//! sandboxed open (`cap-primitives`, the crate wasmtime-wasi's own copy
//! was taken from: `openat2` with `RESOLVE_BENEATH` on Linux).

use super::FILE_IO_INLINE;
use cap_primitives::fs::{FollowSymlinks, OpenOptions, OpenOptionsExt};
use wasmtime::component::Resource;
use wasmtime_wasi::OpenMode;
use wasmtime_wasi::filesystem::{Descriptor, Dir, File, WasiFilesystemCtxView};
use wasmtime_wasi::p2::FsResult;
use wasmtime_wasi::p2::bindings::filesystem::types::{
    self, DescriptorFlags, ErrorCode, OpenFlags, PathFlags,
};

/// Open `path` beneath the directory `fd` as wasmtime-wasi would, without
/// ever blocking, and refuse what is neither a file nor a directory
/// (`unsupported`).
pub(super) fn open_at(
    fs: &mut WasiFilesystemCtxView<'_>,
    fd: &Resource<types::Descriptor>,
    path_flags: PathFlags,
    path: &str,
    oflags: OpenFlags,
    flags: DescriptorFlags,
) -> FsResult<Resource<types::Descriptor>> {
    let dir = match fs.table.get(fd)? {
        Descriptor::Dir(d) => d.clone(),
        Descriptor::File(_) => return Err(ErrorCode::NotDirectory.into()),
    };
    let opened = open_checked(&dir, path_flags, path, oflags, flags)?;
    Ok(fs.table.push(opened)?)
}

/// [`open_at`]'s open and check, beneath `dir`.
fn open_checked(
    dir: &Dir,
    path_flags: PathFlags,
    path: &str,
    oflags: OpenFlags,
    flags: DescriptorFlags,
) -> Result<Descriptor, ErrorCode> {
    let (opts, open_mode) = options(dir, path_flags, oflags, flags)?;
    let opened = cap_primitives::fs::open(&dir.dir, path.as_ref(), &opts).map_err(|e| {
        match e.raw_os_error() {
            // A FIFO opened for writing with no reader, or a socket file:
            // what any other special file gets, below.
            Some(errno) if errno == rustix::io::Errno::NXIO.raw_os_error() => {
                ErrorCode::Unsupported
            }
            // A lease held elsewhere (an NFS delegation, a Samba oplock):
            // the open would have waited for its break.
            Some(errno) if errno == rustix::io::Errno::AGAIN.raw_os_error() => {
                ErrorCode::WouldBlock
            }
            _ => ErrorCode::from(e),
        }
    })?;
    let file_type = opened.metadata().map_err(ErrorCode::from)?.file_type();
    if file_type.is_dir() {
        Ok(Descriptor::Dir(Dir::new(
            opened,
            dir.perms,
            open_mode,
            FILE_IO_INLINE,
        )))
    } else if oflags.contains(OpenFlags::DIRECTORY) {
        Err(ErrorCode::NotDirectory)
    } else if file_type.is_file() {
        // Back to blocking I/O: local filesystems ignore the flag on
        // files, a FUSE one may not. (F_SETFL changes only the status
        // flags, none of which an open here sets but this one.)
        rustix::fs::fcntl_setfl(&opened, rustix::fs::OFlags::empty())
            .map_err(|e| ErrorCode::from(std::io::Error::from(e)))?;
        Ok(Descriptor::File(File::new(
            opened,
            dir.perms,
            open_mode,
            FILE_IO_INLINE,
        )))
    } else {
        // A FIFO, socket or device: closed here, never read or written.
        Err(ErrorCode::Unsupported)
    }
}

/// wasmtime-wasi's mapping of WASI's open flags to the OS's, plus
/// `O_NONBLOCK`, and the mode the descriptor records.
fn options(
    dir: &Dir,
    path_flags: PathFlags,
    oflags: OpenFlags,
    flags: DescriptorFlags,
) -> Result<(OpenOptions, OpenMode), ErrorCode> {
    let mut create = false;
    let mut open_mode = OpenMode::empty();
    let mut opts = OpenOptions::new();
    // `follow` and `nonblock` are set through the wrappers cap-primitives
    // exports for cap-fs-ext (whose extension traits only call them).
    opts._cap_fs_ext_nonblock(true);
    // A terminal opened (then refused) never becomes the server's own.
    opts.custom_flags(rustix::fs::OFlags::NOCTTY.bits() as i32);
    if oflags.contains(OpenFlags::CREATE) {
        if oflags.contains(OpenFlags::EXCLUSIVE) {
            opts.create_new(true);
        } else {
            opts.create(true);
        }
        create = true;
        opts.write(true);
        open_mode |= OpenMode::WRITE;
    }
    if oflags.contains(OpenFlags::TRUNCATE) {
        opts.truncate(true).write(true);
        open_mode |= OpenMode::WRITE;
    }
    if flags.contains(DescriptorFlags::READ) {
        opts.read(true);
        open_mode |= OpenMode::READ;
    }
    if flags.contains(DescriptorFlags::WRITE) {
        opts.write(true);
        open_mode |= OpenMode::WRITE;
    } else {
        // Opened for reading at least, so the OS lets it open; the
        // recorded mode refuses the uses not asked for.
        opts.read(true);
        open_mode |= OpenMode::READ;
    }
    opts._cap_fs_ext_follow(match path_flags.contains(PathFlags::SYMLINK_FOLLOW) {
        true => FollowSymlinks::Yes,
        false => FollowSymlinks::No,
    });
    if flags.intersects(
        DescriptorFlags::FILE_INTEGRITY_SYNC
            | DescriptorFlags::DATA_INTEGRITY_SYNC
            | DescriptorFlags::REQUESTED_WRITE_SYNC,
    ) {
        return Err(ErrorCode::Unsupported);
    }
    if oflags.contains(OpenFlags::DIRECTORY)
        && oflags.intersects(OpenFlags::CREATE | OpenFlags::EXCLUSIVE | OpenFlags::TRUNCATE)
    {
        return Err(ErrorCode::Invalid);
    }
    if dir.perms.write_not_permitted() && (create || open_mode.contains(OpenMode::WRITE)) {
        return Err(ErrorCode::NotPermitted);
    }
    Ok((opts, open_mode))
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime_wasi::FsPerms;

    fn dir(perms: FsPerms) -> Dir {
        let handle = std::fs::File::open(std::env::temp_dir()).unwrap();
        Dir::new(handle, perms, OpenMode::READ | OpenMode::WRITE, true)
    }

    #[test]
    fn a_read_only_directory_refuses_creating_and_writing() {
        let ro = dir(FsPerms::ReadOnly);
        let create = options(
            &ro,
            PathFlags::empty(),
            OpenFlags::CREATE,
            DescriptorFlags::READ,
        );
        assert!(matches!(create, Err(ErrorCode::NotPermitted)));
        let write = options(
            &ro,
            PathFlags::empty(),
            OpenFlags::empty(),
            DescriptorFlags::WRITE,
        );
        assert!(matches!(write, Err(ErrorCode::NotPermitted)));
        let read = options(
            &ro,
            PathFlags::empty(),
            OpenFlags::empty(),
            DescriptorFlags::READ,
        );
        assert_eq!(read.unwrap().1, OpenMode::READ);
    }

    #[test]
    fn a_directory_cannot_be_created_or_truncated_by_open() {
        let rw = dir(FsPerms::ReadWrite);
        let bad = OpenFlags::DIRECTORY | OpenFlags::TRUNCATE;
        let opened = options(&rw, PathFlags::empty(), bad, DescriptorFlags::READ);
        assert!(matches!(opened, Err(ErrorCode::Invalid)));
    }

    #[test]
    fn sync_flags_are_unsupported_as_in_wasmtime_wasi() {
        let rw = dir(FsPerms::ReadWrite);
        let flags = DescriptorFlags::WRITE | DescriptorFlags::DATA_INTEGRITY_SYNC;
        let opened = options(&rw, PathFlags::empty(), OpenFlags::empty(), flags);
        assert!(matches!(opened, Err(ErrorCode::Unsupported)));
    }

    /// A directory holding a FIFO, a socket file, a symbolic link to the
    /// FIFO and a plain file.
    fn specials() -> (tempfile::TempDir, Dir, std::os::unix::net::UnixListener) {
        let root = tempfile::tempdir().unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.path().join("fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let socket = std::os::unix::net::UnixListener::bind(root.path().join("socket")).unwrap();
        std::os::unix::fs::symlink("fifo", root.path().join("link")).unwrap();
        std::fs::write(root.path().join("file"), b"state").unwrap();
        let handle = std::fs::File::open(root.path()).unwrap();
        let dir = Dir::new(
            handle,
            FsPerms::ReadWrite,
            OpenMode::READ | OpenMode::WRITE,
            true,
        );
        (root, dir, socket)
    }

    /// Every open of a special file answers at once (a hang fails the test
    /// at its deadline instead of stalling it), and answers `expected`.
    #[test]
    fn special_files_are_refused_at_once_never_waited_on() {
        use std::sync::mpsc;
        let (_root, dir, _socket) = specials();
        let read = DescriptorFlags::READ;
        let write = DescriptorFlags::WRITE;
        let follow = PathFlags::SYMLINK_FOLLOW;
        let cases = [
            (
                "fifo",
                PathFlags::empty(),
                OpenFlags::empty(),
                read,
                ErrorCode::Unsupported,
            ),
            (
                "fifo",
                PathFlags::empty(),
                OpenFlags::empty(),
                write,
                ErrorCode::Unsupported,
            ),
            (
                "fifo",
                PathFlags::empty(),
                OpenFlags::TRUNCATE,
                write,
                ErrorCode::Unsupported,
            ),
            (
                "fifo",
                PathFlags::empty(),
                OpenFlags::CREATE,
                write,
                ErrorCode::Unsupported,
            ),
            (
                "fifo",
                PathFlags::empty(),
                OpenFlags::DIRECTORY,
                read,
                ErrorCode::NotDirectory,
            ),
            (
                "socket",
                PathFlags::empty(),
                OpenFlags::empty(),
                read,
                ErrorCode::Unsupported,
            ),
            (
                "link",
                follow,
                OpenFlags::empty(),
                read,
                ErrorCode::Unsupported,
            ),
            (
                "link",
                PathFlags::empty(),
                OpenFlags::empty(),
                read,
                ErrorCode::Loop,
            ),
        ];
        for (path, path_flags, oflags, flags, expected) in cases {
            let (tx, rx) = mpsc::channel();
            let dir = dir.clone();
            std::thread::spawn(move || {
                let opened = open_checked(&dir, path_flags, path, oflags, flags);
                let _ = tx.send(opened.err());
            });
            let answer = rx
                .recv_timeout(std::time::Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("opening {path} ({oflags:?}, {flags:?}) blocked"));
            assert_eq!(answer, Some(expected), "{path} {oflags:?} {flags:?}");
        }
        let file = open_checked(&dir, PathFlags::empty(), "file", OpenFlags::empty(), read);
        assert!(matches!(file, Ok(Descriptor::File(_))));
        let itself = open_checked(&dir, PathFlags::empty(), ".", OpenFlags::DIRECTORY, read);
        assert!(matches!(itself, Ok(Descriptor::Dir(_))));
    }
}
