//! The cloud block over HTTPS with a private CA, trusted through
//! `SSL_CERT_FILE` (terraform has no "skip verify" for it), with network
//! discovery (`/.well-known/terraform.json`) instead of a `host` block.

use crate::common::*;
use crate::terraform::{CONFIG, terraform};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A CA and a server certificate for `localhost`, as files in `dir`.
fn pki(dir: &std::path::Path) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "wasmstate test CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let mut server =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_key = KeyPair::generate().unwrap();
    let server_cert = server.signed_by(&server_key, &issuer).unwrap();
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
    std::fs::write(dir.join("server.pem"), server_cert.pem()).unwrap();
    std::fs::write(dir.join("server.key"), server_key.serialize_pem()).unwrap();
}

#[test]
fn https_with_a_private_ca_through_ssl_cert_file() {
    let data = tempdir();
    pki(data.path());
    let (token, sha) = generate_token();
    let server = Server::with_config(
        data.path(),
        &format!(
            "[tls]\ncert = {:?}\nkey = {:?}\n\n[backends.acme]\nguest = \"local\"\n\n[[tokens]]\nname = \"ci\"\nsha256 = \"{sha}\"\ngrants = [\"acme:*:admin\"]\n",
            data.path().join("server.pem"),
            data.path().join("server.key")
        ),
    );
    assert!(server.url.starts_with("https://"), "{}", server.url);
    let port = server.url.rsplit(':').next().unwrap();
    let host = format!("localhost:{port}");
    let work = tempdir();
    std::fs::write(
        work.path().join("main.tf"),
        format!(
            "terraform {{\n  cloud {{\n    hostname     = \"{host}\"\n    organization = \"acme\"\n    workspaces {{\n      name = \"tls\"\n    }}\n  }}\n}}\n{CONFIG}"
        ),
    )
    .unwrap();
    let ca = data.path().join("ca.pem");
    let tf = |args: &[&str], trust: bool| {
        let mut cmd = terraform(work.path(), args);
        cmd.env(format!("TF_TOKEN_{host}"), &token);
        if trust {
            cmd.env("SSL_CERT_FILE", &ca);
        }
        cmd.output().unwrap()
    };
    let text = |out: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    // Without the CA terraform refuses the server...
    let refused = tf(&["init", "-input=false"], false);
    assert!(!refused.status.success());
    assert!(text(&refused).contains("certificate"), "{}", text(&refused));
    // ...and with it, discovers the API and works, uploads included
    // (their URLs are https, built from the request's host).
    for args in [
        &["init", "-input=false"][..],
        &["apply", "-auto-approve", "-input=false"],
    ] {
        let out = tf(args, true);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
    }
    let out = tf(&["output", "-raw", "value"], true);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "one");
}
