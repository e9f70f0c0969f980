//! Trust boundaries: what storage hands back under encryption, what the
//! compiled-code cache may run, what a granted name connects to, and the
//! modes of what the host writes. Each test plays the attacker the
//! defence is against (a guest's storage, someone able to write the cache,
//! DNS) with real files and processes.

use crate::common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Where the `local` guest keeps a workspace's state under `dir`.
fn state_file(dir: &Path, workspace: &str) -> PathBuf {
    dir.join(workspace).join("terraform.tfstate")
}

#[test]
fn under_encryption_storage_cannot_substitute_what_it_hands_back() {
    let root = tempdir();
    let (store, twin) = (root.path().join("store"), root.path().join("twin"));
    let key = key_file(root.path());
    let keys = format!("encryption = {{ keys = [{{ id = \"k1\", file = {key:?} }}] }}");
    let config = format!(
        "[backends.main]\nguest = \"local\"\ndir = {store:?}\n{keys}\n\
         [backends.twin]\nguest = \"local\"\ndir = {twin:?}\n{keys}\n"
    );
    let data = root.path().join("data");
    let server = Server::with_config(&data, &config);
    let url = |backend: &str, ws: &str| server.state_url(backend, ws);
    let post = |u: String, serial: u64| {
        let answer = send("POST", &u, Some(&state(serial)));
        assert_eq!(answer.status, 200, "{}", answer.text());
    };
    post(url("main", "a"), 1);
    let older = std::fs::read(state_file(&store, "a")).unwrap();
    post(url("main", "a"), 2);
    let genuine = std::fs::read(state_file(&store, "a")).unwrap();
    // Same lineage and serial elsewhere: only the binding tells them apart.
    post(url("main", "b"), 2);
    post(url("twin", "a"), 2);

    let refused = |what: &str, bytes: &[u8], expected: &str| {
        std::fs::write(state_file(&store, "a"), bytes).unwrap();
        let answer = send("GET", &url("main", "a"), None);
        assert_eq!(answer.status, 500, "{what}: {}", answer.text());
        assert!(
            answer.text().contains(expected),
            "{what}: expected {expected:?} in {}",
            answer.text()
        );
        assert_ne!(answer.body, state(2), "{what}");
    };
    refused("a plain state", &state(2), "is not sealed");
    refused(
        "another workspace's envelope",
        &std::fs::read(state_file(&store, "b")).unwrap(),
        "for main/a",
    );
    refused(
        "another backend's envelope",
        &std::fs::read(state_file(&twin, "a")).unwrap(),
        "for main/a",
    );
    refused("an older envelope", &older, "refused as a rollback");
    // The genuine envelope still opens.
    std::fs::write(state_file(&store, "a"), &genuine).unwrap();
    assert_eq!(send("GET", &url("main", "a"), None).body, state(2));
    drop(server);

    // After a restart the host's history still knows serial 2.
    std::fs::write(state_file(&store, "a"), &older).unwrap();
    let server = Server::with_config(&data, &config);
    let answer = send("GET", &server.state_url("main", "a"), None);
    assert_eq!(answer.status, 500, "{}", answer.text());
    assert!(
        answer.text().contains("refused as a rollback"),
        "{}",
        answer.text()
    );
}

/// Issue 47, security 4: with encryption on, a read of a name with no
/// state left a rollback mark behind and asked for the version history
/// first, so a read-only caller looping random names grew host memory
/// outside every budget, with two storage calls a read. Now such a read
/// costs one guest call and leaves no mark (`wasmstate_rollback_marks`).
#[test]
fn reads_of_names_without_a_state_leave_no_mark_and_cost_one_call() {
    let root = tempdir();
    let store = root.path().join("store");
    let key = key_file(root.path());
    let config = format!(
        "[backends.main]\nguest = \"local\"\ndir = {store:?}\n\
         encryption = {{ keys = [{{ id = \"k1\", file = {key:?} }}] }}\n"
    );
    let server = Server::with_config(&root.path().join("data"), &config);
    let marks = r#"wasmstate_rollback_marks{backend="main"}"#;
    let calls = r#"wasmstate_guest_call_seconds_count{backend="main"}"#;
    // A workspace with a state has its mark.
    let url = server.state_url("main", "real");
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);
    assert_eq!(send("GET", &url, None).status, 200);
    assert_eq!(server.metric(marks), 1.0);

    let before = server.metric(calls);
    let mut rng = Rng::new(unique());
    let reads = 2_000;
    for _ in 0..reads {
        let name = format!("probe-{:016x}", rng.next());
        let answer = send("GET", &server.state_url("main", &name), None);
        assert!(answer.status < 500, "{name}: {}", answer.text());
    }
    assert_eq!(
        server.metric(marks),
        1.0,
        "reads of names without a state left marks"
    );
    let spent = server.metric(calls) - before;
    assert!(
        spent <= f64::from(reads),
        "{spent} guest calls for {reads} reads of absent names"
    );
    // The workspace with a state is still guarded.
    assert_eq!(send("GET", &url, None).body, state(1));
}

/// The cached compilation of the guest with digest `sha256` in `cache`.
fn cached(cache: &Path, sha256: &str) -> PathBuf {
    std::fs::read_dir(cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with(sha256) && name.ends_with(".cwasm")
        })
        .unwrap_or_else(|| panic!("no compiled guest {sha256} in {}", cache.display()))
}

fn swap(a: &Path, b: &Path) {
    let temp = a.with_extension("swap");
    std::fs::rename(a, &temp).unwrap();
    std::fs::rename(b, a).unwrap();
    std::fs::rename(&temp, b).unwrap();
}

#[test]
fn swapped_compiled_guests_are_compiled_again_never_run() {
    let root = tempdir();
    let cache = root.path().join("cache");
    let config = format!(
        "[backends.store]\nguest = {ETCD_GUEST_WASM:?}\nconfig = {{ endpoint = \"http://127.0.0.1:9\" }}\n\
         allow_http = [\"http://127.0.0.1:9\"]\n\
         [backends.trap]\nguest = {MISBEHAVE_WASM:?}\nconfig = {{ mode = \"trap\" }}\n"
    );
    let data = root.path().join("data");
    // Each guest answers in its own way: etcd cannot reach port 9 (503),
    // the trap guest crashes (500).
    let behaves = |server: &Server| {
        let store = send("GET", &server.state_url("store", "ws"), None);
        assert_eq!(store.status, 503, "etcd guest: {}", store.text());
        let trap = send("GET", &server.state_url("trap", "ws"), None);
        assert_eq!(trap.status, 500, "trap guest: {}", trap.text());
        assert!(trap.text().contains("guest crashed"), "{}", trap.text());
    };
    let refusals = |server: &Server| {
        server
            .log_text()
            .matches("does not carry this host's MAC")
            .count()
    };
    let server = Server::with_cache(&data, &config, &cache);
    behaves(&server);
    drop(server);
    let store = cached(&cache, &sha256_of(ETCD_GUEST_WASM));
    let trap = cached(&cache, &sha256_of(MISBEHAVE_WASM));
    let mac = |p: &Path| p.with_extension("cwasm.mac");

    // The machine code swapped: neither MAC fits; both compiled again.
    swap(&store, &trap);
    let server = Server::with_cache(&data, &config, &cache);
    behaves(&server);
    assert_eq!(refusals(&server), 2, "{}", server.log_text());
    drop(server);

    // Machine code and MACs swapped together: each MAC binds the source's
    // digest too, so still refused.
    swap(&store, &trap);
    swap(&mac(&store), &mac(&trap));
    let server = Server::with_cache(&data, &config, &cache);
    behaves(&server);
    assert_eq!(refusals(&server), 2, "{}", server.log_text());
    drop(server);

    // Compiled again and vouched for: the next start maps them as they are.
    let server = Server::with_cache(&data, &config, &cache);
    behaves(&server);
    assert_eq!(refusals(&server), 0, "{}", server.log_text());
    // Entries another host wrote (another key) are refused the same way.
    drop(server);
    std::fs::write(data.join("cache.key"), [7u8; 32]).unwrap();
    let server = Server::with_cache(&data, &config, &cache);
    behaves(&server);
    assert_eq!(refusals(&server), 2, "{}", server.log_text());
}

#[test]
fn a_backend_directory_overlapping_the_hosts_own_is_refused() {
    let root = tempdir();
    let data = root.path().join("data");
    for (dir, names) in [
        (data.clone(), "the data directory"),
        (data.join("cache"), "the compiled-guest cache"),
        (root.path().to_path_buf(), "the data directory"),
    ] {
        std::fs::create_dir_all(&data).unwrap();
        let config = data.join("wasmstate.toml");
        std::fs::write(
            &config,
            format!("[backends.x]\nguest = \"local\"\ndir = {dir:?}\n"),
        )
        .unwrap();
        let (ok, out) = wasmstate(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ]);
        assert!(!ok, "{} was accepted: {out}", dir.display());
        assert!(out.contains(names), "{}: {out}", dir.display());
    }
}

#[test]
fn a_granted_name_reaches_an_internal_address_only_when_that_address_is_granted() {
    let listener = Canary::start();
    let origin = format!("http://localhost:{}", listener.addr.port());
    let root = tempdir();
    let config = |addresses: &str| {
        format!(
            "[backends.kv]\nguest = {ETCD_GUEST_WASM:?}\nallow_http = [{origin:?}]\n{addresses}\n\
             config = {{ endpoint = {origin:?} }}\n"
        )
    };
    // Granted by name only: refused on the address, never connected.
    let server = Server::with_config(&root.path().join("a"), &config(""));
    let answer = send("GET", &server.state_url("kv", "ws"), None);
    assert!(answer.status >= 500, "{} {}", answer.status, answer.text());
    assert_eq!(listener.connections(), 0);
    assert!(
        server
            .log_text()
            .contains("an internal address nobody granted"),
        "{}",
        server.log_text()
    );
    drop(server);
    // The operator grants loopback by address: the same name connects.
    let server = Server::with_config(
        &root.path().join("b"),
        &config("allow_http_addresses = [\"127.0.0.1\", \"::1\"]"),
    );
    let _ = send("GET", &server.state_url("kv", "ws"), None);
    assert!(listener.connections() >= 1, "{}", server.log_text());
}

/// The permission bits of every file and directory under `dir`.
fn modes_under(dir: &Path) -> Vec<(PathBuf, u32)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        out.push((path.clone(), meta.permissions().mode() & 0o777));
        if meta.is_dir() {
            out.extend(modes_under(&path));
        }
    }
    out
}

#[test]
fn what_the_host_writes_is_its_owners_alone_whatever_the_umask() {
    let root = tempdir();
    let store = root.path().join("store");
    let key = key_file(root.path());
    let data = root.path().join("data");
    let cache = root.path().join("cache");
    let config = format!(
        "[backends.default]\nguest = \"local\"\ndir = {store:?}\n\
         encryption = {{ keys = [{{ id = \"k1\", file = {key:?} }}] }}\n"
    );
    // Started as a shell with a permissive umask would start it.
    let config_path = root.path().join("wasmstate.toml");
    std::fs::write(&config_path, &config).unwrap();
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg("umask 000 && exec \"$@\"")
        .arg("sh")
        .arg(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .arg("--cache-dir")
        .arg(&cache)
        .arg("--config")
        .arg(&config_path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    let url = first
        .trim()
        .strip_prefix("wasmstate listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {first}"))
        .to_string();
    let ws = format!("{url}/states/default/ws");
    assert_eq!(send("POST", &ws, Some(&state(1))).status, 200);
    assert_eq!(send("LOCK", &ws, Some(&lock_info("l", "me"))).status, 200);
    let _ = child.kill();
    let _ = child.wait();
    let mut seen = 0;
    for dir in [&store, &data, &cache] {
        for (path, mode) in modes_under(dir) {
            seen += 1;
            assert_eq!(
                mode & 0o077,
                0,
                "{} is mode {mode:o}: readable by others",
                path.display()
            );
        }
    }
    // States, the lock, the history, the cache key and compiled guests.
    assert!(seen >= 6, "only {seen} files written");
}
