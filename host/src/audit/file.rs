//! The log on disk: `audit.jsonl` takes new records; when it would pass
//! its share of the bound it becomes `audit.1.jsonl` (and that one
//! `audit.2.jsonl`…), the oldest file is dropped, and a new one begins.
//! A record is written whole with one `write` before the change is
//! answered (a crash of the process loses nothing acknowledged) and
//! reaches the disk within [`SYNC_EVERY`] (a power cut may lose that last
//! second).

use super::Record;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How often records written are synced to the disk.
pub const SYNC_EVERY: Duration = Duration::from_secs(1);

/// The `[audit]` table, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditSettings {
    /// The most bytes all the log's files hold together.
    pub max_bytes: u64,
    /// How many files the log is rotated over (the newest included).
    pub files: usize,
    /// Also print each record to stdout as a JSON line.
    pub stdout: bool,
    /// This replica's name in its records.
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
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "wasmstate".into())
}

/// One replica's audit log.
pub struct AuditLog {
    /// `None`: records go nowhere but stdout (tests, benchmarks).
    dir: Option<PathBuf>,
    settings: AuditSettings,
    current: Mutex<Option<Current>>,
    unsynced: AtomicBool,
    failures: AtomicU64,
}

struct Current {
    file: File,
    bytes: u64,
}

impl AuditLog {
    /// The log under `data_dir/audit`, created when missing.
    pub fn open(data_dir: &Path, settings: AuditSettings) -> io::Result<AuditLog> {
        let dir = data_dir.join("audit");
        std::fs::create_dir_all(&dir)?;
        let current = open_current(&dir)?;
        Ok(AuditLog {
            dir: Some(dir),
            settings,
            current: Mutex::new(Some(current)),
            unsynced: AtomicBool::new(false),
            failures: AtomicU64::new(0),
        })
    }

    /// A log that keeps nothing (and prints nothing).
    pub fn disabled() -> AuditLog {
        AuditLog {
            dir: None,
            settings: AuditSettings {
                stdout: false,
                ..AuditSettings::default()
            },
            current: Mutex::new(None),
            unsynced: AtomicBool::new(false),
            failures: AtomicU64::new(0),
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

    /// Records that could not be written since the start.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Append `record`. A failure to write is logged and counted, never
    /// turned into the request's answer: the change it records is done.
    pub fn append(&self, record: &Record) {
        let mut line = serde_json::to_vec(record).expect("records serialise");
        line.push(b'\n');
        if self.settings.stdout {
            let mut out = io::stdout().lock();
            let _ = out.write_all(&line).and_then(|()| out.flush());
        }
        let Some(dir) = &self.dir else { return };
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = self.write_line(dir, &mut current, &line) {
            self.failures.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                dir = %dir.display(),
                error = %e,
                "an audit record could not be written (is the disk full?): {}",
                String::from_utf8_lossy(&line).trim_end()
            );
        }
    }

    fn write_line(&self, dir: &Path, current: &mut Option<Current>, line: &[u8]) -> io::Result<()> {
        let per_file = (self.settings.max_bytes / self.settings.files as u64).max(1);
        let full = current
            .as_ref()
            .is_some_and(|c| c.bytes > 0 && c.bytes + line.len() as u64 > per_file);
        if full || current.is_none() {
            if let Some(old) = current.take() {
                old.file.sync_data()?;
                rotate(dir, self.settings.files)?;
            }
            *current = Some(open_current(dir)?);
        }
        let current = current.as_mut().expect("opened above");
        // One write of the whole line with O_APPEND: a line is never torn
        // by another writer, and never half-written by this one unless the
        // disk fills (then the next line starts after the torn one, which
        // a query skips).
        current.file.write_all(line)?;
        current.bytes += line.len() as u64;
        self.unsynced.store(true, Ordering::Release);
        Ok(())
    }

    /// Sync what was written since the last sync.
    pub fn sync(&self) {
        if !self.unsynced.swap(false, Ordering::AcqRel) {
            return;
        }
        let file = {
            let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
            current.as_ref().and_then(|c| c.file.try_clone().ok())
        };
        if let Some(file) = file
            && let Err(e) = file.sync_data()
        {
            tracing::error!(error = %e, "the audit log could not be synced to disk");
        }
    }

    /// Sync every [`SYNC_EVERY`], for as long as the server runs.
    pub fn sync_in_background(self: &std::sync::Arc<Self>) {
        if self.dir.is_none() {
            return;
        }
        let log = std::sync::Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SYNC_EVERY);
            loop {
                tick.tick().await;
                let Some(log) = log.upgrade() else { return };
                let _ = tokio::task::spawn_blocking(move || log.sync()).await;
            }
        });
    }

    /// The log's files, newest first.
    pub(super) fn files(&self) -> Vec<PathBuf> {
        let Some(dir) = &self.dir else {
            return Vec::new();
        };
        (0..self.settings.files)
            .map(|n| file_name(dir, n))
            .collect()
    }
}

fn file_name(dir: &Path, n: usize) -> PathBuf {
    match n {
        0 => dir.join("audit.jsonl"),
        n => dir.join(format!("audit.{n}.jsonl")),
    }
}

fn open_current(dir: &Path) -> io::Result<Current> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(file_name(dir, 0))?;
    let bytes = file.metadata()?.len();
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
    if files == 1 {
        std::fs::remove_file(file_name(dir, 0))?;
    }
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{Operation, Record};

    fn record(n: usize) -> Record {
        Record {
            time: crate::audit::now_text(),
            replica: "r1".into(),
            caller: "alice".into(),
            claims: Default::default(),
            backend: "default".into(),
            workspace: format!("w{n}"),
            operation: Operation::Write,
            before: None,
            after: None,
            lock: None,
            holder: None,
            status: 200,
            result: "ok".into(),
        }
    }

    fn log_bytes(dir: &Path) -> u64 {
        std::fs::read_dir(dir.join("audit"))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum()
    }

    #[test]
    fn the_log_stays_within_its_bound_and_keeps_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let settings = AuditSettings {
            max_bytes: 64 << 10,
            files: 4,
            stdout: false,
            replica: "r1".into(),
        };
        let log = AuditLog::open(dir.path(), settings).unwrap();
        for n in 0..5_000 {
            log.append(&record(n));
        }
        assert!(
            log_bytes(dir.path()) <= 64 << 10,
            "{}",
            log_bytes(dir.path())
        );
        assert_eq!(
            std::fs::read_dir(dir.path().join("audit")).unwrap().count(),
            4
        );
        let newest = std::fs::read_to_string(dir.path().join("audit/audit.jsonl")).unwrap();
        assert!(newest.trim_end().ends_with("\"result\":\"ok\"}"));
        assert!(newest.contains("\"workspace\":\"w4999\""));
        assert_eq!(log.failures(), 0);
    }

    #[test]
    fn a_reopened_log_appends_after_what_it_held() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::open(dir.path(), AuditSettings::default()).unwrap();
        log.append(&record(1));
        drop(log);
        let log = AuditLog::open(dir.path(), AuditSettings::default()).unwrap();
        log.append(&record(2));
        let text = std::fs::read_to_string(dir.path().join("audit/audit.jsonl")).unwrap();
        let lines: Vec<Record> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            lines,
            vec![record_at(&lines[0], 1), record_at(&lines[1], 2)]
        );
    }

    fn record_at(seen: &Record, n: usize) -> Record {
        Record {
            time: seen.time.clone(),
            ..record(n)
        }
    }
}
