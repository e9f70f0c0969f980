//! One replica's audit log on disk, `<data_dir>/audit/<replica>/`, written
//! by a thread of its own ([`super::writer`]), so a slow disk never holds
//! an async worker, nor the blocking pool that guests' file calls use. A
//! change waits until its record is written whole with one append (a crash
//! of the process loses no record of an answered change); the thread syncs
//! the file within a second (a power cut may lose that last second). A
//! disk that stops answering costs a change at most [`GIVE_UP`], then the
//! record is counted as lost. Records printed to stdout go through a
//! bounded queue of their own: a stalled reader loses lines (logged),
//! never stalls changes.

use super::Record;
use super::limit::{RefusalLimiter, Verdict};
use super::writer::{Job, Sequence, Writer, claim_folder, drop_extra_files, file_names};
use super::writers::Writers;
use std::collections::HashMap;
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// Records waiting for the writer thread (then changes wait to queue).
const QUEUE: usize = 4096;
/// The longest a change waits to queue its record, and then for it to be
/// written.
pub const GIVE_UP: Duration = Duration::from_secs(10);

/// Where each configured backend's sequences are kept, under a replica's
/// folder: `backends/<name>/changes*.jsonl` and `requests*.jsonl`.
const BACKENDS: &str = "backends";
/// The sequence of records of no backend served here, and of records
/// written before the trail was split by backend: `audit*.jsonl`.
const OTHER: &str = "audit";
/// A backend's acknowledged state changes.
const CHANGES: &str = "changes";
/// A backend's other records: locks, unlocks, retried writes.
const REQUESTS: &str = "requests";
/// Changes refused before they started (403, a refused body), of every
/// backend: `refusals*.jsonl` beside the records of no backend.
const REFUSALS: &str = "refusals";
/// Shares of the bound, in units: each backend's changes take two, its
/// other records one, the refusals of all backends one and the records of
/// no backend one. A flood of locks can thus rotate out only its own
/// backend's oldest such records, and a flood of refusals (which anyone
/// signed in can cause, with no grant on the backend) only the oldest
/// refusals: never a state change, never a lock record.
const CHANGES_UNITS: u64 = 2;
const REQUESTS_UNITS: u64 = 1;
/// The refusals' sequence, after the records of no backend (0).
const REFUSALS_SEQUENCE: usize = 1;

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

/// One replica's audit log.
pub struct AuditLog {
    /// `<data_dir>/audit`; `None`: records go nowhere (tests, benchmarks).
    root: Option<PathBuf>,
    settings: AuditSettings,
    jobs: Mutex<Option<tokio::sync::mpsc::Sender<Job>>>,
    stdout: Mutex<Option<mpsc::SyncSender<Vec<u8>>>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    failures: Arc<AtomicU64>,
    lost_to_stdout: AtomicU64,
    limiter: Mutex<RefusalLimiter>,
    writers: Arc<Mutex<Writers>>,
    /// Each configured backend's changes sequence (its other records are
    /// in the next); a backend not here goes to sequence 0, refusals to
    /// sequence [`REFUSALS_SEQUENCE`].
    backends: HashMap<String, usize>,
    /// Searches under way at once ([`super::query`]); owned permits, so a
    /// search's turn ends with its blocking work, not with its request.
    pub(super) searches: Arc<tokio::sync::Semaphore>,
}

impl AuditLog {
    /// The log of `settings.replica` under `data_dir/audit`, created when
    /// missing; its writer thread started. Each running server holds its
    /// folder: a second server of the same name on the same data directory
    /// (two processes on one machine) takes `<replica>-2`, and so on, and
    /// names itself so in its records.
    ///
    /// Every record goes to the sequence of records of no backend: see
    /// [`AuditLog::open_serving`] for a server's.
    pub fn open(data_dir: &Path, settings: AuditSettings) -> io::Result<AuditLog> {
        AuditLog::open_serving(data_dir, settings, std::iter::empty::<&str>())
    }

    /// [`AuditLog::open`] for a server of `backends`: each keeps its
    /// records in sequences of its own, with shares of `max_bytes` (two
    /// units for its state changes, one for its other records; one unit
    /// for the refusals of all, one for records of no backend served).
    pub fn open_serving(
        data_dir: &Path,
        mut settings: AuditSettings,
        backends: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> io::Result<AuditLog> {
        let root = data_dir.join("audit");
        let (dir, lock, replica) = claim_folder(&root, &settings.replica)?;
        settings.replica = replica;
        let mut names: Vec<String> = backends
            .into_iter()
            .map(|b| b.as_ref().to_string())
            // A folder's name: only names that are one.
            .filter(|b| crate::names::check_name("backend", b).is_ok())
            .collect();
        names.sort();
        names.dedup();
        let files = settings.files as u64;
        let units = names.len() as u64 * (CHANGES_UNITS + REQUESTS_UNITS) + 2;
        let unit = settings.max_bytes / units;
        let mut sequences = vec![
            Sequence::new(dir.clone(), OTHER, unit / files),
            Sequence::new(dir.clone(), REFUSALS, unit / files),
        ];
        debug_assert_eq!(sequences[REFUSALS_SEQUENCE].prefix, REFUSALS);
        let mut by_name = HashMap::new();
        for name in names {
            let folder = dir.join(BACKENDS).join(&name);
            by_name.insert(name, sequences.len());
            sequences.push(Sequence::new(
                folder.clone(),
                CHANGES,
                unit * CHANGES_UNITS / files,
            ));
            sequences.push(Sequence::new(
                folder,
                REQUESTS,
                unit * REQUESTS_UNITS / files,
            ));
        }
        for sequence in &sequences {
            drop_extra_files(&sequence.dir, sequence.prefix, settings.files)?;
        }
        // What the trail held before this start, read before this server
        // writes anything (a thread of its own: changes need not wait).
        // Only state changes are remembered: each backend's changes, and
        // the records of no backend (those of an older version among them).
        let before: Vec<PathBuf> = folders(&root)
            .iter()
            .flat_map(|folder| {
                let mut found = file_names(folder, OTHER, settings.files.max(100));
                for backend in folders(&folder.join(BACKENDS)) {
                    found.extend(file_names(&backend, CHANGES, settings.files.max(100)));
                }
                found
            })
            .filter(|path| path.exists())
            .collect();
        // The newest file of records of no backend is opened now: a line
        // a crash tore is ended before anything else is written.
        sequences[0].open()?;
        let writer = Writer {
            sequences,
            files: settings.files,
            failures: Arc::default(),
            lock,
        };
        let failures = writer.failures.clone();
        let (jobs, queue) = tokio::sync::mpsc::channel(QUEUE);
        let mut threads = vec![
            std::thread::Builder::new()
                .name("audit-writer".into())
                .spawn(move || writer.run(queue))?,
        ];
        let writers = Arc::new(Mutex::new(Writers::default()));
        let files: Vec<std::fs::File> = before
            .iter()
            .rev()
            .filter_map(|p| std::fs::File::open(p).ok())
            .collect();
        let seen = writers.clone();
        std::thread::Builder::new()
            .name("audit-reader".into())
            .spawn(move || remember_writers(files, &seen))?;
        let stdout = match settings.stdout {
            false => None,
            true => {
                let (lines, queue) = mpsc::sync_channel::<Vec<u8>>(QUEUE);
                threads.push(std::thread::spawn(move || {
                    for line in queue {
                        let mut out = io::stdout().lock();
                        let _ = out.write_all(&line).and_then(|()| out.flush());
                    }
                }));
                Some(lines)
            }
        };
        Ok(AuditLog {
            root: Some(root),
            settings,
            jobs: Mutex::new(Some(jobs)),
            stdout: Mutex::new(stdout),
            threads: Mutex::new(threads),
            failures,
            lost_to_stdout: AtomicU64::new(0),
            limiter: Mutex::default(),
            writers,
            backends: by_name,
            searches: Arc::new(tokio::sync::Semaphore::new(super::query::SEARCHES)),
        })
    }

    /// A log that keeps nothing.
    pub fn disabled() -> AuditLog {
        AuditLog {
            root: None,
            settings: AuditSettings {
                stdout: false,
                ..AuditSettings::default()
            },
            jobs: Mutex::new(None),
            stdout: Mutex::new(None),
            threads: Mutex::default(),
            failures: Arc::default(),
            lost_to_stdout: AtomicU64::new(0),
            limiter: Mutex::default(),
            writers: Arc::default(),
            backends: HashMap::new(),
            searches: Arc::new(tokio::sync::Semaphore::new(super::query::SEARCHES)),
        }
    }

    /// This replica's name, as its records give it.
    pub fn replica(&self) -> &str {
        &self.settings.replica
    }

    /// Whether records are kept here (a query can answer).
    pub fn keeps(&self) -> bool {
        self.root.is_some()
    }

    /// Records that could not be written since the start, and records not
    /// printed because stdout was not read.
    pub fn failures(&self) -> (u64, u64) {
        (
            self.failures.load(Ordering::Relaxed),
            self.lost_to_stdout.load(Ordering::Relaxed),
        )
    }

    /// Record a change refused before it started (a 403, a body refused):
    /// at a bounded rate per caller ([`RefusalLimiter`]), the rest counted
    /// and said in the next one recorded.
    pub async fn append_refusal(&self, mut record: Record) {
        if self
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
        {
            return;
        }
        let verdict = self
            .limiter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .judge(&record.caller, Instant::now());
        let n = match verdict {
            Verdict::Suppress => return,
            Verdict::Record(n) => n,
        };
        record = record.bounded();
        if n > 0 {
            record.result.push_str(&format!(
                " (and {n} earlier refusals of this caller not recorded: too many)"
            ));
        }
        self.write(record, true).await;
    }

    /// Append `record`, and return once it is written (or could not be:
    /// logged and counted, never the request's answer, since the change
    /// it records is done).
    pub async fn append(&self, record: Record) {
        self.write(record.bounded(), false).await;
    }

    /// Write `record` to its sequence: a `refusal` to the refusals' own.
    async fn write(&self, record: Record, refusal: bool) {
        let Some(jobs) = self.jobs.lock().unwrap_or_else(|e| e.into_inner()).clone() else {
            return;
        };
        self.writers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .note(&record, true);
        let mut line = serde_json::to_vec(&record).expect("records serialise");
        line.push(b'\n');
        self.print(&line);
        let to = match self.backends.get(&record.backend) {
            _ if refusal => REFUSALS_SEQUENCE,
            None => 0,
            Some(&changes) if is_change(&record) => changes,
            Some(&changes) => changes + 1,
        };
        let (done, written) = tokio::sync::oneshot::channel();
        let queued = tokio::time::timeout(GIVE_UP, jobs.send(Job(line, to, done))).await;
        let outcome = match queued {
            Ok(Ok(())) => tokio::time::timeout(GIVE_UP, written)
                .await
                .map_err(|_| "not written within 10 s")
                .and_then(|r| r.map_err(|_| "its writer stopped")),
            Ok(Err(_)) => Err("its writer stopped"),
            Err(_) => Err("not queued within 10 s"),
        };
        if let Err(why) = outcome {
            self.failures.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                "an audit record may be lost ({why}): {}",
                serde_json::to_string(&record).unwrap_or_default()
            );
        }
    }

    fn print(&self, line: &[u8]) {
        let stdout = self.stdout.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(stdout) = stdout.as_ref()
            && stdout.try_send(line.to_vec()).is_err()
        {
            let lost = self.lost_to_stdout.fetch_add(1, Ordering::Relaxed) + 1;
            if lost == 1 || lost.is_multiple_of(1000) {
                tracing::warn!(lost, "audit records not printed: stdout is not being read");
            }
        }
    }

    /// Write what is queued, and stop the threads (at shutdown): blocks.
    pub fn close(&self) {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.stdout.lock().unwrap_or_else(|e| e.into_inner()).take();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for thread in threads {
            let _ = thread.join();
        }
    }

    /// The newest writes of `backend`/`workspace` this trail remembers,
    /// oldest first.
    pub fn writes_of(&self, backend: &str, workspace: &str) -> Vec<super::Write> {
        self.writers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .of(backend, workspace)
    }

    /// The files that may hold `backend`'s records in every trail of this
    /// data directory (this replica's, others sharing the directory,
    /// earlier names), by sequence, each newest first: the records of no
    /// backend, the backend's changes, its other records.
    pub(super) fn sequences_of(&self, backend: &str) -> Vec<Vec<PathBuf>> {
        let Some(root) = &self.root else {
            return Vec::new();
        };
        let files = self.settings.files.max(100);
        let named = crate::names::check_name("backend", backend).is_ok();
        let mut sequences = Vec::new();
        for folder in folders(root) {
            sequences.push(file_names(&folder, OTHER, files));
            sequences.push(file_names(&folder, REFUSALS, files));
            if named {
                let own = folder.join(BACKENDS).join(backend);
                sequences.push(file_names(&own, CHANGES, files));
                sequences.push(file_names(&own, REQUESTS, files));
            }
        }
        sequences
    }
}

/// Whether `record` is an acknowledged change of a state, a lock held by
/// another or a workspace (kept in its backend's share of changes), rather
/// than a lock, an unlock, a refusal or a retried write, which anyone who
/// may write can repeat at will.
fn is_change(record: &Record) -> bool {
    use super::Operation::{Lock, Unlock};
    record.status < 400
        && (record.result == "ok" || record.result.starts_with("ok;"))
        && !matches!(record.operation, Lock | Unlock)
}

/// The trails' folders under `root`.
fn folders(root: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    found.sort();
    found
}

/// Read the writes `files` hold (oldest first) into `writers`, as older
/// than any written since the start.
fn remember_writers(files: Vec<std::fs::File>, writers: &Mutex<Writers>) {
    for file in files {
        for line in io::BufReader::new(file).split(b'\n').map_while(Result::ok) {
            // A cheap look before the parse: most records are not writes.
            let has = |op: &[u8]| line.windows(op.len()).any(|w| w == op);
            if !has(b"\"operation\":\"write\"") && !has(b"\"operation\":\"restore\"") {
                continue;
            }
            if let Ok(record) = serde_json::from_slice::<Record>(&line) {
                writers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .note(&record, false);
            }
        }
    }
}

#[cfg(test)]
mod tests;
