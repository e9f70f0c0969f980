//! HTTPS for `serve`: rustls with the operator's certificate, and optional
//! client-certificate verification (mTLS, Terraform's
//! `client_certificate_pem`).
//!
//! Handshakes run on their own tasks, so a slow or silent client cannot hold
//! up everyone else's `accept`; finished connections reach axum through a
//! channel, which keeps `axum::serve` (and its graceful shutdown) unchanged.

use crate::config::TlsConfig;
use anyhow::Context;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;

/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Finished handshakes waiting for axum to pick them up.
const ACCEPT_BACKLOG: usize = 128;

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

/// A listener that yields TLS connections whose handshake has completed.
pub struct TlsListener {
    local_addr: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl TlsListener {
    /// Accept on `listener`, handshaking each connection with `config`.
    pub fn new(listener: TcpListener, config: Arc<ServerConfig>) -> std::io::Result<Self> {
        let local_addr = listener.local_addr()?;
        let (sender, ready) = mpsc::channel(ACCEPT_BACKLOG);
        tokio::spawn(accept_loop(listener, TlsAcceptor::from(config), sender));
        Ok(TlsListener { local_addr, ready })
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: back off briefly
                // instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if ready.is_closed() {
            return;
        }
        let acceptor = acceptor.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let _ = ready.send((stream, peer)).await;
                }
                Ok(Err(e)) => tracing::info!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::info!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept loop only ends when this receiver is gone.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}
