//! The audit trail: one structured record per change to a state, a lock or
//! a workspace, and per refused write, kept by each replica in an
//! append-only, rotated, bounded log under its data directory
//! (`<data_dir>/audit/`), and printed to stdout as JSON lines when asked.
//!
//! Each backend has its own shares of the bound, one for its state changes
//! and one for the rest (locks, unlocks, refusals), so whoever may write to
//! one backend can rotate out only that backend's own oldest lock and
//! refusal records ([`writer`]).
//!
//! Each replica writes its own log: a record says which replica took the
//! request, and the fleet's whole trail is the union of its replicas' logs
//! (ship stdout to the log store for one place to search). Nothing here
//! reaches storage, so a guest can neither read nor rewrite the trail.

mod file;
mod limit;
mod query;
mod writer;
mod writers;

pub use file::{AuditLog, AuditSettings, GIVE_UP};
pub use query::{Filter, MAX_LIMIT, SEARCHES, SearchError};
pub use writers::{Write, unix_ms};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a record says was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Operation {
    /// A state written (POST/PUT), or refused.
    Write,
    /// A state deleted through the state URL (DELETE).
    Delete,
    /// A lock taken.
    Lock,
    /// A lock older than the backend's `lock_ttl` released so another
    /// could take it.
    LockTakeover,
    /// A lock released by its holder.
    Unlock,
    /// A lock released whoever held it (`terraform force-unlock`, the
    /// console).
    ForceUnlock,
    /// A kept version written back from the console.
    Restore,
    /// A state and its kept versions sealed again under the newest key
    /// (`wasmstate state reseal`).
    Reseal,
    /// A workspace created.
    WorkspaceCreate,
    /// A workspace and its state deleted.
    WorkspaceDelete,
    /// A workspace's TFE metadata changed (tags, terraform-version).
    WorkspaceUpdate,
}

impl Operation {
    /// Every operation, as filters and pages name them.
    pub const ALL: [Operation; 11] = [
        Operation::Write,
        Operation::Delete,
        Operation::Lock,
        Operation::LockTakeover,
        Operation::Unlock,
        Operation::ForceUnlock,
        Operation::Restore,
        Operation::Reseal,
        Operation::WorkspaceCreate,
        Operation::WorkspaceDelete,
        Operation::WorkspaceUpdate,
    ];

    /// Its name in records and filters (`force-unlock`).
    pub fn name(self) -> &'static str {
        match self {
            Operation::Write => "write",
            Operation::Delete => "delete",
            Operation::Lock => "lock",
            Operation::LockTakeover => "lock-takeover",
            Operation::Unlock => "unlock",
            Operation::ForceUnlock => "force-unlock",
            Operation::Restore => "restore",
            Operation::Reseal => "reseal",
            Operation::WorkspaceCreate => "workspace-create",
            Operation::WorkspaceDelete => "workspace-delete",
            Operation::WorkspaceUpdate => "workspace-update",
        }
    }

    /// The operation named `name`.
    pub fn parse(name: &str) -> Option<Operation> {
        Operation::ALL.into_iter().find(|o| o.name() == name)
    }
}

/// A state's place in its history: what the stale-write guard compares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateVersion {
    /// The state's lineage, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<String>,
    /// Its serial.
    pub serial: u64,
}

impl StateVersion {
    /// From the `(lineage, serial)` pair the guard reads.
    pub fn of((lineage, serial): (String, u64)) -> StateVersion {
        StateVersion {
            lineage: Some(lineage),
            serial,
        }
    }
}

/// One audit record, a line of JSON in the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// When the change ended, RFC 3339 in UTC to the microsecond (each
    /// backend's changes and its other records are kept apart: the time
    /// orders them again).
    pub time: String,
    /// The replica that served it (`[audit] replica`, default the host name).
    pub replica: String,
    /// Who asked: a user or token name, `oidc:<issuer name>:<sub>`, or
    /// `anyone` on a server without users.
    pub caller: String,
    /// An OIDC caller's claims worth keeping (repository, ref, actor…).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub claims: BTreeMap<String, String>,
    /// The backend.
    pub backend: String,
    /// The workspace.
    pub workspace: String,
    /// What was done or tried.
    pub operation: Operation,
    /// The stored state before, when the change read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<StateVersion>,
    /// The state the change wrote (or tried to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<StateVersion>,
    /// The first 16 hex digits of the SHA-256 of the lock ID involved
    /// (never the ID: whoever knows it can unlock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock: Option<String>,
    /// Who held the lock that was released, taken over or in the way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// The HTTP status answered.
    pub status: u16,
    /// `ok`, `unchanged` (a retried write already stored), or why not.
    pub result: String,
}

/// The most characters a record keeps of a caller's or holder's name.
const MAX_NAME_CHARS: usize = 200;
/// The most characters a record keeps of a reason.
const MAX_RESULT_CHARS: usize = 300;
/// The most claims a record keeps, and characters of each name and value.
const MAX_CLAIMS: usize = 16;
const MAX_CLAIM_CHARS: usize = 200;

fn cut(text: &mut String, max: usize) {
    if let Some((at, _)) = text.char_indices().nth(max) {
        text.truncate(at);
        text.push('…');
    }
}

impl Record {
    /// The record with every free-text field cut to its bound (a lock
    /// holder's name, a guest's error, a claim come from others), so one
    /// record stays a few KiB whatever it quotes.
    pub fn bounded(mut self) -> Record {
        cut(&mut self.caller, MAX_NAME_CHARS);
        if let Some(holder) = &mut self.holder {
            cut(holder, MAX_NAME_CHARS);
        }
        cut(&mut self.result, MAX_RESULT_CHARS);
        self.claims = std::mem::take(&mut self.claims)
            .into_iter()
            .take(MAX_CLAIMS)
            .map(|(mut name, mut value)| {
                cut(&mut name, 64);
                cut(&mut value, MAX_CLAIM_CHARS);
                (name, value)
            })
            .collect();
        for version in [&mut self.before, &mut self.after].into_iter().flatten() {
            if let Some(lineage) = &mut version.lineage {
                cut(lineage, MAX_NAME_CHARS);
            }
        }
        self
    }

    /// `before → after` serials, as far as known (empty: neither).
    pub fn serials(&self) -> String {
        match (&self.before, &self.after) {
            (Some(b), Some(a)) => format!("{} → {}", b.serial, a.serial),
            (None, Some(a)) => format!("→ {}", a.serial),
            (Some(b), None) => b.serial.to_string(),
            (None, None) => String::new(),
        }
    }
}

/// The digest of a lock ID a record keeps.
pub fn lock_digest(id: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(id.as_bytes())[..8])
}

/// The time now, as records write it: RFC 3339 in UTC with exactly six
/// decimals, so records' times are all as long and sort as text, and a
/// client's lock, write and unlock, kept in two sequences, sort back into
/// the order they happened in.
pub fn now_text() -> String {
    static FORMAT: std::sync::OnceLock<Vec<time::format_description::BorrowedFormatItem<'static>>> =
        std::sync::OnceLock::new();
    let format = FORMAT.get_or_init(|| {
        time::format_description::parse_borrowed::<2>(
            "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z",
        )
        .expect("a valid format")
    });
    time::OffsetDateTime::now_utc()
        .format(format)
        .unwrap_or_default()
}

/// What a change reports to the trail besides who, where and its answer.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// The stored state before.
    pub before: Option<StateVersion>,
    /// The state written or tried.
    pub after: Option<StateVersion>,
    /// The lock ID involved (digested when recorded).
    pub lock_id: Option<String>,
    /// Who held the lock released, taken over or in the way.
    pub holder: Option<String>,
    /// A retried write found its state already stored.
    pub unchanged: bool,
    /// Said after the result (`ok; …`).
    pub note: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_round_trip_by_name() {
        for op in Operation::ALL {
            assert_eq!(Operation::parse(op.name()), Some(op));
            let json = serde_json::to_string(&op).unwrap();
            assert_eq!(json, format!("\"{}\"", op.name()));
        }
        assert_eq!(Operation::parse("drop-table"), None);
    }

    #[test]
    fn times_have_six_decimals_and_parse_back() {
        let now = now_text();
        assert_eq!(now.len(), "2026-11-25T17:55:56.940123Z".len(), "{now}");
        assert!(writers::unix_ms(&now).is_some(), "{now}");
    }

    #[test]
    fn a_lock_digest_hides_the_id() {
        let digest = lock_digest("7a1c6e5e-0000-4000-8000-000000000001");
        assert_eq!(digest.len(), 16);
        assert!(!digest.contains("7a1c6e5e"));
        assert_eq!(digest, lock_digest("7a1c6e5e-0000-4000-8000-000000000001"));
    }
}
