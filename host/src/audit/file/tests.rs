use super::*;
use crate::audit::{Operation, Record};
use std::fs::OpenOptions;

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

fn settings(max_bytes: u64, files: usize) -> AuditSettings {
    AuditSettings {
        max_bytes,
        files,
        stdout: false,
        replica: "r1".into(),
    }
}

fn log_files(dir: &Path) -> Vec<(String, u64)> {
    let mut files: Vec<(String, u64)> = std::fs::read_dir(dir.join("audit/r1"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".jsonl"))
        .map(|e| {
            let len = e.metadata().unwrap().len();
            (e.file_name().to_string_lossy().into_owned(), len)
        })
        .collect();
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_stays_within_its_bound_and_keeps_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::open(dir.path(), settings(64 << 10, 4)).unwrap();
    for n in 0..5_000 {
        log.append(record(n)).await;
    }
    let files = log_files(dir.path());
    let total: u64 = files.iter().map(|(_, len)| len).sum();
    assert!(total <= 64 << 10, "{files:?}");
    assert_eq!(files.len(), 4, "{files:?}");
    let newest = std::fs::read_to_string(dir.path().join("audit/r1/audit.jsonl")).unwrap();
    assert!(newest.contains("\"workspace\":\"w4999\""));
    assert_eq!(log.failures(), (0, 0));
}

#[tokio::test]
async fn a_huge_field_is_cut_so_one_record_stays_small() {
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::open(dir.path(), settings(1 << 20, 2)).unwrap();
    let mut big = record(1);
    big.holder = Some("h".repeat(1 << 20));
    big.result = "r\n".repeat(1 << 19);
    big.caller = "c".repeat(1 << 16);
    log.append(big).await;
    let text = std::fs::read_to_string(dir.path().join("audit/r1/audit.jsonl")).unwrap();
    assert!(text.len() < 2048, "{}", text.len());
    assert_eq!(text.lines().count(), 1);
}

#[tokio::test]
async fn a_reopened_log_appends_after_what_it_held_even_a_torn_line() {
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::open(
        dir.path(),
        AuditSettings {
            replica: "r1".into(),
            ..AuditSettings::default()
        },
    )
    .unwrap();
    log.append(record(1)).await;
    drop(log);
    // A crash (or a full disk) tore the last record.
    let path = dir.path().join("audit/r1/audit.jsonl");
    let mut file = OpenOptions::new().append(true).open(&path).unwrap();
    file.write_all(b"{\"time\":\"2026-11-25T10:0\xc3").unwrap();
    let log = wait_for_the_lock(dir.path());
    log.append(record(2)).await;
    let found = log
        .query("default", &crate::audit::Filter::default())
        .unwrap();
    let workspaces: Vec<&str> = found.iter().map(|r| r.workspace.as_str()).collect();
    assert_eq!(workspaces, ["w2", "w1"]);
}

/// The dropped log's writer thread lets go of the folder when it ends.
fn wait_for_the_lock(dir: &Path) -> AuditLog {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let log = AuditLog::open(dir, settings(64 << 20, 4)).unwrap();
        if log.replica() == "r1" {
            return log;
        }
        // Still held by the dropped log's thread: it took r1-2.
        assert!(Instant::now() < until, "the folder was never let go");
        drop(log);
        std::thread::yield_now();
    }
}

#[tokio::test]
async fn a_second_server_of_one_name_keeps_a_trail_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let first = AuditLog::open(dir.path(), settings(1 << 20, 2)).unwrap();
    let second = AuditLog::open(dir.path(), settings(1 << 20, 2)).unwrap();
    assert_eq!((first.replica(), second.replica()), ("r1", "r1-2"));
    let mut one = record(1);
    one.replica = first.replica().into();
    first.append(one).await;
    let mut two = record(2);
    two.replica = second.replica().into();
    second.append(two).await;
    // Each wrote its own folder; a search reads every folder of the data
    // directory.
    for (folder, workspace) in [("r1", "w1"), ("r1-2", "w2")] {
        let text =
            std::fs::read_to_string(dir.path().join("audit").join(folder).join("audit.jsonl"));
        assert!(
            text.unwrap()
                .contains(&format!("\"workspace\":\"{workspace}\""))
        );
    }
    for log in [&first, &second] {
        let found = log
            .query("default", &crate::audit::Filter::default())
            .unwrap();
        let mut replicas: Vec<String> = found.into_iter().map(|r| r.replica).collect();
        replicas.sort();
        assert_eq!(replicas, ["r1", "r1-2"]);
    }
}

#[test]
fn files_past_the_setting_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("audit/r1");
    std::fs::create_dir_all(&folder).unwrap();
    for n in 1..6 {
        std::fs::write(folder.join(format!("audit.{n}.jsonl")), "{}\n").unwrap();
    }
    let _log = AuditLog::open(dir.path(), settings(1 << 20, 3)).unwrap();
    let names: Vec<String> = log_files(dir.path()).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["audit.1.jsonl", "audit.2.jsonl", "audit.jsonl"]);
}

/// Each backend's locks and refusals rotate within their own share: a
/// flood of one backend's locks leaves another backend's records, and its
/// own changes, where they were, and the trail within its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_one_backends_locks_rotates_out_only_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let max = 70 << 10;
    let log = AuditLog::open_serving(dir.path(), settings(max, 2), ["b", "a"]).unwrap();
    let mut other = record(1);
    other.backend = "b".into();
    log.append(other).await;
    let mut own = record(2);
    own.backend = "a".into();
    log.append(own).await;
    for n in 0..3_000 {
        let mut lock = record(n);
        lock.backend = "a".into();
        lock.operation = Operation::Lock;
        log.append(lock).await;
    }
    let size = |path: &str| {
        std::fs::metadata(dir.path().join("audit/r1").join(path)).map_or(0, |m| m.len())
    };
    // Three units for each of two backends, one for refusals, one for
    // records of no backend.
    let unit = max / 8;
    let a_rest = size("backends/a/requests.jsonl") + size("backends/a/requests.1.jsonl");
    assert!(a_rest <= unit && a_rest > unit / 3, "{a_rest} of {unit}");
    let total: u64 = ["a", "b"]
        .iter()
        .flat_map(|b| ["changes", "requests"].map(|k| format!("backends/{b}/{k}")))
        .flat_map(|p| [format!("{p}.jsonl"), format!("{p}.1.jsonl")])
        .map(|p| size(&p))
        .sum::<u64>()
        + ["audit", "refusals"]
            .iter()
            .flat_map(|p| [format!("{p}.jsonl"), format!("{p}.1.jsonl")])
            .map(|p| size(&p))
            .sum::<u64>();
    assert!(total <= max, "{total}");
    let all = crate::audit::Filter {
        limit: Some(1000),
        ..Default::default()
    };
    assert_eq!(log.query("b", &all).unwrap().len(), 1);
    let writes = crate::audit::Filter {
        operation: Some("write".into()),
        ..all.clone()
    };
    assert_eq!(log.query("a", &writes).unwrap()[0].workspace, "w2");
    let kept = log.query("a", &all).unwrap();
    assert!(kept.len() < 3_000, "the flood rotated: {}", kept.len());
    // Newest first, across a's two sequences: the lock flood, then the write.
    assert_eq!(kept.last().unwrap().operation, Operation::Write);
    assert_eq!(kept[0].workspace, "w2999");
}

/// Refusals (which callers with no grant on a backend can cause at will)
/// go to a sequence of their own: a flood of them rotates out only older
/// refusals, never a backend's lock record, and searches still find them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_rotate_out_only_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let max = 70 << 10;
    let log = AuditLog::open_serving(dir.path(), settings(max, 2), ["a"]).unwrap();
    let mut lock = record(0);
    lock.backend = "a".into();
    lock.operation = Operation::Lock;
    log.append(lock).await;
    for n in 0..3_000 {
        let mut refused = record(n);
        refused.backend = "a".into();
        refused.caller = format!("stranger-{n}");
        refused.operation = Operation::Lock;
        refused.status = 403;
        refused.result = "forbidden: no grant".into();
        log.append_refusal(refused).await;
    }
    let size = |path: &str| {
        std::fs::metadata(dir.path().join("audit/r1").join(path)).map_or(0, |m| m.len())
    };
    let unit = max / 5;
    let refusals = size("refusals.jsonl") + size("refusals.1.jsonl");
    assert!(
        refusals <= unit && refusals > unit / 3,
        "{refusals} of {unit}"
    );
    let requests =
        std::fs::read_to_string(dir.path().join("audit/r1/backends/a/requests.jsonl")).unwrap();
    assert_eq!(requests.lines().count(), 1, "the lock record stays, alone");
    let all = crate::audit::Filter {
        limit: Some(1000),
        ..Default::default()
    };
    let found = log.query("a", &all).unwrap();
    assert_eq!(found.last().unwrap().workspace, "w0", "the lock, oldest");
    assert!(found.iter().any(|r| r.status == 403), "refusals are found");
}
