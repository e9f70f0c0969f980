//! Compiled-guest cache: compiling a component with Cranelift takes about a
//! second, so the machine code is kept on disk, keyed by the component's
//! sha256 and the engine's compatibility hash (wasmtime version, CPU
//! features, settings). A restart then only reads the file.
//!
//! Loading machine code runs it, so a cache entry is trusted only with this
//! host's MAC: HMAC-SHA256, under a key kept in the data directory (where no
//! guest's directory may be), over the component's sha256 and the compiled
//! bytes. An entry that was swapped for another guest's, altered, or written
//! by anyone without the key is compiled again, never run. Temporary files
//! have random names, so replicas sharing a cache never collide.
//!
//! A miss is compiled in a child process (the `compiler` module) that writes
//! the entry and exits; the server then loads it as on a warm start, so
//! the memory the compiler used leaves with the child.

use anyhow::Context;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use wasmtime::Engine;
use wasmtime::component::Component;

/// The key that vouches for cache entries this host (or its replicas
/// sharing the data directory) wrote.
#[derive(Clone)]
pub struct CacheKey([u8; 32]);

impl std::fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CacheKey(<redacted>)")
    }
}

impl CacheKey {
    /// The key at `path`, made (owner-only) when there is none yet.
    pub fn load_or_create(path: &Path) -> anyhow::Result<CacheKey> {
        match std::fs::read(path) {
            Ok(bytes) => {
                let key: [u8; 32] = bytes.try_into().map_err(|_| {
                    anyhow::anyhow!(
                        "{} is not a 32-byte key; delete it to make a new one",
                        path.display()
                    )
                })?;
                return Ok(CacheKey(key));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
        use aes_gcm::aead::rand_core::RngCore;
        let mut key = [0u8; 32];
        aes_gcm::aead::OsRng.fill_bytes(&mut key);
        let dir = path.parent().context("the key path has no folder")?;
        std::fs::create_dir_all(dir)?;
        let mut temp = tempfile::NamedTempFile::new_in(dir)?;
        temp.write_all(&key)?;
        // Another replica may have made one meanwhile: theirs wins.
        match temp.persist_noclobber(path) {
            Ok(_) => Ok(CacheKey(key)),
            Err(_) => CacheKey::load_or_create(path),
        }
    }

    /// The key's bytes, for handing to a compiler child on its stdin.
    pub(super) fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The key a compiler child was handed.
    pub(super) fn from_bytes(bytes: [u8; 32]) -> CacheKey {
        CacheKey(bytes)
    }

    fn mac(&self, sha256: &str, artifact: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("any key length");
        mac.update(sha256.as_bytes());
        mac.update(b"\0");
        mac.update(artifact);
        mac
    }
}

/// Where the compiled form of the component with digest `sha256` for
/// `engine` lives under `dir`.
pub fn artifact_path(engine: &Engine, sha256: &str, dir: &Path) -> PathBuf {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    dir.join(format!("{sha256}-{:016x}.cwasm", hasher.finish()))
}

fn mac_path(artifact: &Path) -> PathBuf {
    artifact.with_extension("cwasm.mac")
}

/// The component cached at `path`, when it carries `key`'s MAC and loads.
pub(super) fn load(
    engine: &Engine,
    path: &Path,
    sha256: &str,
    key: &CacheKey,
) -> Option<Component> {
    let artifact = vouched(path, sha256, key)?;
    // SAFETY: `deserialize` trusts its input to be wasmtime's own
    // output. These bytes carry this host's MAC over the source's
    // digest and the bytes themselves, so this host (or its compiler
    // child, handed the key) compiled them from exactly this component.
    #[allow(unsafe_code)]
    match unsafe { Component::deserialize(engine, &artifact) } {
        Ok(component) => Some(component),
        Err(e) => {
            tracing::warn!(path = %path.display(), "ignoring unusable compiled guest: {e:#}");
            None
        }
    }
}

/// `wasm` compiled to machine code for `engine`, serialized.
pub(super) fn precompile(engine: &Engine, wasm: &[u8]) -> anyhow::Result<Vec<u8>> {
    engine
        .precompile_component(wasm)
        .map_err(anyhow::Error::from)
        .context("not a valid WebAssembly component")
}

/// The cached bytes at `path`, when their MAC is ours.
pub(super) fn vouched(path: &Path, sha256: &str, key: &CacheKey) -> Option<Vec<u8>> {
    let artifact = std::fs::read(path).ok()?;
    let tag = std::fs::read_to_string(mac_path(path))
        .ok()
        .and_then(|t| hex::decode(t.trim()).ok());
    let verified = tag.is_some_and(|tag| key.mac(sha256, &artifact).verify_slice(&tag).is_ok());
    if !verified {
        tracing::warn!(
            path = %path.display(),
            "compiled guest does not carry this host's MAC (altered, swapped, or not written here): compiling again"
        );
        return None;
    }
    Some(artifact)
}

/// Write atomically (random temp names + rename), so a concurrent reader or
/// another replica never reads a half-written file; the MAC last.
pub(super) fn store(
    path: &Path,
    sha256: &str,
    artifact: &[u8],
    key: &CacheKey,
) -> anyhow::Result<()> {
    let dir = path.parent().context("cache path has no parent")?;
    std::fs::create_dir_all(dir)?;
    let write = |to: &Path, bytes: &[u8]| -> anyhow::Result<()> {
        let mut temp = tempfile::NamedTempFile::new_in(dir)?;
        temp.write_all(bytes)?;
        temp.persist(to).map_err(|e| e.error)?;
        Ok(())
    };
    write(path, artifact)?;
    let tag = hex::encode(key.mac(sha256, artifact).finalize().into_bytes());
    write(&mac_path(path), tag.as_bytes())
}
