//! Running wasmstate for real: TLS and client certificates (with the real
//! `terraform` and a Rust client), encryption at rest that the guest never
//! sees through, version history and restore, and SIGTERM in mid-write.

use crate::common::*;
use crate::terraform::{CONFIG, HTTP_BACKEND, backend_config, terraform};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A private CA with a server certificate for 127.0.0.1 and a client
/// certificate, as PEM files in a directory.
struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
    client_cert_pem: String,
    client_key_pem: String,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempdir();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "wasmstate test CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);

        let mut server = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_key = KeyPair::generate().unwrap();
        let server_cert = server.signed_by(&server_key, &issuer).unwrap();

        let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
        client
            .distinguished_name
            .push(DnType::CommonName, "terraform-ci");
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_key = KeyPair::generate().unwrap();
        let client_cert = client.signed_by(&client_key, &issuer).unwrap();

        let pki = Pki {
            ca_pem: ca_cert.pem(),
            client_cert_pem: client_cert.pem(),
            client_key_pem: client_key.serialize_pem(),
            dir,
        };
        for (name, text) in [
            ("ca.pem", pki.ca_pem.as_str()),
            ("server.pem", &server_cert.pem()),
            ("server.key", &server_key.serialize_pem()),
            ("client.pem", &pki.client_cert_pem),
            ("client.key", &pki.client_key_pem),
        ] {
            std::fs::write(pki.path(name), text).unwrap();
        }
        pki
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn server_config(&self, mtls: bool) -> String {
        let client_ca = if mtls {
            format!("client_ca = {:?}\n", self.path("ca.pem"))
        } else {
            String::new()
        };
        format!(
            "[tls]\ncert = {:?}\nkey = {:?}\n{client_ca}\n[backends.default]\nguest = \"local\"\n",
            self.path("server.pem"),
            self.path("server.key")
        )
    }

    /// A Rust client trusting the CA, with or without the client certificate.
    fn client(&self, with_cert: bool) -> reqwest::blocking::Client {
        let mut builder = reqwest::blocking::Client::builder()
            .use_rustls_tls()
            .timeout(Duration::from_secs(30))
            .add_root_certificate(reqwest::Certificate::from_pem(self.ca_pem.as_bytes()).unwrap());
        if with_cert {
            let pem = format!("{}\n{}", self.client_cert_pem, self.client_key_pem);
            builder = builder.identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap());
        }
        builder.build().unwrap()
    }
}

/// `terraform init` + `apply` against an https `url`, trusting the CA and
/// presenting the client certificate when `with_cert`.
fn terraform_over_tls(pki: &Pki, url: &str, with_cert: bool) -> std::process::Output {
    let work = tempdir();
    std::fs::write(
        work.path().join("main.tf"),
        format!("{HTTP_BACKEND}{CONFIG}"),
    )
    .unwrap();
    let tf = |args: &[&str]| {
        let mut cmd = terraform(work.path(), args);
        cmd.env("TF_HTTP_CLIENT_CA_CERTIFICATE_PEM", &pki.ca_pem);
        if with_cert {
            cmd.env("TF_HTTP_CLIENT_CERTIFICATE_PEM", &pki.client_cert_pem)
                .env("TF_HTTP_CLIENT_PRIVATE_KEY_PEM", &pki.client_key_pem);
        }
        cmd.output().unwrap()
    };
    let mut init = vec!["init", "-input=false"];
    let config = backend_config(url);
    init.extend(config.iter().map(String::as_str));
    let out = tf(&init);
    if !out.status.success() {
        return out;
    }
    tf(&["apply", "-auto-approve", "-input=false"])
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn tls_handshakes_from_terraform_and_a_rust_client() {
    let pki = Pki::new();
    let data = tempdir();
    let server = Server::with_config(data.path(), &pki.server_config(false));
    assert!(
        server.url.starts_with("https://127.0.0.1:"),
        "{}",
        server.url
    );

    let health = pki
        .client(false)
        .get(format!("{}/healthz", server.url))
        .send()
        .unwrap();
    assert_eq!(health.status(), 200);
    // A client that does not trust the CA refuses the server.
    let untrusted = reqwest::blocking::Client::builder()
        .use_rustls_tls()
        .build()
        .unwrap()
        .get(format!("{}/healthz", server.url))
        .send();
    assert!(untrusted.is_err());
    // Plain HTTP to the TLS port gets no answer.
    let plain = server.url.replacen("https://", "http://", 1);
    assert!(
        reqwest::blocking::get(format!("{plain}/healthz"))
            .map(|r| r.status() != 200)
            .unwrap_or(true)
    );

    let url = server.state_url("default", "tls");
    let out = terraform_over_tls(&pki, &url, false);
    assert!(out.status.success(), "{}", text(&out));
    let state = pki.client(false).get(&url).send().unwrap().text().unwrap();
    assert!(
        state.contains("terraform_data.example") || state.contains("terraform_data"),
        "{state}"
    );
}

#[test]
fn mtls_requires_a_client_certificate_signed_by_the_ca() {
    let pki = Pki::new();
    let data = tempdir();
    let server = Server::with_config(data.path(), &pki.server_config(true));
    let health = format!("{}/healthz", server.url);

    assert!(
        pki.client(false).get(&health).send().is_err(),
        "no client certificate must fail the handshake"
    );
    assert_eq!(pki.client(true).get(&health).send().unwrap().status(), 200);
    // A certificate from another CA is refused too.
    let stranger = Pki::new();
    let forged = format!("{}\n{}", stranger.client_cert_pem, stranger.client_key_pem);
    let client = reqwest::blocking::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(reqwest::Certificate::from_pem(pki.ca_pem.as_bytes()).unwrap())
        .identity(reqwest::Identity::from_pem(forged.as_bytes()).unwrap())
        .build()
        .unwrap();
    assert!(client.get(&health).send().is_err());

    let url = server.state_url("default", "mtls");
    let refused = terraform_over_tls(&pki, &url, false);
    assert!(
        !refused.status.success(),
        "terraform without a client certificate must fail"
    );
    let out = terraform_over_tls(&pki, &url, true);
    assert!(out.status.success(), "{}", text(&out));

    // The CLI speaks TLS too.
    let (ok, out) = wasmstate(&[
        "workspace",
        "list",
        "--server",
        &server.url,
        "--ca-cert",
        pki.path("ca.pem").to_str().unwrap(),
        "--client-cert",
        pki.path("client.pem").to_str().unwrap(),
        "--client-key",
        pki.path("client.key").to_str().unwrap(),
    ]);
    assert!(ok && out.contains("mtls"), "{out}");
}

const SECRET_STATE: &str = r#"{"version":4,"serial":SERIAL,"lineage":"enc-lineage","outputs":{"db_password":{"value":"hunter2-SERIAL","type":"string","sensitive":true}},"resources":[]}"#;

fn secret_state(serial: u64) -> Vec<u8> {
    SECRET_STATE
        .replace("SERIAL", &serial.to_string())
        .into_bytes()
}

/// Every file under `dir`, with its bytes.
fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push((path.clone(), std::fs::read(&path).unwrap()));
        }
    }
    out
}

fn encrypted_config(store: &Path, key_lines: &str) -> String {
    format!("[backends.default]\nguest = \"local\"\ndir = {store:?}\nhistory = 5\n{key_lines}")
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[test]
fn encryption_at_rest_the_guest_and_the_history_hold_only_ciphertext() {
    let data = tempdir();
    let store = data.path().join("store");
    let key_file = key_file(data.path());

    // A state written before encryption was enabled.
    let plain = Server::with_config(data.path(), &encrypted_config(&store, ""));
    let url = plain.state_url("default", "enc");
    assert_eq!(send("POST", &url, Some(&secret_state(1))).status, 200);
    drop(plain);

    let key = format!("{{ id = \"k1\", file = {key_file:?} }}");
    let keys = format!("encryption = {{ keys = [{key}] }}\n");
    let migrating = format!("encryption = {{ keys = [{key}], accept_plain = true }}\n");
    // Encryption on: the plain state is refused (storage could have put
    // anyone's there)...
    let server = Server::with_config(data.path(), &encrypted_config(&store, &keys));
    let refused = send("GET", &server.state_url("default", "enc"), None);
    assert_eq!(refused.status, 500, "{}", refused.text());
    assert!(
        refused.text().contains("accept_plain"),
        "{}",
        refused.text()
    );
    drop(server);
    // ...unless the operator migrates on purpose.
    let server = Server::with_config(data.path(), &encrypted_config(&store, &migrating));
    let url = server.state_url("default", "enc");
    assert_eq!(send("GET", &url, None).body, secret_state(1));
    // New writes are sealed; Terraform reads its own bytes back.
    assert_eq!(send("POST", &url, Some(&secret_state(2))).status, 200);
    assert_eq!(send("GET", &url, None).body, secret_state(2));
    let stored = files_under(&store);
    let state_file = stored
        .iter()
        .find(|(p, _)| p.ends_with("enc/terraform.tfstate"))
        .expect("the local guest's state file");
    assert!(contains(&state_file.1, "wasmstate_encrypted"));
    assert!(
        !contains(&state_file.1, "hunter2"),
        "plaintext reached the guest's storage"
    );
    // serial and lineage stay readable for the stale-write guard.
    let envelope: serde_json::Value = serde_json::from_slice(&state_file.1).unwrap();
    assert_eq!(envelope["serial"], 2);
    assert_eq!(envelope["lineage"], "enc-lineage");
    let refused = send("POST", &url, Some(&secret_state(1)));
    assert_eq!(refused.status, 409, "{}", refused.text());
    // The host's version history keeps what the guest got: ciphertext.
    for (path, bytes) in files_under(&data.path().join("history")) {
        assert!(
            !contains(&bytes, "hunter2-2"),
            "{} holds plaintext",
            path.display()
        );
    }
    let versions = send("GET", &format!("{url}/versions"), None).json();
    let newest = versions[0]["id"].as_str().unwrap().to_string();
    assert_eq!(
        send("GET", &format!("{url}/versions/{newest}"), None).body,
        secret_state(2)
    );
    drop(server);

    // Migrated: the sealed state opens without accept_plain.
    let server = Server::with_config(data.path(), &encrypted_config(&store, &keys));
    let answer = send("GET", &server.state_url("default", "enc"), None);
    assert_eq!(answer.body, secret_state(2), "{}", answer.text());
    drop(server);

    // The same key id with other key material: a clear error, not garbage.
    let (_, other) = wasmstate(&["generate-key"]);
    std::fs::write(&key_file, other.trim()).unwrap();
    let wrong = Server::with_config(data.path(), &encrypted_config(&store, &keys));
    let answer = send("GET", &wrong.state_url("default", "enc"), None);
    assert_eq!(answer.status, 500);
    assert!(
        answer.text().contains("does not open with key \"k1\""),
        "{}",
        answer.text()
    );
    drop(wrong);

    // No key at all for a sealed state: also a clear error.
    let none = Server::with_config(data.path(), &encrypted_config(&store, ""));
    let answer = send("GET", &none.state_url("default", "enc"), None);
    assert_eq!(answer.status, 500);
    assert!(
        answer
            .text()
            .contains("key \"k1\", which is not configured"),
        "{}",
        answer.text()
    );
}

fn versioned_state(serial: u64, note: &str) -> Vec<u8> {
    format!(r#"{{"version":4,"serial":{serial},"lineage":"hist","note":"{note}"}}"#).into_bytes()
}

#[test]
fn history_lists_versions_and_restore_writes_one_back_under_the_lock() {
    let data = tempdir();
    let server = Server::with_config(
        data.path(),
        "[backends.default]\nguest = \"local\"\nhistory = 2\n[backends.nohistory]\nguest = \"local\"\nhistory = 0\n",
    );
    let url = server.state_url("default", "hist");
    for (serial, note) in [(1, "first"), (2, "second"), (3, "third")] {
        assert_eq!(
            send("POST", &url, Some(&versioned_state(serial, note))).status,
            200
        );
    }
    let (versions, serials) = versions(&url);
    assert_eq!(serials, [3, 2], "newest first, at most `history` kept");
    let second = versions[1]["id"].as_str().unwrap().to_string();
    assert_eq!(
        send("GET", &format!("{url}/versions/{second}"), None).body,
        versioned_state(2, "second")
    );
    assert_eq!(
        send("GET", &format!("{url}/versions/0000000000000-9"), None).status,
        404
    );

    // The CLI lists them too.
    let (ok, out) = wasmstate(&["state", "versions", "hist", "--server", &server.url]);
    assert!(ok && out.contains(&second), "{out}");

    // Restore is refused while someone else holds the lock, and changes nothing.
    let other = lock_info("someone-else", "ops@elsewhere");
    assert_eq!(send("LOCK", &url, Some(&other)).status, 200);
    let (ok, out) = wasmstate(&["state", "restore", "hist", &second, "--server", &server.url]);
    assert!(!ok && out.contains("someone-else"), "{out}");
    assert_eq!(send("GET", &url, None).json()["note"], "third");
    assert_eq!(send("UNLOCK", &url, Some(&other)).status, 200);

    // Restore writes the old content back as the next serial and unlocks.
    let (ok, out) = wasmstate(&["state", "restore", "hist", &second, "--server", &server.url]);
    assert!(ok && out.contains("as serial 4"), "{out}");
    let restored = send("GET", &url, None).json();
    assert_eq!(restored["note"], "second");
    assert_eq!(restored["serial"], 4);
    assert_eq!(
        send("LOCK", &url, Some(&other)).status,
        200,
        "restore left the lock held"
    );

    let off = send(
        "GET",
        &format!("{}/versions", server.state_url("nohistory", "x")),
        None,
    );
    assert_eq!(off.status, 404);
    assert!(off.text().contains("history = N"), "{}", off.text());
}

#[test]
fn sigterm_during_a_write_lets_it_finish_whole() {
    let data = tempdir();
    let server = Server::start(data.path());
    let url = server.state_url("default", "term");
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);

    // A 4 MiB state, sent in two halves with SIGTERM in between.
    let padding = "x".repeat(4 << 20);
    let body =
        format!(r#"{{"version":4,"serial":2,"lineage":"test-lineage","padding":"{padding}"}}"#);
    let addr = server.url.trim_start_matches("http://").to_string();
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(
        stream,
        "POST /states/default/term HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    let (first, rest) = body.as_bytes().split_at(body.len() / 2);
    stream.write_all(first).unwrap();
    // The write is being served once two requests are in flight: it and
    // the metrics scrape asking.
    wait_until("the write to be in flight", Duration::from_secs(30), || {
        server.metric("wasmstate_requests_in_flight") >= 2.0
    });
    let pid = server.pid().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    stream.write_all(rest).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let status = server.terminate(Duration::from_secs(30));
    assert!(status.success(), "exit status {status}");

    let again = Server::start(data.path());
    let stored = send("GET", &again.state_url("default", "term"), None);
    assert_eq!(
        stored.body,
        body.as_bytes(),
        "the state must be the whole new write"
    );
    // And the lock files were not left behind: a new lock is granted.
    assert_eq!(
        send(
            "LOCK",
            &again.state_url("default", "term"),
            Some(&lock_info("after", "t@h"))
        )
        .status,
        200
    );
}

/// The configuration shipped in the Kubernetes example, cut out of its
/// ConfigMap.
fn kubernetes_example_config() -> String {
    let manifest = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/kubernetes/wasmstate.yaml"),
    )
    .unwrap();
    let start = manifest
        .find("wasmstate.toml: |\n")
        .expect("the ConfigMap's config")
        + 18;
    manifest[start..]
        .lines()
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn kubernetes_example_config_passes_check_config() {
    let dir = tempdir();
    let k8s = dir.path().join("k8s.toml");
    std::fs::write(&k8s, kubernetes_example_config()).unwrap();
    let (_, key) = wasmstate(&["generate-key"]);
    let out = std::process::Command::new(BIN)
        .args(["check-config"])
        .arg(&k8s)
        .env("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
        .env("AWS_SECRET_ACCESS_KEY", "secret")
        .env("WASMSTATE_KEY", key.trim())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("configuration OK"),
        "{text}"
    );
}
