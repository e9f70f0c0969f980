//! `wasmstate serve`: load every backend's guest, bind, print the Terraform
//! snippet, serve until SIGTERM or Ctrl-C (letting in-flight requests finish).

use crate::auth::Authenticator;
use crate::config::Config;
use crate::listen::NetworkLimits;
use crate::listen::timed_io::Clocks;
use crate::metrics::Metrics;
use crate::protocol::{self, App, OriginPolicy, SwitchValues, Switches};
use crate::reload::{ConfigSource, Swappable};
use crate::runtime::{GuestBackend, Runtime};
use crate::store::Store;
use crate::store::history::History;
use crate::store::rollback::RollbackMarks;
use anyhow::Context;
use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Each backend's rollback marks, made once and kept across reloads.
type Marks = Arc<BTreeMap<String, Arc<RollbackMarks>>>;

/// The host's layers around one backend's guest: encryption and history.
fn store_for(
    config: &Config,
    backend: &crate::config::BackendConfig,
    guest: GuestBackend,
    marks: &Marks,
    max_stored_bytes: usize,
    metrics: &Metrics,
) -> Store<GuestBackend> {
    let name = backend.name.as_str();
    let history = (backend.history > 0)
        .then(|| History::new(config.data_dir.join("history").join(name), backend.history));
    Store::new(
        guest,
        name,
        backend.encryption.as_ref(),
        history,
        marks
            .get(name)
            .cloned()
            .unwrap_or_else(|| Arc::new(RollbackMarks::counted_in(metrics.rollback_marks(name)))),
        max_stored_bytes,
    )
    .allowing_older_states(backend.allow_force_push)
    .counting_key_calls(metrics.key_calls(name))
}

/// The per-backend switches `config` sets: stale-write guards off, lock
/// takeovers on.
fn switch_values(config: &Config) -> SwitchValues {
    let backends = config.backends.iter();
    SwitchValues {
        force_push: backends
            .clone()
            .filter(|b| b.allow_force_push)
            .map(|b| b.name.clone())
            .collect(),
        lock_ttl: backends
            .filter_map(|b| Some((b.name.clone(), b.lock_ttl?)))
            .collect(),
    }
}

/// Run the server described by `config` until a shutdown signal. With
/// `source`, SIGHUP re-reads the config file and swaps the backends in.
pub async fn serve(config: Config, source: Option<ConfigSource>) -> anyhow::Result<()> {
    let issuers = config
        .oidc
        .iter()
        .cloned()
        .map(crate::auth::oidc::Issuer::new)
        .collect::<anyhow::Result<Vec<_>>>()?;
    let auth = Arc::new(
        Authenticator::new(config.users.clone(), config.tokens.clone()).with_oidc(issuers),
    );
    let client_certs = config.tls.as_ref().is_some_and(|t| t.client_ca.is_some());
    if !config.listen.ip().is_loopback() && !auth.enabled() && !client_certs {
        anyhow::bail!(
            "refusing to listen on {} without authentication: anyone who can reach it could read \
             and overwrite state. Add [[users]], [[tokens]] or [[oidc]] to the config file, require client \
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
    let backends = crate::loader::load_all(&config, &runtime).await?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener.local_addr()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    // Signals are taken before the banner: scripts (and tests) signal the
    // server once it says it listens, and a SIGHUP or SIGTERM that came
    // before its handler would kill the process outright.
    use tokio::signal::unix::{SignalKind, signal};
    let terminate = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let hangups = signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?;
    let marks: Marks = Arc::new(
        backends
            .keys()
            .map(|name| {
                let count = metrics.rollback_marks(name);
                (name.clone(), Arc::new(RollbackMarks::counted_in(count)))
            })
            .collect(),
    );
    let configured: std::collections::HashMap<&str, &crate::config::BackendConfig> = config
        .backends
        .iter()
        .map(|b| (b.name.as_str(), b))
        .collect();
    let backends: BTreeMap<String, Arc<Swappable<Store<GuestBackend>>>> = backends
        .into_iter()
        .map(|(name, guest)| {
            let max_stored = runtime.max_stored_bytes();
            let backend = configured[name.as_str()];
            let store = store_for(&config, backend, guest, &marks, max_stored, &metrics);
            (name, Arc::new(Swappable::new(store)))
        })
        .collect();
    let runtime = Arc::new(runtime);
    for name in backends.keys() {
        metrics.backend_up(name, true);
    }
    let switches = Arc::new(Switches::new(switch_values(&config)));
    let audit = Arc::new(
        crate::audit::AuditLog::open_serving(
            &config.data_dir,
            config.audit.clone(),
            backends.keys(),
        )
        .with_context(|| {
            format!(
                "cannot open the audit trail in {}",
                config.data_dir.join("audit").display()
            )
        })?,
    );
    if let Some(source) = source {
        tokio::spawn(reload_on_sighup(
            hangups,
            source,
            runtime.clone(),
            backends.clone(),
            metrics.clone(),
            switches.clone(),
            marks,
            restart_only_settings(&config),
        ));
    }
    let draining = Arc::new(AtomicBool::new(false));
    let network = &config.network;
    // On a wildcard address with no names configured, the server cannot
    // tell which host names are its own (it requires credentials there).
    let check_host = config.listen.ip().is_loopback()
        || !config.listen.ip().is_unspecified()
        || !network.server_names.is_empty();
    let app = Arc::new(App {
        backends,
        max_body_bytes: config.max_body_bytes,
        body_timeout: network.body_timeout,
        metrics: metrics.clone(),
        auth,
        switches,
        audit,
        gates: Default::default(),
        changes: Default::default(),
        origins: OriginPolicy::new(network.server_names.clone(), check_host),
        draining: draining.clone(),
        bodies: protocol::BodyBudget::new(
            network
                .max_buffered_bytes
                .unwrap_or_else(|| crate::config::default_max_buffered(config.max_body_bytes)),
            crate::config::buffered_reserve(config.max_body_bytes),
        ),
    });
    let console = crate::console::Options {
        secure_cookies: tls.is_some(),
        data_dir: config.data_dir.clone(),
    };
    let tfe = crate::tfe::Options {
        data_dir: Some(config.data_dir.clone()),
        secure: tls.is_some(),
    };
    let app_state = app.clone();
    let tfe = crate::tfe::routes(app.clone(), tfe);
    let more = crate::console::routes(app.clone(), console).merge(tfe.routes.clone());
    let app = tfe.around(protocol::router_with(app, more));
    let limits = NetworkLimits {
        clocks: Clocks {
            header: network.header_read_timeout,
            idle: network.keepalive_timeout,
            write: network.body_timeout,
        },
        max_connections: network.max_connections,
        max_connections_per_address: network.max_connections_per_address,
        shutdown_timeout: network.shutdown_timeout,
    };
    let signal = async {
        shutdown_signal(terminate).await;
        draining.store(true, Ordering::Release);
    };
    print_banner(
        scheme,
        addr,
        &network.server_names,
        app_state.backends.keys().map(String::as_str),
    );
    probe_histories(app_state.backends.values().cloned().collect());
    let changes = app_state.changes.clone();
    crate::listen::serve(listener, tls, app, limits, metrics, signal).await;
    // Changes whose client went away still finish (a lock taken for an
    // unlocked write is released); each guest call ends by its deadline.
    changes.close();
    let _ = tokio::time::timeout(runtime.longest_call() * 4, changes.wait()).await;
    // Guest calls already under way finish (a write completes or never
    // started); each ends by its own deadline.
    runtime.drain().await;
    // The records queued are written (and printed) before the process ends.
    let audit = app_state.audit.clone();
    let closed = tokio::task::spawn_blocking(move || audit.close());
    let _ = tokio::time::timeout(crate::audit::GIVE_UP, closed).await;
    tracing::info!("stopped");
    Ok(())
}

/// What an operator needs to point Terraform here. The first line is stable
/// (`wasmstate listening on http[s]://ADDR`): scripts and tests read it.
fn print_banner<'a>(
    scheme: &str,
    addr: SocketAddr,
    server_names: &[String],
    backends: impl Iterator<Item = &'a str>,
) {
    let names: Vec<&str> = backends.collect();
    let name = names
        .iter()
        .copied()
        .find(|n| *n == "default")
        .or_else(|| names.first().copied())
        .unwrap_or("default");
    let (authority, note) = client_authority(addr, server_names, &machine_name());
    let url = format!(
        "{scheme}://{authority}/states/{name}/{}",
        protocol::DEFAULT_WORKSPACE
    );
    let note = note.map(|n| format!("{n}\n\n")).unwrap_or_default();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "wasmstate listening on {scheme}://{addr}\n\
         backends: {}\n\n\
         {note}Paste into your Terraform configuration (change the last path segment to pick another state):\n\n\
         terraform {{\n  backend \"http\" {{\n    address        = \"{url}\"\n    lock_address   = \"{url}\"\n    unlock_address = \"{url}\"\n  }}\n}}\n",
        names.join(", ")
    );
    let _ = out.flush();
}

/// This machine's host name, if it has a usable one.
fn machine_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty() && n != "(none)" && n != "localhost")
}

/// `host:port` a client can put in its backend's address. A wildcard
/// listen (`0.0.0.0`, `[::]`) is no address a client can connect to, so
/// the banner names the server instead: the first `server_names` entry,
/// else `machine` (this host's name), else loopback; and, unless the name
/// is the operator's own, a line saying to replace it.
fn client_authority(
    addr: SocketAddr,
    server_names: &[String],
    machine: &Option<String>,
) -> (String, Option<String>) {
    if !addr.ip().is_unspecified() {
        return (addr.to_string(), None);
    }
    let port = addr.port();
    if let Some(name) = server_names.first() {
        return (format!("{name}:{port}"), None);
    }
    let (host, what) = match (machine, addr) {
        (Some(name), _) => (name.clone(), format!("this machine's name, {name}")),
        (None, SocketAddr::V4(_)) => ("127.0.0.1".to_string(), "127.0.0.1".to_string()),
        (None, SocketAddr::V6(_)) => ("[::1]".to_string(), "[::1]".to_string()),
    };
    let note = format!(
        "Listening on every address ({}): the addresses below use {what}; \
         replace it with a name or address your clients reach this server by \
         (or set [network] server_names).",
        addr.ip()
    );
    (format!("{host}:{port}"), Some(note))
}

/// Who may sign in, as the config says: a reload does not change it.
/// What a reload cannot change: who signs in, and the audit trail.
fn restart_only_settings(config: &Config) -> String {
    format!(
        "{:?}{:?}{:?}{:?}",
        config.users, config.tokens, config.oidc, config.audit
    )
}

/// Ask each backend's guest, one after another and off the start's path,
/// who keeps its versions (the storage, or this replica), so the log says
/// it once per backend and the console knows it before anyone lists.
fn probe_histories(backends: Vec<Arc<Swappable<Store<GuestBackend>>>>) {
    tokio::spawn(async move {
        for backend in backends {
            backend.probe_history().await;
        }
    });
}

#[allow(clippy::too_many_arguments)]
async fn reload_on_sighup(
    mut hangups: tokio::signal::unix::Signal,
    source: ConfigSource,
    runtime: Arc<Runtime>,
    served: BTreeMap<String, Arc<Swappable<Store<GuestBackend>>>>,
    metrics: Arc<Metrics>,
    switches: Arc<Switches>,
    marks: Marks,
    restart_only: String,
) {
    let max_stored = runtime.max_stored_bytes();
    let build = |config: &Config, backend: &crate::config::BackendConfig, guest| {
        store_for(config, backend, guest, &marks, max_stored, &metrics)
    };
    while hangups.recv().await.is_some() {
        tracing::info!(config = %source.path.display(), "SIGHUP: reloading backends");
        match crate::reload::reload(&source, &runtime, &served, build).await {
            Ok(outcome) => {
                switches.set(switch_values(&outcome.config));
                if restart_only_settings(&outcome.config) != restart_only {
                    tracing::warn!(
                        "[[users]], [[tokens]], [[oidc]] or [audit] changed in the config: they \
                         take effect at the next restart (a reload swaps backends only)"
                    );
                }
                metrics.reloaded(true);
                probe_histories(
                    outcome
                        .replaced
                        .iter()
                        .filter_map(|name| served.get(name).cloned())
                        .collect(),
                );
                // Metrics first: whoever reads the log line reads them true.
                for (name, slot) in &served {
                    metrics.backend_up(name, slot.is_up());
                }
                tracing::info!(
                    replaced = outcome.replaced.len(),
                    stopped = outcome.stopped.len(),
                    "reload done"
                )
            }
            Err(e) => {
                metrics.reloaded(false);
                tracing::error!("reload failed, nothing changed: {e:#}")
            }
        }
    }
}

async fn shutdown_signal(mut terminate: tokio::signal::unix::Signal) {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        terminate.recv().await;
    };
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutdown signal: finishing requests under way");
}

#[cfg(test)]
mod tests {
    use super::client_authority;

    #[test]
    fn a_wildcard_listen_is_given_an_address_a_client_can_use() {
        let machine = Some("state-1".to_string());
        for listen in ["0.0.0.0:6081", "[::]:6081"] {
            let (authority, note) = client_authority(listen.parse().unwrap(), &[], &machine);
            assert_eq!(authority, "state-1:6081", "{listen}");
            assert!(note.unwrap().contains("replace it"), "{listen}");
        }
        let (authority, note) = client_authority("0.0.0.0:6081".parse().unwrap(), &[], &None);
        assert_eq!(authority, "127.0.0.1:6081");
        assert!(note.unwrap().contains("replace it"));
        let (authority, _) = client_authority("[::]:6081".parse().unwrap(), &[], &None);
        assert_eq!(authority, "[::1]:6081");
        // The operator's own name needs no replacing.
        let names = ["state.example.com".to_string()];
        let (authority, note) = client_authority("[::]:443".parse().unwrap(), &names, &machine);
        assert_eq!((authority.as_str(), note), ("state.example.com:443", None));
        // A concrete address is already usable, as it is.
        let (authority, note) = client_authority("[::1]:6061".parse().unwrap(), &[], &machine);
        assert_eq!((authority.as_str(), note), ("[::1]:6061", None));
    }
}
