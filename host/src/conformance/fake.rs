//! An in-memory [`Storage`] with switchable bugs, to prove that each
//! conformance case fails when the behaviour it checks is broken.

use super::{Report, run};
use crate::backend::{Expect, Head, LockInfo, Metadata, Storage, StorageError, StorageResult};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Deliberate bugs.
#[derive(Default, Clone, Copy)]
struct Bugs {
    grants_lock_twice: bool,
    ignores_lock_on_write: bool,
    truncates_large_states: bool,
    forgets_unlock_check: bool,
    /// A guest built before contract 0.3.0: no head, conditional write or
    /// metadata (not a bug: its cases are skipped).
    old_contract: bool,
    /// Conditional writes write whatever is stored.
    ignores_expectation: bool,
    /// Heads say one byte less than is stored.
    head_miscounts: bool,
    /// Deleting a workspace leaves its metadata.
    keeps_metadata: bool,
    /// The storage keeps no metadata (not a bug: passes with a note).
    no_metadata: bool,
}

#[derive(Default)]
struct Fake {
    bugs: Bugs,
    /// Each state with its version.
    states: Mutex<BTreeMap<String, (u64, Vec<u8>)>>,
    locks: Mutex<BTreeMap<String, LockInfo>>,
    workspaces: Mutex<BTreeMap<String, ()>>,
    metadata: Mutex<BTreeMap<String, (u64, String)>>,
    versions: AtomicU64,
}

impl Fake {
    fn holder(&self, ws: &str) -> Option<LockInfo> {
        self.locks.lock().unwrap().get(ws).cloned()
    }

    fn check(&self, ws: &str, id: Option<&str>) -> StorageResult<()> {
        if self.bugs.ignores_lock_on_write {
            return Ok(());
        }
        match (self.holder(ws), id) {
            (Some(h), Some(id)) if h.id == id => Ok(()),
            (Some(h), _) => Err(StorageError::Locked(h)),
            (None, Some(_)) => Err(StorageError::LockMismatch(None)),
            (None, None) => Ok(()),
        }
    }

    fn next_version(&self) -> u64 {
        self.versions.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn no_metadata(&self) -> StorageResult<()> {
        match self.bugs.no_metadata {
            true => Err(StorageError::NoMetadata("a fake without it".into())),
            false => Ok(()),
        }
    }
}

/// Whether `stored` (a version, or none) is as `expect` says.
fn as_expected(expect: &Expect, stored: Option<u64>) -> bool {
    match (expect, stored) {
        (Expect::Any, _) | (Expect::Absent, None) => true,
        (Expect::Version(v), Some(stored)) => *v == stored.to_string(),
        _ => false,
    }
}

impl Storage for Fake {
    fn conditional_writes(&self) -> bool {
        !self.bugs.old_contract
    }
    async fn head(&self, ws: &str) -> StorageResult<Option<Head>> {
        let states = self.states.lock().unwrap();
        Ok(states.get(ws).map(|(version, bytes)| Head {
            version: version.to_string(),
            size: bytes.len() as u64 - u64::from(self.bugs.head_miscounts),
            digest: Some(format!("sha256:{}", crate::digest::sha256_hex(bytes))),
            prefix: bytes[..bytes.len().min(crate::statefile::PREFIX_BYTES)].to_vec(),
        }))
    }
    async fn write_if(
        &self,
        ws: &str,
        state: bytes::Bytes,
        id: Option<&str>,
        expect: Expect,
    ) -> StorageResult<bool> {
        self.check(ws, id)?;
        let mut states = self.states.lock().unwrap();
        let stored = states.get(ws).map(|(version, _)| *version);
        if !as_expected(&expect, stored) && !self.bugs.ignores_expectation {
            return Ok(false);
        }
        self.workspaces.lock().unwrap().insert(ws.into(), ());
        states.insert(ws.into(), (self.next_version(), state.to_vec()));
        Ok(true)
    }
    async fn read_metadata(&self, ws: &str) -> StorageResult<Option<Metadata>> {
        self.no_metadata()?;
        let metadata = self.metadata.lock().unwrap();
        Ok(metadata.get(ws).map(|(version, content)| Metadata {
            content: content.clone(),
            version: version.to_string(),
        }))
    }
    async fn write_metadata(
        &self,
        ws: &str,
        content: Option<String>,
        expect: Expect,
    ) -> StorageResult<bool> {
        self.no_metadata()?;
        let mut metadata = self.metadata.lock().unwrap();
        let stored = metadata.get(ws).map(|(version, _)| *version);
        if !as_expected(&expect, stored) && !self.bugs.ignores_expectation {
            return Ok(false);
        }
        match content {
            Some(content) => metadata.insert(ws.into(), (self.next_version(), content)),
            None => metadata.remove(ws),
        };
        Ok(true)
    }
    async fn read(&self, ws: &str) -> StorageResult<Option<Vec<u8>>> {
        Ok(self.states.lock().unwrap().get(ws).map(|(_, b)| b.clone()))
    }
    async fn write(&self, ws: &str, state: bytes::Bytes, id: Option<&str>) -> StorageResult<()> {
        self.check(ws, id)?;
        let mut state = state.to_vec();
        if self.bugs.truncates_large_states {
            state.truncate(1 << 20);
        }
        self.workspaces.lock().unwrap().insert(ws.into(), ());
        let version = self.next_version();
        self.states
            .lock()
            .unwrap()
            .insert(ws.into(), (version, state));
        Ok(())
    }
    async fn delete(&self, ws: &str, id: Option<&str>) -> StorageResult<()> {
        self.check(ws, id)?;
        self.states.lock().unwrap().remove(ws);
        Ok(())
    }
    async fn lock(&self, ws: &str, info: LockInfo) -> StorageResult<()> {
        let mut locks = self.locks.lock().unwrap();
        match locks.get(ws) {
            Some(h) if h.id != info.id && !self.bugs.grants_lock_twice => {
                Err(StorageError::Locked(h.clone()))
            }
            _ => {
                locks.insert(ws.into(), info);
                Ok(())
            }
        }
    }
    async fn unlock(&self, ws: &str, id: &str) -> StorageResult<()> {
        let mut locks = self.locks.lock().unwrap();
        match locks.get(ws) {
            Some(h) if h.id != id && !self.bugs.forgets_unlock_check => {
                Err(StorageError::LockMismatch(Some(h.clone())))
            }
            _ => {
                locks.remove(ws);
                Ok(())
            }
        }
    }
    async fn current_lock(&self, ws: &str) -> StorageResult<Option<LockInfo>> {
        Ok(self.holder(ws))
    }
    async fn force_unlock(&self, ws: &str) -> StorageResult<Option<LockInfo>> {
        Ok(self.locks.lock().unwrap().remove(ws))
    }
    async fn list_workspaces(&self) -> StorageResult<Vec<String>> {
        Ok(self.workspaces.lock().unwrap().keys().cloned().collect())
    }
    async fn create_workspace(&self, name: &str) -> StorageResult<bool> {
        Ok(self
            .workspaces
            .lock()
            .unwrap()
            .insert(name.into(), ())
            .is_none())
    }
    async fn delete_workspace(&self, name: &str) -> StorageResult<()> {
        if let Some(h) = self.holder(name) {
            return Err(StorageError::Locked(h));
        }
        self.states.lock().unwrap().remove(name);
        if !self.bugs.keeps_metadata {
            self.metadata.lock().unwrap().remove(name);
        }
        match self.workspaces.lock().unwrap().remove(name) {
            Some(()) => Ok(()),
            None => Err(StorageError::NotFound),
        }
    }
}

async fn report(bugs: Bugs) -> Report {
    run(
        Arc::new(Fake {
            bugs,
            ..Fake::default()
        }),
        "test",
    )
    .await
}

fn failed(report: &Report) -> Vec<&'static str> {
    report
        .outcomes
        .iter()
        .filter(|o| o.result.is_err())
        .map(|o| o.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_correct_storage_passes_every_case() {
    let report = report(Bugs::default()).await;
    assert!(report.all_passed(), "{}", report.render());
    assert!(
        report
            .render()
            .ends_with(&format!("{} passed, 0 failed\n", report.outcomes.len()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bug_is_caught_by_the_case_about_it() {
    let cases: [(Bugs, &str); 4] = [
        (
            Bugs {
                grants_lock_twice: true,
                ..Bugs::default()
            },
            "a second lock is refused and names the holder",
        ),
        (
            Bugs {
                ignores_lock_on_write: true,
                ..Bugs::default()
            },
            "writes and deletes without the holder's ID are refused while locked",
        ),
        (
            Bugs {
                truncates_large_states: true,
                ..Bugs::default()
            },
            "a 10 MiB state round-trips",
        ),
        (
            Bugs {
                forgets_unlock_check: true,
                ..Bugs::default()
            },
            "unlock with a wrong ID is refused and names the holder",
        ),
    ];
    for (bugs, case) in cases {
        let report = report(bugs).await;
        let failed = failed(&report);
        assert!(
            failed.contains(&case),
            "{case:?} did not fail:\n{}",
            report.render()
        );
        assert!(report.render().contains("FAIL  "), "{}", report.render());
    }
    let report = report(Bugs {
        grants_lock_twice: true,
        ..Bugs::default()
    })
    .await;
    assert!(failed(&report).contains(&"parallel lockers: exactly one wins each round"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_read_names_where_it_stopped() {
    let report = report(Bugs {
        truncates_large_states: true,
        ..Bugs::default()
    })
    .await;
    let text = report.render();
    assert!(
        text.contains("read stopped after 1048576 of the 10485760 bytes written"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_broken_conditional_call_is_caught_by_its_case() {
    let cases: [(Bugs, &[&str]); 3] = [
        (
            Bugs {
                ignores_expectation: true,
                ..Bugs::default()
            },
            &[
                "a write expecting a stale version answers false and changes nothing",
                "a write expecting no state answers false over a state",
                "a second write with the expectation a successful write used fails",
                "parallel conditional writers from one version: exactly one wins",
                "workspace metadata round-trips and is replaced only as expected",
            ],
        ),
        (
            Bugs {
                head_miscounts: true,
                ..Bugs::default()
            },
            &["head agrees with read: size, first bytes, digest, a new version per write"],
        ),
        (
            Bugs {
                keeps_metadata: true,
                ..Bugs::default()
            },
            &["deleting a workspace removes its metadata"],
        ),
    ];
    for (bugs, expected) in cases {
        let report = report(bugs).await;
        let failed = failed(&report);
        for case in expected {
            assert!(
                failed.contains(case),
                "{case:?} did not fail:\n{}",
                report.render()
            );
        }
        assert_eq!(failed.len(), expected.len(), "{}", report.render());
    }
}

/// A guest built for 0.2.x or 0.1.0 passes the kit: it skips 0.3.0's
/// cases, each with why, and the summary counts only what ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_before_0_3_0_skips_the_conditional_cases_saying_why() {
    let old = report(Bugs {
        old_contract: true,
        ..Bugs::default()
    })
    .await;
    assert!(old.all_passed(), "{}", old.render());
    let text = old.render();
    let skipped: Vec<&str> = text.lines().filter(|l| l.starts_with("SKIP  ")).collect();
    assert_eq!(
        skipped.len(),
        super::conditional::all::<Fake>().len(),
        "{text}"
    );
    assert!(skipped.iter().all(|l| l.contains("before 0.3.0")), "{text}");
    let current = report(Bugs::default()).await;
    let ran = current.outcomes.len() - skipped.len();
    assert!(
        text.ends_with(&format!("{ran} passed, 0 failed\n")),
        "{text}"
    );
    assert!(!current.render().contains("SKIP"), "{}", current.render());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_without_metadata_passes_its_cases_with_a_note() {
    let report = report(Bugs {
        no_metadata: true,
        ..Bugs::default()
    })
    .await;
    assert!(report.all_passed(), "{}", report.render());
    let noted = report
        .render()
        .lines()
        .filter(|l| l.starts_with("PASS  ") && l.contains("keeps no metadata"))
        .count();
    assert_eq!(noted, 2, "{}", report.render());
}
