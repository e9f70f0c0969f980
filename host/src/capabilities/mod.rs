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
/// a guest (its HTTP requests, its database): Mozilla's roots and
/// [`extra_roots`], ring, like the rest of the host.
static TLS: LazyLock<Arc<rustls::ClientConfig>> = LazyLock::new(|| {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.into(),
    };
    let (added, ignored) = roots.add_parsable_certificates(extra_roots());
    if ignored > 0 {
        tracing::warn!(
            added,
            ignored,
            "SSL_CERT_FILE: some certificates are not usable as roots"
        );
    }
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

/// The certificates of the PEM file `SSL_CERT_FILE` names, trusted beside
/// Mozilla's roots for what the host connects to for guests and for its
/// own cloud sign-ins (a private CA, or a proxy's, as terraform and
/// OpenSSL read the same variable). Read once; none when unset or
/// unreadable (then a warning).
pub fn extra_roots() -> Vec<rustls::pki_types::CertificateDer<'static>> {
    static ROOTS: LazyLock<Vec<rustls::pki_types::CertificateDer<'static>>> = LazyLock::new(|| {
        use rustls::pki_types::{CertificateDer, pem::PemObject};
        let Some(path) = std::env::var_os("SSL_CERT_FILE").filter(|p| !p.is_empty()) else {
            return Vec::new();
        };
        match CertificateDer::pem_file_iter(&path) {
            Ok(certs) => certs.filter_map(Result::ok).collect(),
            Err(e) => {
                tracing::warn!("SSL_CERT_FILE {}: {e}", path.to_string_lossy());
                Vec::new()
            }
        }
    });
    ROOTS.clone()
}

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
