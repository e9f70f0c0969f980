//! What one backend's guest calls share. Below both the backend
//! ([`super::guest`]) and its instances ([`super::instance`]), so their
//! imports go one way: guest → instance → shared.

use super::limits::Budget;
use super::quota::DirQuota;
use super::sandbox::Sandbox;
use super::turns::Turns;
use super::versions::{Guest, GuestPre};
use crate::config::Limits;
use crate::metrics::Metrics;
use crate::policy::OutboundPolicy;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::Semaphore;
use wasmtime::{Engine, Store};

/// An instance and its store: made ahead of a call (no call has run in
/// it yet), or kept from its request's last call.
pub(super) type Prepared = (Store<Sandbox>, Guest);

/// Everything one backend's guest calls share.
pub(super) struct Shared {
    pub metrics: Arc<Metrics>,
    pub name: Arc<str>,
    pub pre: GuestPre,
    pub engine: Engine,
    /// Every guest call's task, so the server can wait for them when it stops.
    pub tasks: tokio_util::task::TaskTracker,
    pub instances: Arc<Semaphore>,
    /// This backend's own share of the slots: a flood of requests to one
    /// backend queues here, leaving slots for the others.
    pub own_instances: Arc<Semaphore>,
    /// How many slots `own_instances` started with.
    pub instances_per_backend: usize,
    pub turns: Turns,
    /// Heavy host work for this backend (sealing, signing big bodies).
    pub host_work: crate::work::HostWork,
    pub limits: Limits,
    pub memory: Budget,
    pub server_memory: Budget,
    pub quota: Option<Arc<DirQuota>>,
    /// Most bytes the host lifts out of the guest in one call.
    pub max_lift_bytes: usize,
    /// The most linear memory one instance used since last taken (for
    /// `guest bench`).
    pub memory_peak: std::sync::atomic::AtomicU64,
    pub dir: Option<PathBuf>,
    pub config: Arc<[(String, String)]>,
    pub outbound: Arc<OutboundPolicy>,
    /// Signs the guest's AWS requests, if the backend is granted any.
    pub aws: Option<Arc<crate::capabilities::aws::AwsSigner>>,
    /// Signs the guest's Azure Storage requests, if granted.
    pub azure: Option<Arc<crate::capabilities::azure::AzureSigner>>,
    /// Adds a token to the guest's Google Cloud requests, if granted.
    pub gcp: Option<Arc<crate::capabilities::gcp::GcpAuth>>,
    /// The backend's database, if it has one.
    pub postgres: Option<Arc<crate::capabilities::postgres::PgStore>>,
    pub git: Option<crate::capabilities::git::GitAccess>,
    pub secrets: Arc<[(String, String)]>,
    pub sha256: String,
    /// The contract version the guest was built for.
    pub contract: crate::contract::ContractVersion,
    /// The instance made ready for its next call.
    pub ready: super::ready::Ready<Prepared>,
}
