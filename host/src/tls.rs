//! HTTPS for `serve`: rustls with the operator's certificate, and optional
//! client-certificate verification (mTLS, Terraform's
//! `client_certificate_pem`).
//!
//! Handshakes run in each connection's own task ([`crate::listen`]), under
//! the connection caps and a time limit, so a slow or silent client cannot
//! hold up everyone else's `accept`.

use crate::config::TlsConfig;
use anyhow::Context;
use std::sync::Arc;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};

/// Build the rustls server configuration from PEM files.
pub fn server_config(tls: &TlsConfig) -> anyhow::Result<Arc<ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = read_certs(&tls.cert)?;
    let key = PrivateKeyDer::from_pem_file(&tls.key).map_err(|e| {
        anyhow::anyhow!(
            "tls.key = {}: no usable private key ({e}); expected a PEM file with a PKCS#8, PKCS#1 or SEC1 key",
            tls.key.display()
        )
    })?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS provider")?;
    let builder = match &tls.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certs(ca)? {
                roots.add(cert).with_context(|| {
                    format!(
                        "tls.client_ca = {}: not a usable CA certificate",
                        ca.display()
                    )
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .with_context(|| format!("tls.client_ca = {}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .context("tls.cert and tls.key do not form a usable certificate and key pair")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn read_certs(path: &std::path::Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<_, _>>())
        .map_err(|e| anyhow::anyhow!("{}: cannot read PEM certificates: {e}", path.display()))?;
    if certs.is_empty() {
        anyhow::bail!("{}: no PEM certificates in the file", path.display());
    }
    Ok(certs)
}
