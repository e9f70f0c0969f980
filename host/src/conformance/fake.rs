//! An in-memory [`Storage`] with switchable bugs, to prove that each
//! conformance case fails when the behaviour it checks is broken.

use super::{Report, run};
use crate::backend::{LockInfo, Storage, StorageError, StorageResult};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Deliberate bugs.
#[derive(Default, Clone, Copy)]
struct Bugs {
    grants_lock_twice: bool,
    ignores_lock_on_write: bool,
    truncates_large_states: bool,
    forgets_unlock_check: bool,
}

#[derive(Default)]
struct Fake {
    bugs: Bugs,
    states: Mutex<BTreeMap<String, Vec<u8>>>,
    locks: Mutex<BTreeMap<String, LockInfo>>,
    workspaces: Mutex<BTreeMap<String, ()>>,
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
}

impl Storage for Fake {
    async fn read(&self, ws: &str) -> StorageResult<Option<Vec<u8>>> {
        Ok(self.states.lock().unwrap().get(ws).cloned())
    }
    async fn write(&self, ws: &str, state: bytes::Bytes, id: Option<&str>) -> StorageResult<()> {
        self.check(ws, id)?;
        let mut state = state.to_vec();
        if self.bugs.truncates_large_states {
            state.truncate(1 << 20);
        }
        self.workspaces.lock().unwrap().insert(ws.into(), ());
        self.states.lock().unwrap().insert(ws.into(), state);
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
