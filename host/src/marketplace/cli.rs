//! `wasmstate guest install|list|inspect|remove|keygen|sign|search`.

use super::store::{GuestStore, Installed};
use super::{Policy, Source, index, manifest, signing};
use crate::cli::GuestAction;
use crate::runtime::sha256_hex;
use anyhow::anyhow;

/// Run one store command.
pub async fn run(action: GuestAction) -> anyhow::Result<()> {
    match action {
        GuestAction::Install {
            source,
            signature,
            store,
        } => {
            let config = store.load()?;
            let policy = Policy::new(&config.marketplace).map_err(anyhow::Error::msg)?;
            let guests = GuestStore::new(&config.data_dir);
            let (source, signature) =
                resolve(&source, signature, config.marketplace.index.as_deref()).await?;
            let installed = super::install(&guests, &policy, &source, signature.as_deref())
                .await
                .map_err(anyhow::Error::msg)?;
            println!(
                "installed {} {} (sha256 {}, {})\nuse it in a backend: guest = \"{}@sha256:{}\"",
                installed.name,
                installed.version,
                installed.sha256,
                signer(&installed),
                installed.name,
                installed.sha256
            );
            Ok(())
        }
        GuestAction::List { store } => {
            let config = store.load()?;
            let guests = GuestStore::new(&config.data_dir)
                .list()
                .map_err(anyhow::Error::msg)?;
            if guests.is_empty() {
                println!("no guests installed (wasmstate guest install PATH|URL|NAME)");
            }
            for g in guests {
                println!(
                    "{:<24} {:<10} sha256:{}  {}",
                    g.name,
                    g.version,
                    g.sha256,
                    signer(&g)
                );
            }
            Ok(())
        }
        GuestAction::Inspect { guest, store } => {
            let config = store.load()?;
            let guests = GuestStore::new(&config.data_dir);
            let (wasm, installed) = match guests.get(&guest).map_err(anyhow::Error::msg)? {
                Some(g) => (std::fs::read(guests.blob(&g.sha256))?, Some(g)),
                None => (
                    std::fs::read(&guest).map_err(|e| {
                        anyhow!("{guest:?} is neither an installed guest nor a readable file: {e}")
                    })?,
                    None,
                ),
            };
            print!(
                "{}",
                describe(&wasm, installed.as_ref()).map_err(anyhow::Error::msg)?
            );
            Ok(())
        }
        GuestAction::Remove { name, store } => {
            let config = store.load()?;
            let removed = GuestStore::new(&config.data_dir)
                .remove(&name)
                .map_err(anyhow::Error::msg)?;
            println!(
                "removed {} {} (sha256 {})",
                removed.name, removed.version, removed.sha256
            );
            Ok(())
        }
        GuestAction::Keygen { secret_key } => {
            let public = signing::generate(&secret_key).map_err(anyhow::Error::msg)?;
            println!(
                "secret key written to {}\npublic key (for [marketplace] trusted_keys):\n{public}",
                secret_key.display()
            );
            Ok(())
        }
        GuestAction::Sign { component, key } => {
            let wasm =
                std::fs::read(&component).map_err(|e| anyhow!("{}: {e}", component.display()))?;
            let manifest = manifest::inspect(&wasm)
                .map_err(anyhow::Error::msg)?
                .manifest
                .ok_or_else(|| anyhow!("{}: no embedded manifest; add wasmstate_guest::manifest!(…) before signing", component.display()))?;
            let sha256 = sha256_hex(&wasm);
            let signature = signing::sign(&wasm, &manifest.name, &manifest.version, &sha256, &key)
                .map_err(anyhow::Error::msg)?;
            let out = std::path::PathBuf::from(format!("{}.minisig", component.display()));
            std::fs::write(&out, signature)?;
            println!(
                "signed {} {} (sha256 {sha256}): {}",
                manifest.name,
                manifest.version,
                out.display()
            );
            Ok(())
        }
        GuestAction::Push {
            component,
            reference,
        } => {
            let wasm =
                std::fs::read(&component).map_err(|e| anyhow!("{}: {e}", component.display()))?;
            let sha256 = sha256_hex(&wasm);
            let signature =
                std::fs::read_to_string(format!("{}.minisig", component.display())).ok();
            let signed = if signature.is_some() {
                "with its signature"
            } else {
                "unsigned"
            };
            let url = super::oci::push(&reference, wasm, signature)
                .await
                .map_err(anyhow::Error::msg)?;
            println!(
                "pushed {} ({signed}) to {url}\ninstall it with: wasmstate guest install {reference}@sha256:{sha256}",
                component.display()
            );
            Ok(())
        }
        GuestAction::Search { term, store } => {
            let config = store.load()?;
            let location = config.marketplace.index.ok_or_else(|| {
                anyhow!("no guest index: pass --index PATH|URL or set [marketplace] index")
            })?;
            let entries = index::load(&location).await.map_err(anyhow::Error::msg)?;
            let found = index::search(&entries, &term);
            if found.is_empty() {
                println!("no guest matches {term:?} in {location}");
            }
            for e in found {
                println!(
                    "{:<24} {:<10} {}  ({})",
                    e.name, e.version, e.description, e.publisher
                );
            }
            Ok(())
        }
        GuestAction::Test { .. } => unreachable!("the conformance kit is run by cli.rs"),
    }
}

/// A source on the command line: a path or URL as given, or a bare name
/// looked up in the index (pinned to the index's digest).
async fn resolve(
    text: &str,
    signature: Option<String>,
    index_location: Option<&str>,
) -> anyhow::Result<(Source, Option<String>)> {
    let source = Source::parse(text).map_err(anyhow::Error::msg)?;
    let is_name = manifest::check_name(&source.location).is_ok()
        && !std::path::Path::new(&source.location).exists();
    let Some(location) = index_location.filter(|_| is_name) else {
        return Ok((source, signature));
    };
    let entries = index::load(location).await.map_err(anyhow::Error::msg)?;
    let entry = index::find(&entries, &source.location).ok_or_else(|| {
        anyhow!(
            "no guest named {:?} in the index {location}",
            source.location
        )
    })?;
    if let Some(pin) = &source.sha256
        && *pin != entry.sha256
    {
        anyhow::bail!(
            "the index lists {} at sha256:{}, not the pinned sha256:{pin}",
            entry.name,
            entry.sha256
        );
    }
    Ok((
        Source {
            location: entry.url.clone(),
            sha256: Some(entry.sha256.clone()),
            name: Some(entry.name.clone()),
        },
        signature,
    ))
}

fn signer(g: &Installed) -> String {
    match &g.signed_by {
        Some(key) => format!("signed by key {key}"),
        None => "unsigned".to_string(),
    }
}

/// What `guest inspect` prints.
fn describe(wasm: &[u8], installed: Option<&Installed>) -> Result<String, String> {
    let info = manifest::inspect(wasm)?;
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<14}{v}\n"));
    match &info.manifest {
        Some(m) => {
            line("name", m.name.clone());
            line("version", m.version.clone());
            line("author", m.author.clone());
            line("description", m.description.clone());
            let c = &m.capabilities;
            line(
                "http",
                if c.http.is_empty() {
                    "none".into()
                } else {
                    c.http.join(", ")
                },
            );
            line("directory", c.directory.to_string());
            line("git", c.git.to_string());
            line(
                "secrets",
                if c.secrets.is_empty() {
                    "none".into()
                } else {
                    c.secrets.join(", ")
                },
            );
            line(
                "memory",
                c.memory_mib
                    .map_or("host default".into(), |m| format!("{m} MiB")),
            );
            line(
                "time",
                c.timeout_ms
                    .map_or("host default".into(), |t| format!("{t} ms")),
            );
        }
        None => line(
            "manifest",
            "none (runs only from a local path, with the operator's grants as written)".into(),
        ),
    }
    let wit = info
        .exports
        .iter()
        .find_map(|e| e.strip_prefix("wasmstate:backend/storage@"))
        .unwrap_or("not a wasmstate guest");
    line("wit", wit.to_string());
    line("imports", info.imports.join(", "));
    line("exports", info.exports.join(", "));
    line("sha256", sha256_hex(wasm));
    line("size", format!("{} bytes", wasm.len()));
    if let Some(g) = installed {
        line("source", g.source.clone());
        line("signature", signer(g));
    }
    Ok(out)
}
