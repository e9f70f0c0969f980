//! Compare-and-swap of one file in the granted directory, for every writer
//! of that directory at once: threads, instances and host processes
//! sharing it.
//!
//! A filesystem has no "rename only if the target is still this file". So
//! the check and the rename are made one step by a **write marker**: an
//! empty file beside the target (`.<name>.writing`) created with
//! create-new (`O_EXCL`, which exactly one creator wins, across processes),
//! held for the few calls between the check and the rename, then removed.
//! A writer that finds the marker taken waits for it, polling with short
//! pauses for at most [`stamp::WAIT_LIMIT`], then answers "unavailable".
//!
//! A writer killed while holding it (a deadline, a trap, a killed host)
//! leaves the marker behind. One older than [`stamp::STALE_AFTER`] (6 s,
//! by its modification time against the clock) is debris, and the next
//! writer removes it, under a second marker (`.<name>.writing.break`) so
//! that two writers that both found it stale cannot both remove "it": the
//! second would remove the marker the first has just taken. The breaker
//! removes the marker only if it is still the very file it found stale.
//!
//! What remains open, and only on a host that stops for seconds: a writer
//! checks, right before it renames, that it has held the marker for less
//! than [`stamp::HOLD_LIMIT`] (2 s), and gives up otherwise; a marker is
//! broken only once 6 s old. So two writers can both be inside only if one
//! is frozen for more than 4 s between that check and the end of its
//! rename (a SIGSTOP, a suspended VM, a swap storm), or if hosts sharing
//! the directory over a network filesystem have clocks more than 4 s apart.
//! A breaker frozen as long inside its own three calls is the same case.

use crate::stamp::{self, Nanos, SECOND, Stamp};
use std::io::ErrorKind;
use std::time::Instant;
use wasip2::clocks::{monotonic_clock, wall_clock};
use wasip2::filesystem::types::{
    Descriptor, DescriptorFlags, DescriptorStat, ErrorCode, MetadataHashValue, NewTimestamp,
    OpenFlags, PathFlags,
};
use wasmstate_guest::fs::Dir;
use wasmstate_guest::{Error, Expect, StateWriter};

/// Most bytes asked of the host per read: what it serves in one call.
const READ_CHUNK: u64 = 64 << 10;
/// A head's first read of a state larger than one read: its lineage and
/// serial are in its first few hundred bytes, and the host stops the copy
/// once it has them, so the rest of a 64 KiB read would only be copied
/// (into this guest's memory, out again) for nothing.
const HEAD_FIRST_READ: u64 = 4 << 10;

/// A WASI filesystem failure as the SDK's error (passing ones, such as a
/// busy file, become "unavailable").
pub fn fs_error(code: ErrorCode, context: &str, path: &str) -> Error {
    let kind = match code {
        ErrorCode::WouldBlock => ErrorKind::WouldBlock,
        ErrorCode::Busy => ErrorKind::ResourceBusy,
        ErrorCode::Interrupted => ErrorKind::Interrupted,
        _ => ErrorKind::Other,
    };
    Error::io(
        context,
        std::io::Error::new(kind, format!("{path}: {code:?}")),
    )
}

fn nanos(time: Option<wall_clock::Datetime>) -> Nanos {
    time.map_or(0, |t| {
        Nanos::from(t.seconds) * SECOND + Nanos::from(t.nanoseconds)
    })
}

/// The wall clock's time.
fn now() -> Nanos {
    nanos(Some(wall_clock::now()))
}

fn stamp_of(stat: &DescriptorStat, hash: &MetadataHashValue) -> Stamp {
    Stamp {
        identity: hash.lower,
        modified: nanos(stat.data_modification_timestamp),
        size: stat.size,
    }
}

/// The stamp of the file at `path` (two calls), `None` when there is none.
pub fn stamp_at(dir: &Dir, path: &str) -> Result<Option<Stamp>, Error> {
    let fd = dir.descriptor();
    let found = fd
        .stat_at(PathFlags::empty(), path)
        .and_then(|stat| Ok((stat, fd.metadata_hash_at(PathFlags::empty(), path)?)));
    match found {
        Ok((stat, hash)) => Ok(Some(stamp_of(&stat, &hash))),
        Err(ErrorCode::NoEntry) => Ok(None),
        Err(e) => Err(fs_error(e, "inspecting", path)),
    }
}

/// A file opened for reading, with its stamp taken from the open file (not
/// the path): its version and its bytes describe the same file even if
/// another writer replaces it meanwhile.
pub struct Opened {
    file: Descriptor,
    path: String,
    /// What the file is.
    pub stamp: Stamp,
}

impl Opened {
    /// Open `path` (three calls: open, stat, hash); `None` when it does not
    /// exist.
    pub fn open(dir: &Dir, path: &str) -> Result<Option<Opened>, Error> {
        let file = match dir.descriptor().open_at(
            PathFlags::empty(),
            path,
            OpenFlags::empty(),
            DescriptorFlags::READ,
        ) {
            Ok(file) => file,
            Err(ErrorCode::NoEntry) => return Ok(None),
            Err(e) => return Err(fs_error(e, "opening", path)),
        };
        let stamp = file
            .stat()
            .and_then(|stat| Ok(stamp_of(&stat, &file.metadata_hash()?)))
            .map_err(|e| fs_error(e, "inspecting", path))?;
        Ok(Some(Opened {
            file,
            path: path.to_string(),
            stamp,
        }))
    }

    /// Hand the file's bytes to `each`, in order, `first` bytes at most in
    /// the first read, until its size is read or `each` answers `false`.
    fn each_chunk(&self, first: u64, mut each: impl FnMut(Vec<u8>) -> bool) -> Result<(), Error> {
        let mut offset = 0u64;
        while offset < self.stamp.size {
            let most = if offset == 0 { first } else { READ_CHUNK };
            let want = (self.stamp.size - offset).min(most);
            let (chunk, end) = self
                .file
                .read(want, offset)
                .map_err(|e| fs_error(e, "reading", &self.path))?;
            offset += chunk.len() as u64;
            if chunk.is_empty() || !each(chunk) || end {
                break;
            }
        }
        Ok(())
    }

    /// Write the file's first bytes into `out` until the host has what it
    /// needs: one read and one host call for a Terraform state. A state
    /// of up to 64 KiB goes whole, so the host can tell from it alone
    /// whether it is empty or the very body a retry sends again (judged
    /// on bytes read later, a retry racing another writer could be
    /// answered as a conflict); a larger one, which no prefix holds
    /// whole, starts with [`HEAD_FIRST_READ`].
    pub fn copy_prefix(&self, out: &mut StateWriter<'_>) -> Result<(), Error> {
        use std::io::Write;
        let first = match self.stamp.size <= READ_CHUNK {
            true => READ_CHUNK,
            false => HEAD_FIRST_READ,
        };
        // A write fails only once the host has enough: that is the end.
        self.each_chunk(first, |chunk| out.write_all(&chunk).is_ok())
    }

    /// The whole file, read to its size as stamped.
    pub fn read_all(&self) -> Result<Vec<u8>, Error> {
        let mut bytes = Vec::with_capacity(usize::try_from(self.stamp.size).unwrap_or(0));
        self.each_chunk(READ_CHUNK, |chunk| {
            bytes.extend_from_slice(&chunk);
            true
        })?;
        Ok(bytes)
    }
}

/// One compare-and-swapped file: `dir/name`.
pub struct Slot<'a> {
    /// The directory holding it, relative to the granted one.
    pub dir: &'a str,
    /// Its name.
    pub name: &'a str,
}

impl Slot<'_> {
    /// Its path, relative to the granted directory.
    pub fn path(&self) -> String {
        format!("{}/{}", self.dir, self.name)
    }

    fn marker(&self) -> String {
        format!("{}/.{}.writing", self.dir, self.name)
    }
}

/// Replace `slot`'s file with the file at `temp` (`None`: remove it), only
/// if what is stored is as `expect` says and `guard` (a lock check) still
/// passes, as one step for every writer of the directory; `false` when the
/// stored file is not as expected (nothing changed then). The caller
/// removes `temp` unless this answers `true`, and makes the change durable.
pub fn switch(
    dir: &Dir,
    slot: &Slot,
    temp: Option<&str>,
    expect: &Expect,
    guard: impl FnOnce() -> Result<(), Error>,
) -> Result<bool, Error> {
    let Some(marker) = Marker::take(dir, &slot.marker())? else {
        // No directory. A write made its temporary file in it, so a
        // workspace delete removed it since: nothing is stored.
        if temp.is_some() {
            return Err(deleted_meanwhile(slot.dir));
        }
        // A removal: nothing is stored there.
        guard()?;
        return Ok(stamp::matches(expect, None));
    };
    let outcome = swap_under(dir, slot, temp, expect, guard, &marker);
    marker.release(dir);
    outcome
}

/// Remove everything in `slot`'s directory but `keep` (the lock of the
/// delete that empties it) while holding the slot's write marker, so no
/// write's check and rename straddle the removal (removing a live marker
/// with the rest would let two writers in at once, and a writer that
/// checked before the delete rename over a state written after it).
/// `guard` runs under the marker first. The directory itself stays: the
/// caller removes it once empty, and what landed in it meanwhile is kept.
pub fn empty_dir(
    dir: &Dir,
    slot: &Slot,
    keep: &str,
    guard: impl FnOnce() -> Result<(), Error>,
) -> Result<(), Error> {
    let Some(marker) = Marker::take(dir, &slot.marker())? else {
        return Err(Error::NotFound);
    };
    let emptied = guard().and_then(|()| {
        let entries = dir
            .list(slot.dir)
            .map_err(|e| Error::io("listing the workspace", e))?;
        let own = marker.path.rsplit('/').next().unwrap_or_default();
        for (name, is_dir) in entries {
            if name == own || name == keep {
                continue;
            }
            let path = format!("{}/{name}", slot.dir);
            let gone = if is_dir {
                dir.remove_dir_all(&path)
            } else {
                dir.remove_file(&path)
            };
            match gone {
                Err(e) if e.kind() != ErrorKind::NotFound => {
                    return Err(Error::io("deleting workspace", e));
                }
                _ => {}
            }
        }
        Ok(())
    });
    marker.release(dir);
    emptied
}

/// The check and the switch, while holding the marker.
fn swap_under(
    dir: &Dir,
    slot: &Slot,
    temp: Option<&str>,
    expect: &Expect,
    guard: impl FnOnce() -> Result<(), Error>,
    marker: &Marker,
) -> Result<bool, Error> {
    guard()?;
    let path = slot.path();
    let found = stamp_at(dir, &path)?;
    if !stamp::matches(expect, stamp::stored(found).as_ref()) {
        return Ok(false);
    }
    match temp {
        Some(temp) => {
            set_time_past(dir, temp, found.map(|f| f.modified)).map_err(|e| match e {
                Vanished::Temp => deleted_meanwhile(slot.dir),
                Vanished::Not(e) => e,
            })?;
            marker.still_in_time(&path)?;
            dir.rename(temp, &path).map_err(|e| match e.kind() {
                ErrorKind::NotFound => deleted_meanwhile(slot.dir),
                _ => Error::io("replacing", e),
            })?;
        }
        None => {
            marker.still_in_time(&path)?;
            match dir.remove_file(&path) {
                Err(e) if e.kind() != ErrorKind::NotFound => return Err(Error::io("removing", e)),
                _ => {}
            }
        }
    }
    Ok(true)
}

/// A write answered once a workspace delete removed its temporary file or
/// directory (not stored; a retry writes it afresh).
fn deleted_meanwhile(dir: &str) -> Error {
    Error::Unavailable(format!(
        "{dir:?} was deleted while this write was under way; nothing was stored: send it again"
    ))
}

/// Why [`set_time_past`] failed: its file is gone, or anything else.
enum Vanished {
    Temp,
    Not(Error),
}

impl Vanished {
    /// `code` of a call on `temp` that `what` names: its file gone, or an
    /// error.
    fn of(code: ErrorCode, what: &str, temp: &str) -> Vanished {
        match code {
            ErrorCode::NoEntry => Vanished::Temp,
            code => Vanished::Not(fs_error(code, what, temp)),
        }
    }
}

/// Set the modification time of `temp` past `previous` (the time of the
/// file it replaces) as the filesystem stores it, so that no version
/// repeats even when the new file gets the old one's inode (see stamp.rs).
/// A filesystem keeping whole seconds (ext3, ext4 with 128-byte inodes,
/// some NFS servers) or two (FAT) drops a finer step: the stored time is
/// read back and stepped further ([`stamp::COARSER_STEPS`]) until it is
/// later.
fn set_time_past(dir: &Dir, temp: &str, previous: Option<Nanos>) -> Result<(), Vanished> {
    let fd = dir.descriptor();
    let set = |when: Nanos| {
        let when = wall_clock::Datetime {
            seconds: u64::try_from(when / SECOND).unwrap_or(u64::MAX),
            nanoseconds: (when % SECOND) as u32,
        };
        fd.set_times_at(
            PathFlags::empty(),
            temp,
            NewTimestamp::NoChange,
            NewTimestamp::Timestamp(when),
        )
        .map_err(|e| Vanished::of(e, "setting the time of", temp))
    };
    set(stamp::next_modified(now(), previous))?;
    let Some(previous) = previous else {
        return Ok(());
    };
    for step in stamp::COARSER_STEPS {
        let stored = fd
            .stat_at(PathFlags::empty(), temp)
            .map_err(|e| Vanished::of(e, "inspecting", temp))?
            .data_modification_timestamp;
        if nanos(stored) > previous {
            return Ok(());
        }
        set(previous + step)?;
    }
    Err(Vanished::Not(Error::Internal(format!(
        "the filesystem holding {temp} does not keep a modification time later than the \
         file it replaces, which the version of a state relies on; use another filesystem"
    ))))
}

/// A write marker this writer holds.
struct Marker {
    path: String,
    file: Descriptor,
    since: Instant,
}

fn create_new(dir: &Dir, path: &str) -> Result<Descriptor, ErrorCode> {
    dir.descriptor().open_at(
        PathFlags::empty(),
        path,
        OpenFlags::CREATE | OpenFlags::EXCLUSIVE,
        DescriptorFlags::WRITE,
    )
}

fn sleep(pause: std::time::Duration) {
    let nanos = u64::try_from(pause.as_nanos()).unwrap_or(u64::MAX);
    monotonic_clock::subscribe_duration(nanos).block();
}

impl Marker {
    /// Take the marker at `path`, waiting for whoever holds it (clearing it
    /// when stale); `None` when its directory does not exist.
    fn take(dir: &Dir, path: &str) -> Result<Option<Marker>, Error> {
        let start = Instant::now();
        for attempt in 0u32.. {
            if attempt > 0 && start.elapsed() >= stamp::WAIT_LIMIT {
                break;
            }
            match create_new(dir, path) {
                Ok(file) => {
                    return Ok(Some(Marker {
                        path: path.to_string(),
                        file,
                        since: Instant::now(),
                    }));
                }
                Err(ErrorCode::NoEntry) => return Ok(None),
                Err(ErrorCode::Exist) => {}
                Err(e) => return Err(fs_error(e, "creating the write marker", path)),
            }
            match stamp_at(dir, path)? {
                // Released meanwhile: take it at once.
                None => continue,
                Some(seen) if stamp::is_stale(seen.modified, now()) => {
                    if break_stale(dir, path, seen)? {
                        continue;
                    }
                }
                Some(_) => {}
            }
            sleep(stamp::pause(attempt));
        }
        Err(Error::Unavailable(format!(
            "another writer held {path} for over {} s; try again",
            stamp::WAIT_LIMIT.as_secs()
        )))
    }

    /// Fail unless the marker was taken less than [`stamp::HOLD_LIMIT`]
    /// ago: past it, another writer may soon break it as stale.
    fn still_in_time(&self, path: &str) -> Result<(), Error> {
        if self.since.elapsed() < stamp::HOLD_LIMIT {
            return Ok(());
        }
        Err(Error::Unavailable(format!(
            "replacing {path} took over {} s (the host is overloaded?); nothing was changed; try again",
            stamp::HOLD_LIMIT.as_secs()
        )))
    }

    /// Remove the marker. Best effort: one left behind is broken as stale.
    fn release(self, dir: &Dir) {
        // Held briefly, nobody can have broken it (that takes 6 s): it is
        // still ours. Held long, it may have been broken and taken by
        // another writer: remove it only if it is still the file created.
        if self.since.elapsed() >= stamp::HOLD_LIMIT {
            let ours = self
                .file
                .stat()
                .and_then(|stat| Ok(stamp_of(&stat, &self.file.metadata_hash()?)));
            if ours.ok() != stamp_at(dir, &self.path).ok().flatten() {
                return;
            }
        }
        let _ = dir.remove_file(&self.path);
    }
}

/// Remove the marker at `path`, found stale as `seen`, under the breaker
/// marker; `true` when it is gone (try to take it at once), `false` when
/// another writer is breaking it (wait).
fn break_stale(dir: &Dir, path: &str, seen: Stamp) -> Result<bool, Error> {
    let breaker = format!("{path}.break");
    match create_new(dir, &breaker) {
        Ok(_file) => {
            let removed = match stamp_at(dir, path) {
                // Still the marker found stale: no writer took it since.
                Ok(Some(still)) if still == seen => match dir.remove_file(path) {
                    Err(e) if e.kind() != ErrorKind::NotFound => {
                        Err(Error::io("removing a stale write marker", e))
                    }
                    _ => Ok(true),
                },
                Ok(_) => Ok(true),
                Err(e) => Err(e),
            };
            let _ = dir.remove_file(&breaker);
            removed
        }
        Err(ErrorCode::Exist) => {
            // A breaker that stopped within its three calls left this.
            if let Some(left) = stamp_at(dir, &breaker)?
                && stamp::is_stale(left.modified, now())
            {
                let _ = dir.remove_file(&breaker);
            }
            Ok(false)
        }
        Err(e) => Err(fs_error(e, "creating the marker breaker", &breaker)),
    }
}
