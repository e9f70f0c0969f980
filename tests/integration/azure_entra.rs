//! The `azure` guest signing in with Microsoft Entra ID, the host holding
//! the credential: Azurite over HTTPS with `--oauth basic` (it checks a
//! bearer token's issuer, audience and lifetime), and a loopback fake of
//! Entra ID's token endpoint and the managed-identity endpoint
//! ([`fake::FakeEntra`]). Each way of signing in (workload identity,
//! managed identity, client secret, client certificate) passes the kit
//! and a Terraform journey; tokens are cached and minted again before they
//! expire, a rotated federated token file is read again, no token reaches
//! the guest or the log, and a refused sign-in is a 503 naming what to fix.

mod fake;
mod pfx;

use crate::common::*;
use crate::terraform::apply_and_check;
use fake::{CLIENT, FakeEntra, TENANT};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const CONTAINER: &str = "tfstate";
const KEY: &str = "prod.terraform.tfstate";
const SECRET: &str = "wasmstate-test-client-secret~9f8e7d";

/// Azurite over HTTPS with OAuth, its CA, and the container made.
struct Storage {
    azurite: Azurite,
    ca: PathBuf,
    _dir: tempfile::TempDir,
}

impl Storage {
    fn start() -> Storage {
        let dir = tempdir();
        let (ca, cert, key) = fake::tls_files(dir.path());
        let azurite = Azurite::start_oauth(&cert, &key, &ca);
        // The container, made with a token as an operator's tooling would.
        let roots = reqwest::Certificate::from_pem(&std::fs::read(&ca).unwrap()).unwrap();
        let client = reqwest::blocking::Client::builder()
            .add_root_certificate(roots)
            .build()
            .unwrap();
        let made = client
            .put(format!(
                "{}/{CONTAINER}?restype=container",
                azurite.https_endpoint()
            ))
            .header("authorization", format!("Bearer {}", fake::mint(600, 0)))
            .header("x-ms-version", "2021-12-02")
            .header("content-length", "0")
            .send()
            .unwrap();
        assert_eq!(made.status().as_u16(), 201, "{:?}", made.text());
        Storage {
            azurite,
            ca,
            _dir: dir,
        }
    }

    /// Whether blob `name` exists (asked with a token of the tests' own).
    fn exists(&self, name: &str) -> bool {
        let roots = reqwest::Certificate::from_pem(&std::fs::read(&self.ca).unwrap()).unwrap();
        let client = reqwest::blocking::Client::builder()
            .add_root_certificate(roots)
            .build()
            .unwrap();
        let status = client
            .head(format!(
                "{}/{CONTAINER}/{name}",
                self.azurite.https_endpoint()
            ))
            .header("authorization", format!("Bearer {}", fake::mint(600, 0)))
            .header("x-ms-version", "2021-12-02")
            .send()
            .unwrap()
            .status()
            .as_u16();
        assert!(matches!(status, 200 | 404), "HEAD {name}: {status}");
        status == 200
    }

    /// The backend's settings: the blobs, Entra ID at the fake, and `more`.
    fn settings(&self, entra: &FakeEntra, more: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut all = vec![
            ("storage_account_name", "devstoreaccount1".to_string()),
            ("container_name", CONTAINER.into()),
            ("key", KEY.into()),
            ("blob_endpoint", self.azurite.https_endpoint()),
            ("use_azuread_auth", "true".into()),
            ("authority_host", entra.url.clone()),
            ("snapshot", "true".into()),
        ];
        all.extend(more.iter().map(|(k, v)| (*k, v.to_string())));
        all.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    /// The environment of a host reaching this Azurite: its CA trusted.
    fn env<'a>(&'a self, more: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut env = vec![("SSL_CERT_FILE", self.ca.to_str().unwrap())];
        env.extend_from_slice(more);
        env
    }
}

/// `wasmstate guest test azure` with `settings` and `env`.
fn kit(settings: &[(String, String)], env: &[(&str, &str)]) -> (bool, String) {
    let mut command = Command::new(BIN);
    command.args(["guest", "test", "azure"]);
    for (k, v) in settings {
        command.arg("--config").arg(format!("{k}={v}"));
    }
    let out = command.envs(env.iter().copied()).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// A server with one `azure` backend `az`, logging at debug level.
fn server(data: &Path, settings: &[(String, String)], env: &[(&str, &str)]) -> Server {
    let config = data.join("wasmstate.toml");
    std::fs::create_dir_all(data).unwrap();
    std::fs::write(&config, backend_table("az", "azure", "", settings)).unwrap();
    let mut env = env.to_vec();
    env.push(("WASMSTATE_LOG", "debug"));
    Server::with_config_env(data, &config, &env)
}

/// Nothing the host holds shows in its log (read at debug level) or in
/// `answers`: no token it was given, nor `secrets`.
fn nothing_leaked(server: &Server, entra: &FakeEntra, secrets: &[&str], answers: &[String]) {
    let log = server.log_text();
    assert!(log.contains("DEBUG"), "the log is at debug level");
    let minted = entra.minted();
    assert!(!minted.is_empty());
    for token in minted
        .iter()
        .map(String::as_str)
        .chain(secrets.iter().copied())
    {
        assert!(!log.contains(token), "a credential in the log");
        assert!(
            answers.iter().all(|a| !a.contains(token)),
            "a credential in an answer"
        );
    }
}

/// The kit, then Terraform through wasmstate, signed in by `settings` and
/// `env`; the host's log and Terraform's state carry no credential.
fn kit_and_terraform(
    entra: &FakeEntra,
    settings: &[(String, String)],
    env: &[(&str, &str)],
    secrets: &[&str],
) {
    let (ok, out) = kit(settings, env);
    assert!(ok, "{out}");
    assert_eq!(summary(&out), "33 passed, 0 failed", "{out}");
    let (data, work) = (tempdir(), tempdir());
    let server = server(data.path(), settings, env);
    let url = server.state_url("az", "default");
    apply_and_check(work.path(), &url, &server);
    let state = send("GET", &url, None).text();
    assert!(state.contains("\"serial\""), "{state}");
    assert_eq!(entra.refusals(), Vec::<String>::new());
    nothing_leaked(&server, entra, secrets, &[state, out]);
}

/// AKS's way: the webhook's `AZURE_*` variables and a projected token
/// file; the backend says only `use_azuread_auth = true`.
#[test]
fn workload_identity_from_the_environment_passes_the_kit_and_terraform() {
    let storage = Storage::start();
    let entra = FakeEntra::start(3600, SECRET);
    let dir = tempdir();
    let file = dir.path().join("azure-identity-token");
    std::fs::write(&file, "k8s-sa-token-1\n").unwrap();
    entra.accept_federated("k8s-sa-token-1");
    let mut settings = storage.settings(&entra, &[]);
    settings.retain(|(k, _)| k != "authority_host");
    let env = storage.env(&[
        ("AZURE_CLIENT_ID", CLIENT),
        ("AZURE_TENANT_ID", TENANT),
        ("AZURE_FEDERATED_TOKEN_FILE", file.to_str().unwrap()),
        ("AZURE_AUTHORITY_HOST", entra.url.as_str()),
    ]);
    kit_and_terraform(&entra, &settings, &env, &["k8s-sa-token-1"]);
    assert!(entra.token_hits() >= 2, "the kit's and the server's");
    assert!(entra.assertions().iter().all(|a| a == "k8s-sa-token-1"));
}

#[test]
fn managed_identity_passes_the_kit_and_terraform() {
    let storage = Storage::start();
    let entra = FakeEntra::start(3600, SECRET);
    let endpoint = entra.msi_endpoint();
    let settings = storage.settings(
        &entra,
        &[
            ("use_msi", "true"),
            ("client_id", CLIENT),
            ("msi_endpoint", endpoint.as_str()),
        ],
    );
    kit_and_terraform(&entra, &settings, &storage.env(&[]), &[]);
    assert!(entra.msi_hits() >= 2);
    assert_eq!(entra.token_hits(), 0);
}

#[test]
fn a_client_secret_passes_the_kit_and_terraform() {
    let storage = Storage::start();
    let entra = FakeEntra::start(3600, SECRET);
    let settings = storage.settings(
        &entra,
        &[
            ("client_id", CLIENT),
            ("tenant_id", TENANT),
            ("client_secret", SECRET),
        ],
    );
    kit_and_terraform(&entra, &settings, &storage.env(&[]), &[SECRET]);
    assert!(entra.token_hits() >= 2);
}

#[test]
fn a_client_certificate_passes_the_kit_and_terraform() {
    let storage = Storage::start();
    let entra = FakeEntra::start(3600, SECRET);
    let dir = tempdir();
    let (file, public, x5t) = fake::client_certificate(dir.path());
    entra.accept_certificate(&public, &x5t);
    let settings = storage.settings(
        &entra,
        &[
            ("client_id", CLIENT),
            ("tenant_id", TENANT),
            ("client_certificate_path", file.to_str().unwrap()),
        ],
    );
    let key = std::fs::read_to_string(&file).unwrap();
    let key_body = key.lines().nth(1).unwrap().to_string();
    kit_and_terraform(&entra, &settings, &storage.env(&[]), &[&key_body]);
    assert!(entra.token_hits() >= 2);
}

/// Tokens of 12 seconds: the first serves the next requests (one exchange),
/// then, half its life gone, another is minted before Azurite would find
/// it expired (every answer a 200), with the federated token file read
/// again (it rotated meanwhile).
#[test]
fn an_expiring_token_is_minted_again_with_the_rotated_token_file() {
    let storage = Storage::start();
    let entra = FakeEntra::start(12, SECRET);
    let dir = tempdir();
    let file = dir.path().join("token");
    std::fs::write(&file, "rotated-token-1").unwrap();
    entra.accept_federated("rotated-token-1");
    entra.accept_federated("rotated-token-2");
    let path = file.to_str().unwrap().to_string();
    let settings = storage.settings(
        &entra,
        &[
            ("use_oidc", "true"),
            ("client_id", CLIENT),
            ("tenant_id", TENANT),
            ("oidc_token_file_path", path.as_str()),
        ],
    );
    let data = tempdir();
    let server = server(data.path(), &settings, &storage.env(&[]));
    let url = server.state_url("az", "default");
    let posted = send("POST", &url, Some(&state(1)));
    assert_eq!(posted.status, 200, "{}", posted.text());
    for _ in 0..3 {
        assert_eq!(send("GET", &url, None).status, 200);
    }
    assert_eq!(entra.token_hits(), 1, "one token serves until it is due");
    std::fs::write(&file, "rotated-token-2").unwrap();
    let mut answers = Vec::new();
    wait_until("a second token", Duration::from_secs(30), || {
        let got = send("GET", &url, None);
        assert_eq!(got.status, 200, "{}", got.text());
        answers.push(got.text());
        entra.token_hits() >= 2
    });
    // Minted again well before the first one's 12 seconds were up.
    let at = entra.minted_at();
    assert!(
        at[1] - at[0] < Duration::from_secs(10),
        "the second token came {:?} after the first",
        at[1] - at[0]
    );
    assert_eq!(
        entra.assertions(),
        vec!["rotated-token-1".to_string(), "rotated-token-2".to_string()]
    );
    assert_eq!(entra.refusals(), Vec::<String>::new());
    nothing_leaked(
        &server,
        &entra,
        &["rotated-token-1", "rotated-token-2"],
        &answers,
    );
}

/// Azure refuses a token the host still thought good (revoked; here one
/// minted already expired): the host forgets it and sends the request
/// once more with a new one, and the caller never sees the refusal.
#[test]
fn a_token_azure_refuses_is_replaced_and_the_request_sent_again() {
    let storage = Storage::start();
    let entra = FakeEntra::start(3600, SECRET);
    entra.mint_stale(1);
    let settings = storage.settings(
        &entra,
        &[
            ("client_id", CLIENT),
            ("tenant_id", TENANT),
            ("client_secret", SECRET),
        ],
    );
    let data = tempdir();
    let server = server(data.path(), &settings, &storage.env(&[]));
    let url = server.state_url("az", "default");
    let posted = send("POST", &url, Some(&state(1)));
    assert_eq!(posted.status, 200, "{}", posted.text());
    assert_eq!(
        entra.token_hits(),
        2,
        "the refused token, then its successor"
    );
    assert_eq!(send("GET", &url, None).body, state(1));
    assert_eq!(entra.token_hits(), 2, "the successor is kept");
    assert!(
        server
            .log_text()
            .contains("Azure refused the Entra ID token"),
        "{}",
        server.log_text()
    );
}

/// A wrong secret: the request is a 503 naming the tenant and Entra ID's
/// error, the log says the same, neither shows the secret; nothing is
/// written.
#[test]
fn a_wrong_client_secret_is_a_503_naming_the_tenant_and_the_aadsts_error() {
    let storage = Storage::start();
    let entra = FakeEntra::start(3600, SECRET);
    let wrong = "not-the-secret~1a2b3c4d5e";
    let settings = storage.settings(
        &entra,
        &[
            ("client_id", CLIENT),
            ("tenant_id", TENANT),
            ("client_secret", wrong),
        ],
    );
    let data = tempdir();
    let server = server(data.path(), &settings, &storage.env(&[]));
    let url = server.state_url("az", "default");
    let answer = send("POST", &url, Some(&state(1)));
    let text = answer.text();
    assert_eq!(answer.status, 503, "{text}");
    for said in [&text, &server.log_text()] {
        assert!(said.contains(TENANT), "{said}");
        assert!(said.contains("AADSTS7000215"), "{said}");
        assert!(said.contains("client secret"), "{said}");
        assert!(!said.contains(wrong), "the secret shows");
    }
    assert!(
        entra
            .refusals()
            .iter()
            .all(|r| r == "a wrong client secret")
    );
    assert_eq!(entra.token_hits(), 0);
    assert!(!storage.exists(KEY), "nothing was written");
}

/// Settings that contradict each other are refused in one line naming
/// them, before anything is reached.
#[test]
fn contradictory_sign_in_settings_are_refused_in_one_line() {
    let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        let mut all = vec![
            ("storage_account_name", "devstoreaccount1"),
            ("container_name", CONTAINER),
            ("key", KEY),
            ("blob_endpoint", "https://127.0.0.1:9/devstoreaccount1"),
        ];
        all.extend_from_slice(list);
        all.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    for (settings, expected) in [
        (
            pairs(&[("use_oidc", "true"), ("use_msi", "true")]),
            "use_oidc, use_msi: name one way of signing in",
        ),
        (
            pairs(&[("use_azuread_auth", "false"), ("use_msi", "true")]),
            "set use_azuread_auth = true",
        ),
        (
            pairs(&[("use_azuread_auth", "true"), ("access_key", "a2V5")]),
            "access_key, use_azuread_auth: choose one",
        ),
        (
            pairs(&[("client_secret", SECRET), ("client_id", CLIENT)]),
            "tenant_id: required to sign in with a client secret",
        ),
    ] {
        let (ok, out) = kit(&settings, &[]);
        assert!(!ok, "{out}");
        let line = out
            .lines()
            .find(|l| l.contains(expected))
            .unwrap_or_else(|| panic!("{expected:?} not in {out}"));
        assert!(!line.contains(SECRET), "{line}");
    }
}

/// A loopback listener standing for a proxy: it counts the connections
/// made to it and closes them.
struct CountingProxy {
    url: String,
    count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CountingProxy {
    fn start() -> CountingProxy {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (counted, stopped) = (count.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok(_) => {
                        counted.fetch_add(1, Ordering::SeqCst);
                    }
                    // Polling the non-blocking accept, not synchronising.
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        CountingProxy {
            url,
            count,
            stop,
            thread: Some(thread),
        }
    }

    fn connections(&self) -> usize {
        self.count.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A proxy in the host's environment (`HTTP_PROXY`) never sees a
/// plain-http sign-in: the managed-identity endpoint's token, or a client
/// secret posted to a loopback token endpoint, would cross it in the
/// clear (Azure documents that IMDS requests must bypass proxies).
#[test]
fn a_plain_http_sign_in_bypasses_the_environments_proxy() {
    let storage = Storage::start();
    let entra = FakeEntra::start(3600, SECRET);
    let proxy = CountingProxy::start();
    let endpoint = entra.msi_endpoint();
    let proxied = [
        ("HTTP_PROXY", proxy.url.as_str()),
        ("http_proxy", proxy.url.as_str()),
        ("NO_PROXY", ""),
        ("no_proxy", ""),
    ];
    for way in [
        vec![
            ("use_msi", "true"),
            ("client_id", CLIENT),
            ("msi_endpoint", endpoint.as_str()),
        ],
        vec![
            ("client_id", CLIENT),
            ("tenant_id", TENANT),
            ("client_secret", SECRET),
        ],
    ] {
        let (ok, out) = kit(&storage.settings(&entra, &way), &storage.env(&proxied));
        assert!(ok, "{way:?}: {out}");
        assert_eq!(proxy.connections(), 0, "{way:?}: the proxy saw a sign-in");
    }
    assert!(entra.msi_hits() >= 1 && entra.token_hits() >= 1);
}
