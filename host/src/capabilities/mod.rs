//! Capabilities the host lends guests beyond WASI, each granted per backend
//! by the operator. Plain Rust: the runtime adapts them to WIT.

pub mod aws;
pub mod azure;
pub mod gcp;
pub mod git;
pub mod postgres;

use std::sync::{Arc, LazyLock};
use tokio_rustls::rustls;

/// One client configuration for every TLS connection the host makes for
/// a guest (its HTTP requests, its database): Mozilla's roots, ring, like
/// the rest of the host.
static TLS: LazyLock<Arc<rustls::ClientConfig>> = LazyLock::new(|| {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.into(),
    };
    Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
});

/// The shared TLS client configuration.
pub fn tls_client() -> Arc<rustls::ClientConfig> {
    TLS.clone()
}

/// Whether `host` (an origin's) is this machine: the only place a
/// credential may go over plain http.
pub fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `Err` naming the first origin that is neither https nor loopback.
pub fn confidential(origins: &[crate::policy::Origin], key: &str) -> Result<(), String> {
    match origins
        .iter()
        .find(|o| o.scheme != "https" && !is_loopback(&o.host))
    {
        Some(origin) => Err(format!(
            "{key}: {}://{} is plain http; the host sends credentials only over https or to loopback",
            origin.scheme, origin.host
        )),
        None => Ok(()),
    }
}

/// Whether the host's own identity (credentials from its environment or
/// its cloud's metadata server) may go to `origin`: the cloud's own
/// endpoints (`https`, a host under one of `suffixes`) or this machine.
pub fn takes_host_identity(origin: &crate::policy::Origin, suffixes: &[&str]) -> bool {
    is_loopback(&origin.host)
        || (origin.scheme == "https" && suffixes.iter().any(|s| origin.host.ends_with(s)))
}

/// Take the settings named `keys` out of a guest's flattened config: the
/// credentials the host holds and the guest must never see.
pub fn take_settings(
    guest_config: &mut Vec<(String, String)>,
    keys: &[&str],
) -> Vec<(String, String)> {
    let mut taken = Vec::new();
    guest_config.retain(|(key, value)| {
        let ours = keys.contains(&key.as_str());
        if ours {
            taken.push((key.clone(), value.clone()));
        }
        !ours
    });
    taken
}

/// The value of `name` among `settings`, if set.
pub fn setting(settings: &[(String, String)], name: &str) -> Option<String> {
    settings
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

/// Make the `origins` a grant signs for reachable in `allow_http`.
pub fn reach(origins: &[crate::policy::Origin], allow_http: &mut Vec<crate::policy::Origin>) {
    for origin in origins {
        if !allow_http.contains(origin) {
            allow_http.push(origin.clone());
        }
    }
}
