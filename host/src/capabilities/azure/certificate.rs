//! A client certificate file for Entra ID's certificate sign-in, in
//! either form Azure's tools write: PEM (the private key and the
//! certificate in one file, as `az ad sp create-for-rbac --create-cert`
//! writes it), or PKCS#12 (a `.pfx`, with or without a password, as the
//! portal, Key Vault and Terraform azurerm's `client_certificate_path`
//! have it).
//!
//! Read once when the backend is set up, so a bad file or a wrong
//! password fails at start, not at a request. The answer is what the
//! assertion needs: the private key (PKCS#8, as PEM, the form
//! `jsonwebtoken` signs with) and the leaf certificate's `x5t`.

use std::path::Path;

/// What a certificate file gives the sign-in.
pub struct ClientCertificate {
    /// The RSA private key, PKCS#8 PEM (one block).
    pub key_pem: String,
    /// base64url of the leaf certificate's SHA-1 (the assertion's `x5t`).
    pub x5t: String,
}

/// Read the client certificate file `path`: PEM, else PKCS#12 opened with
/// `password` (none: the empty password, as `openssl pkcs12 -export
/// -passout pass:` and Terraform azurerm take it). A PEM file's key is
/// unencrypted, so `password` does not apply to it. Errors are one line
/// naming the file and what to do, never the password.
pub fn read(path: &Path, password: Option<&str>) -> Result<ClientCertificate, String> {
    let bytes = std::fs::read(path).map_err(|e| {
        format!(
            "client_certificate_path: cannot read {}: {e}",
            path.display()
        )
    })?;
    let blocks = pem::parse_many(&bytes).unwrap_or_default();
    let (key_pem, cert_der) = if blocks.is_empty() {
        from_pkcs12(path, &bytes, password)?
    } else {
        from_pem(path, &blocks)?
    };
    jsonwebtoken::EncodingKey::from_rsa_pem(key_pem.as_bytes()).map_err(|e| {
        format!(
            "client_certificate_path: the key in {} is not an RSA key Entra ID accepts: {e}",
            path.display()
        )
    })?;
    use base64::Engine as _;
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &cert_der);
    let x5t = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest.as_ref());
    Ok(ClientCertificate { key_pem, x5t })
}

/// The key (PEM) and the first certificate (DER) of a PEM file.
fn from_pem(path: &Path, blocks: &[pem::Pem]) -> Result<(String, Vec<u8>), String> {
    let key = blocks
        .iter()
        .find(|b| b.tag() == "PRIVATE KEY" || b.tag() == "RSA PRIVATE KEY")
        .ok_or_else(|| {
            format!(
                "client_certificate_path: {} holds no unencrypted RSA private key (PEM \"PRIVATE KEY\"); put the key beside the certificate, or give a PFX with client_certificate_password",
                path.display()
            )
        })?;
    let cert = blocks
        .iter()
        .find(|b| b.tag() == "CERTIFICATE")
        .ok_or_else(|| {
            format!(
                "client_certificate_path: {} holds no certificate; put it beside the key",
                path.display()
            )
        })?;
    Ok((pem::encode(key), cert.contents().to_vec()))
}

/// The key (PKCS#8 PEM) and its leaf certificate (DER) of a PKCS#12 file.
fn from_pkcs12(
    path: &Path,
    bytes: &[u8],
    password: Option<&str>,
) -> Result<(String, Vec<u8>), String> {
    use p12_keystore::error::Error;
    let file = path.display();
    // Strict: a key is kept only with the certificate its local key ID
    // names, so the x5t is the key's own certificate's.
    let store = p12_keystore::KeyStore::from_pkcs12(
        bytes,
        password.unwrap_or(""),
        p12_keystore::Pkcs12ImportPolicy::Strict,
    )
    .map_err(|e| match e {
        // The integrity check (or, without one, the decryption's padding)
        // failed: the password is not the file's.
        Error::MacError(_) | Error::UnpadError => match password {
            Some(_) => format!(
                "client_certificate_password: it does not open {file} (the PKCS#12 integrity check failed); set the password the file was exported with"
            ),
            None => format!(
                "client_certificate_password: {file} is a PKCS#12 file protected by a password; set client_certificate_password (or ARM_CLIENT_CERTIFICATE_PASSWORD)"
            ),
        },
        Error::DerError(_) | Error::InvalidVersion | Error::UnsupportedContentType => format!(
            "client_certificate_path: {file} is neither PEM (the key and the certificate) nor a PKCS#12 (.pfx) file"
        ),
        // The crate's own words: they name an algorithm or a structure,
        // never the password.
        other => format!(
            "client_certificate_path: cannot open the PKCS#12 file {file}: {other}; export it again (openssl pkcs12 -export -inkey key.pem -in cert.pem -out cert.pfx)"
        ),
    })?;
    let (_, chain) = store.private_key_chain().ok_or_else(|| {
        format!(
            "client_certificate_path: {file} holds no private key with its certificate; export both (openssl pkcs12 -export -inkey key.pem -in cert.pem -out cert.pfx)"
        )
    })?;
    // The chain starts with the key's own certificate (then its issuers).
    let leaf = chain.certs().first().ok_or_else(|| {
        format!("client_certificate_path: {file} holds the key without its certificate")
    })?;
    let key_pem = pem::encode(&pem::Pem::new("PRIVATE KEY", chain.key().as_der().to_vec()));
    Ok((key_pem, leaf.as_der().to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::process::Command;

    /// `openssl` with `args` in `dir`; panics with its stderr if it fails.
    fn openssl(dir: &Path, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl runs");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A key and a self-signed certificate in `dir`, and the certificate's
    /// x5t as a reader of its DER computes it.
    fn key_and_cert(dir: &Path) -> String {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "key.pem",
                "-out",
                "cert.pem",
                "-subj",
                "/CN=wasmstate-unit",
                "-days",
                "2",
            ],
        );
        openssl(
            dir,
            &[
                "x509", "-in", "cert.pem", "-outform", "DER", "-out", "cert.der",
            ],
        );
        use base64::Engine as _;
        let der = std::fs::read(dir.join("cert.der")).unwrap();
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &der).as_ref())
    }

    /// `openssl pkcs12 -export` of the key and certificate into `name`,
    /// with `more` arguments (the password, algorithms).
    fn export(dir: &Path, name: &str, more: &[&str]) -> PathBuf {
        let mut args = vec![
            "pkcs12", "-export", "-inkey", "key.pem", "-in", "cert.pem", "-out", name,
        ];
        args.extend_from_slice(more);
        openssl(dir, &args);
        dir.join(name)
    }

    /// OpenSSL 3's default PKCS#12 (PBES2, AES-256-CBC, PBKDF2 with
    /// HMAC-SHA256, a SHA-256 MAC), with a password and with none, and
    /// the legacy 3DES form: the key signs and the x5t is the leaf's.
    #[test]
    fn pkcs12_files_give_the_key_and_the_leafs_x5t() {
        let dir = tempfile::tempdir().unwrap();
        let x5t = key_and_cert(dir.path());
        let cases = [
            (
                "modern.pfx",
                vec!["-passout", "pass:s3cr3t-pfx"],
                Some("s3cr3t-pfx"),
            ),
            ("empty.pfx", vec!["-passout", "pass:"], None),
            (
                "legacy.pfx",
                vec![
                    "-passout",
                    "pass:s3cr3t-pfx",
                    "-keypbe",
                    "PBE-SHA1-3DES",
                    "-certpbe",
                    "PBE-SHA1-3DES",
                    "-macalg",
                    "sha1",
                ],
                Some("s3cr3t-pfx"),
            ),
        ];
        for (name, args, password) in cases {
            let file = export(dir.path(), name, &args);
            let got = read(&file, password).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(got.x5t, x5t, "{name}");
            assert!(
                got.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"),
                "{name}"
            );
            jsonwebtoken::EncodingKey::from_rsa_pem(got.key_pem.as_bytes()).unwrap();
        }
        // An empty password given is the same as none.
        assert!(read(&dir.path().join("empty.pfx"), Some("")).is_ok());
    }

    /// A wrong or missing password, a file without its key, a file that
    /// is neither form: one line naming the file and what to do, never the
    /// password.
    #[test]
    fn bad_pkcs12_files_are_refused_in_one_line() {
        let dir = tempfile::tempdir().unwrap();
        key_and_cert(dir.path());
        let file = export(dir.path(), "locked.pfx", &["-passout", "pass:right-one"]);
        let shown = file.display().to_string();
        let wrong = read(&file, Some("wrong-guess-42")).err().unwrap();
        assert!(wrong.starts_with("client_certificate_password:"), "{wrong}");
        assert!(
            wrong.contains("the password the file was exported with"),
            "{wrong}"
        );
        let missing = read(&file, None).err().unwrap();
        assert!(
            missing.contains("set client_certificate_password"),
            "{missing}"
        );
        openssl(
            dir.path(),
            &[
                "pkcs12",
                "-export",
                "-nokeys",
                "-in",
                "cert.pem",
                "-out",
                "nokey.pfx",
                "-passout",
                "pass:right-one",
            ],
        );
        let nokey = read(&dir.path().join("nokey.pfx"), Some("right-one"))
            .err()
            .unwrap();
        assert!(nokey.contains("holds no private key"), "{nokey}");
        let junk = dir.path().join("junk.bin");
        std::fs::write(&junk, [0x30, 0x03, 0x02, 0x01, 0x07]).unwrap();
        let neither = read(&junk, None).err().unwrap();
        assert!(neither.contains("neither PEM"), "{neither}");
        for e in [&wrong, &missing, &nokey] {
            assert!(e.contains(&shown) || e.contains("nokey.pfx"), "{e}");
        }
        for e in [&wrong, &missing, &nokey, &neither] {
            assert!(!e.contains('\n'), "{e}");
            assert!(
                !e.contains("right-one") && !e.contains("wrong-guess-42"),
                "{e}"
            );
        }
    }

    /// PEM keeps working, whatever password is around.
    #[test]
    fn a_pem_file_is_read_as_before() {
        let dir = tempfile::tempdir().unwrap();
        let x5t = key_and_cert(dir.path());
        let both = dir.path().join("both.pem");
        let text = std::fs::read_to_string(dir.path().join("key.pem")).unwrap()
            + &std::fs::read_to_string(dir.path().join("cert.pem")).unwrap();
        std::fs::write(&both, text).unwrap();
        assert_eq!(read(&both, None).unwrap().x5t, x5t);
        assert_eq!(read(&both, Some("unused")).unwrap().x5t, x5t);
        let e = read(&dir.path().join("cert.pem"), None).err().unwrap();
        assert!(e.contains("holds no unencrypted RSA private key"), "{e}");
    }
}
