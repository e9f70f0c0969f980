//! The writer thread and the files it keeps. The trail is kept in
//! *sequences* of rotated files, each with its own share of the bound:
//! one for each configured backend's state changes, one for each
//! backend's other records (locks, unlocks, refusals, retried writes), and
//! one for what belongs to no backend served (and records written before
//! the trail was split). A sequence's newest file (`changes.jsonl`) takes
//! new records; when it would pass its share it becomes `changes.1.jsonl`
//! (and that one `changes.2.jsonl`…), the oldest file is dropped, and a new
//! one begins. So a flood of one backend's locks rotates only that
//! backend's oldest lock records, never another backend's records nor a
//! state change.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How often records written are synced to the disk.
pub const SYNC_EVERY: Duration = Duration::from_secs(1);

/// A line to append, the sequence it goes to (an index into
/// [`Writer::sequences`]), and who waits for it.
pub(super) struct Job(pub Vec<u8>, pub usize, pub tokio::sync::oneshot::Sender<()>);

/// What the writer thread owns.
pub(super) struct Writer {
    pub sequences: Vec<Sequence>,
    pub files: usize,
    pub failures: Arc<AtomicU64>,
    /// Held while the thread runs: the folder is this process's.
    pub lock: File,
}

/// One sequence of rotated files: `dir/prefix.jsonl`, `dir/prefix.1.jsonl`…
pub(super) struct Sequence {
    pub dir: PathBuf,
    pub prefix: &'static str,
    /// What one file may hold: the sequence's share over `files`.
    pub per_file: u64,
    /// Its newest file, once opened (at the first record).
    pub current: Option<Current>,
    unsynced: bool,
}

impl Sequence {
    /// The sequence `dir/prefix*.jsonl`, not opened yet.
    pub fn new(dir: PathBuf, prefix: &'static str, per_file: u64) -> Sequence {
        Sequence {
            dir,
            prefix,
            per_file: per_file.max(1),
            current: None,
            unsynced: false,
        }
    }
}

pub(super) struct Current {
    file: File,
    bytes: u64,
}

impl Writer {
    /// Write what arrives until every sender is gone; sync within
    /// [`SYNC_EVERY`] of a write. Its own small runtime: the waits are
    /// async, the file calls block this thread only.
    pub fn run(mut self, mut queue: tokio::sync::mpsc::Receiver<Job>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime");
        runtime.block_on(async {
            loop {
                match tokio::time::timeout(SYNC_EVERY, queue.recv()).await {
                    Ok(Some(Job(line, to, done))) => {
                        self.append(&line, to);
                        let _ = done.send(());
                    }
                    Ok(None) => break,
                    Err(_) => self.sync(),
                }
            }
        });
        self.sync();
        let _ = &self.lock;
    }

    fn sync(&mut self) {
        for sequence in self.sequences.iter_mut().filter(|s| s.unsynced) {
            sequence.unsynced = false;
            if let Some(Err(e)) = sequence.current.as_ref().map(|c| c.file.sync_data()) {
                tracing::error!(error = %e, "the audit log could not be synced to disk");
            }
        }
    }

    fn append(&mut self, line: &[u8], to: usize) {
        let files = self.files;
        let Some(sequence) = self.sequences.get_mut(to) else {
            return;
        };
        sequence.unsynced = true;
        if let Err(e) = sequence.write(line, files) {
            self.failures.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                dir = %sequence.dir.display(),
                error = %e,
                "an audit record could not be written (is the disk full?): {}",
                String::from_utf8_lossy(line).trim_end()
            );
        }
    }
}

impl Sequence {
    /// Open its newest file (its folder made first), a torn last line
    /// ended.
    pub fn open(&mut self) -> io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        self.current = Some(open_current(&self.dir, self.prefix)?);
        Ok(())
    }

    fn write(&mut self, line: &[u8], files: usize) -> io::Result<()> {
        let full = self
            .current
            .as_ref()
            .is_some_and(|c| c.bytes > 0 && c.bytes + line.len() as u64 > self.per_file);
        if full || self.current.is_none() {
            if let Some(old) = self.current.take() {
                old.file.sync_data()?;
                rotate(&self.dir, self.prefix, files)?;
            }
            self.open()?;
        }
        let current = self.current.as_mut().expect("opened above");
        // One append of the whole line: never interleaved with another.
        if let Err(e) = current.file.write_all(line) {
            // A part may have been written (a full disk): cut it off, so
            // the next record starts a line of its own.
            let _ = current.file.set_len(current.bytes);
            return Err(e);
        }
        current.bytes += line.len() as u64;
        Ok(())
    }
}

/// The files of sequence `prefix` in `dir`, newest first.
pub(super) fn file_names(dir: &Path, prefix: &str, files: usize) -> Vec<PathBuf> {
    (0..files).map(|n| file_name(dir, prefix, n)).collect()
}

fn file_name(dir: &Path, prefix: &str, n: usize) -> PathBuf {
    match n {
        0 => dir.join(format!("{prefix}.jsonl")),
        n => dir.join(format!("{prefix}.{n}.jsonl")),
    }
}

/// The newest file, ending with a line break (a record torn by a crash or
/// a full disk is ended, so the next starts a line of its own).
fn open_current(dir: &Path, prefix: &str) -> io::Result<Current> {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .open(file_name(dir, prefix, 0))?;
    let mut bytes = file.metadata()?.len();
    if bytes > 0 {
        use std::io::{Read, Seek, SeekFrom};
        let mut last = [0u8];
        file.seek(SeekFrom::Start(bytes - 1))?;
        file.read_exact(&mut last)?;
        if last[0] != b'\n' {
            file.write_all(b"\n")?;
            bytes += 1;
        }
    }
    Ok(Current { file, bytes })
}

/// Shift every file one place older; the oldest is replaced.
fn rotate(dir: &Path, prefix: &str, files: usize) -> io::Result<()> {
    for n in (0..files.saturating_sub(1)).rev() {
        match std::fs::rename(file_name(dir, prefix, n), file_name(dir, prefix, n + 1)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    File::open(dir)?.sync_all()
}

/// Files past `files` (left by a larger `files` setting) are dropped: the
/// bound holds for what is kept.
pub(super) fn drop_extra_files(dir: &Path, prefix: &str, files: usize) -> io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        entries => entries?,
    };
    for entry in entries {
        let name = entry?.file_name();
        let n = name.to_str().and_then(|n| {
            n.strip_prefix(prefix)?
                .strip_prefix('.')?
                .strip_suffix(".jsonl")?
                .parse::<usize>()
                .ok()
        });
        if n.is_some_and(|n| n >= files) {
            tracing::info!(file = ?name, files, "dropping an audit file past [audit] files");
            std::fs::remove_file(dir.join(&name))?;
        }
    }
    Ok(())
}

/// The first folder of `replica`'s names no running server holds, held:
/// (its path, the held lock file, the name).
pub(super) fn claim_folder(audit: &Path, replica: &str) -> io::Result<(PathBuf, File, String)> {
    const NAMES: usize = 16;
    for n in 1..=NAMES {
        let name = match n {
            1 => replica.to_string(),
            n => format!("{replica}-{n}"),
        };
        let dir = audit.join(&name);
        std::fs::create_dir_all(&dir)?;
        let lock = File::create(dir.join(".lock"))?;
        let exclusive = rustix::fs::FlockOperation::NonBlockingLockExclusive;
        match rustix::fs::flock(&lock, exclusive) {
            Ok(()) => {
                if n > 1 {
                    tracing::info!(replica = %name, "another server on this data directory keeps the audit trail of {replica}: this one keeps its own as {name}");
                }
                return Ok((dir, lock, name));
            }
            // Held by another running server: the next name.
            Err(rustix::io::Errno::WOULDBLOCK) => {}
            Err(e) => {
                return Err(io::Error::other(format!(
                    "cannot lock {} ({e}): the audit trail needs a filesystem with flock",
                    dir.join(".lock").display()
                )));
            }
        }
    }
    Err(io::Error::other(format!(
        "{NAMES} running servers already keep audit trails named {replica} in {}: give each replica its own [audit] replica name",
        audit.display()
    )))
}
