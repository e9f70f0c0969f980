//! The conformance kit, run through the `wasmstate guest test` command as a
//! guest author would run it.

use crate::common::*;

#[test]
fn the_local_guest_passes_the_kit() {
    let (ok, out) = wasmstate(&["guest", "test", "local"]);
    assert!(ok, "{out}");
    assert!(!out.contains("FAIL"), "{out}");
    let last = summary(&out);
    assert!(last.ends_with("passed, 0 failed"), "{out}");
    let passed: usize = last.split(' ').next().unwrap().parse().unwrap();
    assert!(passed >= 20, "{out}");
}

/// `wasmstate guest test ARGS` with WASMSTATE_LOG unset: (stdout, stderr).
fn kit_streams(args: &[&str]) -> (String, String) {
    let out = std::process::Command::new(BIN)
        .args(["guest", "test"])
        .args(args)
        .env_remove("WASMSTATE_LOG")
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_kit_prints_only_its_cases_and_the_log_only_when_asked() {
    let (stdout, stderr) = kit_streams(&["local"]);
    assert_eq!(stderr, "", "no log lines among the cases");
    for line in stdout.lines() {
        assert!(
            line.starts_with("PASS  ")
                || line.starts_with("memory cap: ")
                || line.ends_with(" passed, 0 failed"),
            "only the kit's own lines: {line:?}\n{stdout}"
        );
    }
    assert!(summary(&stdout).ends_with(" passed, 0 failed"), "{stdout}");
    // A failing guest's report says where the log is.
    let (stdout, stderr) = kit_streams(&[MISBEHAVE_WASM, "--config", "mode=trap"]);
    assert_eq!(stderr, "", "{stdout}");
    assert!(stdout.contains("add --verbose"), "{stdout}");
    // --verbose brings the host's log back, on stderr only.
    let (stdout, stderr) = kit_streams(&["local", "--verbose"]);
    assert!(stderr.contains(" INFO "), "{stderr}");
    assert!(!stdout.contains(" INFO "), "{stdout}");
}

#[test]
fn a_crashing_guest_fails_the_kit_with_reasons() {
    let (ok, out) = wasmstate(&["guest", "test", MISBEHAVE_WASM, "--config", "mode=trap"]);
    assert!(!ok, "the kit must exit non-zero:\n{out}");
    assert!(
        out.contains("FAIL  read of a missing workspace returns no state: read: guest crashed"),
        "{out}"
    );
    assert!(!summary(&out).ends_with(" 0 failed"), "{out}");
}

#[test]
fn a_guest_for_another_wit_version_is_refused_at_load() {
    let dir = tempdir();
    let config = dir.path().join("future.toml");
    std::fs::write(
        &config,
        format!("[backends.future]\nguest = \"{FUTURE_VERSION_WASM}\"\n"),
    )
    .unwrap();
    let (ok, out) = wasmstate(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        dir.path().join("data").to_str().unwrap(),
    ]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("guest is built for wasmstate:backend@9.0.0, but this host supports wasmstate:backend@0.3.0, 0.2.1, 0.2.0, 0.1.0"),
        "{out}"
    );
    let (ok, out) = wasmstate(&["guest", "test", FUTURE_VERSION_WASM]);
    assert!(!ok && out.contains("wasmstate:backend@0.3.0"), "{out}");
}

/// The `local` guest as the 0.1.0 SDK built it (states passed whole), from
/// the sources at the last 0.1.0 commit: see `tests/fixtures/v0.1.0/`.
pub const V0_1_0_LOCAL_WASM: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/v0.1.0/local.wasm"
);

#[test]
fn a_guest_built_for_0_1_0_passes_the_kit_but_the_big_state_and_says_so() {
    // 0.1.0 passed states whole: such a guest holds each one in its memory,
    // so a state larger than its cap is the one case it cannot pass.
    let (ok, out) = wasmstate(&["guest", "test", V0_1_0_LOCAL_WASM]);
    assert!(!ok, "{out}");
    assert_eq!(summary(&out), "24 passed, 1 failed", "{out}");
    assert!(
        out.contains("FAIL  a state larger than the memory cap round-trips both ways"),
        "{out}"
    );
    let (ok, out) = wasmstate(&["guest", "inspect", V0_1_0_LOCAL_WASM]);
    assert!(ok, "{out}");
    assert!(out.contains("wit           0.1.0 (supported;"), "{out}");
    assert!(out.contains("wasmstate:backend/storage@0.1.0"), "{out}");
}

#[test]
fn guest_bench_measures_latency_and_peak_memory_per_size() {
    let (ok, out) = wasmstate(&[
        "guest",
        "bench",
        "local",
        "--size-kib",
        "64",
        "--size-kib",
        "2048",
        "--runs",
        "2",
    ]);
    assert!(ok, "{out}");
    assert!(
        out.contains("write median") && out.contains("peak memory"),
        "{out}"
    );
    for size in ["64 KiB", "2 MiB"] {
        let row = out
            .lines()
            .find(|l| l.trim_start().starts_with(size))
            .unwrap_or_else(|| panic!("no row for {size}:\n{out}"));
        // The local guest streams: its peak is a few MiB, above zero.
        let peak: f64 = row
            .split_whitespace()
            .rev()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no peak memory in {row:?}"));
        assert!(peak > 0.0 && peak < 64.0, "{row}");
    }
}

/// The `local` guest as the 0.2.0 SDK built it: see `tests/fixtures/v0.2.0/`.
const V0_2_0_LOCAL_WASM: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/v0.2.0/local.wasm"
);

/// The `local` guest as the 0.2.1 SDK built it: see `tests/fixtures/v0.2.1/`.
pub const V0_2_1_LOCAL_WASM: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/v0.2.1/local.wasm"
);

#[test]
fn guests_built_for_0_2_x_are_served_through_the_0_2_1_adapter_and_pass_everything() {
    for (version, wasm) in [("0.2.1", V0_2_1_LOCAL_WASM), ("0.2.0", V0_2_0_LOCAL_WASM)] {
        let (ok, out) = wasmstate(&["guest", "test", wasm]);
        assert!(ok, "{version}: {out}");
        assert!(!out.contains("FAIL"), "{version}: {out}");
        let last = summary(&out);
        assert!(last.ends_with(" passed, 0 failed"), "{version}: {out}");
        let passed: usize = last.split(' ').next().unwrap().parse().unwrap();
        assert!(passed >= 25, "{version}: {out}");
        let (ok, out) = wasmstate(&["guest", "inspect", wasm]);
        assert!(ok, "{out}");
        assert!(
            out.contains(&format!(
                "wit           {version} (supported; no conditional writes"
            )),
            "{out}"
        );
        assert!(
            out.contains(&format!("wasmstate:backend/storage@{version}")),
            "{out}"
        );
        // And a real server takes states through it: written, read back,
        // and an unlocked write to a workspace a client holds refused.
        let root = tempdir();
        let server = Server::with_config(
            &root.path().join("data"),
            &format!(
                "[backends.old]\nguest = {wasm:?}\ndir = {:?}\n",
                root.path().join("store")
            ),
        );
        let url = server.state_url("old", "ws");
        assert_eq!(send("POST", &url, Some(&state(3))).status, 200);
        assert_eq!(send("GET", &url, None).body, state(3));
        let held = lock_info("held-by-a-client", "ci@elsewhere");
        assert_eq!(send("LOCK", &url, Some(&held)).status, 200);
        assert_eq!(send("POST", &url, Some(&state(4))).status, 423);
        let under_lock = format!("{url}?ID=held-by-a-client");
        assert_eq!(send("POST", &under_lock, Some(&state(4))).status, 200);
        assert_eq!(send("GET", &url, None).body, state(4));
        assert_eq!(send("UNLOCK", &url, Some(&held)).status, 200);
    }
}
