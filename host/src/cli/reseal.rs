//! `wasmstate state reseal`: walk a backend's workspaces on a running
//! server, asking it to re-seal each ([`crate::protocol`]'s reseal route),
//! with a progress line per workspace on stderr and a summary on stdout.

use crate::client::Client;
use crate::resealing::{Outcome, ResealReport};
use std::collections::BTreeMap;

/// What to re-seal.
pub struct Plan {
    /// The backend.
    pub backend: String,
    /// One workspace, else all.
    pub workspace: Option<String>,
    /// Change nothing.
    pub dry_run: bool,
    /// The backend's name before a rename.
    pub from_backend: Option<String>,
}

/// Run `plan` against the server behind `client`; `Err` when anything
/// still needs an older key (a skipped workspace, a failed version).
pub async fn run(client: &Client, plan: Plan) -> anyhow::Result<()> {
    let workspaces = match &plan.workspace {
        Some(one) => vec![one.clone()],
        None => client.list(&plan.backend).await?,
    };
    let total = workspaces.len();
    let mut reports = Vec::with_capacity(total);
    let mut errors: Vec<(String, String)> = Vec::new();
    for (n, workspace) in workspaces.iter().enumerate() {
        let answer = client
            .reseal(
                &plan.backend,
                workspace,
                plan.from_backend.as_deref(),
                plan.dry_run,
            )
            .await;
        match answer {
            Ok(report) => {
                eprintln!("[{}/{total}] {workspace}: {}", n + 1, report.line());
                reports.push(report);
            }
            Err(e) => {
                // One workspace's failure does not stop the others.
                eprintln!("[{}/{total}] {workspace}: FAILED: {e:#}", n + 1);
                errors.push((workspace.clone(), format!("{e:#}")));
            }
        }
    }
    let summary = Summary::of(&reports, plan.dry_run);
    println!("{}", summary.text(&plan, &errors));
    let unfinished = reports.iter().filter(|r| r.pending()).count() + errors.len();
    if unfinished > 0 && !plan.dry_run {
        anyhow::bail!(
            "{unfinished} workspace(s) not finished (above); run `wasmstate state reseal` again for them, \
             and keep the older keys configured until it reports nothing left"
        );
    }
    Ok(())
}

/// Counts over every workspace.
#[derive(Default)]
struct Summary {
    dry_run: bool,
    sealing_key: Option<String>,
    states: BTreeMap<&'static str, usize>,
    versions: BTreeMap<&'static str, usize>,
    /// Why something was left: the reason and how many.
    left: BTreeMap<String, usize>,
    /// What read-only versions still need, and how many.
    still: BTreeMap<String, usize>,
    /// Versions kept by the data directory of the replica that answered.
    by_replica: bool,
}

fn kind(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Resealed { .. } => "re-sealed",
        Outcome::WouldReseal { .. } => "would be re-sealed",
        Outcome::Current => "already current",
        Outcome::Absent => "absent",
        Outcome::Skipped { .. } => "skipped",
        Outcome::KeptByStorage { .. } => "kept by the storage (read-only)",
        Outcome::Failed { .. } => "failed",
    }
}

impl Summary {
    fn of(reports: &[ResealReport], dry_run: bool) -> Summary {
        let mut summary = Summary {
            dry_run,
            ..Summary::default()
        };
        for report in reports {
            summary.sealing_key = Some(report.sealing_key.clone());
            summary.by_replica |= report.versions_kept_by == "replica";
            *summary.states.entry(kind(&report.state)).or_default() += 1;
            summary.note(&report.workspace, &report.state);
            for version in &report.versions {
                *summary.versions.entry(kind(&version.outcome)).or_default() += 1;
                summary.note(&report.workspace, &version.outcome);
            }
        }
        summary
    }

    fn note(&mut self, workspace: &str, outcome: &Outcome) {
        match outcome {
            Outcome::Skipped { reason } | Outcome::Failed { reason } => {
                *self
                    .left
                    .entry(format!("{workspace}: {reason}"))
                    .or_default() += 1;
            }
            Outcome::KeptByStorage { still } => *self.still.entry(still.clone()).or_default() += 1,
            _ => {}
        }
    }

    fn text(&self, plan: &Plan, errors: &[(String, String)]) -> String {
        let counts = |map: &BTreeMap<&str, usize>| {
            if map.is_empty() {
                return "none".to_string();
            }
            let parts: Vec<String> = map.iter().map(|(k, n)| format!("{n} {k}")).collect();
            parts.join(", ")
        };
        let key = self.sealing_key.as_deref().unwrap_or("?");
        let mut text = format!(
            "{}backend {:?}, sealing key {key:?}{}\n  states:   {}\n  versions: {}",
            if self.dry_run { "dry run: " } else { "" },
            plan.backend,
            plan.from_backend
                .as_deref()
                .map(|old| format!(", re-bound from {old:?}"))
                .unwrap_or_default(),
            counts(&self.states),
            counts(&self.versions),
        );
        for (reason, n) in &self.left {
            text.push_str(&format!("\n  left ({n}): {reason}"));
        }
        for (workspace, error) in errors {
            text.push_str(&format!("\n  error: {workspace}: {error}"));
        }
        for (still, n) in &self.still {
            text.push_str(&format!(
                "\n  note: {n} version(s) kept by the storage still need {still}; storage cannot \
                 rewrite them: keep it while they matter"
            ));
        }
        if self.by_replica {
            text.push_str(
                "\n  note: versions are kept in the data directory of the replica that answered; \
                 replicas that do not share it keep their own: run this against each (--server)",
            );
        }
        text
    }
}
