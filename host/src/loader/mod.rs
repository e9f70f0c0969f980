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
//!    ([`crate::runtime::Runtime::load_backend`]);
//! 5. refuse a guest without a manifest that has nowhere to keep states
//!    as configured ([`usable`]).
//!
//! The config (plain, validated data) comes in; a ready [`GuestBackend`]
//! goes out. Nothing here serves requests.

mod narrow;
mod source;
mod usable;

pub use source::resolve;

use crate::config::{BackendConfig, Config};
use crate::runtime::{GuestBackend, Runtime};
use std::collections::BTreeMap;
use std::sync::Arc;

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

/// Guests already resolved, verified and inspected in one load pass (a
/// start, a reload), by source: thousands of backends of one guest read,
/// hash and parse it once, not once each. A pass is short and every start
/// or reload makes a new one, so an installed guest is still verified on
/// every load. It keeps each guest's digest and manifest, not its bytes:
/// once the runtime has linked a guest, its other backends need none.
#[derive(Default)]
pub struct Pass {
    guests: std::collections::HashMap<String, Known>,
    /// The installed guests' signers, read from the store once.
    signers: Option<Vec<(String, Option<String>)>>,
}

/// One guest's digest and manifest.
#[derive(Clone)]
struct Known {
    sha256: String,
    info: Arc<crate::marketplace::manifest::ComponentInfo>,
}

impl Pass {
    /// The guest of `backend`: its bytes (empty when `runtime` has it
    /// linked already), digest and manifest.
    fn resolve(
        &mut self,
        config: &Config,
        backend: &BackendConfig,
        runtime: &Runtime,
    ) -> anyhow::Result<(std::borrow::Cow<'static, [u8]>, Known)> {
        // Config paths are TOML strings, so this key is the source exactly.
        let key = backend.guest.to_string();
        if let Some(known) = self.guests.get(&key)
            && runtime.has_linked(&known.sha256)
        {
            return Ok((std::borrow::Cow::Borrowed(&[]), known.clone()));
        }
        let wasm = source::resolve(&backend.guest, config)?;
        let info = crate::marketplace::manifest::inspect(&wasm)
            .map_err(|e| anyhow::anyhow!("backend {:?}: {e}", backend.name))?;
        let known = Known {
            sha256: crate::digest::sha256_hex(&wasm),
            info: Arc::new(info),
        };
        self.guests.insert(key, known.clone());
        Ok((wasm, known))
    }

    /// Who signed the installed guest `sha256`, if it is installed signed.
    fn signer(&mut self, config: &Config, sha256: &str) -> Option<String> {
        let installed = self.signers.get_or_insert_with(|| {
            crate::marketplace::store::GuestStore::new(&config.data_dir)
                .list()
                .map(|all| all.into_iter().map(|i| (i.sha256, i.signed_by)).collect())
                .unwrap_or_default()
        });
        installed
            .iter()
            .find(|(sha, _)| sha == sha256)
            .and_then(|(_, signer)| signer.clone())
    }
}

/// Load one backend's guest through every stage.
pub async fn load(
    config: &Config,
    backend: &BackendConfig,
    runtime: &Runtime,
    ungranted: Ungranted,
) -> anyhow::Result<GuestBackend> {
    load_in(&mut Pass::default(), config, backend, runtime, ungranted).await
}

/// [`load`], sharing what `pass` already resolved.
pub async fn load_in(
    pass: &mut Pass,
    config: &Config,
    backend: &BackendConfig,
    runtime: &Runtime,
    ungranted: Ungranted,
) -> anyhow::Result<GuestBackend> {
    let (wasm, guest) = pass.resolve(config, backend, runtime)?;
    let (backend, dir) = narrow::to_manifest(config, backend, &guest.info, ungranted)?;
    let loaded = runtime
        .load_backend(&backend, &wasm, &guest.sha256, dir.clone())
        .await?;
    if ungranted == Ungranted::Refuse {
        usable::check(&backend, &guest.info, &loaded, dir.as_deref()).await?;
    }
    let signer = pass.signer(config, &guest.sha256);
    let description = describe(&backend, &guest.info, signer, &loaded, dir.as_deref());
    tracing::info!(
        backend = %backend.name,
        guest = %backend.guest,
        sha256 = loaded.sha256(),
        dir = ?dir,
        "backend ready"
    );
    Ok(loaded.described(description))
}

/// What the console shows of a loaded backend: its origin, its manifest's
/// asks beside the grants it was given (already narrowed to them).
fn describe(
    backend: &BackendConfig,
    info: &crate::marketplace::manifest::ComponentInfo,
    signer: Option<String>,
    guest: &GuestBackend,
    dir: Option<&std::path::Path>,
) -> crate::backend::Description {
    let manifest = info.manifest.as_ref();
    let asked = manifest.map_or_else(
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
    let mut pass = Pass::default();
    for backend in &config.backends {
        let guest = load_in(&mut pass, config, backend, runtime, Ungranted::Refuse).await?;
        backends.insert(backend.name.clone(), guest);
    }
    Ok(backends)
}
