//! The guest marketplace with real components: install from a path, an
//! HTTP URL and an index, digest pins, minisign signatures, manifests and
//! grants, inspect/list/remove, and hot reload of a new guest on SIGHUP.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// `wasmstate` with a signing password set (empty: unattended keys).
fn cli(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("WASMSTATE_SIGNING_PASSWORD", "")
        .env_remove("WASMSTATE_CONFIG")
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

fn copy_guest(from: &str, dir: &Path, name: &str) -> PathBuf {
    let to = dir.join(name);
    std::fs::copy(from, &to).unwrap();
    to
}

/// A publisher key pair: (secret key path, public key).
fn keygen(dir: &Path, name: &str) -> (PathBuf, String) {
    let secret = dir.join(format!("{name}.key"));
    let out = cli(&["guest", "keygen", secret.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let public = text(&out).lines().last().unwrap().trim().to_string();
    (secret, public)
}

/// `wasmstate guest sign COMPONENT --key SECRET`, which must succeed.
fn sign(component: &Path, secret: &Path) {
    let out = cli(&[
        "guest",
        "sign",
        component.to_str().unwrap(),
        "--key",
        secret.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
}

/// A config file with a marketplace policy (and optional extra tables).
fn write_config(dir: &Path, marketplace: &str, rest: &str) -> PathBuf {
    let path = dir.join("wasmstate.toml");
    std::fs::write(
        &path,
        format!("data_dir = \"data\"\n[marketplace]\n{marketplace}\n[backends.default]\nguest = \"local\"\n{rest}"),
    )
    .unwrap();
    path
}

fn install(config: &Path, source: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "guest",
        "install",
        source,
        "--config",
        config.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    cli(&args)
}

fn listed(config: &Path) -> String {
    text(&cli(&[
        "guest",
        "list",
        "--config",
        config.to_str().unwrap(),
    ]))
}

#[test]
fn signed_install_pins_and_refusals() {
    let dir = tempdir();
    let etcd = copy_guest(ETCD_GUEST_WASM, dir.path(), "etcd.wasm");
    let digest = sha256_of(&etcd);
    let (secret, public) = keygen(dir.path(), "publisher");
    let (_, stranger) = keygen(dir.path(), "stranger");

    // Unsigned and not allowed: refused, nothing installed.
    let config = write_config(dir.path(), &format!("trusted_keys = [{public:?}]"), "");
    let out = install(&config, etcd.to_str().unwrap(), &[]);
    assert!(
        !out.status.success() && text(&out).contains("not signed"),
        "{}",
        text(&out)
    );
    assert!(listed(&config).contains("no guests installed"));

    // A wrong pin: refused, nothing installed.
    let wrong = format!("{}@sha256:{}", etcd.display(), "0".repeat(64));
    let out = install(&config, &wrong, &[]);
    assert!(text(&out).contains("digest mismatch"), "{}", text(&out));

    // Signed by the publisher, pinned: installed, signer recorded.
    sign(&etcd, &secret);
    let pinned = format!("{}@sha256:{digest}", etcd.display());
    let out = install(&config, &pinned, &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("guest = \"etcd@sha256:{digest}\"")),
        "{}",
        text(&out)
    );
    let list = listed(&config);
    assert!(
        list.contains("etcd") && list.contains(&digest) && list.contains("signed by key"),
        "{list}"
    );

    // inspect shows the manifest and what it asks for.
    let out = cli(&[
        "guest",
        "inspect",
        "etcd",
        "--config",
        config.to_str().unwrap(),
    ]);
    let shown = text(&out);
    for want in [
        "http://*:*",
        "memory        64 MiB",
        "wit           0.3.0 (current)",
        "wasmstate:backend/storage@0.3.0",
        &digest,
    ] {
        assert!(shown.contains(want), "{want} missing:\n{shown}");
    }

    // A key the operator does not trust: refused.
    let config2_dir = tempdir();
    let config2 = write_config(
        config2_dir.path(),
        &format!("trusted_keys = [{stranger:?}]"),
        "",
    );
    let out = install(&config2, etcd.to_str().unwrap(), &[]);
    assert!(
        text(&out).contains("does not verify with any trusted publisher key"),
        "{}",
        text(&out)
    );

    // Bytes changed after signing: refused.
    let tampered = dir.path().join("tampered.wasm");
    let mut bytes = std::fs::read(&etcd).unwrap();
    bytes.extend_from_slice(&[0, 4, 3, b'x', b'y', b'z']); // one more custom section
    std::fs::write(&tampered, &bytes).unwrap();
    let out = install(
        &config2,
        tampered.to_str().unwrap(),
        &["--signature", &format!("{}.minisig", etcd.display())],
    );
    assert!(!out.status.success(), "{}", text(&out));

    // Remove.
    let out = cli(&[
        "guest",
        "remove",
        "etcd",
        "--config",
        config.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(listed(&config).contains("no guests installed"));
}

#[test]
fn install_from_a_url_and_an_index_then_serve_with_exact_grants() {
    let dir = tempdir();
    let site = dir.path().join("site");
    std::fs::create_dir_all(&site).unwrap();
    let etcd = copy_guest(ETCD_GUEST_WASM, &site, "etcd.wasm");
    let digest = sha256_of(&etcd);
    let files = FileServer::start(&site);
    let url = format!("{}/etcd.wasm", files.url);
    let index = dir.path().join("index.json");
    std::fs::write(
        &index,
        serde_json::json!({"guests": [{"name": "etcd", "version": "0.1.0", "description": "state in etcd v3",
            "sha256": digest, "url": url, "publisher": "wasmstate examples"}]})
        .to_string(),
    )
    .unwrap();

    let config = write_config(dir.path(), "allow_unsigned = true", "");
    let out = cli(&[
        "guest",
        "search",
        "ETCD",
        "--config",
        config.to_str().unwrap(),
        "--index",
        index.to_str().unwrap(),
    ]);
    assert!(text(&out).contains("state in etcd v3"), "{}", text(&out));
    let out = install(&config, "etcd", &["--index", index.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(listed(&config).contains("unsigned"));
    let out = install(&config, &url, &[]);
    assert!(out.status.success(), "{}", text(&out));

    // A backend on the installed guest without its grant does not start,
    // and says exactly what to add.
    let backend = format!(
        "[backends.kv]\nguest = \"etcd@sha256:{digest}\"\nconfig = {{ endpoint = \"http://127.0.0.1:2379\" }}\n"
    );
    let refused = write_config(dir.path(), "allow_unsigned = true", &backend);
    let out = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--config",
            refused.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = text(&out);
    assert!(
        said.contains("asks for capabilities the operator has not granted"),
        "{said}"
    );
    assert!(
        said.contains("allow_http = [\"http://HOST:PORT\"]"),
        "{said}"
    );

    // Granted: it starts.
    let granted = format!("{backend}allow_http = [\"http://127.0.0.1:2379\"]\n");
    std::fs::write(dir.path().join("wasmstate.toml"), format!("data_dir = \"data\"\n[marketplace]\nallow_unsigned = true\n[backends.default]\nguest = \"local\"\n{granted}")).unwrap();
    let data = dir.path().join("data");
    let server = Server::with_config_file(&data, &dir.path().join("wasmstate.toml"));
    // Nothing listens on 2379 here: the guest runs and reports it (503).
    let answer = send("GET", &server.state_url("kv", "ws"), None);
    assert_eq!(answer.status, 503, "{}", answer.text());

    // The stored component altered on disk: the next start refuses it.
    drop(server);
    let blob = data.join("guests/blobs").join(format!("{digest}.wasm"));
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes.extend_from_slice(&[0, 4, 3, b'x', b'y', b'z']);
    std::fs::write(&blob, bytes).unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(dir.path().join("wasmstate.toml"))
        .output()
        .unwrap();
    assert!(text(&out).contains("altered on disk"), "{}", text(&out));
}

#[test]
fn sighup_swaps_in_a_new_guest_while_in_flight_requests_finish_on_the_old() {
    let dir = tempdir();
    let misbehave = copy_guest(MISBEHAVE_WASM, dir.path(), "misbehave.wasm");
    let etcd = copy_guest(ETCD_GUEST_WASM, dir.path(), "etcd.wasm");
    let config = write_config(dir.path(), "allow_unsigned = true", "");
    for guest in [&misbehave, &etcd] {
        let out = install(&config, guest.to_str().unwrap(), &[]);
        assert!(out.status.success(), "{}", text(&out));
    }
    let (old, new) = (sha256_of(&misbehave), sha256_of(&etcd));
    let write = |backend: &str| {
        std::fs::write(
            &config,
            format!("data_dir = \"data\"\n[marketplace]\nallow_unsigned = true\n[backends.default]\nguest = \"local\"\n{backend}"),
        )
        .unwrap();
    };
    write(&format!(
        "[backends.swap]\nguest = \"misbehave@sha256:{old}\"\ntimeout_ms = 3000\nconfig = {{ mode = \"loop\" }}\n"
    ));
    let server = Server::with_config_file(&dir.path().join("data"), &config);
    let url = server.state_url("swap", "ws");

    // A request spinning in the old guest...
    let in_flight = {
        let url = url.clone();
        std::thread::spawn(move || send("GET", &url, None))
    };
    wait_until(
        "the old guest to be running",
        Duration::from_secs(30),
        || server.metric("wasmstate_requests_in_flight") >= 2.0,
    );
    // ...while the operator pins the new guest and reloads.
    // (Nothing listens on 2379 in the tests.)
    write(&format!(
        "[backends.swap]\nguest = \"etcd@sha256:{new}\"\nallow_http = [\"http://127.0.0.1:2379\"]\nconfig = {{ endpoint = \"http://127.0.0.1:2379\" }}\n"
    ));
    let pid = server.pid().to_string();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    wait_until("the reload", Duration::from_secs(30), || {
        server.log_text().contains("reload done")
    });
    assert!(server.log_text().contains(&new), "{}", server.log_text());

    // New requests reach the new guest at once (etcd is not there: 503).
    let started = Instant::now();
    let answer = send("GET", &url, None);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the new guest answered slowly"
    );
    assert_eq!(answer.status, 503, "{}", answer.text());
    // The in-flight request finished on the old guest: its deadline.
    let old_answer = in_flight.join().unwrap();
    assert_eq!(old_answer.status, 504, "{}", old_answer.text());
}

const PROBE_WASM: &str = env!("WASMSTATE_FIXTURE_SECRETS_PROBE");

#[test]
fn a_guest_sees_only_the_secrets_its_manifest_asks_for_and_never_the_host_environment() {
    let dir = tempdir();
    let probe = copy_guest(PROBE_WASM, dir.path(), "probe.wasm");
    let config = write_config(dir.path(), "allow_unsigned = true", "");
    let out = install(&config, probe.to_str().unwrap(), &[]);
    assert!(out.status.success(), "{}", text(&out));
    let digest = sha256_of(&probe);
    let with = |secrets: &str| {
        let text = format!(
            "data_dir = \"data\"\n[marketplace]\nallow_unsigned = true\n[backends.probe]\nguest = \"secrets-probe@sha256:{digest}\"\n{secrets}"
        );
        std::fs::write(&config, text).unwrap();
    };

    // TOKEN not provided: the backend does not start, naming it.
    with("");
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        text(&out).contains("secrets.TOKEN = { env = "),
        "{}",
        text(&out)
    );

    // Both provided: it sees TOKEN only, and none of the host's environment.
    with("secrets = { TOKEN = { env = \"PROBE_TOKEN\" }, OTHER = { env = \"PROBE_OTHER\" } }\n");
    let server = Server::with_config_env(
        &dir.path().join("data"),
        &config,
        &[
            ("PROBE_TOKEN", "t0ken"),
            ("PROBE_OTHER", "other"),
            ("HOST_CANARY", "canary"),
        ],
    );
    let seen: serde_json::Value =
        serde_json::from_slice(&send("GET", &format!("{}/states/probe/x", server.url), None).body)
            .unwrap();
    assert_eq!(seen["TOKEN"], "t0ken");
    assert!(seen["OTHER"].is_null(), "{seen}");
    assert_eq!(
        seen["env"],
        serde_json::json!({}),
        "the guest must see no environment: {seen}"
    );
}

#[test]
fn push_to_and_install_from_an_oci_registry_with_signature_and_pin() {
    let registry = Registry::start();
    let dir = tempdir();
    let etcd = copy_guest(ETCD_GUEST_WASM, dir.path(), "etcd.wasm");
    let digest = sha256_of(&etcd);
    let (secret, public) = keygen(dir.path(), "publisher");
    sign(&etcd, &secret);
    let reference = format!("oci://{}/guests/etcd:0.1.0", registry.address);
    let out = cli(&["guest", "push", etcd.to_str().unwrap(), &reference]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("with its signature"), "{}", text(&out));

    let config = write_config(dir.path(), &format!("trusted_keys = [{public:?}]"), "");
    let wrong = format!("{reference}@sha256:{}", "f".repeat(64));
    let out = install(&config, &wrong, &[]);
    assert!(text(&out).contains("digest mismatch"), "{}", text(&out));
    let out = install(&config, &format!("{reference}@sha256:{digest}"), &[]);
    assert!(out.status.success(), "{}", text(&out));
    let list = listed(&config);
    assert!(
        list.contains(&digest) && list.contains("signed by key"),
        "{list}"
    );

    let missing = format!("oci://{}/guests/nope:1", registry.address);
    let out = install(&config, &missing, &[]);
    assert!(
        !out.status.success() && text(&out).contains("cannot pull"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_pin_naming_another_installed_guest_is_refused_at_start() {
    let dir = tempdir();
    let misbehave = copy_guest(MISBEHAVE_WASM, dir.path(), "misbehave.wasm");
    let config = write_config(dir.path(), "allow_unsigned = true", "");
    let out = install(&config, misbehave.to_str().unwrap(), &[]);
    assert!(out.status.success(), "{}", text(&out));
    let digest = sha256_of(&misbehave);
    write_config(
        dir.path(),
        "allow_unsigned = true",
        &format!("[backends.x]\nguest = \"etcd@sha256:{digest}\"\n"),
    );
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out).contains("is the guest \"misbehave\", not \"etcd\""),
        "{}",
        text(&out)
    );
}

/// Send SIGHUP and wait until the server has reloaded `n` times in all.
pub(crate) fn reload(server: &Server, n: usize) {
    let pid = server.pid().to_string();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    wait_until("the reload", Duration::from_secs(30), || {
        server.log_text().matches("reload done").count() >= n
    });
}

mod scopes;
