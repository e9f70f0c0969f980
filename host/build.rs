//! Compiles the first-party guests (and the test fixture guests) to
//! `wasm32-wasip2` components so the host can embed them with
//! `include_bytes!`. Guests are built in release mode into
//! `<target>/wasm-guests`, shared by every host profile, so they are built
//! once. Set `WASMSTATE_GUESTS_DIR` to a folder of prebuilt `.wasm` files to
//! skip the nested build.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// (crate name, env var the host reads the component's path from)
const GUESTS: &[(&str, &str)] = &[
    ("wasmstate-guest-local", "WASMSTATE_GUEST_LOCAL"),
    ("wasmstate-guest-s3-lockfile", "WASMSTATE_GUEST_S3_LOCKFILE"),
    ("wasmstate-guest-dynamodb", "WASMSTATE_GUEST_DYNAMODB"),
    ("wasmstate-guest-git", "WASMSTATE_GUEST_GIT"),
    ("wasmstate-guest-gcs", "WASMSTATE_GUEST_GCS"),
    ("wasmstate-guest-azure", "WASMSTATE_GUEST_AZURE"),
    ("wasmstate-guest-postgres", "WASMSTATE_GUEST_POSTGRES"),
    // Built here only so the tests can find it; it is not embedded.
    ("wasmstate-guest-etcd", "WASMSTATE_EXAMPLE_ETCD"),
    ("wasmstate-fixture-misbehave", "WASMSTATE_FIXTURE_MISBEHAVE"),
    (
        "wasmstate-fixture-future-version",
        "WASMSTATE_FIXTURE_FUTURE_VERSION",
    ),
    ("wasmstate-fixture-hostile", "WASMSTATE_FIXTURE_HOSTILE"),
    (
        "wasmstate-fixture-secrets-probe",
        "WASMSTATE_FIXTURE_SECRETS_PROBE",
    ),
    ("wasmstate-fixture-aws-probe", "WASMSTATE_FIXTURE_AWS_PROBE"),
];
const TARGET: &str = "wasm32-wasip2";

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let workspace = manifest_dir.parent().unwrap().to_path_buf();
    for watched in [
        "wit",
        "sdk",
        "guests",
        "examples/etcd-guest",
        "tests/fixtures",
        "Cargo.lock",
    ] {
        println!(
            "cargo:rerun-if-changed={}",
            workspace.join(watched).display()
        );
    }
    println!("cargo:rerun-if-env-changed=WASMSTATE_GUESTS_DIR");

    let out_dir = match env::var_os("WASMSTATE_GUESTS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => build_guests(&workspace),
    };
    for (krate, var) in GUESTS {
        let file = out_dir.join(format!("{}.wasm", krate.replace('-', "_")));
        if !file.is_file() {
            fail(&format!(
                "guest component {} was not produced",
                file.display()
            ));
        }
        println!("cargo:rustc-env={var}={}", file.display());
    }
}

fn build_guests(workspace: &Path) -> PathBuf {
    let target_root = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    let target_dir = target_root.join("wasm-guests");
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    ensure_wasm_target();

    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace)
        .args(["build", "--release", "--target", TARGET, "--target-dir"])
        .arg(&target_dir)
        // Guests are embedded in the binary and compiled at startup: no
        // DWARF (the AWS SDK's would make them 40-50 MB). Function names
        // stay, so a trap's backtrace is still readable.
        .args(["--config", "profile.release.debug=false"])
        .args(["--config", "profile.release.strip=\"debuginfo\""]);
    for (krate, _) in GUESTS {
        cmd.args(["-p", krate]);
    }
    // The outer build's flags and wrappers are for the host target; the guest
    // build must not inherit them (clippy's wrapper would also make every
    // `cargo clippy` rebuild the guests).
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_PRIMARY_PACKAGE",
    ] {
        cmd.env_remove(var);
    }
    let output = cmd
        .output()
        .unwrap_or_else(|e| fail(&format!("could not run cargo to build the guests: {e}")));
    if !output.status.success() {
        let log = String::from_utf8_lossy(&output.stderr);
        fail(&format!(
            "building the wasm guests failed; cargo said:\n\n{log}"
        ));
    }
    target_dir.join(TARGET).join("release")
}

/// rustup installs `rust-toolchain.toml`'s targets only when it installs the
/// toolchain itself; a machine that already had the toolchain lacks the wasm
/// target. Add it here so `cargo run`/`cargo test` work on any machine.
fn ensure_wasm_target() {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let sysroot = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let target_dir = sysroot.map(|s| s.join("lib/rustlib").join(TARGET));
    if let Some(dir) = &target_dir {
        // Cargo replays a build script's warnings on every build until the
        // script runs again. Installing changes this folder, so the next
        // build reruns the script once and the notice below is not
        // repeated: it shows only on the build that installs.
        println!("cargo:rerun-if-changed={}", dir.display());
    }
    if target_dir.is_some_and(|dir| dir.is_dir()) {
        return;
    }
    println!(
        "cargo:warning=installing the {TARGET} target with rustup (first build on this machine)"
    );
    let status = Command::new("rustup")
        .args(["target", "add", TARGET])
        .status();
    if !matches!(status, Ok(s) if s.success()) {
        fail(&format!(
            "the {TARGET} target is missing and `rustup target add {TARGET}` failed; \
             install it by hand and build again"
        ));
    }
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    panic!(
        "wasmstate build script: {}",
        message.lines().next().unwrap_or(message)
    );
}
