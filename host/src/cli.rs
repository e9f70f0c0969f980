//! Command-line interface.

use crate::client::{Client, ClientTls, Credentials};
use crate::config::{Config, GuestSource, Limits, Overrides};
use crate::conformance::{GuestUnderTest, run_guest};
use crate::policy::Origin;
use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

/// A Terraform/OpenTofu HTTP state backend whose storage drivers are
/// sandboxed WebAssembly components.
#[derive(Debug, Parser)]
#[command(name = "wasmstate", version, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve Terraform's `backend "http"` protocol.
    ///
    /// Without --config, serves one backend named `default` on the embedded
    /// `local` guest, storing state under --data-dir.
    Serve {
        /// TOML config file with [backends.NAME] tables.
        #[arg(long, short, env = "WASMSTATE_CONFIG")]
        config: Option<PathBuf>,
        /// Address to listen on (overrides the config file) [default: 127.0.0.1:6061].
        #[arg(long, env = "WASMSTATE_LISTEN")]
        listen: Option<SocketAddr>,
        /// Directory for state files and the compiled-guest cache (overrides
        /// the config file) [default: ./wasmstate-data].
        #[arg(long, env = "WASMSTATE_DATA_DIR")]
        data_dir: Option<PathBuf>,
        /// Directory for compiled guests (overrides the config file)
        /// [default: <data-dir>/cache].
        #[arg(long, env = "WASMSTATE_CACHE_DIR")]
        cache_dir: Option<PathBuf>,
    },
    /// Check a config file, including each guest's own validation of its
    /// `config` table, and print what it would serve, without serving.
    CheckConfig {
        /// The TOML config file.
        config: PathBuf,
    },
    /// Hash a password for a [[users]] entry: reads one line from stdin,
    /// prints an argon2id hash.
    HashPassword,
    /// Make a bearer token for a [[tokens]] entry: prints the token (give it
    /// to the client) and its sha256 (put it in the config).
    GenerateToken,
    /// Work with guest components.
    Guest {
        /// Which operation.
        #[command(subcommand)]
        action: GuestAction,
    },
    /// List, create or delete workspaces on a running server.
    Workspace {
        /// Which operation.
        #[command(subcommand)]
        action: WorkspaceAction,
        /// Which server and how to sign in.
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// List a state's kept versions, or write one back, on a running server.
    State {
        /// Which operation.
        #[command(subcommand)]
        action: StateAction,
        /// Which server and how to sign in.
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Make a random AES-256 key for a backend's `encryption.keys`: prints it
    /// base64-encoded; keep it in a file or environment variable.
    GenerateKey,
}

/// How the CLI reaches a running server.
#[derive(Debug, clap::Args)]
pub struct RemoteArgs {
    /// Backend to act on.
    #[arg(long, short, global = true, default_value = "default")]
    backend: String,
    /// URL of the running server.
    #[arg(
        long,
        global = true,
        env = "WASMSTATE_SERVER",
        default_value = "http://127.0.0.1:6061"
    )]
    server: String,
    /// Bearer token, when the server requires authentication.
    #[arg(long, global = true, env = "WASMSTATE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// User for HTTP Basic; the password comes from WASMSTATE_PASSWORD.
    #[arg(long, global = true, env = "WASMSTATE_USER")]
    user: Option<String>,
    /// PEM CA certificate to trust for an https server (besides the
    /// public roots).
    #[arg(long, global = true, env = "WASMSTATE_CA_CERT")]
    ca_cert: Option<PathBuf>,
    /// PEM client certificate, when the server requires one (mTLS).
    #[arg(
        long,
        global = true,
        env = "WASMSTATE_CLIENT_CERT",
        requires = "client_key"
    )]
    client_cert: Option<PathBuf>,
    /// PEM private key of --client-cert.
    #[arg(
        long,
        global = true,
        env = "WASMSTATE_CLIENT_KEY",
        requires = "client_cert"
    )]
    client_key: Option<PathBuf>,
}

impl RemoteArgs {
    fn client(&self) -> anyhow::Result<Client> {
        let credentials = match (&self.token, &self.user) {
            (Some(token), _) => Some(Credentials::Bearer(token.clone())),
            (None, Some(user)) => Some(Credentials::Basic(
                user.clone(),
                std::env::var("WASMSTATE_PASSWORD").unwrap_or_default(),
            )),
            (None, None) => None,
        };
        let tls = ClientTls {
            ca_cert: self.ca_cert.clone(),
            identity: self.client_cert.clone().zip(self.client_key.clone()),
        };
        Client::new(&self.server, credentials, &tls)
    }
}

/// State operations.
#[derive(Debug, Subcommand)]
pub enum StateAction {
    /// List the kept versions of a workspace's state, newest first.
    Versions {
        /// Workspace name.
        #[arg(default_value = "default")]
        workspace: String,
    },
    /// Write a kept version back as the newest state: takes the lock, gives
    /// the version the next serial, writes it, releases the lock.
    Restore {
        /// Workspace name.
        workspace: String,
        /// Version id, from `wasmstate state versions`.
        version: String,
    },
}

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
    /// Run the conformance kit against a guest: a PASS/FAIL line per case,
    /// exit status 1 if any case fails.
    Test {
        /// An embedded guest (`local`) or a path to a `.wasm` component.
        guest: String,
        /// Configuration handed to the guest (repeatable).
        #[arg(long = "config", value_name = "KEY=VALUE")]
        config: Vec<String>,
        /// Directory granted to the guest at /data [default: a fresh
        /// temporary directory].
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Origin the guest may send HTTP requests to, e.g.
        /// http://127.0.0.1:2379 (repeatable).
        #[arg(long = "allow-http", value_name = "ORIGIN")]
        allow_http: Vec<String>,
        /// Git repository URL the guest may use through the host (repeatable;
        /// the embedded git guest gets its --config repository=URL).
        #[arg(long = "allow-git", value_name = "URL")]
        allow_git: Vec<String>,
        /// Ref the guest may update in those repositories, `*` within a
        /// segment, `**` across (repeatable; the embedded git guest: its
        /// branch and refs/heads/locks/**).
        #[arg(long = "git-ref", value_name = "PATTERN")]
        git_refs: Vec<String>,
        /// Path its commits may touch (repeatable; the embedded git guest:
        /// its state and lock files).
        #[arg(long = "git-path", value_name = "PATTERN")]
        git_paths: Vec<String>,
        /// Memory cap per call.
        #[arg(long, default_value_t = 256)]
        memory_mib: u64,
        /// Deadline per call.
        #[arg(long, default_value_t = 30_000)]
        timeout_ms: u64,
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

/// Workspace operations.
#[derive(Debug, Subcommand)]
pub enum WorkspaceAction {
    /// Print every workspace, `default` first.
    List,
    /// Create a workspace (no error if it exists).
    Create {
        /// Workspace name.
        name: String,
    },
    /// Delete a workspace and its state (refused while it is locked).
    Delete {
        /// Workspace name.
        name: String,
    },
}

/// Run the parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve {
            config,
            listen,
            data_dir,
            cache_dir,
        } => {
            let overrides = Overrides {
                listen,
                data_dir,
                cache_dir,
            };
            let source = config.clone().map(|path| crate::reload::ConfigSource {
                path,
                overrides: overrides.clone(),
            });
            let config = Config::load(config.as_deref(), overrides)?;
            crate::server::serve(config, source).await
        }
        Command::CheckConfig { config } => {
            let config = Config::load(Some(&config), Overrides::default())?;
            let metrics = std::sync::Arc::new(crate::metrics::Metrics::new([]));
            let runtime = crate::runtime::Runtime::new(&config, metrics)?;
            let backends = crate::server::load_backends(&config, &runtime).await?;
            println!("listen {}", config.listen);
            for b in &config.backends {
                let dir = config.granted_dir(b);
                println!(
                    "backend {}: guest {} (sha256 {}), memory {} MiB, timeout {} ms, directory {}",
                    b.name,
                    b.guest,
                    backends[&b.name].sha256(),
                    b.limits.memory_bytes >> 20,
                    b.limits.timeout.as_millis(),
                    dir.map_or("(none)".to_string(), |d| d.display().to_string())
                );
            }
            println!("configuration OK");
            Ok(())
        }
        Command::Guest {
            action:
                GuestAction::Test {
                    guest,
                    config,
                    dir,
                    allow_http,
                    allow_git,
                    git_refs,
                    git_paths,
                    memory_mib,
                    timeout_ms,
                },
        } => {
            let subject = GuestUnderTest {
                guest: guest_source(&guest)?,
                config: config
                    .iter()
                    .map(|kv| {
                        kv.split_once('=')
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .ok_or_else(|| anyhow::anyhow!("--config {kv:?}: write KEY=VALUE"))
                    })
                    .collect::<Result<_, _>>()?,
                dir,
                allow_http: allow_http
                    .iter()
                    .map(|o| Origin::parse(o).map_err(|e| anyhow::anyhow!("--allow-http {e}")))
                    .collect::<Result<_, _>>()?,
                allow_git,
                git_refs,
                git_paths,
                limits: Limits {
                    memory_bytes: memory_mib << 20,
                    timeout: std::time::Duration::from_millis(timeout_ms),
                },
            };
            let report = run_guest(subject).await?;
            print!("{}", report.render());
            if !report.all_passed() {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Guest { action } => crate::marketplace::cli::run(action).await,
        Command::HashPassword => {
            let mut password = String::new();
            std::io::stdin().read_line(&mut password)?;
            let password = password.trim_end_matches(['\r', '\n']);
            anyhow::ensure!(
                !password.is_empty(),
                "no password on stdin: echo 'the password' | wasmstate hash-password"
            );
            println!("{}", crate::auth::hash_password(password));
            Ok(())
        }
        Command::GenerateToken => {
            let (token, sha256) = crate::auth::generate_token();
            println!("token:  {token}\nsha256: {sha256}");
            Ok(())
        }
        Command::Workspace { action, remote } => {
            let client = remote.client()?;
            let backend = &remote.backend;
            match action {
                WorkspaceAction::List => {
                    for name in client.list(backend).await? {
                        println!("{name}");
                    }
                }
                WorkspaceAction::Create { name } => {
                    println!("{}", client.create(backend, &name).await?)
                }
                WorkspaceAction::Delete { name } => {
                    println!("{}", client.delete(backend, &name).await?)
                }
            }
            Ok(())
        }
        Command::State { action, remote } => {
            let client = remote.client()?;
            let backend = &remote.backend;
            match action {
                StateAction::Versions { workspace } => {
                    let versions = client.versions(backend, &workspace).await?;
                    println!("{:<20} {:>8} {:>10}  written", "id", "serial", "bytes");
                    for v in versions {
                        println!(
                            "{:<20} {:>8} {:>10}  {}",
                            v.id,
                            v.serial.map_or("-".to_string(), |s| s.to_string()),
                            v.bytes,
                            crate::client::format_unix_ms(v.created_unix_ms)
                        );
                    }
                }
                StateAction::Restore { workspace, version } => {
                    let serial = client.restore(backend, &workspace, &version).await?;
                    println!(
                        "restored version {version} of {backend}/{workspace} as serial {serial}"
                    );
                }
            }
            Ok(())
        }
        Command::GenerateKey => {
            println!("{}", crate::store::envelope::EncryptionKey::generate());
            Ok(())
        }
    }
}

/// `local` (embedded) or a path to a component file.
fn guest_source(text: &str) -> anyhow::Result<GuestSource> {
    if let Some(embedded) = crate::guests::embedded(text) {
        return Ok(GuestSource::Embedded(embedded.name));
    }
    let path = PathBuf::from(text);
    anyhow::ensure!(
        path.is_file(),
        "{text:?} is neither an embedded guest ({}) nor a component file",
        crate::guests::embedded_names().join(", ")
    );
    Ok(GuestSource::File(path))
}
