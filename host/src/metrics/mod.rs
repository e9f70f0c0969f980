//! Prometheus metrics, served at `GET /metrics`. The protocol layer records
//! requests and locks, the runtime records guest instantiation, execution
//! and faults; neither knows the other's types, both know this module.
//!
//! Labels are bounded: `backend` is a configured backend's name or `-`,
//! `method` one of the protocol's methods or `other`, so no request can
//! create new series at will.

mod keys;
mod resources;

pub use keys::KeyCalls;
pub use resources::Usage;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    backend: String,
    method: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    backend: String,
    method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabels {
    backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FaultLabels {
    backend: String,
    kind: String,
}

/// How a guest call was stopped.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// It trapped (panicked, or hit its memory limit).
    Trap,
    /// It ran past its deadline.
    Timeout,
    /// It tried to grow past its memory limit.
    OutOfMemory,
}

impl Fault {
    fn label(self) -> &'static str {
        match self {
            Fault::Trap => "trap",
            Fault::Timeout => "timeout",
            Fault::OutOfMemory => "out_of_memory",
        }
    }
}

const METHODS: &[&str] = &["GET", "POST", "PUT", "DELETE", "LOCK", "UNLOCK"];
/// A held lock as the metrics follow it: a digest of its ID, and since when.
type HeldLock = ([u8; 32], Instant);

/// Most locks the held-locks gauge follows at once.
const MAX_TRACKED_LOCKS: usize = 100_000;

fn latency() -> Histogram {
    // 100 µs … ~3.3 s
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

/// Every metric the server exports.
pub struct Metrics {
    registry: Registry,
    /// Ordered for the scrape; a set because every request looks its
    /// backend up (thousands of tenants).
    backends: std::collections::BTreeSet<String>,
    requests: Family<RequestLabels, Counter>,
    in_flight: Gauge,
    request_seconds: Family<MethodLabels, Histogram, fn() -> Histogram>,
    instantiate_seconds: Family<BackendLabels, Histogram, fn() -> Histogram>,
    call_seconds: Family<BackendLabels, Histogram, fn() -> Histogram>,
    faults: Family<FaultLabels, Counter>,
    lock_conflicts: Family<BackendLabels, Counter>,
    locks_held: Family<BackendLabels, Gauge>,
    oldest_lock_seconds: Family<BackendLabels, Gauge>,
    lock_held_seconds: Family<BackendLabels, Histogram, fn() -> Histogram>,
    /// Locks granted through this server, for the held gauge and duration.
    /// Keyed by backend and workspace (validated names); the holder kept
    /// as a hash of its lock ID, whatever the ID's length.
    held: Mutex<HashMap<(String, String), HeldLock>>,
    resources: resources::Resources,
    keys: keys::KeyServiceMetrics,
    auth_failures: Family<ThrottleLabels, Counter>,
    connections_open: Gauge,
    connections_refused: Family<ReasonLabels, Counter>,
    connection_timeouts: Family<PhaseLabels, Counter>,
    backend_up: Family<BackendLabels, Gauge>,
    reloads: Family<ResultLabels, Counter>,
    rollback_marks: Family<BackendLabels, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ThrottleLabels {
    throttled: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
}

impl Metrics {
    /// Metrics for a server with these backends.
    pub fn new(backends: impl IntoIterator<Item = String>) -> Self {
        let mut registry = Registry::with_prefix("wasmstate");
        let requests = Family::default();
        let in_flight = Gauge::default();
        let request_seconds: Family<_, _, fn() -> Histogram> =
            Family::new_with_constructor(latency);
        let instantiate_seconds: Family<_, _, fn() -> Histogram> =
            Family::new_with_constructor(latency);
        let call_seconds: Family<_, _, fn() -> Histogram> = Family::new_with_constructor(latency);
        let faults = Family::default();
        let lock_conflicts = Family::default();
        let locks_held = Family::default();
        let lock_held_seconds: Family<_, _, fn() -> Histogram> =
            Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.1, 2.0, 16)));
        registry.register("requests", "HTTP requests answered", requests.clone());
        registry.register(
            "requests_in_flight",
            "HTTP requests being served right now",
            in_flight.clone(),
        );
        registry.register(
            "request_seconds",
            "Time to answer a request",
            request_seconds.clone(),
        );
        registry.register(
            "guest_instantiate_seconds",
            "Time to create a guest instance for a request",
            instantiate_seconds.clone(),
        );
        registry.register(
            "guest_call_seconds",
            "Time a guest spent serving a call",
            call_seconds.clone(),
        );
        registry.register(
            "guest_faults",
            "Guest calls stopped by the sandbox",
            faults.clone(),
        );
        registry.register(
            "lock_conflicts",
            "LOCK requests refused because another holds the lock",
            lock_conflicts.clone(),
        );
        registry.register(
            "locks_held",
            "Locks granted through this server and not yet released",
            locks_held.clone(),
        );
        registry.register(
            "lock_held_seconds",
            "How long locks granted here were held",
            lock_held_seconds.clone(),
        );
        let oldest_lock_seconds = Family::default();
        registry.register(
            "oldest_lock_seconds",
            "Age of the oldest lock granted through this server and not yet released through it (0: none); with replicas, take the max across them",
            oldest_lock_seconds.clone(),
        );
        let resources = resources::Resources::new(&mut registry);
        let keys = keys::KeyServiceMetrics::new(&mut registry);
        let auth_failures = Family::default();
        registry.register(
            "auth_failures",
            "Sign-ins refused: wrong credentials (throttled=\"false\") or refused unchecked during a backoff (throttled=\"true\")",
            auth_failures.clone(),
        );
        let connections_open = Gauge::default();
        registry.register(
            "connections_open",
            "Client connections open now",
            connections_open.clone(),
        );
        let connections_refused = Family::default();
        registry.register(
            "connections_refused",
            "Connections refused past max_connections (reason=\"total\") or max_connections_per_address (\"address\")",
            connections_refused.clone(),
        );
        let connection_timeouts = Family::default();
        registry.register(
            "connection_timeouts",
            "Connections closed by a deadline (phase=\"header\", \"idle\" or \"write\"), or idle and closed to make room for a new one at a connection cap (\"room\")",
            connection_timeouts.clone(),
        );
        let backend_up = Family::default();
        registry.register(
            "backend_up",
            "1 while a backend serves, 0 while it is stopped (a reload that failed for it, or removed it)",
            backend_up.clone(),
        );
        let reloads = Family::default();
        registry.register(
            "reloads",
            "Config reloads (SIGHUP): result=\"ok\" (the file was read; backends may still have stopped) or \"failed\" (nothing changed)",
            reloads.clone(),
        );
        let rollback_marks = Family::default();
        registry.register(
            "rollback_marks",
            "Workspaces whose newest sealed state this server remembers, to refuse a rollback (at most 10000 per backend)",
            rollback_marks.clone(),
        );
        Metrics {
            rollback_marks,
            backend_up,
            reloads,
            auth_failures,
            connections_open,
            connections_refused,
            connection_timeouts,
            resources,
            keys,
            registry,
            backends: backends.into_iter().collect(),
            requests,
            in_flight,
            request_seconds,
            instantiate_seconds,
            call_seconds,
            faults,
            lock_conflicts,
            locks_held,
            oldest_lock_seconds,
            lock_held_seconds,
            held: Mutex::new(HashMap::new()),
        }
    }

    fn backend(&self, name: &str) -> String {
        if self.backends.contains(name) {
            name.to_string()
        } else {
            "-".to_string()
        }
    }

    /// A request started; the returned guard marks it finished when
    /// dropped (also when the client goes away mid-request).
    pub fn request_started(&self) -> InFlight {
        self.in_flight.inc();
        InFlight(self.in_flight.clone())
    }

    /// One answered request.
    pub fn request(&self, backend: &str, method: &str, status: u16, elapsed: Duration) {
        let backend = self.backend(backend);
        let method = if METHODS.contains(&method) {
            method
        } else {
            "other"
        }
        .to_string();
        self.requests
            .get_or_create(&RequestLabels {
                backend: backend.clone(),
                method: method.clone(),
                status,
            })
            .inc();
        self.request_seconds
            .get_or_create(&MethodLabels { backend, method })
            .observe(elapsed.as_secs_f64());
    }

    /// A guest instance was created.
    pub fn instantiated(&self, backend: &str, elapsed: Duration) {
        self.instantiate_seconds
            .get_or_create(&BackendLabels {
                backend: self.backend(backend),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// A guest call finished (however it ended).
    pub fn called(&self, backend: &str, elapsed: Duration) {
        self.call_seconds
            .get_or_create(&BackendLabels {
                backend: self.backend(backend),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// The sandbox stopped a guest.
    pub fn fault(&self, backend: &str, fault: Fault) {
        self.faults
            .get_or_create(&FaultLabels {
                backend: self.backend(backend),
                kind: fault.label().into(),
            })
            .inc();
    }

    /// The key service counters of `backend`'s sealer.
    pub fn key_calls(&self, backend: &str) -> KeyCalls {
        self.keys.for_backend(self.backend(backend))
    }

    /// The gauge of how many rollback marks `backend` keeps.
    pub fn rollback_marks(&self, backend: &str) -> Gauge {
        self.rollback_marks
            .get_or_create(&BackendLabels {
                backend: self.backend(backend),
            })
            .clone()
    }

    /// A LOCK was refused: someone else holds it.
    pub fn lock_conflict(&self, backend: &str) {
        self.lock_conflicts
            .get_or_create(&BackendLabels {
                backend: self.backend(backend),
            })
            .inc();
    }

    /// A LOCK under `id` succeeded (a retry by the holder counts once).
    pub fn lock_granted(&self, backend: &str, workspace: &str, id: &str) {
        use sha2::Digest;
        let id: [u8; 32] = sha2::Sha256::digest(id.as_bytes()).into();
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let key = (backend.to_string(), workspace.to_string());
        if held.get(&key).is_some_and(|(holder, _)| *holder == id) {
            return;
        }
        // Bounded: past this many held locks, new ones go uncounted.
        if held.len() >= MAX_TRACKED_LOCKS && !held.contains_key(&key) {
            return;
        }
        if held.insert(key, (id, Instant::now())).is_none() {
            self.locks_held
                .get_or_create(&BackendLabels {
                    backend: self.backend(backend),
                })
                .inc();
        }
    }

    /// Set each backend's oldest-lock gauge from the locks held now.
    fn sample_oldest_locks(&self) {
        let mut oldest: HashMap<String, u64> = HashMap::new();
        for ((backend, _), (_, since)) in self.held.lock().unwrap_or_else(|e| e.into_inner()).iter()
        {
            let age = oldest.entry(self.backend(backend)).or_default();
            *age = (*age).max(since.elapsed().as_secs());
        }
        for backend in &self.backends {
            let age = oldest.get(backend).copied().unwrap_or(0);
            self.oldest_lock_seconds
                .get_or_create(&BackendLabels {
                    backend: backend.clone(),
                })
                .set(age as i64);
        }
    }

    /// The lock of `workspace` was released (by its holder or by force).
    pub fn lock_released(&self, backend: &str, workspace: &str) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, since)) = held.remove(&(backend.to_string(), workspace.to_string())) {
            let labels = BackendLabels {
                backend: self.backend(backend),
            };
            self.locks_held.get_or_create(&labels).dec();
            self.lock_held_seconds
                .get_or_create(&labels)
                .observe(since.elapsed().as_secs_f64());
        }
    }

    /// Whether `backend` serves (after startup or a reload).
    pub fn backend_up(&self, backend: &str, up: bool) {
        self.backend_up
            .get_or_create(&BackendLabels {
                backend: self.backend(backend),
            })
            .set(i64::from(up));
    }

    /// A reload was attempted.
    pub fn reloaded(&self, ok: bool) {
        self.reloads
            .get_or_create(&ResultLabels {
                result: if ok { "ok" } else { "failed" }.to_string(),
            })
            .inc();
    }

    /// A sign-in was refused; `throttled` when it was refused unchecked
    /// during a backoff.
    pub fn auth_failed(&self, throttled: bool) {
        self.auth_failures
            .get_or_create(&ThrottleLabels {
                throttled: throttled.to_string(),
            })
            .inc();
    }

    /// The server-wide guest memory budget, read at every scrape.
    pub fn set_memory_budget(&self, budget: impl Usage + 'static) {
        self.resources.set_server(std::sync::Arc::new(budget));
    }

    /// The server's slots for instances made ahead, read at every scrape.
    pub fn set_ready_slots(&self, slots: impl Usage + 'static) {
        self.resources.set_ready_slots(std::sync::Arc::new(slots));
    }

    /// A guest call found its instance made ahead.
    pub fn called_on_ready(&self, backend: &str) {
        self.resources.called_on_ready(self.backend(backend));
    }

    /// A backend's memory share, disk quota, cores and host work, read at
    /// every scrape (a reloaded backend's replace its old ones).
    pub fn set_backend_limits(
        &self,
        backend: &str,
        memory: impl Usage + 'static,
        disk: Option<std::sync::Arc<dyn Usage>>,
        cores: impl Usage + 'static,
        host_work: impl Usage + 'static,
    ) {
        self.resources.set_backend(
            self.backend(backend),
            std::sync::Arc::new(memory),
            disk,
            std::sync::Arc::new(cores),
            std::sync::Arc::new(host_work),
        );
    }

    /// A guest's memory growth was refused because a budget (the server's,
    /// or the backend's share) was in use.
    pub fn memory_refused(&self, backend: &str, server: bool) {
        self.resources.memory_refused(self.backend(backend), server);
    }

    /// A request stopped at its directory's disk quota.
    pub fn disk_quota_refused(&self, backend: &str) {
        self.resources.disk_refused(self.backend(backend));
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        self.resources.sample();
        self.sample_oldest_locks();
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

impl crate::listen::ConnectionEvents for Metrics {
    fn open(&self, opened: bool) {
        if opened {
            self.connections_open.inc();
        } else {
            self.connections_open.dec();
        }
    }

    fn refused(&self, reason: &'static str) {
        self.connections_refused
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    fn timed_out(&self, phase: &'static str) {
        self.connection_timeouts
            .get_or_create(&PhaseLabels {
                phase: phase.to_string(),
            })
            .inc();
    }
}

/// A request being served; see [`Metrics::request_started`].
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests;
