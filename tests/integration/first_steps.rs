//! What an operator meets first, from the docs alone: a key file made
//! owner-only and a warning for one that is not, and a start banner whose
//! Terraform address a client can use even when the server listens on
//! every address.

use crate::common::*;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// `wasmstate check-config CONFIG`: (success, stdout + stderr).
fn check_config(config: &Path) -> (bool, String) {
    wasmstate(&["check-config", config.to_str().unwrap()])
}

/// The lines of `text` that tell how to fix a readable `key`.
fn warnings_for<'a>(text: &'a str, key: &Path) -> Vec<&'a str> {
    let fix = format!("chmod 600 {}", key.display());
    text.lines().filter(|l| l.contains(&fix)).collect()
}

#[test]
fn generate_key_out_writes_an_owner_only_key_and_a_readable_one_is_warned_about() {
    let dir = tempdir();
    let key = dir.path().join("k1.key");
    let (ok, out) = wasmstate(&["generate-key", "--out", key.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert_eq!(mode_of(&key), 0o600, "{out}");
    let material = std::fs::read_to_string(&key).unwrap();
    assert!(
        !out.contains(material.trim()),
        "the key is not printed: {out}"
    );
    // A key in use is never replaced.
    let (ok, out) = wasmstate(&["generate-key", "--out", key.to_str().unwrap()]);
    assert!(!ok && out.contains("exists"), "{out}");
    assert_eq!(std::fs::read_to_string(&key).unwrap(), material);

    // The key works, and an owner-only key draws no warning.
    let config = dir.path().join("wasmstate.toml");
    let store = dir.path().join("store");
    std::fs::write(
        &config,
        format!(
            "[backends.prod]\nguest = \"local\"\ndir = {store:?}\n\
             encryption = {{ keys = [{{ id = \"k1\", file = {key:?} }}] }}\n"
        ),
    )
    .unwrap();
    let (ok, out) = check_config(&config);
    assert!(ok && out.contains("configuration OK"), "{out}");
    assert!(warnings_for(&out, &key).is_empty(), "{out}");

    // What `generate-key > k1.key` leaves under a common umask.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (ok, out) = check_config(&config);
    assert!(ok, "a warning, not a refusal: {out}");
    let warned = warnings_for(&out, &key);
    assert_eq!(
        warned.len(),
        1,
        "one line naming the file and the fix: {out}"
    );
    assert!(
        warned[0].contains("readable by its group or others"),
        "{out}"
    );
    assert!(
        !out.contains(material.trim()),
        "never the key itself: {out}"
    );
    // And `serve` says it at its start.
    let server = Server::with_config_file(&dir.path().join("data"), &config);
    assert_eq!(warnings_for(&server.log_text(), &key).len(), 1);
}

/// A `serve` killed on drop.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What `serve --listen LISTEN --config CONFIG` prints, up to the end of
/// its Terraform snippet.
fn banner(config: &Path, listen: &str) -> Vec<String> {
    let data = tempdir();
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", listen, "--config"])
        .arg(config)
        .arg("--data-dir")
        .arg(data.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let log = capture(child.stderr.take().unwrap());
    let _running = Running(child);
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        match lines.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                let done = line == "}";
                seen.push(line);
                if done {
                    return seen;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    panic!(
        "no whole banner: {seen:?}\n--- its log ---\n{}",
        log.lock().unwrap()
    );
}

/// The `address = "…"` of a banner.
fn address(banner: &[String]) -> String {
    banner
        .iter()
        .find_map(|l| l.trim().strip_prefix("address        = "))
        .unwrap_or_else(|| panic!("no address in {banner:?}"))
        .trim_matches('"')
        .to_string()
}

#[test]
fn a_wildcard_listen_prints_an_address_a_client_can_use() {
    let dir = tempdir();
    let (_, sha256) = generate_token();
    let tokens =
        format!("[[tokens]]\nname = \"ci\"\nsha256 = \"{sha256}\"\ngrants = [\"*:*:admin\"]\n");
    let config = dir.path().join("wasmstate.toml");
    std::fs::write(
        &config,
        format!("{tokens}[backends.default]\nguest = \"local\"\n"),
    )
    .unwrap();
    // Where a client reaches this machine: its name, else loopback.
    let machine = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|n| n.trim().to_string())
        .ok()
        .filter(|n| !n.is_empty() && n != "(none)" && n != "localhost");
    for (listen, wildcard, fallback) in [
        ("0.0.0.0:0", "0.0.0.0", "127.0.0.1"),
        ("[::]:0", "[::]", "[::1]"),
    ] {
        let lines = banner(&config, listen);
        let text = lines.join("\n");
        let port = lines[0]
            .strip_prefix(&format!("wasmstate listening on http://{wildcard}:"))
            .unwrap_or_else(|| panic!("the first line stays the bound address: {text}"));
        let host = machine.as_deref().unwrap_or(fallback);
        assert_eq!(
            address(&lines),
            format!("http://{host}:{port}/states/default/default"),
            "{text}"
        );
        assert!(!address(&lines).contains(wildcard), "{text}");
        assert!(
            text.contains(&format!(
                "use {}",
                machine.as_deref().map_or(fallback.to_string(), |m| format!(
                    "this machine's name, {m}"
                ))
            )) && text.contains("replace it"),
            "says what to replace: {text}"
        );
    }
    // The name the operator gave is used as it is, with nothing to replace.
    std::fs::write(
        &config,
        format!(
            "{tokens}[network]\nserver_names = [\"state.example.com\"]\n\
             [backends.default]\nguest = \"local\"\n"
        ),
    )
    .unwrap();
    let lines = banner(&config, "0.0.0.0:0");
    let port = lines[0].rsplit(':').next().unwrap().to_string();
    assert_eq!(
        address(&lines),
        format!("http://state.example.com:{port}/states/default/default")
    );
    assert!(!lines.join("\n").contains("replace it"), "{lines:?}");
}
