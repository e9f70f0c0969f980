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
    let description = describe(config, &backend, &wasm, &guest, dir.as_deref());
    tracing::info!(
        backend = %backend.name,
        guest = %backend.guest,
        sha256 = guest.sha256(),
        dir = ?dir,
        "backend ready"
    );
    Ok(guest.described(description))
}

/// What the console shows of a loaded backend: its origin, its manifest's
/// asks beside the grants it was given (already narrowed to them).
fn describe(
    config: &Config,
    backend: &BackendConfig,
    wasm: &[u8],
    guest: &GuestBackend,
    dir: Option<&std::path::Path>,
) -> crate::backend::Description {
    let manifest = crate::marketplace::manifest::inspect(wasm)
        .ok()
        .and_then(|info| info.manifest);
    let signer = crate::marketplace::store::GuestStore::new(&config.data_dir)
        .list()
        .ok()
        .and_then(|installed| {
            installed
                .into_iter()
                .find(|i| i.sha256 == guest.sha256())
                .and_then(|i| i.signed_by)
        });
    let asked = manifest.as_ref().map_or_else(
        || vec!["no manifest: everything the operator grants".to_string()],
        |m| {
            let c = &m.capabilities;
            let mut asked = Vec::new();
            if c.directory {
                asked.push("directory".to_string());
            }
            asked.extend(c.http.iter().map(|o| format!("http {o}")));
            asked.extend(c.aws_sign.iter().map(|o| format!("aws_sign {o}")));
            if c.git {
                asked.push("git".to_string());
            }
            asked.extend(c.secrets.iter().map(|s| format!("secret {s}")));
            asked
        },
    );
    let mut granted = Vec::new();
    if let Some(dir) = dir {
        granted.push(format!("directory {}", dir.display()));
    }
    granted.extend(backend.allow_http.iter().map(|o| format!("http {o}")));
    if let Some(aws) = &backend.aws {
        granted.extend(aws.origins.iter().map(|o| format!("aws_sign {o}")));
    }
    // A URL may carry credentials (`https://user:token@…`): never shown.
    granted.extend(
        backend
            .allow_git
            .iter()
            .map(|g| format!("git {}", crate::capabilities::git::redact(&g.url))),
    );
    granted.extend(
        backend
            .secrets
            .iter()
            .map(|(name, _)| format!("secret {name}")),
    );
    crate::backend::Description {
        guest: backend.guest.to_string(),
        manifest: manifest.map(|m| format!("{} {}", m.name, m.version)),
        contract: guest.contract().to_string(),
        sha256: guest.sha256().to_string(),
        signer,
        asked,
        granted,
        limits: Vec::new(),
    }
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
