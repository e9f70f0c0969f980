//! The guest store: installed components under `<data_dir>/guests/`, by
//! digest, with an index naming them.
//!
//! ```text
//! guests/installed.json             name → version, sha256, source, signer
//! guests/blobs/<sha256>.wasm        the component
//! guests/blobs/<sha256>.wasm.minisig   its publisher's signature, if any
//! ```
//!
//! Blobs are never changed in place, so a server pinned to a digest keeps
//! working while a new version is installed beside it. Every write is a
//! temporary file renamed into place.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One installed guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Installed {
    /// Name from its manifest.
    pub name: String,
    /// Version from its manifest.
    pub version: String,
    /// sha256 of the component.
    pub sha256: String,
    /// Where it was installed from.
    pub source: String,
    /// Key id of the publisher signature that verified, if any.
    pub signed_by: Option<String>,
    /// Size in bytes.
    pub size: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Index {
    guests: BTreeMap<String, Installed>,
}

/// The store in one data directory.
#[derive(Debug, Clone)]
pub struct GuestStore {
    root: PathBuf,
}

impl GuestStore {
    /// The store of the server whose data directory is `data_dir`.
    pub fn new(data_dir: &Path) -> Self {
        GuestStore {
            root: data_dir.join("guests"),
        }
    }

    fn index_path(&self) -> PathBuf {
        self.root.join("installed.json")
    }

    /// Path of the component with digest `sha256`.
    pub fn blob(&self, sha256: &str) -> PathBuf {
        self.root.join("blobs").join(format!("{sha256}.wasm"))
    }

    /// Path of the signature of the component with digest `sha256`.
    pub fn signature(&self, sha256: &str) -> PathBuf {
        self.root
            .join("blobs")
            .join(format!("{sha256}.wasm.minisig"))
    }

    fn read_index(&self) -> Result<Index, String> {
        match std::fs::read(self.index_path()) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| format!("{}: corrupt store index: {e}", self.index_path().display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Index::default()),
            Err(e) => Err(format!("{}: {e}", self.index_path().display())),
        }
    }

    fn write_atomically(&self, path: &Path, bytes: &[u8]) -> Result<(), String> {
        let dir = path.parent().expect("store paths have a parent");
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut temp = tempfile::NamedTempFile::new_in(dir).map_err(|e| e.to_string())?;
        std::io::Write::write_all(&mut temp, bytes).map_err(|e| e.to_string())?;
        temp.as_file().sync_all().map_err(|e| e.to_string())?;
        temp.persist(path).map_err(|e| e.error.to_string())?;
        Ok(())
    }

    /// Every installed guest, by name.
    pub fn list(&self) -> Result<Vec<Installed>, String> {
        Ok(self.read_index()?.guests.into_values().collect())
    }

    /// The installed guest called `name`.
    pub fn get(&self, name: &str) -> Result<Option<Installed>, String> {
        Ok(self.read_index()?.guests.remove(name))
    }

    /// Record `wasm` (already verified by the caller) as guest `entry.name`,
    /// replacing an older version of that name. The old blob stays.
    pub fn add(
        &self,
        entry: Installed,
        wasm: &[u8],
        signature: Option<&str>,
    ) -> Result<(), String> {
        self.write_atomically(&self.blob(&entry.sha256), wasm)?;
        if let Some(signature) = signature {
            self.write_atomically(&self.signature(&entry.sha256), signature.as_bytes())?;
        }
        let mut index = self.read_index()?;
        index.guests.insert(entry.name.clone(), entry);
        let json = serde_json::to_vec_pretty(&index).map_err(|e| e.to_string())?;
        self.write_atomically(&self.index_path(), &json)
    }

    /// Forget `name` and delete its blob unless another name uses it.
    pub fn remove(&self, name: &str) -> Result<Installed, String> {
        let mut index = self.read_index()?;
        let removed = index.guests.remove(name).ok_or_else(|| {
            format!("no installed guest named {name:?} (see `wasmstate guest list`)")
        })?;
        let json = serde_json::to_vec_pretty(&index).map_err(|e| e.to_string())?;
        self.write_atomically(&self.index_path(), &json)?;
        if !index.guests.values().any(|g| g.sha256 == removed.sha256) {
            let _ = std::fs::remove_file(self.blob(&removed.sha256));
            let _ = std::fs::remove_file(self.signature(&removed.sha256));
        }
        Ok(removed)
    }
}
