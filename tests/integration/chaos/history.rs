//! What the clients did and what they were told: one [`Event`] per
//! operation, with its real-time interval, so the checker can reason about
//! which operations could have seen which.

use std::fmt;
use std::sync::Mutex;
use std::time::Instant;

/// One operation a client invoked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// LOCK with this lock id.
    Lock(String),
    /// UNLOCK with this lock id.
    Unlock(String),
    /// UNLOCK without a body (Terraform's force-unlock).
    ForceUnlock,
    /// GET of the state.
    Get,
    /// POST of a whole state.
    Post(Written),
    /// A POST whose body the client stopped sending half-way, then closed
    /// the connection: its state must never be stored.
    PartialPost(Written),
    /// DELETE /workspaces/{backend}/{workspace}.
    DeleteWorkspace,
    /// An administrator's DELETE of the state (`?ID=` the lock it holds,
    /// if any): the state goes, the lock stays.
    DeleteState(Option<String>),
    /// PUT /workspaces/{backend}/{workspace} (`wasmstate workspace create`).
    CreateWorkspace,
    /// A native Terraform client's lock (on host [`NATIVE`]) with this
    /// id; `true` when a force-unlock through wasmstate releases it (an S3
    /// lock file: deleted), `false` when only its holder can (a pg advisory
    /// lock: its session's). Released by `Unlock` with the same id.
    NativeLock(String, bool),
    /// A host killed with `kill -9` (`true`) or reloaded with SIGHUP, in
    /// no workspace: when it happened, for the rules that allow for it.
    Fault(bool),
}

/// The host of an operation a native Terraform client ran on the storage
/// itself (its `backend "pg"` advisory lock, its S3 lock file), beside
/// wasmstate: its locks exclude wasmstate's clients as theirs do.
pub const NATIVE: usize = usize::MAX;

/// The workspace of events that belong to none (faults).
pub const NO_WORKSPACE: &str = "";

/// A state a client sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// Its lineage.
    pub lineage: String,
    /// Its serial.
    pub serial: u64,
    /// sha256 of its bytes, shortened.
    pub digest: String,
    /// The lock id sent with it (`?ID=`), if any.
    pub lock_id: Option<String>,
    /// What kind of body, for the report: "" (a plain format-4 state),
    /// "opaque" (OpenTofu-encrypted: only serial and lineage in clear),
    /// "v3" (a legacy format-3 state), "re-push" (a backup sent again).
    pub shape: &'static str,
}

/// A state a GET returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// Its lineage (empty when it had none).
    pub lineage: String,
    /// Its serial.
    pub serial: u64,
    /// sha256 of its bytes, shortened.
    pub digest: String,
    /// Nothing in it (format 4, no resources, no outputs): a state no
    /// client here writes, which a workspace created through the API may
    /// start with (Terraform's empty state).
    pub blank: bool,
}

/// What came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// An HTTP answer; for a GET that answered 200, the state it returned.
    Answered(u16, Option<Seen>),
    /// A 5xx answer, with the first line of what it said (a state the
    /// host refused to open says why).
    Failed(u16, String),
    /// No answer (timeout, connection dropped, host killed): it may or may
    /// not have taken effect.
    Unknown(String),
    /// 423, held by the lock a host takes for a write sent without one
    /// (`wasmstate-unlocked-write`): only a guest built before contract
    /// 0.3.0 needs it; with a conditional write no host takes it.
    HeldByHost,
}

impl Outcome {
    /// Answered with `status`.
    pub fn is(&self, status: u16) -> bool {
        matches!(self, Outcome::Answered(s, _) | Outcome::Failed(s, _) if *s == status)
            || (status == 423 && *self == Outcome::HeldByHost)
    }

    /// It may have taken effect: answered 200, or no answer at all. A 5xx
    /// counts too: the storage may have applied it before failing.
    pub fn may_have_applied(&self) -> bool {
        match self {
            Outcome::Answered(status, _) => *status == 200 || *status >= 500,
            Outcome::Failed(..) | Outcome::Unknown(_) => true,
            Outcome::HeldByHost => false,
        }
    }
}

/// One operation: who, where, what, when, and what came back.
#[derive(Debug, Clone)]
pub struct Event {
    /// Its index in the history.
    pub index: usize,
    /// The client that ran it.
    pub client: usize,
    /// The host it was sent to.
    pub host: usize,
    /// The workspace.
    pub workspace: String,
    /// What it did.
    pub op: Op,
    /// Microseconds since the run began, when it was sent…
    pub start: u64,
    /// …and when its answer (or failure) came.
    pub end: u64,
    /// The answer.
    pub outcome: Outcome,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match &self.op {
            Op::Lock(id) => format!("LOCK {id}"),
            Op::Unlock(id) => format!("UNLOCK {id}"),
            Op::ForceUnlock => "FORCE-UNLOCK".into(),
            Op::Get => "GET".into(),
            Op::Post(w) => format!(
                "POST {}#{} {}{}{}",
                w.lineage,
                w.serial,
                w.digest,
                w.lock_id
                    .as_ref()
                    .map(|id| format!(" ?ID={id}"))
                    .unwrap_or_default(),
                if w.shape.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", w.shape)
                }
            ),
            Op::PartialPost(w) => format!("PARTIAL POST {}#{} {}", w.lineage, w.serial, w.digest),
            Op::DeleteWorkspace => "DELETE WORKSPACE".into(),
            Op::DeleteState(id) => format!(
                "DELETE STATE{}",
                id.as_ref()
                    .map(|id| format!(" ?ID={id}"))
                    .unwrap_or_default()
            ),
            Op::CreateWorkspace => "CREATE WORKSPACE".into(),
            Op::NativeLock(id, _) => format!("LOCK {id}"),
            Op::Fault(true) => "kill -9, restarted".into(),
            Op::Fault(false) => "SIGHUP".into(),
        };
        let outcome = match &self.outcome {
            Outcome::Answered(status, Some(seen)) => {
                format!("{status} {}#{} {}", seen.lineage, seen.serial, seen.digest)
            }
            Outcome::Answered(status, None) => status.to_string(),
            Outcome::Failed(status, said) => format!("{status} {said}"),
            Outcome::Unknown(why) => format!("unknown ({why})"),
            Outcome::HeldByHost => "423 (held by a host's lock for an unlocked write)".into(),
        };
        let host = match self.host {
            NATIVE => "native Terraform".to_string(),
            host => format!("host {host}"),
        };
        write!(
            f,
            "#{:<5} [{:>9.3} s – {:>9.3} s] client {} → {host} {}: {op} ⇒ {outcome}",
            self.index,
            self.start as f64 / 1e6,
            self.end as f64 / 1e6,
            self.client,
            self.workspace,
        )
    }
}

/// The history being recorded, shared by the clients.
pub struct Recorder {
    began: Instant,
    events: Mutex<Vec<Event>>,
    /// How the races of two unlocked writers from one serial ended.
    pub races: Mutex<Races>,
}

/// How the races of two unlocked writers from one serial, through two
/// hosts at once, ended ([`super::clients::Client`]'s `race`): how many
/// ended each way, by the two answers (`200+409`, `423+423`, …).
#[derive(Debug, Default, Clone)]
pub struct Races(pub std::collections::BTreeMap<String, usize>);

impl Races {
    /// Count one race that ended with `outcomes`.
    pub fn tally(&mut self, outcomes: &[Outcome]) {
        let mut answers: Vec<String> = outcomes
            .iter()
            .map(|o| match o {
                Outcome::Answered(status, _) | Outcome::Failed(status, _) => status.to_string(),
                Outcome::HeldByHost => "423".into(),
                Outcome::Unknown(_) => "none".into(),
            })
            .collect();
        answers.sort();
        *self.0.entry(answers.join("+")).or_default() += 1;
    }

    /// Races answered one 200 and one 409: what every guest must answer
    /// when both are answered and nothing else wrote in between.
    pub fn one_each(&self) -> usize {
        self.0.get("200+409").copied().unwrap_or(0)
    }
}

impl fmt::Display for Races {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let run: usize = self.0.values().sum();
        let ends: Vec<String> = self.0.iter().map(|(k, n)| format!("{n} × {k}")).collect();
        write!(
            f,
            "unlocked races from one serial through two hosts: {run} ({})",
            ends.join(", ")
        )
    }
}

impl Recorder {
    /// A history that begins now.
    pub fn new() -> Recorder {
        Recorder {
            began: Instant::now(),
            events: Mutex::new(Vec::new()),
            races: Mutex::default(),
        }
    }

    /// Microseconds since the run began.
    pub fn now(&self) -> u64 {
        self.began.elapsed().as_micros() as u64
    }

    /// Run `op` and record it, with the time around it.
    pub fn record(
        &self,
        client: usize,
        host: usize,
        workspace: &str,
        op: Op,
        run: impl FnOnce() -> Outcome,
    ) -> Outcome {
        let start = self.now();
        let outcome = run();
        let end = self.now();
        let mut events = self.events.lock().unwrap();
        let index = events.len();
        events.push(Event {
            index,
            client,
            host,
            workspace: workspace.to_string(),
            op,
            start,
            end,
            outcome: outcome.clone(),
        });
        outcome
    }

    /// Every event, in the order they were recorded.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }
}
