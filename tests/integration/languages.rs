//! Guests in any language, from nothing: `wasmstate guest new NAME --lang
//! rust|python|js` writes a template; the real toolchains build it
//! (cargo for wasm32-wasip2, componentize-py 0.25.1 from PyPI,
//! componentize-js 0.23.0 from npm, each installed and version-checked by
//! the harness); the conformance kit passes unchanged (20/20); the embedded
//! manifest is read back; and a real `terraform apply` is served through it.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The PATH the templates' build scripts run with: `wasmstate` (for
/// `guest embed-manifest`) and `extra` first.
fn path_with(extra: &[&Path]) -> String {
    let bin = Path::new(BIN).parent().unwrap();
    let mut parts: Vec<String> = extra.iter().map(|p| p.display().to_string()).collect();
    parts.push(bin.display().to_string());
    parts.push(std::env::var("PATH").unwrap_or_default());
    parts.join(":")
}

/// Run `command`, which must succeed; its output otherwise.
fn must(what: &str, command: &mut Command) {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `wasmstate guest new NAME --lang LANG --dir DIR`.
fn template(lang: &str, name: &str, dir: &Path, extra: &[&str]) {
    let mut args = vec![
        "guest",
        "new",
        name,
        "--lang",
        lang,
        "--dir",
        dir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let (ok, out) = wasmstate(&args);
    assert!(ok, "{out}");
    assert!(out.contains("next:"), "{out}");
}

/// The kit on `wasm` must pass every case; its report.
fn passes_the_kit(wasm: &Path) -> String {
    let (ok, out) = wasmstate(&["guest", "test", wasm.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert_eq!(summary(&out), "21 passed, 0 failed", "{out}");
    out
}

/// `guest inspect` reads the manifest the template embedded.
fn carries_its_manifest(wasm: &Path, name: &str) {
    let (ok, out) = wasmstate(&["guest", "inspect", wasm.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(out.contains(name), "{out}");
    assert!(out.contains("directory     true"), "{out}");
}

/// A real `terraform apply` through a backend on `wasm`.
fn serves_terraform(wasm: &Path) {
    let root = tempdir();
    let store = root.path().join("store");
    let server = Server::with_config(
        &root.path().join("data"),
        &format!("[backends.lang]\nguest = {wasm:?}\ndir = {store:?}\n"),
    );
    let work = tempdir();
    crate::terraform::apply_and_check(work.path(), &server.state_url("lang", "tf"), &server);
    assert!(
        store.join("tf/terraform.tfstate").is_file(),
        "the state is in the guest's layout"
    );
}

#[test]
fn a_python_guest_from_the_template_passes_the_kit_and_serves_terraform() {
    let venv = tools::python_env();
    let root = tempdir();
    let dir = root.path().join("py-guest");
    template("python", "py-guest", &dir, &[]);
    must(
        "./build.sh",
        Command::new(dir.join("build.sh"))
            .current_dir(&dir)
            .env("PATH", path_with(&[&venv.dir().join("bin")])),
    );
    let wasm = dir.join("guest.wasm");
    passes_the_kit(&wasm);
    carries_its_manifest(&wasm, "py-guest");
    serves_terraform(&wasm);
}

#[test]
fn a_javascript_guest_from_the_template_passes_the_kit_and_serves_terraform() {
    let modules = tools::node_modules();
    let root = tempdir();
    let dir = root.path().join("js-guest");
    template("js", "js-guest", &dir, &[]);
    // What `npm ci` in the new folder installs, from the same lockfile.
    std::os::unix::fs::symlink(modules, dir.join("node_modules")).unwrap();
    must(
        "npm run build",
        Command::new("npm")
            .args(["run", "build", "--silent"])
            .current_dir(&dir)
            .env("PATH", path_with(&[])),
    );
    let wasm = dir.join("guest.wasm");
    passes_the_kit(&wasm);
    carries_its_manifest(&wasm, "js-guest");
    serves_terraform(&wasm);
}

#[test]
fn a_rust_guest_from_the_template_passes_the_kit_and_serves_terraform() {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let root = tempdir();
    let dir = root.path().join("rust-guest");
    let sdk = workspace.join("sdk");
    template(
        "rust",
        "rust-guest",
        &dir,
        &["--sdk", sdk.to_str().unwrap()],
    );
    // The workspace's lockfile and the guests' target folder: the SDK and
    // its dependencies are already built there, at the same versions.
    std::fs::copy(workspace.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let target = workspace.join("target/wasm-guests");
    must(
        "cargo build --target wasm32-wasip2",
        Command::new(env!("CARGO"))
            .args([
                "build",
                "--release",
                "--target",
                "wasm32-wasip2",
                "--target-dir",
            ])
            .arg(&target)
            .args(["--config", "profile.release.debug=false"])
            .args(["--config", "profile.release.strip=\"debuginfo\""])
            .current_dir(&dir)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_TARGET_DIR"),
    );
    let wasm = target.join("wasm32-wasip2/release/rust_guest.wasm");
    passes_the_kit(&wasm);
    carries_its_manifest(&wasm, "rust-guest");
    serves_terraform(&wasm);
}

#[test]
fn a_template_never_overwrites_and_rust_asks_for_the_sdk() {
    let root = tempdir();
    let dir = root.path().join("taken");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("keep.txt"), "mine").unwrap();
    let (ok, out) = wasmstate(&[
        "guest",
        "new",
        "x",
        "--lang",
        "js",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert!(!ok && out.contains("not empty"), "{out}");
    assert_eq!(
        std::fs::read_to_string(dir.join("keep.txt")).unwrap(),
        "mine"
    );
    let fresh = root.path().join("fresh");
    let (ok, out) = wasmstate(&[
        "guest",
        "new",
        "x",
        "--lang",
        "rust",
        "--dir",
        fresh.to_str().unwrap(),
    ]);
    assert!(!ok && out.contains("--sdk PATH"), "{out}");
    let (ok, out) = wasmstate(&["guest", "new", "Bad_Name", "--lang", "python"]);
    assert!(!ok, "{out}");
}
