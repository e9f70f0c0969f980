//! Server configuration in two stages: the raw TOML as written, then a
//! validated [`Config`] the rest of the host trusts without re-checking.
//!
//! ```toml
//! listen = "127.0.0.1:6061"
//! data_dir = "./wasmstate-data"
//! # cache_dir = "/var/cache/wasmstate"   # compiled guests; default <data_dir>/cache
//! max_body_mib = 512
//!
//! [tls]                    # HTTPS (optional)
//! cert = "server.pem"      # PEM certificate chain
//! key = "server.key"       # PEM private key
//! # client_ca = "ca.pem"   # require client certificates signed by this CA (mTLS)
//!
//! [backends.default]
//! guest = "local"          # an embedded guest, or a path to a .wasm file
//! memory_mib = 256         # per-request memory cap
//! timeout_ms = 10000       # per-request deadline
//! allow_http = []          # origins the guest may call, e.g. "http://127.0.0.1:2379"
//! # max_instances = 48     # instances of this backend at once (default: 3/4 of the server's)
//! allow_force_push = false # accept older/unrelated states (`state push -force`)
//! history = 10             # versions kept per workspace by the host; 0 = none
//! allow_git = []           # repositories the guest may use through the host's git
//!                          # (the embedded git guest: its config.repository)
//! # git_auth = { username_env = "GIT_USER", password_env = "GIT_TOKEN" }  # or ssh_key = "path"
//! # Encrypt states before the guest sees them; the first key seals, all open.
//! # encryption = { keys = [{ id = "2026-12", aws_kms = "arn:aws:kms:eu-west-1:…:key/…" },
//! #                         { id = "2026-11", env = "WASMSTATE_KEY" }, { id = "old", file = "old.key" }] }
//! # (KMS: the backend's AWS credentials, else encryption.aws = { profile = "…" }, else the
//! #  standard chain; data_key_cache_seconds = 300; `wasmstate state reseal` after a rotation)
//! # lock_ttl = "12h"      # a lock this old may be taken over (off by default)
//! [backends.default.config]
//! fsync = true             # handed to the guest as strings
//!
//! [audit]                  # the audit trail under <data_dir>/audit
//! # max_mib = 64           # all its rotated files together
//! # files = 4              # rotated over this many files
//! # stdout = false         # also print each record as a JSON line
//! # replica = "pod-1"      # this replica's name in records; default the host name
//!
//! [[users]]                # HTTP Basic; hash from `wasmstate hash-password`
//! name = "alice"
//! password_hash = "$argon2id$v=19$..."
//! grants = ["default:*:write"]   # backend:workspaces:role (outputs|read|write|admin)
//!
//! [[tokens]]               # bearer; from `wasmstate generate-token`
//! name = "ci"
//! sha256 = "9f86d081..."
//! grants = ["*:*:admin"]
//!
//! [[oidc]]                 # CI jobs' OIDC tokens (Bearer, or the Basic password)
//! name = "github"
//! issuer = "https://token.actions.githubusercontent.com"
//! audiences = ["wasmstate"]
//! [[oidc.roles]]
//! bound_claims = { repository = "acme/infra", ref = "refs/heads/main" }
//! grants = ["prod:*:write"]
//! ```

use crate::auth::{Grant, Token, User, check_hash};
use crate::capabilities::aws::AwsGrant;
use crate::capabilities::azure::AzureGrant;
use crate::capabilities::gcp::GcpGrant;
use crate::capabilities::git::{GitAuth, GitGrant};
use crate::guests;
pub use crate::guests::GuestSource;
use crate::names::check_name;
use crate::policy::Origin;
use crate::store::keys::EncryptionSpec;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Address served when neither the config file nor `--listen` names one.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:6061";
/// Data directory used when neither the config file nor `--data-dir` names one.
pub const DEFAULT_DATA_DIR: &str = "./wasmstate-data";
/// Large organisations keep states of hundreds of MiB, and the contract
/// streams them, so a write in flight holds its body once, in the host.
const DEFAULT_MAX_BODY_MIB: u64 = 512;
const DEFAULT_MEMORY_MIB: u64 = 256;
const DEFAULT_TIMEOUT_MS: u64 = 10_000;
const DEFAULT_MAX_INSTANCES: u32 = 64;
const DEFAULT_HISTORY: u64 = 10;
/// Disk quota of a guest that is not embedded (installed, or a file).
const DEFAULT_DISK_QUOTA_MIB: u64 = 1024;
/// Disk a git clone may use before it is discarded and fetched again.
const DEFAULT_GIT_CLONE_MAX_MIB: u64 = 1024;

/// Validated server configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Where backends' files (and, by default, compiled guests) live.
    pub data_dir: PathBuf,
    /// Where compiled guests are cached; `<data_dir>/cache` when unset.
    pub cache_dir: Option<PathBuf>,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Most guest instances alive at once (the pooling allocator's size);
    /// further requests wait for a free slot.
    pub max_instances: u32,
    /// The configured backends, by name.
    pub backends: Vec<BackendConfig>,
    /// Users who sign in with HTTP Basic.
    pub users: Vec<User>,
    /// Bearer tokens.
    pub tokens: Vec<Token>,
    /// Issuers whose OIDC tokens sign callers in.
    pub oidc: Vec<crate::auth::oidc::OidcConfig>,
    /// HTTPS settings; plain HTTP when `None`.
    pub tls: Option<TlsConfig>,
    /// Signature policy and catalogue for installed guests.
    pub marketplace: MarketplaceConfig,
    /// Linear memory all guest instances together may hold; `None`: half
    /// of the memory the server may use (physical or its cgroup's limit).
    pub max_guest_memory_bytes: Option<u64>,
    /// Disk one repository's clone under `<data_dir>/git` may use.
    pub git_clone_max_bytes: u64,
    /// How the server faces the network: names, timeouts, caps.
    pub network: NetworkConfig,
    /// Where and how the audit trail is kept (`[audit]`).
    pub audit: crate::audit::AuditSettings,
}

/// The `[network]` table: what strangers on the network may cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkConfig {
    /// Host names clients reach the server by, besides its address (and
    /// `localhost`); requests naming any other host are refused.
    pub server_names: Vec<String>,
    /// Time a client has to send a request's header.
    pub header_read_timeout: Duration,
    /// Time an idle keep-alive connection stays open.
    pub keepalive_timeout: Duration,
    /// Time a client has to send a request's body.
    pub body_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
    /// Connections open at once from one address.
    pub max_connections_per_address: usize,
    /// How long requests under way may take to finish at shutdown.
    pub shutdown_timeout: Duration,
    /// Bytes of states the server holds at once while they arrive and
    /// while clients take them (`None`: [`default_max_buffered`]).
    pub max_buffered_bytes: Option<u64>,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            server_names: Vec::new(),
            header_read_timeout: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(120),
            max_connections: default_max_connections(),
            max_connections_per_address: 64,
            shutdown_timeout: Duration::from_secs(25),
            max_buffered_bytes: None,
        }
    }
}

/// Bytes of bodies a server holds at once by default: a quarter of its
/// memory (physical, or its cgroup's limit), and never less than two of
/// the largest bodies (one arriving, one answered) plus 64 MiB, so any
/// accepted state can always be written and read back.
pub fn default_max_buffered(max_body_bytes: usize) -> u64 {
    let memory = crate::runtime::system::memory_limit().map_or(4 << 30, |(bytes, _)| bytes);
    (memory / 4).max(buffered_floor(max_body_bytes))
}

/// The least `max_buffered_mib` may be: two of the largest bodies plus 64 MiB.
pub fn buffered_floor(max_body_bytes: usize) -> u64 {
    max_body_bytes as u64 + buffered_reserve(max_body_bytes)
}

/// What answers leave free of the body budget, so one arriving body of
/// the largest size always fits: that body plus 64 MiB.
pub fn buffered_reserve(max_body_bytes: usize) -> u64 {
    max_body_bytes as u64 + (64 << 20)
}

/// Connections a server holds at once by default: most of its file
/// descriptors, leaving 1,024 for the files, guests and clones it opens; at
/// least 512, at most 8,192. A stalled connection costs a descriptor and
/// about 20 KiB of the server's memory (measured: `escapes.rs`), so the
/// ceiling keeps a full house near 160 MiB. A few hundred stalled sockets
/// must not lock everyone out; the per-address cap and the header deadline
/// bound what one client holds.
pub fn default_max_connections() -> usize {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    (soft.saturating_sub(1024)).clamp(512, 8_192) as usize
}

/// The `[marketplace]` table: which publishers' guests may be installed
/// and run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarketplaceConfig {
    /// Publisher public keys (minisign base64, or paths to `.pub` files),
    /// each for any guest or for the guests it names.
    #[serde(default)]
    pub trusted_keys: Vec<TrustedKey>,
    /// Install and run guests without a trusted signature.
    #[serde(default)]
    pub allow_unsigned: bool,
    /// Guest catalogue (path or URL) for `guest search` and `guest install NAME`.
    pub index: Option<String>,
}

/// One `trusted_keys` entry: `"KEY"` trusts the key for any guest,
/// `{ key = "KEY", guests = ["etcd", "acme-*"] }` only for those names.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum TrustedKey {
    /// Trusted to sign any guest.
    Any(String),
    /// Trusted to sign the guests named (a `*` suffix: any name so prefixed).
    Scoped {
        /// The key.
        key: String,
        /// The guest names.
        guests: Vec<String>,
    },
}

impl TrustedKey {
    /// The key, and the names it may sign (`None`: any).
    pub fn parts(&self) -> (&str, Option<&[String]>) {
        match self {
            TrustedKey::Any(key) => (key, None),
            TrustedKey::Scoped { key, guests } => (key, Some(guests)),
        }
    }
}

/// The `[tls]` table: certificate files for HTTPS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by this CA.
    pub client_ca: Option<PathBuf>,
}

/// One `[backends.NAME]` table, validated.
#[derive(Debug, Clone)]
pub struct BackendConfig {
    /// The name used in URLs: `/states/{name}/{workspace}`.
    pub name: String,
    /// Which guest component serves it.
    pub guest: GuestSource,
    /// Host directory granted to the guest at `/data`, if any.
    pub dir: Option<PathBuf>,
    /// Sandbox limits for each request.
    pub limits: Limits,
    /// Key/value configuration handed to the guest.
    pub guest_config: Vec<(String, String)>,
    /// Origins the guest may send HTTP requests to.
    pub allow_http: Vec<Origin>,
    /// Internal addresses and ranges those origins may resolve to.
    pub allow_http_addresses: Vec<ipnet::IpNet>,
    /// AWS requests the host signs for the guest, and where the
    /// credentials come from.
    pub aws: Option<AwsGrant>,
    /// Azure Storage requests the host signs for the guest, and with what.
    pub azure: Option<AzureGrant>,
    /// Google Cloud requests the host adds a token to, and its source.
    pub gcp: Option<GcpGrant>,
    /// The database the host reaches for the guest (the postgres guest).
    pub postgres: Option<crate::capabilities::postgres::PgGrant>,
    /// Accept states older than, or unrelated to, the stored one.
    pub allow_force_push: bool,
    /// Versions the host keeps per workspace (0: none).
    pub history: usize,
    /// Git repositories the guest may use, with the host-held credentials.
    pub allow_git: Vec<GitGrant>,
    /// Named secrets the guest may read (`host.get-secret`), resolved.
    pub secrets: Vec<(String, String)>,
    /// Most instances of this backend alive at once; `None`: three
    /// quarters of the server's `max_instances`, so one busy or hostile
    /// backend cannot take every slot.
    pub max_instances: Option<u32>,
    /// Encryption at rest: its keys (the first seals), the migration
    /// switch (`accept_plain`: also read states stored before encryption,
    /// or sealed before 2026-11 without backend and workspace bound in),
    /// how long KMS data keys are cached. `None`: no encryption.
    pub encryption: Option<EncryptionSpec>,
    /// Linear memory this backend's instances together may hold; `None`:
    /// three quarters of the server's guest memory budget.
    pub memory_budget_bytes: Option<u64>,
    /// Bytes its granted directory may hold; `None`: no quota.
    pub disk_quota_bytes: Option<u64>,
    /// Instances of this backend running guest code at once; `None`: all
    /// the server's cores but one (at least one).
    pub max_cores: Option<u32>,
    /// After how long a held lock may be taken over by another `LOCK`;
    /// `None` (the default): never, as Terraform's own backends.
    pub lock_ttl: Option<Duration>,
}

/// Per-request sandbox limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Total linear memory one instance may use.
    pub memory_bytes: u64,
    /// Wall-clock deadline for one request's guest call.
    pub timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: DEFAULT_MEMORY_MIB * 1024 * 1024,
            timeout: Duration::from_millis(DEFAULT_TIMEOUT_MS),
        }
    }
}

/// Values from the command line; they win over the config file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--listen`
    pub listen: Option<SocketAddr>,
    /// `--data-dir`
    pub data_dir: Option<PathBuf>,
    /// `--cache-dir`
    pub cache_dir: Option<PathBuf>,
}

/// A configuration problem, phrased for the operator: file, key, reason.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

mod backend;
pub mod cloud;
mod encryption;
mod oidc;
mod raw;
#[cfg(test)]
mod tests;
mod validate;
mod values;

use raw::RawConfig;
use validate::validate;
use values::{line_col, mib};

/// The most bytes a sealed envelope of a `state_len`-byte state takes:
/// base64 of the ciphertext (state + 16-byte tag), plus 64 KiB for the
/// envelope's fields (key id, nonce, clear serial and lineage). A state
/// whose envelope would be larger (a lineage of tens of KiB) is refused
/// before storage sees it.
pub fn sealed_len_bound(state_len: usize) -> usize {
    (state_len + 16).div_ceil(3) * 4 + (64 << 10)
}

impl Config {
    /// The most bytes storage may hold for one state: the sealed size of
    /// the largest body, whether or not a backend encrypts now (a reload
    /// may turn encryption on). Reads are allowed this much and writes
    /// refused beyond it, so a state accepted is a state that reads back.
    pub fn max_stored_bytes(&self) -> usize {
        sealed_len_bound(self.max_body_bytes)
    }

    /// Load `path` (or the built-in default when `None`) and apply `overrides`.
    pub fn load(path: Option<&Path>, overrides: Overrides) -> Result<Config, ConfigError> {
        let Some(path) = path else {
            return Ok(Config::default_with(overrides));
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("cannot read config file {}: {e}", path.display())))?;
        Config::parse(&text, path, overrides)
    }

    /// Parse config text; `path` names the file in errors and anchors
    /// relative paths.
    pub fn parse(text: &str, path: &Path, overrides: Overrides) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let at = e
                .span()
                .map(|span| line_col(text, span.start))
                .map(|(line, col)| format!(":{line}:{col}"))
                .unwrap_or_default();
            ConfigError(format!("{file}{at}: {}", e.message().trim()))
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        validate(raw, base, &file, overrides)
    }

    /// One `default` backend on the embedded `local` guest: what `serve`
    /// runs without a config file.
    pub fn default_with(overrides: Overrides) -> Config {
        Config {
            listen: overrides
                .listen
                .unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("valid default")),
            data_dir: overrides
                .data_dir
                .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
            cache_dir: overrides.cache_dir,
            max_body_bytes: mib(DEFAULT_MAX_BODY_MIB) as usize,
            max_instances: DEFAULT_MAX_INSTANCES,
            backends: vec![BackendConfig {
                name: "default".into(),
                guest: GuestSource::Embedded("local"),
                dir: None,
                limits: Limits::default(),
                guest_config: Vec::new(),
                allow_http: Vec::new(),
                allow_http_addresses: Vec::new(),
                aws: None,
                azure: None,
                gcp: None,
                postgres: None,
                allow_force_push: false,
                history: DEFAULT_HISTORY as usize,
                encryption: None,
                allow_git: Vec::new(),
                secrets: Vec::new(),
                max_instances: None,
                memory_budget_bytes: None,
                disk_quota_bytes: None,
                max_cores: None,
                lock_ttl: None,
            }],
            users: Vec::new(),
            tokens: Vec::new(),
            oidc: Vec::new(),
            tls: None,
            marketplace: MarketplaceConfig::default(),
            max_guest_memory_bytes: None,
            git_clone_max_bytes: mib(DEFAULT_GIT_CLONE_MAX_MIB),
            network: NetworkConfig::default(),
            audit: crate::audit::AuditSettings::default(),
        }
    }

    /// The directory granted to `backend`'s guest: its `dir`, or for the
    /// embedded `local` guest a folder of its own in the data directory.
    pub fn granted_dir(&self, backend: &BackendConfig) -> Option<PathBuf> {
        match (&backend.dir, &backend.guest) {
            (Some(dir), _) => Some(dir.clone()),
            (None, GuestSource::Embedded("local")) => {
                Some(self.data_dir.join("backends").join(&backend.name))
            }
            _ => None,
        }
    }

    /// Where compiled guests are cached.
    pub fn cache_dir(&self) -> PathBuf {
        self.cache_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("cache"))
    }
}
