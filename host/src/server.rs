//! `wasmstate serve`: load every backend's guest, bind, print the Terraform
//! snippet, serve until SIGTERM or Ctrl-C (letting in-flight requests finish).

use crate::auth::Authenticator;
use crate::config::Config;
use crate::guests;
use crate::metrics::Metrics;
use crate::protocol::{self, App};
use crate::runtime::{GuestBackend, Runtime};
use crate::store::Store;
use crate::store::history::History;
use anyhow::Context;
use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

/// Compile, link and validate every configured backend's guest.
pub async fn load_backends(
    config: &Config,
    runtime: &Runtime,
) -> anyhow::Result<BTreeMap<String, GuestBackend>> {
    let mut backends = BTreeMap::new();
    for backend in &config.backends {
        let wasm = guests::load(&backend.guest, config)?;
        let (backend, dir) = narrow_to_manifest(config, backend, &wasm)?;
        let guest = runtime.load_backend(&backend, &wasm, dir.clone()).await?;
        tracing::info!(
            backend = %backend.name,
            guest = %backend.guest,
            sha256 = guest.sha256(),
            dir = ?dir,
            "backend ready"
        );
        backends.insert(backend.name.clone(), guest);
    }
    Ok(backends)
}

/// A guest that carries a manifest gets only what it asks for and the
/// operator granted; one that asks for more does not start. Guests without
/// a manifest (embedded, or a local file) get the operator's grants as
/// written; installed guests always carry one.
fn narrow_to_manifest(
    config: &Config,
    backend: &crate::config::BackendConfig,
    wasm: &[u8],
) -> anyhow::Result<(crate::config::BackendConfig, Option<std::path::PathBuf>)> {
    use crate::marketplace::{grants, manifest};
    let dir = config.granted_dir(backend);
    let info =
        manifest::inspect(wasm).map_err(|e| anyhow::anyhow!("backend {:?}: {e}", backend.name))?;
    let Some(manifest) = info.manifest else {
        anyhow::ensure!(
            !matches!(backend.guest, crate::config::GuestSource::Installed { .. }),
            "backend {:?}: installed guest {} carries no manifest",
            backend.name,
            backend.guest
        );
        return Ok((backend.clone(), dir));
    };
    let narrowed = grants::intersect(&manifest.capabilities, backend, dir.is_some()).map_err(|missing| {
        anyhow::anyhow!(
            "backend {:?}: guest {} {} asks for capabilities the operator has not granted; add to [backends.{}]:\n{}",
            backend.name,
            manifest.name,
            manifest.version,
            backend.name,
            missing
                .lines()
                .map(|l| format!("  {l}"))
                .collect::<Vec<_>>()
                .join("\n")
        )
    })?;
    let dir = if manifest.capabilities.directory {
        dir
    } else {
        None
    };
    Ok((narrowed, dir))
}

/// Run the server described by `config` until a shutdown signal.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let auth = Arc::new(Authenticator::new(
        config.users.clone(),
        config.tokens.clone(),
    ));
    let client_certs = config.tls.as_ref().is_some_and(|t| t.client_ca.is_some());
    if !config.listen.ip().is_loopback() && !auth.enabled() && !client_certs {
        anyhow::bail!(
            "refusing to listen on {} without authentication: anyone who can reach it could read \
             and overwrite state. Add [[users]] or [[tokens]] to the config file, require client \
             certificates with [tls] client_ca, or listen on 127.0.0.1",
            config.listen
        );
    }
    let tls = config
        .tls
        .as_ref()
        .map(crate::tls::server_config)
        .transpose()?;
    let metrics = Arc::new(Metrics::new(config.backends.iter().map(|b| b.name.clone())));
    let runtime = Runtime::new(&config, metrics.clone())?;
    let backends = load_backends(&config, &runtime).await?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener.local_addr()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    print_banner(scheme, addr, &backends);
    let backends = backends
        .into_iter()
        .map(|(name, guest)| {
            let backend = config
                .backends
                .iter()
                .find(|b| b.name == name)
                .expect("every loaded backend is configured");
            let history = (backend.history > 0).then(|| {
                History::new(config.data_dir.join("history").join(&name), backend.history)
            });
            let store = Store::new(guest, backend.encryption_keys.clone(), history);
            (name, store)
        })
        .collect();
    let app = protocol::router(App {
        backends,
        max_body_bytes: config.max_body_bytes,
        metrics,
        auth,
        allow_force_push: config
            .backends
            .iter()
            .filter(|b| b.allow_force_push)
            .map(|b| b.name.clone())
            .collect(),
    });
    match tls {
        Some(tls) => {
            axum::serve(crate::tls::TlsListener::new(listener, tls)?, app)
                .with_graceful_shutdown(shutdown_signal())
                .await?
        }
        None => {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown_signal())
                .await?
        }
    }
    drop(runtime);
    tracing::info!("stopped");
    Ok(())
}

/// What an operator needs to point Terraform here. The first line is stable
/// (`wasmstate listening on http[s]://ADDR`): scripts and tests read it.
fn print_banner(scheme: &str, addr: SocketAddr, backends: &BTreeMap<String, GuestBackend>) {
    let name = backends
        .keys()
        .find(|n| *n == "default")
        .or_else(|| backends.keys().next())
        .map(String::as_str)
        .unwrap_or("default");
    let url = format!(
        "{scheme}://{addr}/states/{name}/{}",
        protocol::DEFAULT_WORKSPACE
    );
    let names: Vec<&str> = backends.keys().map(String::as_str).collect();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "wasmstate listening on {scheme}://{addr}\n\
         backends: {}\n\n\
         Paste into your Terraform configuration (change the last path segment to pick another state):\n\n\
         terraform {{\n  backend \"http\" {{\n    address        = \"{url}\"\n    lock_address   = \"{url}\"\n    unlock_address = \"{url}\"\n  }}\n}}\n",
        names.join(", ")
    );
    let _ = out.flush();
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutting down: finishing in-flight requests");
}
