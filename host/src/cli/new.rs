//! `wasmstate guest new` and `wasmstate guest embed-manifest`: a working
//! guest to start from in Rust, Python or JavaScript, and the manifest for
//! toolchains that cannot embed one themselves.

use crate::marketplace::manifest::{self, Manifest};
use anyhow::Context;
use std::path::Path;

/// A guest's source language.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// The `wasmstate-guest` SDK (cargo, `wasm32-wasip2`).
    Rust,
    /// componentize-py 0.25.1.
    Python,
    /// componentize-js 0.23.0.
    Js,
}

impl std::fmt::Display for Lang {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Lang::Rust => "Rust",
            Lang::Python => "Python",
            Lang::Js => "JavaScript",
        })
    }
}

/// One file of a template: its path, its text (`{{guest-name}}` and
/// `{{sdk-path}}` replaced, placeholders no shipped text contains: the WIT
/// files' comments say `NAME` and `PATH`), and whether it is a script to run.
type File = (&'static str, &'static str, bool);

/// The contract, as shipped: what non-Rust toolchains build against.
const WIT: &[File] = &[
    (
        "wit/backend.wit",
        include_str!("../../../wit/backend.wit"),
        false,
    ),
    (
        "wit/guest.wit",
        include_str!("../../../wit/guest.wit"),
        false,
    ),
    (
        "wit/deps/cli.wit",
        include_str!("../../../wit/deps/cli.wit"),
        false,
    ),
    (
        "wit/deps/clocks.wit",
        include_str!("../../../wit/deps/clocks.wit"),
        false,
    ),
    (
        "wit/deps/filesystem.wit",
        include_str!("../../../wit/deps/filesystem.wit"),
        false,
    ),
    (
        "wit/deps/http.wit",
        include_str!("../../../wit/deps/http.wit"),
        false,
    ),
    (
        "wit/deps/io.wit",
        include_str!("../../../wit/deps/io.wit"),
        false,
    ),
    (
        "wit/deps/random.wit",
        include_str!("../../../wit/deps/random.wit"),
        false,
    ),
    (
        "wit/deps/sockets.wit",
        include_str!("../../../wit/deps/sockets.wit"),
        false,
    ),
];

const RUST: &[File] = &[
    (
        "Cargo.toml",
        include_str!("../../templates/rust/Cargo.toml"),
        false,
    ),
    (
        "guest.toml",
        include_str!("../../templates/rust/guest.toml"),
        false,
    ),
];

/// The Rust template's code is the `local` guest's own, so the template is
/// exactly what ships (and is tested) as the default guest, plus its
/// manifest.
const LOCAL_GUEST: &str = include_str!("../../../guests/local/src/lib.rs");

/// The `local` guest's other modules (its compare-and-swap, its lock),
/// copied as they are beside its `lib.rs`.
const LOCAL_GUEST_MODULES: &[(&str, &str)] = &[
    (
        "src/cas.rs",
        include_str!("../../../guests/local/src/cas.rs"),
    ),
    (
        "src/locks.rs",
        include_str!("../../../guests/local/src/locks.rs"),
    ),
    (
        "src/stamp.rs",
        include_str!("../../../guests/local/src/stamp.rs"),
    ),
];

fn rust_lib() -> String {
    let body = LOCAL_GUEST.replacen(
        "//! wasmstate's default storage guest:",
        "//! A wasmstate storage guest (a copy of wasmstate's `local` guest):",
        1,
    );
    format!("{body}wasmstate_guest::manifest!(include_str!(\"../guest.toml\"));\n")
}

const PYTHON: &[File] = &[
    (
        "app.py",
        include_str!("../../templates/python/app.py"),
        false,
    ),
    (
        "build.sh",
        include_str!("../../templates/python/build.sh"),
        true,
    ),
    (
        "requirements.txt",
        include_str!("../../templates/python/requirements.txt"),
        false,
    ),
    (
        "guest.toml",
        include_str!("../../templates/python/guest.toml"),
        false,
    ),
];

const JS: &[File] = &[
    (
        "guest.js",
        include_str!("../../templates/js/guest.js"),
        false,
    ),
    (
        "package.json",
        include_str!("../../templates/js/package.json"),
        false,
    ),
    (
        "package-lock.json",
        include_str!("../../templates/js/package-lock.json"),
        false,
    ),
    (
        "guest.toml",
        include_str!("../../templates/js/guest.toml"),
        false,
    ),
];

/// Write a new guest called `name` in `lang` into `dir` (which must not
/// exist or be empty). `sdk` is the path of the Rust SDK in a wasmstate
/// checkout (Rust only). Returns what to run next.
pub fn write_template(
    name: &str,
    lang: Lang,
    dir: &Path,
    sdk: Option<&Path>,
) -> anyhow::Result<String> {
    crate::marketplace::manifest::check_name(name).map_err(anyhow::Error::msg)?;
    if dir.exists() && std::fs::read_dir(dir)?.next().is_some() {
        anyhow::bail!(
            "{} exists and is not empty; pick a new directory with --dir",
            dir.display()
        );
    }
    let sdk_path = match (lang, sdk) {
        (Lang::Rust, Some(sdk)) => {
            let sdk = std::path::absolute(sdk)?;
            anyhow::ensure!(
                sdk.join("Cargo.toml").is_file(),
                "--sdk {}: no Cargo.toml there; give the `sdk` folder of a wasmstate checkout",
                sdk.display()
            );
            sdk.display().to_string()
        }
        (Lang::Rust, None) => anyhow::bail!(
            "the Rust SDK is not on crates.io yet: pass --sdk PATH, the `sdk` folder of a wasmstate checkout"
        ),
        _ => String::new(),
    };
    let files: Vec<File> = match lang {
        Lang::Rust => RUST.to_vec(),
        Lang::Python => PYTHON.iter().chain(WIT).copied().collect(),
        Lang::Js => JS.iter().chain(WIT).copied().collect(),
    };
    for (path, text, executable) in files {
        let target = dir.join(path);
        std::fs::create_dir_all(target.parent().expect("files are in dir"))?;
        let text = text
            .replace("{{guest-name}}", name)
            .replace("{{sdk-path}}", &sdk_path);
        std::fs::write(&target, text).with_context(|| format!("writing {}", target.display()))?;
        if executable {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    if lang == Lang::Rust {
        let target = dir.join("src/lib.rs");
        std::fs::create_dir_all(target.parent().expect("in dir"))?;
        std::fs::write(&target, rust_lib())
            .with_context(|| format!("writing {}", target.display()))?;
        for (path, text) in LOCAL_GUEST_MODULES {
            let target = dir.join(path);
            std::fs::write(&target, text)
                .with_context(|| format!("writing {}", target.display()))?;
        }
    }
    let shown = dir.display();
    Ok(match lang {
        Lang::Rust => format!(
            "cd {shown}\n\
             rustup target add wasm32-wasip2\n\
             cargo build --release --target wasm32-wasip2\n\
             wasmstate guest test target/wasm32-wasip2/release/{}.wasm",
            name.replace('-', "_")
        ),
        Lang::Python => format!(
            "cd {shown}\n\
             python3 -m venv venv && venv/bin/pip install -r requirements.txt\n\
             PATH=\"$PWD/venv/bin:$PATH\" ./build.sh   # runs `wasmstate guest embed-manifest`: keep wasmstate on the PATH\n\
             wasmstate guest test guest.wasm"
        ),
        Lang::Js => format!(
            "cd {shown}\n\
             npm install\n\
             npm run build   # runs `wasmstate guest embed-manifest`: keep wasmstate on the PATH\n\
             wasmstate guest test guest.wasm"
        ),
    })
}

/// Append `manifest_file` to `component` as its `wasmstate-manifest`
/// section, after checking it parses and the component has none yet.
pub fn embed_manifest(component: &Path, manifest_file: &Path) -> anyhow::Result<Manifest> {
    use wasm_encoder::{CustomSection, Section};
    let text = std::fs::read_to_string(manifest_file)
        .with_context(|| format!("cannot read {}", manifest_file.display()))?;
    let parsed: Manifest = toml::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}: {}", manifest_file.display(), e.message()))?;
    manifest::check_name(&parsed.name).map_err(anyhow::Error::msg)?;
    let mut wasm =
        std::fs::read(component).with_context(|| format!("cannot read {}", component.display()))?;
    let info = manifest::inspect(&wasm).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        info.manifest.is_none(),
        "{} already carries a manifest; build it again to replace it",
        component.display()
    );
    CustomSection {
        name: manifest::SECTION.into(),
        data: text.as_bytes().into(),
    }
    .append_to(&mut wasm);
    let temp = component.with_extension("wasm.tmp");
    std::fs::write(&temp, &wasm)?;
    std::fs::rename(&temp, component)?;
    Ok(parsed)
}
