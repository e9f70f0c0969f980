//! The conformance kit: the behaviour every storage guest must have, as a
//! list of cases run against any [`Storage`]. `wasmstate guest test` runs it
//! through the real runtime against a component; the project's own tests run
//! the same cases against each first-party guest.
//!
//! Each case works in a workspace of its own (`ck-<run>-<n>`), removed
//! afterwards, so the kit can run against storage that holds real data.

mod cases;
mod conditional;
mod guest;
mod history;
mod rules;
mod steps;

pub use guest::{GuestUnderTest, LoadedGuest, load_guest, run_guest};

use crate::backend::Storage;
use std::sync::Arc;

/// One case's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// What the case checks, in words.
    pub name: &'static str,
    /// `Err` with the reason when the guest got it wrong.
    pub result: Result<(), String>,
    /// Said beside a pass (what the case could not check, and why); for a
    /// case not run, why not.
    pub note: Option<String>,
    /// Not run: the guest's contract has no such call.
    pub skipped: bool,
}

impl Outcome {
    /// A case run, with its result.
    pub fn of(name: &'static str, result: Result<(), String>) -> Outcome {
        Outcome {
            name,
            result,
            note: None,
            skipped: false,
        }
    }
}

/// The outcomes of a whole run.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// In the order run.
    pub outcomes: Vec<Outcome>,
}

impl Report {
    /// How many cases passed and failed (those skipped did neither).
    pub fn counts(&self) -> (usize, usize) {
        let run = self.outcomes.iter().filter(|o| !o.skipped);
        let passed = run.clone().filter(|o| o.result.is_ok()).count();
        (passed, run.count() - passed)
    }

    /// Whether every case passed.
    pub fn all_passed(&self) -> bool {
        self.counts().1 == 0
    }

    /// The report as printed by `wasmstate guest test`: a line per case
    /// (`SKIP` with why for a case the guest's contract has no call for),
    /// then `N passed, M failed`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for o in &self.outcomes {
            match (&o.result, &o.note) {
                (_, Some(why)) if o.skipped => out.push_str(&format!("SKIP  {}: {why}\n", o.name)),
                (Ok(()), Some(note)) => out.push_str(&format!("PASS  {} ({note})\n", o.name)),
                (Ok(()), None) => out.push_str(&format!("PASS  {}\n", o.name)),
                (Err(reason), _) => out.push_str(&format!("FAIL  {}: {}\n", o.name, reason)),
            }
        }
        let (passed, failed) = self.counts();
        out.push_str(&format!("{passed} passed, {failed} failed\n"));
        out
    }
}

/// Run every storage case against `storage`. Workspace names start with
/// `ck-<run_id>-`.
pub async fn run<S: Storage>(storage: Arc<S>, run_id: &str) -> Report {
    let mut report = Report::default();
    for (index, case) in cases::all::<S>().into_iter().enumerate() {
        let workspace = format!("ck-{run_id}-{index}");
        let result = (case.run)(storage.clone(), workspace.clone()).await;
        // Leave nothing behind, whatever the case did.
        clean_up(&*storage, &workspace).await;
        report.outcomes.push(Outcome::of(case.name, result));
    }
    // Contract 0.3.0's cases, which older guests skip, saying why.
    let conditional = storage.conditional_writes();
    for (index, case) in conditional::all::<S>().into_iter().enumerate() {
        if !conditional {
            report.outcomes.push(Outcome {
                note: Some(conditional::SKIPPED.into()),
                skipped: true,
                ..Outcome::of(case.name, Ok(()))
            });
            continue;
        }
        let workspace = format!("ck-{run_id}-c{index}");
        let checked = (case.run)(storage.clone(), workspace.clone()).await;
        clean_up(&*storage, &workspace).await;
        report.outcomes.push(match checked {
            Ok(note) => Outcome {
                note,
                ..Outcome::of(case.name, Ok(()))
            },
            Err(reason) => Outcome::of(case.name, Err(reason)),
        });
    }
    report
}

/// The big-state rule ([`rules::bigger_than_memory`]) in a workspace of
/// its own, removed afterwards: only a guest run knows its memory cap.
/// The state must also fit under `max_body` (what the host takes).
pub async fn big_state<S: Storage>(
    storage: &S,
    run_id: &str,
    memory_bytes: u64,
    max_body: usize,
) -> Result<(), String> {
    let workspace = format!("ck-{run_id}-big");
    let result = rules::bigger_than_memory(storage, &workspace, memory_bytes, max_body).await;
    clean_up(storage, &workspace).await;
    result
}

/// Remove a workspace the kit or the bench wrote, saying so in the log
/// when that fails (it then stays in the storage under test; a failing
/// guest fails it once per case, so it is no line of the report). Storage
/// that keeps history (git, S3 with versioning) keeps its versions
/// regardless.
pub async fn clean_up<S: Storage>(storage: &S, workspace: &str) {
    let _ = storage.force_unlock(workspace).await;
    match storage.delete_workspace(workspace).await {
        Ok(()) | Err(crate::backend::StorageError::NotFound) => {}
        Err(e) => tracing::warn!("could not remove workspace {workspace:?} the kit wrote: {e}"),
    }
}

/// A random-enough run id for workspace names.
pub fn run_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    format!("{:08x}", h.finish() as u32)
}

#[cfg(test)]
mod fake;
