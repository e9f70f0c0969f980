//! The writer thread and the files it keeps: `audit.jsonl` takes new
//! records; when it would pass its share of the bound it becomes
//! `audit.1.jsonl` (and that one `audit.2.jsonl`…), the oldest file is
//! dropped, and a new one begins.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How often records written are synced to the disk.
pub const SYNC_EVERY: Duration = Duration::from_secs(1);

/// A line to append, and who waits for it.
pub(super) struct Job(pub Vec<u8>, pub tokio::sync::oneshot::Sender<()>);

/// What the writer thread owns.
pub(super) struct Writer {
    pub dir: PathBuf,
    pub per_file: u64,
    pub files: usize,
    pub current: Option<Current>,
    pub failures: Arc<AtomicU64>,
    /// Held while the thread runs: the folder is this process's.
    pub lock: File,
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
            let mut unsynced = false;
            loop {
                match tokio::time::timeout(SYNC_EVERY, queue.recv()).await {
                    Ok(Some(Job(line, done))) => {
                        self.append(&line);
                        unsynced = true;
                        let _ = done.send(());
                    }
                    Ok(None) => break,
                    Err(_) if unsynced => {
                        unsynced = false;
                        if let Some(Err(e)) = self.current.as_ref().map(|c| c.file.sync_data()) {
                            tracing::error!(error = %e, "the audit log could not be synced to disk");
                        }
                    }
                    Err(_) => {}
                }
            }
        });
        if let Some(current) = &self.current {
            let _ = current.file.sync_data();
        }
        let _ = &self.lock;
    }

    fn append(&mut self, line: &[u8]) {
        if let Err(e) = self.write(line) {
            self.failures.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                dir = %self.dir.display(),
                error = %e,
                "an audit record could not be written (is the disk full?): {}",
                String::from_utf8_lossy(line).trim_end()
            );
        }
    }

    fn write(&mut self, line: &[u8]) -> io::Result<()> {
        let full = self
            .current
            .as_ref()
            .is_some_and(|c| c.bytes > 0 && c.bytes + line.len() as u64 > self.per_file);
        if full || self.current.is_none() {
            if let Some(old) = self.current.take() {
                old.file.sync_data()?;
                rotate(&self.dir, self.files)?;
            }
            self.current = Some(open_current(&self.dir)?);
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

/// The log's files in `dir`, newest first.
pub(super) fn file_names(dir: &Path, files: usize) -> Vec<PathBuf> {
    (0..files).map(|n| file_name(dir, n)).collect()
}

fn file_name(dir: &Path, n: usize) -> PathBuf {
    match n {
        0 => dir.join("audit.jsonl"),
        n => dir.join(format!("audit.{n}.jsonl")),
    }
}

/// The newest file, ending with a line break (a record torn by a crash or
/// a full disk is ended, so the next starts a line of its own).
pub(super) fn open_current(dir: &Path) -> io::Result<Current> {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .open(file_name(dir, 0))?;
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
fn rotate(dir: &Path, files: usize) -> io::Result<()> {
    for n in (0..files.saturating_sub(1)).rev() {
        match std::fs::rename(file_name(dir, n), file_name(dir, n + 1)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    File::open(dir)?.sync_all()
}

/// Files past `files` (left by a larger `files` setting) are dropped: the
/// bound holds for what is kept.
pub(super) fn drop_extra_files(dir: &Path, files: usize) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let n = name.to_str().and_then(|n| {
            n.strip_prefix("audit.")?
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
