//! `wasmstate guest …`: the marketplace's commands (install, list,
//! inspect, remove, keygen, sign, push, search), templates (`guest new`,
//! `embed-manifest`), and the author's kit (`guest test`, `guest bench`,
//! in [`super::kit`]).

use crate::config::{Config, Overrides};
use crate::digest::sha256_hex;
use crate::marketplace::store::{GuestStore, Installed};
use crate::marketplace::{Policy, Source, index, manifest, signing};
use anyhow::anyhow;
use clap::Subcommand;
use std::path::PathBuf;

/// Guest operations.
#[derive(Debug, Subcommand)]
pub enum GuestAction {
    /// Install a guest into the data directory's store: from a path, an
    /// https URL, or an index name; pin it with @sha256:HEX. Checks the
    /// manifest, the WIT version and the publisher's signature.
    Install {
        /// PATH, https://URL or NAME (from --index), optionally @sha256:HEX.
        source: String,
        /// The `.minisig` signature (path or URL) [default: SOURCE.minisig].
        #[arg(long)]
        signature: Option<String>,
        /// Where the store is and what it trusts.
        #[command(flatten)]
        store: StoreArgs,
    },
    /// List installed guests.
    List {
        /// Where the store is.
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Show an installed guest (or a component file): manifest, requested
    /// capabilities, imports and exports, sha256, size, signer.
    Inspect {
        /// Installed guest name, or a path to a `.wasm` file.
        guest: String,
        /// Where the store is.
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Remove an installed guest.
    Remove {
        /// Installed guest name.
        name: String,
        /// Where the store is.
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Make a minisign key pair for signing guests: writes the secret key
    /// (password from WASMSTATE_SIGNING_PASSWORD), prints the public key for
    /// operators' [marketplace] trusted_keys.
    Keygen {
        /// Where to write the secret key.
        secret_key: PathBuf,
    },
    /// Sign a guest component: writes COMPONENT.minisig.
    Sign {
        /// The component to sign.
        component: PathBuf,
        /// The secret key from `guest keygen` (or the minisign tool).
        #[arg(long)]
        key: PathBuf,
    },
    /// Publish a component (and COMPONENT.minisig, if present) to an OCI
    /// registry as an artifact, for `guest install oci://…`.
    Push {
        /// The component.
        component: PathBuf,
        /// Where to: oci://HOST[:PORT]/REPOSITORY:TAG.
        reference: String,
    },
    /// Search a guest index (JSON at a path or URL) by name, description or
    /// publisher.
    Search {
        /// Text to look for [default: list everything].
        #[arg(default_value = "")]
        term: String,
        /// Where the store is, and the index ([marketplace] index).
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Write a new guest to start from: a store in the granted directory
    /// (exclusive-create locks, atomic replace, chunked reads, workspaces,
    /// config checks) that passes `guest test` as it is.
    New {
        /// Its name (lower-case letters, digits, `-`).
        name: String,
        /// Its language.
        #[arg(long, value_enum, default_value = "rust")]
        lang: super::new::Lang,
        /// Where to write it [default: ./NAME].
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Rust only: the `sdk` folder of a wasmstate checkout.
        #[arg(long)]
        sdk: Option<PathBuf>,
    },
    /// Embed a manifest (guest.toml) in a component built by a toolchain
    /// that cannot (componentize-py, componentize-js): needed to install it.
    EmbedManifest {
        /// The component, changed in place.
        component: PathBuf,
        /// The manifest.
        #[arg(default_value = "guest.toml")]
        manifest: PathBuf,
    },
    /// Run the conformance kit against a guest: a PASS/FAIL line per case,
    /// exit status 1 if any case fails.
    Test {
        /// The guest and its grants.
        #[command(flatten)]
        guest: super::kit::GuestArgs,
    },
    /// Measure a guest: write and read latency per state size (each call a
    /// fresh instance, as a request is; storage-level, without HTTP) and the
    /// most memory one instance used.
    Bench {
        /// The guest and its grants.
        #[command(flatten)]
        guest: super::kit::GuestArgs,
        /// State sizes to measure, in KiB (repeatable).
        #[arg(long = "size-kib", default_values_t = [100u64, 1024, 10240])]
        sizes_kib: Vec<u64>,
        /// Writes and reads per size.
        #[arg(long, default_value_t = 10)]
        runs: usize,
    },
}

/// Which data directory's guest store, and the marketplace settings.
#[derive(Debug, clap::Args)]
pub struct StoreArgs {
    /// The server's config file, for data_dir and [marketplace].
    #[arg(long, short, env = "WASMSTATE_CONFIG")]
    config: Option<PathBuf>,
    /// Data directory (overrides the config file) [default: ./wasmstate-data].
    #[arg(long, env = "WASMSTATE_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Guest index, path or URL (overrides [marketplace] index).
    #[arg(long)]
    index: Option<String>,
}

impl StoreArgs {
    pub(crate) fn load(&self) -> anyhow::Result<Config> {
        let mut config = Config::load(
            self.config.as_deref(),
            Overrides {
                data_dir: self.data_dir.clone(),
                ..Overrides::default()
            },
        )?;
        if let Some(index) = &self.index {
            config.marketplace.index = Some(index.clone());
        }
        Ok(config)
    }
}

/// Run one `guest` command.
pub async fn run(action: GuestAction) -> anyhow::Result<()> {
    match action {
        GuestAction::New {
            name,
            lang,
            dir,
            sdk,
        } => {
            let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
            let next = super::new::write_template(&name, lang, &dir, sdk.as_deref())?;
            println!("wrote {} ({lang}); next:\n{next}", dir.display());
            Ok(())
        }
        GuestAction::EmbedManifest {
            component,
            manifest,
        } => {
            let m = super::new::embed_manifest(&component, &manifest)?;
            println!(
                "{}: manifest of {} {} embedded",
                component.display(),
                m.name,
                m.version
            );
            Ok(())
        }
        GuestAction::Test { guest } => super::kit::test(&guest).await,
        GuestAction::Bench {
            guest,
            sizes_kib,
            runs,
        } => super::kit::bench(&guest, &sizes_kib, runs).await,
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
            let installed =
                crate::marketplace::install(&guests, &policy, &source, signature.as_deref())
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
            let url = crate::marketplace::oci::push(&reference, wasm, signature)
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
            line(
                "aws signed",
                if c.aws_sign.is_empty() {
                    "none".into()
                } else {
                    c.aws_sign.join(", ")
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
    let wit = match crate::contract::check_version(&info.exports) {
        Ok(version) => version.describe(),
        Err(e) => format!("{e:#}"),
    };
    line("wit", wit);
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
