//! What a run did and found, as a person reads it: counts, how often the
//! run reached each seam, and the history around each anomaly.

use super::check::Anomaly;
use super::history::{Event, NATIVE, Op, Outcome, Races};

/// What a run did and found.
pub struct Report {
    /// The run's seed.
    pub seed: u64,
    /// Its whole history.
    pub events: Vec<Event>,
    /// The host faults injected.
    pub faults: Vec<String>,
    /// What the check found.
    pub anomalies: Vec<Anomaly>,
    /// How the races of unlocked writers from one serial ended.
    pub races: Races,
}

impl Report {
    /// How many answers were a 423 for the lock a host takes for an
    /// unlocked write: none where the guest has conditional writes.
    pub fn host_locks(&self) -> usize {
        self.events
            .iter()
            .filter(|e| e.outcome == Outcome::HeldByHost)
            .count()
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unknown = self
            .events
            .iter()
            .filter(|e| matches!(e.outcome, Outcome::Unknown(_)))
            .count();
        let acknowledged = self
            .events
            .iter()
            .filter(|e| matches!(e.op, Op::Post(_)) && e.outcome.is(200))
            .count();
        writeln!(
            f,
            "seed {} (replay: WASMSTATE_CHAOS_SEED={}): {} operations ({acknowledged} writes acknowledged, {unknown} without an answer), {} faults, {} anomalies",
            self.seed,
            self.seed,
            self.events.len(),
            self.faults.len(),
            self.anomalies.len()
        )?;
        writeln!(f, "{}", Seams::of(&self.events))?;
        writeln!(
            f,
            "{}; {} answers held by a host's own lock for an unlocked write",
            self.races,
            self.host_locks()
        )?;
        let mut kinds = std::collections::BTreeMap::new();
        for anomaly in &self.anomalies {
            let kind = anomaly.what.split(':').next().unwrap_or_default();
            *kinds.entry(kind).or_insert(0) += 1;
        }
        for (kind, count) in kinds {
            writeln!(f, "{count} × {kind}")?;
        }
        for anomaly in self.anomalies.iter().take(5) {
            writeln!(f, "\nANOMALY: {}", anomaly.what)?;
            for event in context(&self.events, anomaly) {
                let mark = if anomaly.events.contains(&event.index) {
                    ">>"
                } else {
                    "  "
                };
                writeln!(f, "{mark} {event}")?;
            }
        }
        Ok(())
    }
}

/// How often the run reached the seams issue 47 added to the model, so a
/// clean run can be told from one that never went there.
#[derive(Debug, Default)]
struct Seams {
    deletes_under_lock: usize,
    pushed_again: usize,
    opaque_or_v3: usize,
    other_lineage_refused: usize,
    created: usize,
    native_locks: usize,
}

impl Seams {
    fn of(events: &[Event]) -> Seams {
        let mut seams = Seams::default();
        for e in events
            .iter()
            .filter(|e| e.outcome.is(200) || e.outcome.is(409))
        {
            let ok = e.outcome.is(200);
            match &e.op {
                Op::DeleteState(Some(_)) if ok => seams.deletes_under_lock += 1,
                Op::Post(w) if ok && w.shape == "re-push" => seams.pushed_again += 1,
                Op::Post(w) if ok && matches!(w.shape, "opaque" | "v3") => seams.opaque_or_v3 += 1,
                Op::Post(w) if !ok && w.lineage.starts_with("s-") => {
                    seams.other_lineage_refused += 1
                }
                Op::NativeLock(..) if ok && e.host == NATIVE => seams.native_locks += 1,
                _ => {}
            }
        }
        seams.created = events
            .iter()
            .filter(|e| e.op == Op::CreateWorkspace && e.outcome.is(201))
            .count();
        seams
    }
}

impl std::fmt::Display for Seams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seams: {} state deletes under a lock, {} backups pushed again after one, {} OpenTofu-encrypted or format-3 writes acknowledged, {} second lineages refused (409), {} workspaces created through the API, {} native Terraform locks",
            self.deletes_under_lock,
            self.pushed_again,
            self.opaque_or_v3,
            self.other_lineage_refused,
            self.created,
            self.native_locks
        )
    }
}

/// The events of an anomaly's workspace around it: from shortly before
/// the first involved event began to its last one's end.
fn context<'a>(events: &'a [Event], anomaly: &Anomaly) -> Vec<&'a Event> {
    let involved: Vec<&Event> = anomaly.events.iter().map(|&i| &events[i]).collect();
    let Some(workspace) = involved.first().map(|e| e.workspace.as_str()) else {
        return Vec::new();
    };
    let from = involved.iter().map(|e| e.start).min().unwrap_or(0);
    let to = involved.iter().map(|e| e.end).max().unwrap_or(0);
    let mut shown: Vec<&Event> = events
        .iter()
        .filter(|e| e.workspace == workspace && e.end + 200_000 >= from && e.start <= to)
        .collect();
    shown.sort_by_key(|e| (e.start, e.index));
    if shown.len() > 40 {
        shown.retain(|e| anomaly.events.contains(&e.index) || !matches!(e.op, Op::Get));
    }
    shown
}
