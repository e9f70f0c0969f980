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
use super::writer::{Job, Writer, claim_folder, drop_extra_files, file_names, open_current};
use super::writers::Writers;
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
}

impl AuditLog {
    /// The log of `settings.replica` under `data_dir/audit`, created when
    /// missing; its writer thread started. Each running server holds its
    /// folder: a second server of the same name on the same data directory
    /// (two processes on one machine) takes `<replica>-2`, and so on, and
    /// names itself so in its records.
    pub fn open(data_dir: &Path, mut settings: AuditSettings) -> io::Result<AuditLog> {
        let root = data_dir.join("audit");
        let (dir, lock, replica) = claim_folder(&root, &settings.replica)?;
        settings.replica = replica;
        drop_extra_files(&dir, settings.files)?;
        // What the trail held before this start, read before this server
        // writes anything (a thread of its own: changes need not wait).
        let before: Vec<PathBuf> = folders(&root)
            .iter()
            .flat_map(|folder| file_names(folder, settings.files))
            .filter(|path| path.exists())
            .collect();
        let writer = Writer {
            per_file: (settings.max_bytes / settings.files as u64).max(1),
            files: settings.files,
            current: Some(open_current(&dir)?),
            failures: Arc::default(),
            dir,
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
        self.write(record).await;
    }

    /// Append `record`, and return once it is written (or could not be:
    /// logged and counted, never the request's answer, since the change
    /// it records is done).
    pub async fn append(&self, record: Record) {
        self.write(record.bounded()).await;
    }

    async fn write(&self, record: Record) {
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
        let (done, written) = tokio::sync::oneshot::channel();
        let queued = tokio::time::timeout(GIVE_UP, jobs.send(Job(line, done))).await;
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

    /// Every trail's files in this data directory, by folder (this
    /// replica's, others sharing the directory, earlier names), each
    /// newest first.
    pub(super) fn folders_files(&self) -> Vec<Vec<PathBuf>> {
        let Some(root) = &self.root else {
            return Vec::new();
        };
        folders(root)
            .iter()
            .map(|folder| file_names(folder, self.settings.files.max(100)))
            .collect()
    }
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
