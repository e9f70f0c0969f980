//! Command-line interface: the only layer that knows the subcommands.

mod audit;
mod guest;
mod kit;
mod new;
mod reseal;

pub use guest::{GuestAction, StoreArgs};

use crate::client::{Client, ClientTls, Credentials};
use crate::config::{Config, Overrides};
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

impl Cli {
    /// The log filter when WASMSTATE_LOG sets none: `info`, but nothing for
    /// the author's kit (`guest test`, `guest bench`) unless `--verbose`,
    /// so its output is only its report (and, before it, what the guest's
    /// manifest asks for that its flags did not grant).
    pub fn default_log_filter(&self) -> &'static str {
        match &self.command {
            Command::Guest {
                action: GuestAction::Test { guest } | GuestAction::Bench { guest, .. },
            } if !guest.verbose() => "off,wasmstate::loader::narrow=warn",
            _ => "info",
        }
    }
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
    /// See the locks held on a running server's backend: holder, operation
    /// and age.
    Lock {
        /// Which operation.
        #[command(subcommand)]
        action: LockAction,
        /// Which server and how to sign in.
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Search a running server's audit trail of a backend: who wrote,
    /// locked, force-unlocked or restored what, and when (admins).
    ///
    /// Example: who changed prod's states on 2026-11-24, and who
    /// force-unlocked one: `wasmstate audit -b prod --since 2026-11-24
    /// --until 2026-11-24`, then `--operation force-unlock`.
    Audit {
        /// Which records.
        #[command(flatten)]
        filter: audit::AuditArgs,
        /// Which server and how to sign in.
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Make a random AES-256 key for a backend's `encryption.keys`: prints it
    /// base64-encoded, or with --out writes it to a new file only its owner
    /// may read (mode 0600).
    ///
    /// Example: `wasmstate generate-key --out /etc/wasmstate/k1.key`, then
    /// `encryption = { keys = [{ id = "k1", file = "/etc/wasmstate/k1.key" }] }`.
    GenerateKey {
        /// Write the key to this new file (mode 0600) instead of stdout;
        /// an existing file is never overwritten.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
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

/// Lock operations.
#[derive(Debug, Subcommand)]
pub enum LockAction {
    /// Print every held lock, oldest first: workspace, age, holder,
    /// operation, since when (and the lock ID, for an admin).
    List {
        /// Only locks held at least this long, e.g. `1h`, `30m`.
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: Option<std::time::Duration>,
    },
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
    /// Seal every state and kept version of a backend again under its
    /// newest key (the first of encryption.keys), online, so an older key
    /// can be removed; after a backend rename, re-bind them to the new name
    /// with --from-backend. Takes each workspace's lock and skips (and
    /// reports) one whose lock is held; run it again for those. Needs an
    /// admin. Exits non-zero while a workspace was skipped or failed;
    /// versions the storage keeps (S3 versions, git commits) cannot be
    /// rewritten and are listed with the key they still need. Versions the
    /// host keeps are each replica's: unless replicas share a data
    /// directory, run it against each (--server).
    ///
    /// Example, after putting a KMS key first in encryption.keys and
    /// reloading: `wasmstate state reseal -b prod --dry-run`, then without
    /// --dry-run, then remove the old key and reload.
    Reseal {
        /// Only this workspace [default: every workspace of the backend].
        #[arg(long, short)]
        workspace: Option<String>,
        /// Say what would be re-sealed; change nothing and take no lock.
        #[arg(long)]
        dry_run: bool,
        /// The backend's name before a rename: open states and versions
        /// bound to it (and move the versions this host kept under it).
        #[arg(long, value_name = "OLD")]
        from_backend: Option<String>,
    },
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
            let backends = crate::loader::load_all(&config, &runtime).await?;
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
        Command::Guest { action } => guest::run(action).await,
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
        Command::Lock {
            action: LockAction::List { older_than },
            remote,
        } => {
            let held = remote.client()?.locks(&remote.backend).await?;
            let min = older_than.map_or(0, |d| d.as_secs());
            println!(
                "{:<24} {:>10}  {:<24} {:<20} since",
                "workspace", "age", "holder", "operation"
            );
            for lock in held
                .iter()
                .filter(|l| l.age_seconds.unwrap_or(u64::MAX) >= min)
            {
                let age = lock
                    .age_seconds
                    .map_or("?".to_string(), crate::backend::age_text);
                let id = lock
                    .id
                    .as_deref()
                    .map(|id| format!("  id {id}"))
                    .unwrap_or_default();
                println!(
                    "{:<24} {:>10}  {:<24} {:<20} {}{id}",
                    lock.workspace, age, lock.who, lock.operation, lock.created
                );
            }
            Ok(())
        }
        Command::State { action, remote } => {
            let client = remote.client()?;
            let backend = &remote.backend;
            match action {
                StateAction::Versions { workspace } => {
                    let (versions, source) =
                        client.versions_with_source(backend, &workspace).await?;
                    if let Some(source) = source {
                        println!("history: {}", history_line(&source));
                    }
                    let width = versions
                        .iter()
                        .map(|v| v.id.len())
                        .max()
                        .unwrap_or(0)
                        .max(20);
                    println!("{:<width$} {:>8} {:>10}  written", "id", "serial", "bytes");
                    for v in versions {
                        println!(
                            "{:<width$} {:>8} {:>10}  {}",
                            v.id,
                            v.serial.map_or("-".to_string(), |s| s.to_string()),
                            v.bytes,
                            crate::client::format_unix_ms(v.created_unix_ms)
                        );
                    }
                }
                StateAction::Reseal {
                    workspace,
                    dry_run,
                    from_backend,
                } => {
                    let plan = reseal::Plan {
                        backend: backend.to_string(),
                        workspace,
                        dry_run,
                        from_backend,
                    };
                    return reseal::run(&client, plan).await;
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
        Command::Audit { filter, remote } => audit::run(filter, remote).await,
        Command::GenerateKey { out: None } => {
            println!("{}", crate::store::envelope::generate_material());
            Ok(())
        }
        Command::GenerateKey { out: Some(path) } => {
            write_owner_only(&path, &crate::store::envelope::generate_material())?;
            println!("key written to {} (mode 0600)", path.display());
            Ok(())
        }
    }
}

/// Write `text` (and a newline) to `path`, a new file created readable and
/// writable by its owner only: a key must never sit, even briefly, in a
/// file others can read, nor replace a key already in use.
fn write_owner_only(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => anyhow::anyhow!(
                "{} exists: a key is never overwritten; choose another file (or remove it first)",
                path.display()
            ),
            _ => anyhow::anyhow!("cannot create {}: {e}", path.display()),
        })?;
    writeln!(file, "{text}")
        .and_then(|()| file.sync_all())
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
}

/// What `state versions` says of who keeps the versions the server listed.
fn history_line(source: &str) -> String {
    use crate::backend::HistorySource;
    [
        HistorySource::Storage,
        HistorySource::Replica,
        HistorySource::None,
    ]
    .into_iter()
    .find(|s| s.name() == source)
    .map_or_else(|| source.to_string(), |s| s.describe().to_string())
}
