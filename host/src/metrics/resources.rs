//! What guests hold of the server's shared resources, read at every scrape:
//! guest memory against the server's budget and each backend's share, disk
//! against each directory's quota; and how often a cap refused.

use super::BackendLabels;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A resource with a cap, as the runtime keeps it (bytes of memory or
/// disk, or cores).
pub trait Usage: Send + Sync {
    /// In use now (for cores: the most ever in use at once).
    fn used(&self) -> u64;
    /// The cap.
    fn limit(&self) -> u64;
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CapLabels {
    backend: String,
    cap: String,
}

/// Per backend: its memory share, its directory's quota if it has one, and
/// its turns on the cores.
struct BackendSources {
    memory: Arc<dyn Usage>,
    disk: Option<Arc<dyn Usage>>,
    cores: Arc<dyn Usage>,
    host_work: Arc<dyn Usage>,
}

pub(super) struct Resources {
    memory_refusals: Family<CapLabels, Counter>,
    disk_refusals: Family<BackendLabels, Counter>,
    memory_budget: Gauge,
    memory_used: Gauge,
    backend_memory_budget: Family<BackendLabels, Gauge>,
    backend_memory_used: Family<BackendLabels, Gauge>,
    disk_quota: Family<BackendLabels, Gauge>,
    disk_used: Family<BackendLabels, Gauge>,
    cores: Family<BackendLabels, Gauge>,
    cores_peak: Family<BackendLabels, Gauge>,
    host_work_peak: Family<BackendLabels, Gauge>,
    ready: Gauge,
    ready_limit: Gauge,
    ready_calls: Family<BackendLabels, Counter>,
    server: Mutex<Option<Arc<dyn Usage>>>,
    ready_slots: Mutex<Option<Arc<dyn Usage>>>,
    backends: Mutex<BTreeMap<String, BackendSources>>,
}

fn bytes(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Resources {
    pub(super) fn new(registry: &mut Registry) -> Self {
        let r = Resources {
            memory_refusals: Family::default(),
            disk_refusals: Family::default(),
            memory_budget: Gauge::default(),
            memory_used: Gauge::default(),
            backend_memory_budget: Family::default(),
            backend_memory_used: Family::default(),
            disk_quota: Family::default(),
            disk_used: Family::default(),
            cores: Family::default(),
            cores_peak: Family::default(),
            host_work_peak: Family::default(),
            ready: Gauge::default(),
            ready_limit: Gauge::default(),
            ready_calls: Family::default(),
            server: Mutex::new(None),
            ready_slots: Mutex::new(None),
            backends: Mutex::new(BTreeMap::new()),
        };
        registry.register(
            "guest_memory_budget_bytes",
            "Linear memory all guest instances together may hold (max_guest_memory_mib, less what the instance pool keeps resident)",
            r.memory_budget.clone(),
        );
        registry.register(
            "guest_memory_used_bytes",
            "Linear memory live guest instances hold now",
            r.memory_used.clone(),
        );
        registry.register(
            "backend_memory_budget_bytes",
            "A backend's share of the guest memory budget (memory_budget_mib)",
            r.backend_memory_budget.clone(),
        );
        registry.register(
            "backend_memory_used_bytes",
            "Linear memory a backend's live instances hold now",
            r.backend_memory_used.clone(),
        );
        registry.register(
            "guest_memory_refusals",
            "Guest memory growths refused because a budget was in use (cap: backend or server)",
            r.memory_refusals.clone(),
        );
        registry.register(
            "disk_quota_bytes",
            "A backend directory's disk quota (disk_quota_mib)",
            r.disk_quota.clone(),
        );
        registry.register(
            "disk_used_bytes",
            "What a backend's directory holds, as its quota counts it",
            r.disk_used.clone(),
        );
        registry.register(
            "backend_cores",
            "Instances of a backend that may run on the guest threads at once (max_cores)",
            r.cores.clone(),
        );
        registry.register(
            "backend_cores_peak",
            "The most instances of a backend that ran on the guest threads at once",
            r.cores_peak.clone(),
        );
        registry.register(
            "backend_host_work_peak",
            "The most pieces of heavy host work (sealing, opening, parsing or signing a big state) of a backend run at once; at most backend_cores",
            r.host_work_peak.clone(),
        );
        registry.register(
            "guest_ready_instances",
            "Guest instances made ahead for the next calls of backends in use, ready now",
            r.ready.clone(),
        );
        registry.register(
            "guest_ready_instances_limit",
            "The most guest instances the server keeps made ahead at once (an eighth of max_instances)",
            r.ready_limit.clone(),
        );
        registry.register(
            "guest_calls_on_ready_instance",
            "Guest calls that found their instance made ahead, off the request's path",
            r.ready_calls.clone(),
        );
        registry.register(
            "disk_quota_refusals",
            "Requests that stopped at their directory's disk quota",
            r.disk_refusals.clone(),
        );
        r
    }

    pub(super) fn set_server(&self, budget: Arc<dyn Usage>) {
        *lock(&self.server) = Some(budget);
    }

    pub(super) fn set_ready_slots(&self, slots: Arc<dyn Usage>) {
        *lock(&self.ready_slots) = Some(slots);
    }

    pub(super) fn called_on_ready(&self, backend: String) {
        self.ready_calls
            .get_or_create(&BackendLabels { backend })
            .inc();
    }

    pub(super) fn set_backend(
        &self,
        backend: String,
        memory: Arc<dyn Usage>,
        disk: Option<Arc<dyn Usage>>,
        cores: Arc<dyn Usage>,
        host_work: Arc<dyn Usage>,
    ) {
        lock(&self.backends).insert(
            backend,
            BackendSources {
                memory,
                disk,
                cores,
                host_work,
            },
        );
    }

    pub(super) fn memory_refused(&self, backend: String, server: bool) {
        let cap = if server { "server" } else { "backend" }.to_string();
        self.memory_refusals
            .get_or_create(&CapLabels { backend, cap })
            .inc();
    }

    pub(super) fn disk_refused(&self, backend: String) {
        self.disk_refusals
            .get_or_create(&BackendLabels { backend })
            .inc();
    }

    /// Read every source into its gauges (before a scrape).
    pub(super) fn sample(&self) {
        if let Some(server) = &*lock(&self.server) {
            self.memory_budget.set(bytes(server.limit()));
            self.memory_used.set(bytes(server.used()));
        }
        if let Some(ready) = &*lock(&self.ready_slots) {
            self.ready.set(bytes(ready.used()));
            self.ready_limit.set(bytes(ready.limit()));
        }
        for (name, sources) in lock(&self.backends).iter() {
            let BackendSources {
                memory,
                disk,
                cores,
                host_work,
            } = sources;
            let labels = BackendLabels {
                backend: name.clone(),
            };
            self.backend_memory_budget
                .get_or_create(&labels)
                .set(bytes(memory.limit()));
            self.backend_memory_used
                .get_or_create(&labels)
                .set(bytes(memory.used()));
            self.cores.get_or_create(&labels).set(bytes(cores.limit()));
            self.cores_peak
                .get_or_create(&labels)
                .set(bytes(cores.used()));
            self.host_work_peak
                .get_or_create(&labels)
                .set(bytes(host_work.used()));
            if let Some(disk) = disk {
                self.disk_quota
                    .get_or_create(&labels)
                    .set(bytes(disk.limit()));
                self.disk_used
                    .get_or_create(&labels)
                    .set(bytes(disk.used()));
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
