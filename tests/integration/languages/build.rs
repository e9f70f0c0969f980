//! Templates written by `wasmstate guest new` and built by the real
//! toolchains, as an author builds them.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

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
pub(super) fn must(what: &str, command: &mut Command) {
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
pub(super) fn template(lang: &str, name: &str, dir: &Path, extra: &[&str]) {
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

/// Where this test run builds templates: a folder of its own under the
/// target's temporary directory, as the built guests must outlive the
/// tests that share them (a `TempDir` in a static is never dropped, and
/// each build is about 20 MB). The folders of earlier runs whose process
/// is gone are removed first, so what a run leaves is bounded by one run.
fn builds_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let all = Path::new(env!("CARGO_TARGET_TMPDIR")).join("languages");
        for entry in std::fs::read_dir(&all).into_iter().flatten().flatten() {
            let pid = entry.file_name();
            let alive = Path::new("/proc").join(&pid).exists();
            if !alive && pid.to_str().is_some_and(|p| p.parse::<u32>().is_ok()) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let own = all.join(std::process::id().to_string());
        std::fs::create_dir_all(&own).unwrap();
        own
    })
}

/// Build the `lang` template (python or js) in a folder that lives as long
/// as the test run, after `edit(dir)`; the component's path.
pub(super) fn build_template(lang: &str, name: &str, edit: impl FnOnce(&Path)) -> PathBuf {
    let dir = tempfile::Builder::new()
        .prefix("wasmstate-lang-")
        .tempdir_in(builds_root())
        .unwrap()
        .keep()
        .join(name);
    template(lang, name, &dir, &[]);
    edit(&dir);
    if lang == "python" {
        let venv = tools::python_env();
        must(
            "./build.sh",
            Command::new(dir.join("build.sh"))
                .current_dir(&dir)
                .env("PATH", path_with(&[&venv.dir().join("bin")])),
        );
    } else {
        // What `npm ci` in the new folder installs, from the same lockfile.
        std::os::unix::fs::symlink(tools::node_modules(), dir.join("node_modules")).unwrap();
        must(
            "npm run build",
            Command::new("npm")
                .args(["run", "build", "--silent"])
                .current_dir(&dir)
                .env("PATH", path_with(&[])),
        );
    }
    dir.join("guest.wasm")
}

/// The unmodified template of `lang`, built once per test run (a build
/// takes 10 to 25 s).
pub(super) fn built(lang: &'static str) -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    static JS: OnceLock<PathBuf> = OnceLock::new();
    let (cell, name) = match lang {
        "python" => (&PYTHON, "py-guest"),
        _ => (&JS, "js-guest"),
    };
    cell.get_or_init(|| build_template(lang, name, |_| {}))
}

/// Replace `from` (which must be there) with `to` in `file`.
pub(super) fn edit_file(file: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(file).unwrap();
    assert!(
        text.contains(from),
        "{} no longer has {from:?}",
        file.display()
    );
    std::fs::write(file, text.replacen(from, to, 1)).unwrap();
}
