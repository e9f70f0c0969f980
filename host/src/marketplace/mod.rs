//! The guest marketplace: install strangers' guests with pinned digests and
//! publisher signatures, and run them with only the capabilities their
//! manifest asks for and the operator granted.
//!
//! - [`manifest`]: what a guest says it is and needs (embedded custom section).
//! - [`grants`]: manifest ∩ operator grants, or the lines to add.
//! - [`signing`]: minisign signatures (`guest keygen`, `guest sign`).
//! - [`store`]: installed components by digest in the data directory.
//! - [`index`]: a JSON catalogue of guests to search and install by name.
//! - [`oci`]: guests as OCI artifacts in a registry.

pub mod grants;
pub mod index;
pub mod manifest;
pub mod oci;
pub mod signing;
pub mod store;

use crate::config::MarketplaceConfig;
use crate::digest::sha256_hex;
use store::{GuestStore, Installed};

/// Where a guest to install comes from, parsed from the command line:
/// a path, an `https://` URL, or `oci://registry/repository:tag`, each
/// optionally pinned with `@sha256:HEX`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The location without the pin.
    pub location: String,
    /// The digest the component must have, when pinned.
    pub sha256: Option<String>,
    /// The name its manifest must have (a guest resolved from an index by
    /// name must be that guest, whatever the index's URL serves).
    pub name: Option<String>,
}

impl Source {
    /// Parse `LOCATION[@sha256:HEX]`.
    pub fn parse(text: &str) -> Result<Source, String> {
        match text.rsplit_once("@sha256:") {
            Some((location, digest)) => {
                let digest = digest.to_ascii_lowercase();
                if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!(
                        "{text}: the pin after @sha256: must be 64 hex digits"
                    ));
                }
                Ok(Source {
                    location: location.to_string(),
                    sha256: Some(digest),
                    name: None,
                })
            }
            None => Ok(Source {
                location: text.to_string(),
                sha256: None,
                name: None,
            }),
        }
    }
}

/// Read bytes from a path or an http(s) URL; `Ok(None)` when a URL answers
/// 404 (used for optional `.minisig` files).
pub async fn fetch(location: &str) -> Result<Option<Vec<u8>>, String> {
    if location.starts_with("http://") && !is_loopback_url(location) {
        return Err(format!(
            "{location}: guests, signatures and indexes are fetched over https only (plain http only from this machine)"
        ));
    }
    if location.starts_with("https://") || location.starts_with("http://") {
        let response = reqwest::get(location)
            .await
            .map_err(|e| format!("cannot download {location}: {e}"))?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !response.status().is_success() {
            return Err(format!(
                "cannot download {location}: HTTP {}",
                response.status()
            ));
        }
        let bytes = response
            .bytes()
            .await
            .map_err(|e| format!("{location}: {e}"))?;
        return Ok(Some(bytes.to_vec()));
    }
    match std::fs::read(location) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {location}: {e}")),
    }
}

/// Whether `url`'s host is this machine (`localhost` or a loopback
/// address).
fn is_loopback_url(url: &str) -> bool {
    url.parse::<http::Uri>()
        .ok()
        .and_then(|u| u.host().map(str::to_owned))
        .is_some_and(|host| {
            let host = host.trim_start_matches('[').trim_end_matches(']');
            host == "localhost"
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        })
}

/// The operator's signature policy, with keys parsed.
pub struct Policy {
    /// Each key, and the guest names it may sign (`None`: any).
    trusted: Vec<(minisign::PublicKey, Option<Vec<String>>)>,
    allow_unsigned: bool,
}

impl Policy {
    /// Parse the `[marketplace]` settings.
    pub fn new(config: &MarketplaceConfig) -> Result<Policy, String> {
        Ok(Policy {
            trusted: config
                .trusted_keys
                .iter()
                .map(|k| {
                    let (key, guests) = k.parts();
                    signing::parse_public_key(key)
                        .map(|parsed| (parsed, guests.map(<[String]>::to_vec)))
                })
                .collect::<Result<_, _>>()?,
            allow_unsigned: config.allow_unsigned,
        })
    }

    /// Check the signature of the component of guest `name` by this
    /// policy: the signer's key id, `None` when unsigned and unsigned
    /// guests are allowed. Only keys trusted for `name` count.
    pub fn check(
        &self,
        name: &str,
        wasm: &[u8],
        sha256: &str,
        signature: Option<&str>,
    ) -> Result<Option<String>, String> {
        let keys: Vec<minisign::PublicKey> = self
            .trusted
            .iter()
            .filter(|(_, guests)| {
                guests
                    .as_ref()
                    .is_none_or(|names| names.iter().any(|n| name_matches(n, name)))
            })
            .map(|(key, _)| key.clone())
            .collect();
        match signature {
            Some(_) if keys.is_empty() && !self.trusted.is_empty() => Err(format!(
                "no key in [marketplace] trusted_keys is trusted for the guest {name:?} (each is scoped to other guests); add {name:?} to the publisher's key's guests"
            )),
            Some(signature) => signing::verify(wasm, sha256, signature, &keys).map(Some),
            None if self.allow_unsigned => Ok(None),
            None => Err(
                "the guest is not signed; ask its publisher for a .minisig signature (pass it with --signature), or set [marketplace] allow_unsigned = true".into(),
            ),
        }
    }
}

/// Whether guest `name` matches `pattern` (a name, or a prefix ending in
/// `*`).
fn name_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// Install the guest at `source` into `store`, verifying its pin, manifest,
/// WIT version and signature (`signature`: a path or URL of a `.minisig`;
/// default: the source's location plus `.minisig`, if it exists).
pub async fn install(
    store: &GuestStore,
    policy: &Policy,
    source: &Source,
    signature: Option<&str>,
) -> Result<Installed, String> {
    let (wasm, bundled_signature) = if source.location.starts_with("oci://") {
        oci::pull(&source.location).await?
    } else {
        let wasm = fetch(&source.location)
            .await?
            .ok_or_else(|| format!("{}: not found", source.location))?;
        (wasm, None)
    };
    let sha256 = sha256_hex(&wasm);
    if let Some(pin) = &source.sha256
        && *pin != sha256
    {
        return Err(format!(
            "{}: digest mismatch: pinned sha256:{pin}, downloaded sha256:{sha256}; nothing was installed",
            source.location
        ));
    }
    let info = manifest::inspect(&wasm)?;
    let manifest = info.manifest.ok_or_else(|| {
        "the component carries no manifest; its author must embed one with wasmstate_guest::manifest!(include_str!(\"guest.toml\"))".to_string()
    })?;
    if let Some(expected) = &source.name
        && manifest.name != *expected
    {
        return Err(format!(
            "{}: the index lists it as {expected:?}, but the component is the guest {:?}; nothing was installed",
            source.location, manifest.name
        ));
    }
    crate::contract::check_version(&info.exports).map_err(|e| e.to_string())?;
    let signature_text = match (signature, bundled_signature) {
        (None, Some(bundled)) => Some(bundled),
        (None, None) if source.location.starts_with("oci://") => None,
        (given, _) => {
            let location = given
                .map(str::to_string)
                .unwrap_or_else(|| format!("{}.minisig", source.location));
            match fetch(&location).await? {
                Some(bytes) => Some(
                    String::from_utf8(bytes)
                        .map_err(|_| format!("{location}: not a minisign signature"))?,
                ),
                None if given.is_some() => return Err(format!("{location}: not found")),
                None => None,
            }
        }
    };
    let signed_by = policy.check(&manifest.name, &wasm, &sha256, signature_text.as_deref())?;
    let entry = Installed {
        name: manifest.name,
        version: manifest.version,
        size: wasm.len() as u64,
        sha256,
        source: source.location.clone(),
        signed_by,
    };
    store.add(entry.clone(), &wasm, signature_text.as_deref())?;
    Ok(entry)
}

/// The bytes of installed guest `name` pinned at `sha256`, re-checked: the
/// digest must match and the signature must still satisfy the policy. (That
/// its manifest names `name` is checked where the manifest is read, when the
/// backend starts.)
pub fn load_installed(
    store: &GuestStore,
    policy: &Policy,
    name: &str,
    sha256: &str,
) -> Result<Vec<u8>, String> {
    let path = store.blob(sha256);
    let wasm = std::fs::read(&path).map_err(|e| {
        format!("guest {name}@sha256:{sha256} is not installed ({}: {e}); install it with `wasmstate guest install`", path.display())
    })?;
    let actual = sha256_hex(&wasm);
    if actual != sha256 {
        return Err(format!(
            "guest {name}: the stored component's digest is sha256:{actual}, not the pinned sha256:{sha256}; it was altered on disk, reinstall it"
        ));
    }
    let signature = std::fs::read_to_string(store.signature(sha256)).ok();
    policy
        .check(name, &wasm, sha256, signature.as_deref())
        .map_err(|e| format!("guest {name}: {e}"))?;
    Ok(wasm)
}
