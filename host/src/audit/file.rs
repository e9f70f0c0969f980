//! The log on disk, `<data_dir>/audit/<replica>/`: `audit.jsonl` takes new
//! records; when it would pass its share of the bound it becomes
//! `audit.1.jsonl` (and that one `audit.2.jsonl`…), the oldest file is
//! dropped, and a new one begins.
//!
//! One thread of its own writes the files, so a slow disk (or a stdout
//! nobody reads) never holds an async worker. A change waits until its
//! record is written whole with one append (a crash of the process loses no
//! record of an answered change); the thread syncs the file to disk within
//! [`SYNC_EVERY`] (a power cut may lose that last second). Records printed
//! to stdout go through a bounded queue of their own: a stalled reader
//! loses lines (counted), never stalls changes.

use super::Record;
use super::limit::{RefusalLimiter, Verdict};
use super::writers::Writers;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// How often records written are synced to the disk.
pub const SYNC_EVERY: Duration = Duration::from_secs(1);
/// Records waiting for the writer thread (then changes wait to queue).
const QUEUE: usize = 4096;

/// The `[audit]` table, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditSettings {
    /// The most bytes all the log's files hold together.
    pub max_bytes: u64,
    /// How many files the log is rotated over (the newest included; ≥ 2).
    pub files: usize,
    /// Also print each record to stdout as a JSON line.
    pub stdout: bool,
    /// This replica's name in its records, and its folder's.
    pub replica: String,
}

impl Default for AuditSettings {
    fn default() -> Self {
        AuditSettings {
            max_bytes: 64 << 20,
            files: 4,
            stdout: false,
            replica: default_replica(),
        }
    }
}

/// The machine's host name (a pod's name on Kubernetes), or `wasmstate`.
pub fn default_replica() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| crate::names::check_name("replica", h).is_ok())
        .unwrap_or_else(|| "wasmstate".into())
}

enum Job {
    /// Append a line; say when it is written.
    Line(Vec<u8>, Option<tokio::sync::oneshot::Sender<()>>),
}

/// One replica's audit log.
pub struct AuditLog {
    /// `None`: records go nowhere (tests, benchmarks).
    dir: Option<PathBuf>,
    settings: AuditSettings,
    jobs: Option<mpsc::SyncSender<Job>>,
    stdout: Option<mpsc::SyncSender<Vec<u8>>>,
    failures: Arc<AtomicU64>,
    lost_to_stdout: AtomicU64,
    limiter: Mutex<RefusalLimiter>,
    writers: Arc<Mutex<Writers>>,
}

impl AuditLog {
    /// The log of `settings.replica` under `data_dir/audit`, created when
    /// missing; its writer thread started. Each running server holds its
    /// folder: a second server of the same name on the same data directory
    /// (two processes on one machine) takes `<replica>-2`, and so on, and
    /// names itself so in its records.
    pub fn open(data_dir: &Path, mut settings: AuditSettings) -> io::Result<AuditLog> {
        let (dir, lock, replica) = claim_folder(&data_dir.join("audit"), &settings.replica)?;
        settings.replica = replica;
        drop_extra_files(&dir, settings.files)?;
        let current = open_current(&dir)?;
        let writers = Arc::new(Mutex::new(Writers::default()));
        let failures = Arc::new(AtomicU64::new(0));
        let (jobs, queue) = mpsc::sync_channel(QUEUE);
        let thread = Thread {
            dir: dir.clone(),
            per_file: (settings.max_bytes / settings.files as u64).max(1),
            files: settings.files,
            current: Some(current),
            failures: failures.clone(),
            _lock: lock,
        };
        let (old, seen) = (file_names(&dir, settings.files), writers.clone());
        std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || {
                remember_writers(&old, &seen);
                thread.run(queue)
            })?;
        let stdout = settings.stdout.then(|| {
            let (lines, queue) = mpsc::sync_channel::<Vec<u8>>(QUEUE);
            std::thread::spawn(move || {
                for line in queue {
                    let mut out = io::stdout().lock();
                    let _ = out.write_all(&line).and_then(|()| out.flush());
                }
            });
            lines
        });
        Ok(AuditLog {
            dir: Some(dir),
            settings,
            jobs: Some(jobs),
            stdout,
            failures,
            lost_to_stdout: AtomicU64::new(0),
            limiter: Mutex::default(),
            writers,
        })
    }

    /// A log that keeps nothing.
    pub fn disabled() -> AuditLog {
        AuditLog {
            dir: None,
            settings: AuditSettings {
                stdout: false,
                ..AuditSettings::default()
            },
            jobs: None,
            stdout: None,
            failures: Arc::default(),
            lost_to_stdout: AtomicU64::new(0),
            limiter: Mutex::default(),
            writers: Arc::default(),
        }
    }

    /// This replica's name, as its records give it.
    pub fn replica(&self) -> &str {
        &self.settings.replica
    }

    /// Whether records are kept here (a query can answer).
    pub fn keeps(&self) -> bool {
        self.dir.is_some()
    }

    /// Records that could not be written since the start, and records not
    /// printed because stdout was not read.
    pub fn failures(&self) -> (u64, u64) {
        (
            self.failures.load(Ordering::Relaxed),
            self.lost_to_stdout.load(Ordering::Relaxed),
        )
    }

    /// Append `record`, and return once it is written (or could not be:
    /// logged and counted, never the request's answer, since the change
    /// it records is done). A refusal past its caller's allowance is only
    /// counted ([`RefusalLimiter`]).
    pub async fn append(&self, mut record: Record) {
        let Some(jobs) = &self.jobs else { return };
        if record.status >= 400 {
            let verdict = self
                .limiter
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .judge(&record.caller, Instant::now());
            match verdict {
                Verdict::Suppress => return,
                Verdict::Record(0) => {}
                Verdict::Record(n) => record.result.push_str(&format!(
                    " (and {n} earlier refusals of this caller not recorded: too many)"
                )),
            }
        }
        let record = record.bounded();
        self.writers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .note(&record);
        let mut line = serde_json::to_vec(&record).expect("records serialise");
        line.push(b'\n');
        if let Some(stdout) = &self.stdout
            && stdout.try_send(line.clone()).is_err()
        {
            self.lost_to_stdout.fetch_add(1, Ordering::Relaxed);
        }
        let (done, written) = tokio::sync::oneshot::channel();
        let job = Job::Line(line, Some(done));
        if let Err(mpsc::TrySendError::Full(job)) = jobs.try_send(job) {
            // The writer is behind: wait for room off the async workers.
            let jobs = jobs.clone();
            let _ = tokio::task::spawn_blocking(move || jobs.send(job)).await;
        }
        let _ = written.await;
    }

    /// The newest writes of `backend`/`workspace` this trail remembers,
    /// oldest first.
    pub fn writes_of(&self, backend: &str, workspace: &str) -> Vec<super::Write> {
        self.writers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .of(backend, workspace)
    }

    /// The log's files, newest first.
    pub(super) fn files(&self) -> Vec<PathBuf> {
        match &self.dir {
            Some(dir) => file_names(dir, self.settings.files),
            None => Vec::new(),
        }
    }
}

/// What the writer thread owns.
struct Thread {
    dir: PathBuf,
    per_file: u64,
    files: usize,
    current: Option<Current>,
    failures: Arc<AtomicU64>,
    /// Held while the thread runs: the folder is this process's.
    _lock: File,
}

struct Current {
    file: File,
    bytes: u64,
}

impl Thread {
    fn run(mut self, queue: mpsc::Receiver<Job>) {
        let mut unsynced = false;
        loop {
            match queue.recv_timeout(SYNC_EVERY) {
                Ok(Job::Line(line, done)) => {
                    if let Err(e) = self.write(&line) {
                        self.failures.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(
                            dir = %self.dir.display(),
                            error = %e,
                            "an audit record could not be written (is the disk full?): {}",
                            String::from_utf8_lossy(&line).trim_end()
                        );
                    }
                    unsynced = true;
                    if let Some(done) = done {
                        let _ = done.send(());
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) if unsynced => {
                    unsynced = false;
                    if let Some(Err(e)) = self.current.as_ref().map(|c| c.file.sync_data()) {
                        tracing::error!(error = %e, "the audit log could not be synced to disk");
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    if let Some(current) = &self.current {
                        let _ = current.file.sync_data();
                    }
                    return;
                }
            }
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

/// The first folder of `replica`'s names no running server holds, held:
/// (its path, the held lock file, the name).
fn claim_folder(audit: &Path, replica: &str) -> io::Result<(PathBuf, File, String)> {
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
        if rustix::fs::flock(&lock, exclusive).is_ok() {
            if n > 1 {
                tracing::info!(replica = %name, "another server on this data directory keeps the audit trail of {replica}: this one keeps its own as {name}");
            }
            return Ok((dir, lock, name));
        }
    }
    Err(io::Error::other(format!(
        "{NAMES} running servers already keep audit trails named {replica} in {}: give each replica its own [audit] replica name",
        audit.display()
    )))
}

fn file_names(dir: &Path, files: usize) -> Vec<PathBuf> {
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
fn open_current(dir: &Path) -> io::Result<Current> {
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
fn drop_extra_files(dir: &Path, files: usize) -> io::Result<()> {
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

/// Read the writes the log holds into `writers`, oldest first.
fn remember_writers(files: &[PathBuf], writers: &Mutex<Writers>) {
    for path in files.iter().rev() {
        let Ok(file) = File::open(path) else { continue };
        for line in io::BufReader::new(file).split(b'\n').map_while(Result::ok) {
            // A cheap look before the parse: most records are not writes.
            let write = |op: &[u8]| line.windows(op.len()).any(|w| w == op);
            if !write(b"\"operation\":\"write\"") && !write(b"\"operation\":\"restore\"") {
                continue;
            }
            if let Ok(record) = serde_json::from_slice::<Record>(&line) {
                writers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .note(&record);
            }
        }
    }
}

#[cfg(test)]
mod tests;
