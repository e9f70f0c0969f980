//! A guest's manifest: who made it and the capabilities it asks for,
//! embedded in the component as the custom section `wasmstate-manifest`
//! (written by the SDK's `manifest!` macro), read here without running it.

use serde::{Deserialize, Serialize};

/// The custom section the SDK's `manifest!` writes.
pub const SECTION: &str = "wasmstate-manifest";

/// What a guest says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Short name, used to install and reference it (`[a-z0-9-]`).
    pub name: String,
    /// Its own version.
    pub version: String,
    /// Who wrote it.
    #[serde(default)]
    pub author: String,
    /// One line on what it stores where.
    #[serde(default)]
    pub description: String,
    /// The WIT package version it targets, when the author states it (the
    /// host also reads it from the component's exports).
    #[serde(default)]
    pub wit: Option<String>,
    /// What it needs from the host.
    #[serde(default)]
    pub capabilities: Capabilities,
}

/// The capabilities a guest asks for. Anything not asked for is not given,
/// whatever the operator grants.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    /// Origins it sends HTTP to, `scheme://host[:port]`; a `*` host means
    /// "the hosts the operator grants" (e.g. `https://*:443`).
    #[serde(default)]
    pub http: Vec<String>,
    /// AWS endpoints whose requests the host signs with the operator's
    /// credentials (same patterns as `http`); the guest never holds them.
    #[serde(default)]
    pub aws_sign: Vec<String>,
    /// A preopened directory at `/data`.
    #[serde(default)]
    pub directory: bool,
    /// The host's git capability, for the repositories the operator grants.
    #[serde(default)]
    pub git: bool,
    /// Names of secrets it reads (`host.get-secret`).
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Memory it needs per request.
    pub memory_mib: Option<u64>,
    /// Time it needs per request.
    pub timeout_ms: Option<u64>,
}

/// The parts of a component `guest inspect` shows.
#[derive(Debug, Clone, Default)]
pub struct ComponentInfo {
    /// The embedded manifest, if any.
    pub manifest: Option<Manifest>,
    /// Top-level import names (interfaces it needs).
    pub imports: Vec<String>,
    /// Top-level export names (interfaces it provides).
    pub exports: Vec<String>,
}

/// Read the manifest and the top-level imports and exports of a component.
/// A malformed manifest is an error naming the problem; none is `None`.
pub fn inspect(wasm: &[u8]) -> Result<ComponentInfo, String> {
    use wasmparser::{Parser, Payload};
    let mut info = ComponentInfo::default();
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(wasm) {
        let payload = payload.map_err(|e| format!("not a valid WebAssembly component: {e}"))?;
        match payload {
            Payload::Version { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 1 => {
                for import in reader {
                    let import = import.map_err(|e| e.to_string())?;
                    info.imports.push(import.name.0.to_string());
                }
            }
            Payload::ComponentExportSection(reader) if depth == 1 => {
                for export in reader {
                    let export = export.map_err(|e| e.to_string())?;
                    info.exports.push(export.name.0.to_string());
                }
            }
            // The SDK's section lands in the guest's core module, nested in
            // the component: look at every depth.
            Payload::CustomSection(section) if section.name() == SECTION => {
                let text = std::str::from_utf8(section.data())
                    .map_err(|_| "the manifest section is not UTF-8".to_string())?;
                let manifest: Manifest = toml::from_str(text)
                    .map_err(|e| format!("the embedded manifest is invalid: {}", e.message()))?;
                check_name(&manifest.name)?;
                info.manifest = Some(manifest);
            }
            _ => {}
        }
    }
    Ok(info)
}

/// Guest names in the store: 1–64 of `a-z 0-9 -`, starting with a letter.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "guest name {name:?}: use 1-64 characters of a-z, 0-9 and '-', starting with a letter"
        ))
    }
}
