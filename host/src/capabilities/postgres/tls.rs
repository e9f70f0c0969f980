//! TLS for the database's connections, as lib/pq (which Terraform uses)
//! reads its settings: the connection string's libpq TLS settings made
//! into what tokio-postgres and the host's verifier take.

use super::{PgError, PgGrant};

/// `conn_str` as tokio-postgres reads it, and its `sslrootcert`: libpq's
/// `sslmode=verify-ca` / `verify-full` become `require` (the host always
/// verifies the server's certificate), `sslrootcert` is read by the host.
/// Client certificates are refused with a message.
pub(super) fn settings(conn_str: &str) -> Result<(String, Option<std::path::PathBuf>), String> {
    let mut root = None;
    let mut keep = |key: &str, value: &str| -> Result<Option<String>, String> {
        match key {
            "sslrootcert" => {
                root = Some(std::path::PathBuf::from(value));
                Ok(None)
            }
            "sslcert" | "sslkey" | "sslpassword" => Err(format!(
                "conn_str: {key}: client certificates are not supported yet; use a password"
            )),
            "sslmode" if matches!(value, "verify-ca" | "verify-full") => Ok(Some("require".into())),
            _ => Ok(Some(value.to_string())),
        }
    };
    if conn_str.starts_with("postgres://") || conn_str.starts_with("postgresql://") {
        let mut url = url::Url::parse(conn_str)
            .map_err(|e| format!("conn_str: not a PostgreSQL URL: {e}"))?;
        let pairs: Vec<(String, String)> = url.query_pairs().into_owned().collect();
        let mut kept = Vec::new();
        for (k, v) in pairs {
            if let Some(v) = keep(&k, &v)? {
                kept.push((k, v));
            }
        }
        url.set_query(None);
        if !kept.is_empty() {
            url.query_pairs_mut().extend_pairs(kept);
        }
        return Ok((url.to_string(), root));
    }
    // key=value words; a quoted value (with spaces) is left as written.
    if conn_str.contains('\'') {
        return Ok((conn_str.to_string(), None));
    }
    let mut words = Vec::new();
    for word in conn_str.split_whitespace() {
        let (k, v) = word.split_once('=').unwrap_or((word, ""));
        if let Some(v) = keep(k, v)? {
            words.push(format!("{k}={v}"));
        }
    }
    Ok((words.join(" "), root))
}

/// The TLS configuration of `grant`'s connections: the host's, plus its
/// `sslrootcert`.
pub(super) fn config(grant: &PgGrant) -> Result<tokio_rustls::rustls::ClientConfig, PgError> {
    use tokio_rustls::rustls::pki_types::{CertificateDer, pem::PemObject};
    let Some(pem) = &grant.root_certs else {
        return Ok((*crate::capabilities::tls_client()).clone());
    };
    let mut roots = tokio_rustls::rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.into(),
    };
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| PgError::Internal(format!("sslrootcert: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| PgError::Internal(format!("sslrootcert: {e}")))?;
    }
    tokio_rustls::rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map(|b| b.with_root_certificates(roots).with_no_client_auth())
    .map_err(|e| PgError::Internal(format!("TLS: {e}")))
}

#[cfg(test)]
mod tests {
    use super::settings as tls_settings;
    use crate::capabilities::postgres::PgGrant;
    use tokio_postgres::config::SslMode;

    fn grant(conn_str: &str) -> PgGrant {
        let mut config = vec![("conn_str".to_string(), conn_str.to_string())];
        PgGrant::take(true, &mut config).unwrap().unwrap()
    }

    /// The TLS mode is the parsed `sslmode`: a password holding the word
    /// (which a substring test took for the setting, leaving
    /// tokio-postgres' `prefer`, which falls back to plain text) changes
    /// nothing, in either form of `conn_str`.
    #[test]
    fn a_password_holding_sslmode_does_not_turn_tls_down() {
        for conn_str in [
            "postgres://u:sslmode=disable@db.example.com/tf",
            "postgres://u:my-sslmode-pass@db.example.com/tf",
            "host=db.example.com user=u password=sslmode=disable dbname=tf",
            "host=db.example.com user=u password='x sslmode=disable' dbname=tf",
        ] {
            let grant = grant(conn_str);
            assert!(grant.tls, "{conn_str}");
            assert_eq!(grant.config.get_ssl_mode(), SslMode::Require, "{conn_str}");
        }
        // As lib/pq: no fall back to plain text, even when asked.
        assert_eq!(
            grant("postgres://u@db/tf?sslmode=prefer")
                .config
                .get_ssl_mode(),
            SslMode::Require
        );
        let off = grant("postgres://u:sslmode=require@db/tf?sslmode=disable");
        assert!(!off.tls);
        assert_eq!(off.config.get_ssl_mode(), SslMode::Disable);
        assert_eq!(
            grant("host=db user=u sslmode=disable")
                .config
                .get_ssl_mode(),
            SslMode::Disable
        );
    }

    #[test]
    fn libpq_tls_settings_become_what_the_host_verifies() {
        let (url, root) = tls_settings(
            "postgres://u:p@db.example.com:5432/tf?sslmode=verify-full&sslrootcert=/etc/ca.pem&application_name=x",
        )
        .unwrap();
        assert_eq!(
            url,
            "postgres://u:p@db.example.com:5432/tf?sslmode=require&application_name=x"
        );
        assert_eq!(root.unwrap().to_str(), Some("/etc/ca.pem"));
        let (words, root) =
            tls_settings("host=db user=u sslmode=verify-ca sslrootcert=ca.pem").unwrap();
        assert_eq!(words, "host=db user=u sslmode=require");
        assert!(root.is_some());
        assert!(tls_settings("host=db sslcert=c.pem sslkey=k.pem").is_err());
        let (plain, root) = tls_settings("postgres://u@127.0.0.1/tf?sslmode=disable").unwrap();
        assert_eq!(
            (plain.as_str(), root),
            ("postgres://u@127.0.0.1/tf?sslmode=disable", None)
        );
    }
}
