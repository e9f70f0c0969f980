//! Compiled-guest cache: compiling a component with Cranelift takes about a
//! second, so the machine code is kept on disk, keyed by the component's
//! sha256 and the engine's compatibility hash (wasmtime version, CPU
//! features, settings). A restart then only maps the file.

use anyhow::Context;
use sha2::{Digest, Sha256};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use wasmtime::Engine;
use wasmtime::component::Component;

/// The component's sha256, hex-encoded.
pub fn sha256_hex(wasm: &[u8]) -> String {
    hex::encode(Sha256::digest(wasm))
}

/// Where the compiled form of the component with digest `sha256` for
/// `engine` lives under `dir`.
pub fn artifact_path(engine: &Engine, sha256: &str, dir: &Path) -> PathBuf {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    dir.join(format!("{sha256}-{:016x}.cwasm", hasher.finish()))
}

/// Compile `wasm` (whose digest is `sha256`), or load its cached
/// compilation from `dir`. A cache that cannot be read or written only costs
/// time: it is reported and bypassed.
pub fn compile(
    engine: &Engine,
    wasm: &[u8],
    sha256: &str,
    dir: &Path,
) -> anyhow::Result<Component> {
    let path = artifact_path(engine, sha256, dir);
    if path.is_file() {
        // SAFETY: `deserialize_file` trusts its input to be wasmtime's own
        // output. Only this function writes this directory, naming each file
        // after the sha256 of the source it compiled, inside the operator's
        // private data directory.
        #[allow(unsafe_code)]
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(component) => return Ok(component),
            Err(e) => {
                tracing::warn!(path = %path.display(), "ignoring unusable compiled guest: {e:#}")
            }
        }
    }
    let artifact = engine
        .precompile_component(wasm)
        .map_err(anyhow::Error::from)
        .context("not a valid WebAssembly component")?;
    if let Err(e) = store(&path, &artifact) {
        tracing::warn!(path = %path.display(), "could not cache compiled guest: {e:#}");
    }
    // SAFETY: `artifact` was produced by `precompile_component` just above.
    #[allow(unsafe_code)]
    let component = unsafe { Component::deserialize(engine, &artifact) }?;
    Ok(component)
}

/// Write atomically (temp file + rename), so a concurrent reader or a second
/// host process never maps a half-written artifact.
fn store(path: &Path, artifact: &[u8]) -> anyhow::Result<()> {
    let dir = path.parent().context("cache path has no parent")?;
    std::fs::create_dir_all(dir)?;
    let temp = dir.join(format!(".tmp-{}", std::process::id()));
    std::fs::write(&temp, artifact)?;
    std::fs::rename(&temp, path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine() -> Engine {
        super::super::engine::build(2, 64 << 20, false).unwrap()
    }

    fn digest() -> String {
        sha256_hex(local_guest())
    }

    fn local_guest() -> &'static [u8] {
        crate::guests::embedded("local").unwrap().wasm
    }

    #[test]
    fn a_second_load_maps_the_cached_artifact() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine();
        compile(&engine, local_guest(), &digest(), dir.path()).unwrap();
        let path = artifact_path(&engine, &digest(), dir.path());
        let first = std::fs::metadata(&path).unwrap().modified().unwrap();

        compile(&engine, local_guest(), &digest(), dir.path()).unwrap();
        let second = std::fs::metadata(&path).unwrap().modified().unwrap();
        assert_eq!(
            first, second,
            "a cache hit must not compile and write again"
        );
        assert!(
            path.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with(&digest())
        );
    }

    #[test]
    fn a_corrupt_artifact_is_replaced_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine();
        let path = artifact_path(&engine, &digest(), dir.path());
        std::fs::write(&path, b"not machine code").unwrap();
        compile(&engine, local_guest(), &digest(), dir.path()).unwrap();
        assert_ne!(std::fs::read(&path).unwrap(), b"not machine code");
    }

    #[test]
    fn garbage_is_refused_with_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = compile(&engine(), b"\0asm garbage", "garbage", dir.path()).unwrap_err();
        assert!(
            format!("{err:#}").contains("not a valid WebAssembly component"),
            "{err:#}"
        );
    }
}
