//! A catalogue of guests: a JSON file at a path or URL that `guest search`
//! reads and `guest install NAME` resolves to a pinned download.
//!
//! ```json
//! {"guests": [{"name": "etcd", "version": "0.1.0", "description": "…",
//!   "sha256": "…", "url": "https://…/etcd.wasm", "publisher": "Jane Doe"}]}
//! ```

use serde::{Deserialize, Serialize};

/// One guest in the catalogue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Name to install it by.
    pub name: String,
    /// Its version.
    pub version: String,
    /// One line on what it does.
    #[serde(default)]
    pub description: String,
    /// Digest the download must have.
    pub sha256: String,
    /// Where to download the component (its signature: the same plus `.minisig`).
    pub url: String,
    /// Who publishes it.
    #[serde(default)]
    pub publisher: String,
}

#[derive(Deserialize)]
struct Catalogue {
    guests: Vec<Entry>,
}

/// Read the catalogue at `location` (path or URL).
pub async fn load(location: &str) -> Result<Vec<Entry>, String> {
    let bytes = super::fetch(location)
        .await?
        .ok_or_else(|| format!("{location}: not found"))?;
    let catalogue: Catalogue = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{location}: not a guest index: {e}"))?;
    Ok(catalogue.guests)
}

/// Entries whose name, description or publisher contain `term`
/// (case-insensitive); all of them for an empty term.
pub fn search<'a>(entries: &'a [Entry], term: &str) -> Vec<&'a Entry> {
    let term = term.to_lowercase();
    entries
        .iter()
        .filter(|e| {
            [&e.name, &e.description, &e.publisher]
                .iter()
                .any(|field| field.to_lowercase().contains(&term))
        })
        .collect()
}

/// The newest-listed entry called `name`.
pub fn find<'a>(entries: &'a [Entry], name: &str) -> Option<&'a Entry> {
    entries.iter().rev().find(|e| e.name == name)
}
