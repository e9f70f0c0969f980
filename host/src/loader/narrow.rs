//! Stage 3 of loading: a guest that carries a manifest is granted only what
//! it asks for and the operator granted.

use super::Ungranted;
use crate::config::{BackendConfig, Config, GuestSource};
use crate::marketplace::{grants, manifest};
use std::path::PathBuf;

/// A guest that carries a manifest gets only what it asks for and the
/// operator granted; one that asks for more does not start. Guests without
/// a manifest (embedded, or a local file) get the operator's grants as
/// written; installed guests always carry one.
pub fn to_manifest(
    config: &Config,
    backend: &BackendConfig,
    info: &manifest::ComponentInfo,
    ungranted: Ungranted,
) -> anyhow::Result<(BackendConfig, Option<PathBuf>)> {
    let dir = config.granted_dir(backend);
    let Some(manifest) = &info.manifest else {
        anyhow::ensure!(
            !matches!(backend.guest, GuestSource::Installed { .. }),
            "backend {:?}: installed guest {} carries no manifest",
            backend.name,
            backend.guest
        );
        return Ok((backend.clone(), dir));
    };
    if let GuestSource::Installed { name, sha256 } = &backend.guest
        && manifest.name != *name
    {
        anyhow::bail!(
            "backend {:?}: sha256:{sha256} is the guest {:?}, not {name:?}; check the pin in the config",
            backend.name,
            manifest.name
        );
    }
    let (narrowed, missing) = grants::narrow(&manifest.capabilities, backend, dir.is_some())
        .map_err(|e| anyhow::anyhow!("backend {:?}: {e}", backend.name))?;
    if !missing.is_empty() {
        let lines: Vec<String> = missing.iter().map(|l| format!("  {l}")).collect();
        let said = format!(
            "backend {:?}: guest {} {} asks for capabilities the operator has not granted; add to [backends.{}]:\n{}",
            backend.name,
            manifest.name,
            manifest.version,
            backend.name,
            lines.join("\n")
        );
        match ungranted {
            Ungranted::Refuse => anyhow::bail!(said),
            Ungranted::Withhold => tracing::warn!("{said}\n(running without them)"),
        }
    }
    let dir = if manifest.capabilities.directory {
        dir
    } else {
        None
    };
    Ok((narrowed, dir))
}
