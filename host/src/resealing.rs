//! What `wasmstate state reseal` asks of one workspace and what it is
//! told back: shared by the server (which re-seals, [`crate::store`]),
//! the HTTP route and the command line, which prints the summary.

use serde::{Deserialize, Serialize};

/// What to re-seal in one workspace.
#[derive(Debug, Clone, Default)]
pub struct ResealRequest {
    /// The backend's name before a rename: states and versions bound to
    /// it are opened as its and sealed again for the current name.
    pub from_backend: Option<String>,
    /// Say what would be done; change nothing, take no lock.
    pub dry_run: bool,
    /// Who asks, for the lock's `Who`.
    pub who: String,
}

/// What became of the current state, or of one version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum Outcome {
    /// Sealed again under the sealing key (`from`: the key, "plain", or
    /// the old backend name, it was sealed with before).
    Resealed {
        /// What it was sealed with or bound to before.
        from: String,
    },
    /// Would be sealed again (a dry run).
    WouldReseal {
        /// What it is sealed with or bound to now.
        from: String,
    },
    /// Already sealed under the sealing key, for this backend.
    Current,
    /// No state to re-seal.
    Absent,
    /// Left as it was, and why (a held lock; storage that cannot rewrite
    /// old versions).
    Skipped {
        /// One line.
        reason: String,
    },
    /// A version the storage keeps (an S3 object version, a git commit):
    /// it cannot be rewritten and still needs `still` (a key id, or the
    /// name it is bound to). Not pending: no run can change it.
    KeptByStorage {
        /// What it still needs.
        still: String,
    },
    /// Could not be opened or written, and why.
    Failed {
        /// One line.
        reason: String,
    },
}

impl Outcome {
    /// Whether it still needs a key other than the sealing one, or could
    /// not be dealt with: the old key must stay until a later run.
    pub fn pending(&self) -> bool {
        matches!(
            self,
            Outcome::Skipped { .. } | Outcome::Failed { .. } | Outcome::WouldReseal { .. }
        )
    }

    /// Short, for a progress line.
    pub fn short(&self) -> String {
        match self {
            Outcome::Resealed { from } => format!("re-sealed (was {from})"),
            Outcome::WouldReseal { from } => format!("would re-seal (now {from})"),
            Outcome::Current => "current".into(),
            Outcome::Absent => "no state".into(),
            Outcome::Skipped { reason } => format!("skipped: {reason}"),
            Outcome::KeptByStorage { still } => format!("kept by the storage, still needs {still}"),
            Outcome::Failed { reason } => format!("FAILED: {reason}"),
        }
    }
}

/// One kept version's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionOutcome {
    /// The version's id.
    pub id: String,
    /// What became of it.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// What re-sealing one workspace did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResealReport {
    /// The workspace.
    pub workspace: String,
    /// The key everything is sealed under now.
    pub sealing_key: String,
    /// The current state.
    pub state: Outcome,
    /// Every kept version, newest first.
    pub versions: Vec<VersionOutcome>,
    /// Who keeps those versions: `storage` (every replica sees the same),
    /// `replica` (the data directory of the replica that answered: others
    /// that do not share it keep their own, to re-seal against each), or
    /// `none`.
    #[serde(default)]
    pub versions_kept_by: String,
}

impl ResealReport {
    /// Whether anything of this workspace still needs another key or
    /// another run.
    pub fn pending(&self) -> bool {
        self.state.pending() || self.versions.iter().any(|v| v.outcome.pending())
    }

    /// One line: the state's outcome and the versions' counts.
    pub fn line(&self) -> String {
        let mut counts: Vec<(String, usize)> = Vec::new();
        for version in &self.versions {
            let name = match &version.outcome {
                Outcome::Resealed { .. } => "re-sealed",
                Outcome::WouldReseal { .. } => "would re-seal",
                Outcome::Current => "current",
                Outcome::Absent => "gone",
                Outcome::Skipped { .. } => "skipped",
                Outcome::KeptByStorage { .. } => "kept by the storage (read-only)",
                Outcome::Failed { .. } => "FAILED",
            };
            match counts.iter_mut().find(|(n, _)| n == name) {
                Some((_, count)) => *count += 1,
                None => counts.push((name.to_string(), 1)),
            }
        }
        let versions = if counts.is_empty() {
            "no kept versions".to_string()
        } else {
            let parts: Vec<String> = counts.iter().map(|(n, c)| format!("{c} {n}")).collect();
            format!("versions: {}", parts.join(", "))
        };
        let mut line = format!("state {}; {versions}", self.state.short());
        // Reasons once each: they say what to do.
        let mut reasons: Vec<&str> = Vec::new();
        for version in &self.versions {
            if let Outcome::Skipped { reason } | Outcome::Failed { reason } = &version.outcome
                && !reasons.contains(&reason.as_str())
            {
                reasons.push(reason);
            }
        }
        for reason in reasons {
            line.push_str(&format!("\n    version: {reason}"));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_travels_as_json_and_says_what_is_pending() {
        let report = ResealReport {
            workspace: "net".into(),
            sealing_key: "2026-12".into(),
            state: Outcome::Resealed { from: "k1".into() },
            versions_kept_by: "replica".into(),
            versions: vec![
                VersionOutcome {
                    id: "1".into(),
                    outcome: Outcome::Resealed { from: "k1".into() },
                },
                VersionOutcome {
                    id: "2".into(),
                    outcome: Outcome::Skipped {
                        reason: "kept by storage".into(),
                    },
                },
            ],
        };
        let json = serde_json::to_string(&report).unwrap();
        assert!(
            json.contains(r#""outcome":"resealed","from":"k1""#),
            "{json}"
        );
        let back: ResealReport = serde_json::from_str(&json).unwrap();
        assert_eq!(back, report);
        assert!(report.pending());
        let line = report.line();
        assert!(
            line.starts_with("state re-sealed (was k1); versions: 1 re-sealed, 1 skipped"),
            "{line}"
        );
        assert!(line.contains("version: kept by storage"), "{line}");
    }
}
