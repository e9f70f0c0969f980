//! How a backend comes to life, in one pipeline that `serve`, hot reload
//! and `wasmstate guest test` all run:
//!
//! 1. **resolve** the guest's bytes: embedded, a file, or an installed pin
//!    ([`source`]);
//! 2. **verify** them: an installed guest's digest against its pin and its
//!    signature against the trusted keys ([`source`]), the WIT contract
//!    version of every guest ([`crate::contract`], checked by the runtime
//!    before linking);
//! 3. **narrow** the operator's grants to what the guest's manifest asks
//!    for, refusing a guest that asks for more ([`narrow`]);
//! 4. **compile** (or map from the cache), **link** against the
//!    capabilities granted, and let the guest **validate** its config
//!    ([`crate::runtime::Runtime::load_backend`]).
//!
//! The config (plain, validated data) comes in; a ready [`GuestBackend`]
//! goes out. Nothing here serves requests.

mod narrow;
mod source;

pub use source::resolve;

use crate::config::{BackendConfig, Config};
use crate::runtime::{GuestBackend, Runtime};
use std::collections::BTreeMap;

/// What happens to a guest whose manifest asks for more than its backend
/// grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ungranted {
    /// It does not start; the error lists what to grant (`serve`, reload).
    Refuse,
    /// It starts with what was granted and meets the host's refusal where
    /// it uses the rest (`guest test`: an author sees which call needs it).
    Withhold,
}

/// Load one backend's guest through every stage.
pub async fn load(
    config: &Config,
    backend: &BackendConfig,
    runtime: &Runtime,
    ungranted: Ungranted,
) -> anyhow::Result<GuestBackend> {
    let wasm = source::resolve(&backend.guest, config)?;
    let (backend, dir) = narrow::to_manifest(config, backend, &wasm, ungranted)?;
    let guest = runtime.load_backend(&backend, &wasm, dir.clone()).await?;
    tracing::info!(
        backend = %backend.name,
        guest = %backend.guest,
        sha256 = guest.sha256(),
        dir = ?dir,
        "backend ready"
    );
    Ok(guest)
}

/// Load every configured backend; the first that fails stops the start.
pub async fn load_all(
    config: &Config,
    runtime: &Runtime,
) -> anyhow::Result<BTreeMap<String, GuestBackend>> {
    let mut backends = BTreeMap::new();
    for backend in &config.backends {
        let guest = load(config, backend, runtime, Ungranted::Refuse).await?;
        backends.insert(backend.name.clone(), guest);
    }
    Ok(backends)
}
