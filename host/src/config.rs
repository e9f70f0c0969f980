//! Server configuration in two stages: the raw TOML as written, then a
//! validated [`Config`] the rest of the host trusts without re-checking.
//!
//! ```toml
//! listen = "127.0.0.1:6061"
//! data_dir = "./wasmstate-data"
//! # cache_dir = "/var/cache/wasmstate"   # compiled guests; default <data_dir>/cache
//! max_body_mib = 64
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
//! # encryption = { keys = [{ id = "2026-11", env = "WASMSTATE_KEY" }, { id = "old", file = "old.key" }] }
//! [backends.default.config]
//! fsync = true             # handed to the guest as strings
//!
//! [[users]]                # HTTP Basic; hash from `wasmstate hash-password`
//! name = "alice"
//! password_hash = "$argon2id$v=19$..."
//! grants = ["default:*:write"]   # backend:workspaces:role (read|write|admin)
//!
//! [[tokens]]               # bearer; from `wasmstate generate-token`
//! name = "ci"
//! sha256 = "9f86d081..."
//! grants = ["*:*:admin"]
//! ```

use crate::auth::{Grant, Token, User, check_hash};
use crate::capabilities::git::{GitAuth, GitGrant};
use crate::guests;
use crate::names::check_name;
use crate::policy::Origin;
use crate::store::envelope::EncryptionKey;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Address served when neither the config file nor `--listen` names one.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:6061";
/// Data directory used when neither the config file nor `--data-dir` names one.
pub const DEFAULT_DATA_DIR: &str = "./wasmstate-data";
const DEFAULT_MAX_BODY_MIB: u64 = 64;
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
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            server_names: Vec::new(),
            header_read_timeout: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(120),
            max_connections: 512,
            max_connections_per_address: 64,
            shutdown_timeout: Duration::from_secs(25),
        }
    }
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
    /// Keys for encryption at rest; the first seals. Empty: no encryption.
    pub encryption_keys: Vec<EncryptionKey>,
    /// With encryption on, still accept states stored before it (plain, or
    /// sealed by wasmstate before 2026-11 without the backend and workspace
    /// bound in): a one-time migration mode, off by default.
    pub encryption_accept_plain: bool,
    /// Linear memory this backend's instances together may hold; `None`:
    /// three quarters of the server's guest memory budget.
    pub memory_budget_bytes: Option<u64>,
    /// Bytes its granted directory may hold; `None`: no quota.
    pub disk_quota_bytes: Option<u64>,
    /// Instances of this backend running guest code at once; `None`: all
    /// the server's cores but one (at least one).
    pub max_cores: Option<u32>,
}

/// Where a guest's component comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestSource {
    /// One of the guests compiled into this binary.
    Embedded(&'static str),
    /// A component file on disk.
    File(PathBuf),
    /// A guest from the store (`wasmstate guest install`), pinned by digest.
    Installed {
        /// Name from its manifest.
        name: String,
        /// The sha256 it must have.
        sha256: String,
    },
}

impl std::fmt::Display for GuestSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GuestSource::Embedded(name) => write!(f, "{name} (embedded)"),
            GuestSource::File(path) => write!(f, "{}", path.display()),
            GuestSource::Installed { name, sha256 } => write!(f, "{name}@sha256:{sha256}"),
        }
    }
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Option<String>,
    data_dir: Option<PathBuf>,
    cache_dir: Option<PathBuf>,
    max_body_mib: Option<u64>,
    max_instances: Option<u32>,
    max_guest_memory_mib: Option<u64>,
    git_clone_max_mib: Option<u64>,
    #[serde(default)]
    backends: BTreeMap<String, RawBackend>,
    #[serde(default)]
    users: Vec<RawUser>,
    #[serde(default)]
    tokens: Vec<RawToken>,
    tls: Option<RawTls>,
    #[serde(default)]
    marketplace: MarketplaceConfig,
    #[serde(default)]
    network: RawNetwork,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawNetwork {
    #[serde(default)]
    server_names: Vec<String>,
    header_read_timeout_secs: Option<u64>,
    keepalive_timeout_secs: Option<u64>,
    body_timeout_secs: Option<u64>,
    max_connections: Option<u64>,
    max_connections_per_address: Option<u64>,
    shutdown_timeout_secs: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSecret {
    env: Option<String>,
    file: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGitAuth {
    username_env: Option<String>,
    password_env: Option<String>,
    ssh_key: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEncryption {
    keys: Vec<RawKey>,
    #[serde(default)]
    accept_plain: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKey {
    id: String,
    env: Option<String>,
    file: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUser {
    name: String,
    password_hash: String,
    grants: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToken {
    name: String,
    sha256: String,
    grants: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    guest: String,
    dir: Option<PathBuf>,
    memory_mib: Option<u64>,
    timeout_ms: Option<u64>,
    #[serde(default)]
    allow_http: Vec<String>,
    #[serde(default)]
    allow_http_addresses: Vec<String>,
    #[serde(default)]
    allow_force_push: bool,
    history: Option<u64>,
    encryption: Option<RawEncryption>,
    #[serde(default)]
    allow_git: Vec<String>,
    git_refs: Option<Vec<String>>,
    git_paths: Option<Vec<String>>,
    git_auth: Option<RawGitAuth>,
    #[serde(default)]
    secrets: BTreeMap<String, RawSecret>,
    max_instances: Option<u32>,
    memory_budget_mib: Option<u64>,
    disk_quota_mib: Option<u64>,
    max_cores: Option<u32>,
    #[serde(default)]
    config: toml::Table,
}

impl Config {
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
                allow_force_push: false,
                history: DEFAULT_HISTORY as usize,
                encryption_keys: Vec::new(),
                encryption_accept_plain: false,
                allow_git: Vec::new(),
                secrets: Vec::new(),
                max_instances: None,
                memory_budget_bytes: None,
                disk_quota_bytes: None,
                max_cores: None,
            }],
            users: Vec::new(),
            tokens: Vec::new(),
            tls: None,
            marketplace: MarketplaceConfig::default(),
            max_guest_memory_bytes: None,
            git_clone_max_bytes: mib(DEFAULT_GIT_CLONE_MAX_MIB),
            network: NetworkConfig::default(),
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

fn mib(n: u64) -> u64 {
    n * 1024 * 1024
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, col)
}

/// Flatten the guest's config table into `key = value` strings: nested
/// tables become dotted keys (`endpoints = { s3 = "…" }` → `endpoints.s3`),
/// scalars become text, and `{ env = "NAME" }` is replaced by the host's
/// environment variable NAME (so secrets stay out of config files).
fn flatten_config(
    path: &str,
    prefix: &str,
    table: toml::Table,
    out: &mut Vec<(String, String)>,
    file: &str,
) -> Result<(), ConfigError> {
    for (k, v) in table {
        let name = if prefix.is_empty() {
            k
        } else {
            format!("{prefix}.{k}")
        };
        let text = match v {
            toml::Value::String(s) => s,
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Table(t) if t.len() == 1 && t.contains_key("env") => {
                let Some(toml::Value::String(var)) = t.get("env") else {
                    return Err(ConfigError(format!(
                        "{file}: {path}.{name}: env must name a variable"
                    )));
                };
                env_var(var, file, &format!("{path}.{name}"))?
            }
            toml::Value::Table(t) => {
                flatten_config(path, &name, t, out, file)?;
                continue;
            }
            other => {
                return Err(ConfigError(format!(
                    "{file}: {path}.{name}: {} values are not supported; use a string, number or boolean",
                    other.type_str()
                )));
            }
        };
        out.push((name, text));
    }
    Ok(())
}

fn in_range(file: &str, key: &str, value: u64, min: u64, max: u64) -> Result<u64, ConfigError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(ConfigError(format!(
            "{file}: {key} = {value}: must be between {min} and {max}"
        )))
    }
}

fn validate(
    raw: RawConfig,
    base: &Path,
    file: &str,
    overrides: Overrides,
) -> Result<Config, ConfigError> {
    let listen = match (overrides.listen, raw.listen) {
        (Some(addr), _) => addr,
        (None, Some(text)) => text.parse().map_err(|_| {
            ConfigError(format!(
                "{file}: listen = {text:?}: not an address; write IP:PORT, e.g. \"{DEFAULT_LISTEN}\""
            ))
        })?,
        (None, None) => DEFAULT_LISTEN.parse().expect("valid default"),
    };
    let data_dir = overrides.data_dir.unwrap_or_else(|| {
        raw.data_dir
            .map(|d| base.join(d))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR))
    });
    let cache_dir = overrides
        .cache_dir
        .or_else(|| raw.cache_dir.map(|d| base.join(d)));
    let max_body = in_range(
        file,
        "max_body_mib",
        raw.max_body_mib.unwrap_or(DEFAULT_MAX_BODY_MIB),
        1,
        4096,
    )?;
    let max_instances = in_range(
        file,
        "max_instances",
        raw.max_instances.unwrap_or(DEFAULT_MAX_INSTANCES).into(),
        1,
        10_000,
    )? as u32;
    let max_guest_memory_bytes = raw
        .max_guest_memory_mib
        .map(|m| in_range(file, "max_guest_memory_mib", m, 16, 1 << 24).map(mib))
        .transpose()?;
    let git_clone_max_bytes = mib(in_range(
        file,
        "git_clone_max_mib",
        raw.git_clone_max_mib.unwrap_or(DEFAULT_GIT_CLONE_MAX_MIB),
        16,
        1 << 24,
    )?);
    if raw.backends.is_empty() {
        return Err(ConfigError(format!(
            "{file}: no backends: add a table such as\n\n[backends.default]\nguest = \"local\""
        )));
    }
    let backends: Vec<BackendConfig> = raw
        .backends
        .into_iter()
        .map(|(name, b)| validate_backend(name, b, base, file))
        .collect::<Result<_, _>>()?;
    let names: Vec<&str> = backends.iter().map(|b| b.name.as_str()).collect();
    let grants = |who: &str, grants: &[String]| -> Result<Vec<Grant>, ConfigError> {
        grants
            .iter()
            .map(|g| {
                let grant = Grant::parse(g).map_err(|e| ConfigError(format!("{file}: {who}: {e}")))?;
                let backend = g.split(':').next().unwrap_or_default();
                if !backend.ends_with('*') && !names.contains(&backend) {
                    return Err(ConfigError(format!(
                        "{file}: {who}: grant {g:?} names backend {backend:?}, which is not configured ({})",
                        names.join(", ")
                    )));
                }
                Ok(grant)
            })
            .collect()
    };
    let mut users = Vec::new();
    for u in raw.users {
        let who = format!("user {:?}", u.name);
        check_hash(&u.password_hash)
            .map_err(|e| ConfigError(format!("{file}: {who}: password_hash: {e}")))?;
        users.push(User {
            grants: grants(&who, &u.grants)?,
            name: u.name,
            password_hash: u.password_hash,
        });
    }
    let mut tokens = Vec::new();
    for t in raw.tokens {
        let who = format!("token {:?}", t.name);
        if t.sha256.len() != 64 || !t.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ConfigError(format!(
                "{file}: {who}: sha256 must be 64 hex digits; make a token with `wasmstate generate-token`"
            )));
        }
        tokens.push(Token {
            grants: grants(&who, &t.grants)?,
            name: t.name,
            sha256: t.sha256.to_ascii_lowercase(),
        });
    }
    let tls = raw
        .tls
        .map(|t| -> Result<TlsConfig, ConfigError> {
            let file_at = |key: &str, path: PathBuf| {
                let path = base.join(path);
                if path.is_file() {
                    Ok(path)
                } else {
                    Err(ConfigError(format!(
                        "{file}: tls.{key} = {}: no such file",
                        path.display()
                    )))
                }
            };
            Ok(TlsConfig {
                cert: file_at("cert", t.cert)?,
                key: file_at("key", t.key)?,
                client_ca: t.client_ca.map(|c| file_at("client_ca", c)).transpose()?,
            })
        })
        .transpose()?;
    let network = validate_network(raw.network, file)?;
    let config = Config {
        network,
        max_guest_memory_bytes,
        git_clone_max_bytes,
        marketplace: raw.marketplace,
        tls,
        users,
        tokens,
        listen,
        data_dir,
        cache_dir,
        max_body_bytes: mib(max_body) as usize,
        max_instances,
        backends,
    };
    check_granted_dirs(&config, file)?;
    Ok(config)
}

/// `path` with symlinks resolved as far as it exists, and `..` removed, so
/// two spellings of one place compare equal.
fn resolved(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut existing = absolute.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = existing.canonicalize() {
            let mut out = real;
            for part in rest.iter().rev() {
                match part {
                    std::path::Component::ParentDir => {
                        out.pop();
                    }
                    std::path::Component::CurDir => {}
                    other => out.push(other),
                }
            }
            return out;
        }
        match (existing.parent(), existing.components().next_back()) {
            (Some(parent), Some(last)) => {
                rest.push(last);
                existing = parent;
            }
            _ => return absolute,
        }
    }
}

/// A guest's directory must not overlap what the host keeps for itself
/// (compiled machine code, the cache key, installed guests, git clones,
/// version history) nor another backend's directory: a guest able to
/// write there could change what the host runs or what others store.
fn check_granted_dirs(config: &Config, file: &str) -> Result<(), ConfigError> {
    let data = resolved(&config.data_dir);
    let own = [
        (resolved(&config.cache_dir()), "the compiled-guest cache"),
        (data.join("git"), "the git clones"),
        (data.join("guests"), "the installed guests"),
        (data.join("history"), "the version history"),
    ];
    let dirs: Vec<(&str, PathBuf)> = config
        .backends
        .iter()
        .filter_map(|b| {
            config
                .granted_dir(b)
                .map(|d| (b.name.as_str(), resolved(&d)))
        })
        .collect();
    let overlap = |a: &Path, b: &Path| a.starts_with(b) || b.starts_with(a);
    for (i, (name, dir)) in dirs.iter().enumerate() {
        let refuse = |what: &str| {
            Err(ConfigError(format!(
                "{file}: backends.{name}.dir = {}: overlaps {what}; give each backend a directory of its own, outside the host's",
                dir.display()
            )))
        };
        if data.starts_with(dir) {
            return refuse(&format!("the data directory {}", data.display()));
        }
        if let Some((_, what)) = own.iter().find(|(host, _)| overlap(dir, host)) {
            return refuse(what);
        }
        if let Some((other, _)) = dirs[i + 1..].iter().find(|(_, d)| overlap(dir, d)) {
            return refuse(&format!("backend {other:?}'s directory"));
        }
    }
    Ok(())
}

fn validate_network(raw: RawNetwork, file: &str) -> Result<NetworkConfig, ConfigError> {
    let d = NetworkConfig::default();
    let secs = |key: &str, value: Option<u64>, default: Duration, max: u64| {
        in_range(
            file,
            &format!("network.{key}"),
            value.unwrap_or(default.as_secs()),
            1,
            max,
        )
        .map(Duration::from_secs)
    };
    let count = |key: &str, value: Option<u64>, default: usize| {
        in_range(
            file,
            &format!("network.{key}"),
            value.unwrap_or(default as u64),
            1,
            1_000_000,
        )
        .map(|n| n as usize)
    };
    let mut server_names = Vec::new();
    for name in raw.server_names {
        let host = name.trim().to_ascii_lowercase();
        if host.is_empty() || host.contains(['/', ':', ' ', '@']) {
            return Err(ConfigError(format!(
                "{file}: network.server_names: {name:?} is not a host name; write e.g. \"state.example.com\" (no scheme or port)"
            )));
        }
        server_names.push(host);
    }
    Ok(NetworkConfig {
        server_names,
        header_read_timeout: secs(
            "header_read_timeout_secs",
            raw.header_read_timeout_secs,
            d.header_read_timeout,
            3600,
        )?,
        keepalive_timeout: secs(
            "keepalive_timeout_secs",
            raw.keepalive_timeout_secs,
            d.keepalive_timeout,
            3600,
        )?,
        body_timeout: secs(
            "body_timeout_secs",
            raw.body_timeout_secs,
            d.body_timeout,
            86_400,
        )?,
        max_connections: count("max_connections", raw.max_connections, d.max_connections)?,
        max_connections_per_address: count(
            "max_connections_per_address",
            raw.max_connections_per_address,
            d.max_connections_per_address,
        )?,
        shutdown_timeout: secs(
            "shutdown_timeout_secs",
            raw.shutdown_timeout_secs,
            d.shutdown_timeout,
            3600,
        )?,
    })
}

fn validate_backend(
    name: String,
    raw: RawBackend,
    base: &Path,
    file: &str,
) -> Result<BackendConfig, ConfigError> {
    let key = |k: &str| format!("backends.{name}.{k}");
    check_name("backend", &name)
        .map_err(|e| ConfigError(format!("{file}: [backends.{name}]: {e}")))?;
    let guest = match guests::embedded(&raw.guest) {
        Some(embedded) => GuestSource::Embedded(embedded.name),
        None if raw.guest.contains("@sha256:") => {
            let (name, sha256) = raw.guest.split_once("@sha256:").expect("checked");
            let sha256 = sha256.to_ascii_lowercase();
            if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(ConfigError(format!(
                    "{file}: {} = {:?}: the pin after @sha256: must be 64 hex digits (see `wasmstate guest list`)",
                    key("guest"),
                    raw.guest
                )));
            }
            GuestSource::Installed {
                name: name.to_string(),
                sha256,
            }
        }
        None if raw.guest.ends_with(".wasm") => {
            let path = base.join(&raw.guest);
            if !path.is_file() {
                return Err(ConfigError(format!(
                    "{file}: {} = {:?}: no such file ({})",
                    key("guest"),
                    raw.guest,
                    path.display()
                )));
            }
            GuestSource::File(path)
        }
        None => {
            return Err(ConfigError(format!(
                "{file}: {} = {:?}: not an embedded guest ({}), a path to a .wasm file, nor an installed guest pinned as NAME@sha256:HEX (see `wasmstate guest list`)",
                key("guest"),
                raw.guest,
                guests::embedded_names().join(", ")
            )));
        }
    };
    let memory_mib = in_range(
        file,
        &key("memory_mib"),
        raw.memory_mib.unwrap_or(DEFAULT_MEMORY_MIB),
        1,
        4096,
    )?;
    let timeout_ms = in_range(
        file,
        &key("timeout_ms"),
        raw.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
        10,
        3_600_000,
    )?;
    let mut guest_config = Vec::new();
    flatten_config(&key("config"), "", raw.config, &mut guest_config, file)?;
    // First-party guests are granted the endpoints and repository their own
    // configuration names, unless the operator lists grants explicitly.
    let (default_http, default_git) = guests::default_grants(&guest, &guest_config);
    let mut allow_http: Vec<Origin> = raw
        .allow_http
        .iter()
        .map(|o| {
            Origin::parse(o).map_err(|e| ConfigError(format!("{file}: {}: {e}", key("allow_http"))))
        })
        .collect::<Result<_, _>>()?;
    if allow_http.is_empty() {
        allow_http = default_http;
    }
    let allow_http_addresses = raw
        .allow_http_addresses
        .iter()
        .map(|a| {
            crate::policy::parse_address_grant(a)
                .map_err(|e| ConfigError(format!("{file}: {}: {e}", key("allow_http_addresses"))))
        })
        .collect::<Result<_, _>>()?;
    let history = in_range(
        file,
        &key("history"),
        raw.history.unwrap_or(DEFAULT_HISTORY),
        0,
        10_000,
    )? as usize;
    let encryption_accept_plain = raw.encryption.as_ref().is_some_and(|e| e.accept_plain);
    let encryption_keys = match raw.encryption {
        None => Vec::new(),
        Some(enc) => encryption_keys(enc, base, &key("encryption.keys"), file)?,
    };
    let auth = match raw.git_auth {
        None => GitAuth::default(),
        Some(a) => {
            let env = |var: Option<String>, what: &str| {
                var.map(|var| env_var(&var, file, &format!("{}.{what}", key("git_auth"))))
                    .transpose()
            };
            GitAuth {
                username: env(a.username_env, "username_env")?,
                password: env(a.password_env, "password_env")?,
                ssh_key: a.ssh_key.map(|k| base.join(k)),
            }
        }
    };
    let mut git_urls = raw.allow_git;
    if git_urls.is_empty() {
        git_urls = default_git.urls;
    }
    // What the guest may change in them: a first-party guest's own layout
    // unless the operator says otherwise; nothing for other guests.
    let git_refs = raw.git_refs.unwrap_or(default_git.refs);
    let git_paths = raw.git_paths.unwrap_or(default_git.paths);
    for pattern in git_refs.iter().chain(&git_paths) {
        if pattern.trim().is_empty() || pattern.contains("..") {
            return Err(ConfigError(format!(
                "{file}: {}: {pattern:?} is not a pattern; write e.g. \"refs/heads/locks/**\" or \"states/*.tfstate\"",
                key("git_refs / git_paths")
            )));
        }
    }
    let allow_git = git_urls
        .into_iter()
        .map(|url| {
            if url.trim().is_empty() {
                return Err(ConfigError(format!(
                    "{file}: {}: empty repository URL",
                    key("allow_git")
                )));
            }
            Ok(GitGrant {
                url,
                auth: auth.clone(),
                refs: git_refs.clone(),
                paths: git_paths.clone(),
            })
        })
        .collect::<Result<_, _>>()?;
    let mut secrets = Vec::new();
    for (name, secret) in raw.secrets {
        let at = format!("{}.{name}", key("secrets"));
        let value = env_or_file(secret.env, secret.file, base, file, &at)?;
        secrets.push((name, value));
    }
    let max_instances = raw
        .max_instances
        .map(|n| in_range(file, &key("max_instances"), n.into(), 1, 10_000).map(|n| n as u32))
        .transpose()?;
    let memory_budget_bytes = raw
        .memory_budget_mib
        .map(|m| in_range(file, &key("memory_budget_mib"), m, 1, 1 << 24).map(mib))
        .transpose()?;
    // Embedded guests are the operator's own choice of code; a stranger's
    // gets a quota unless the operator sets one.
    let disk_quota_bytes = match (raw.disk_quota_mib, &guest) {
        (Some(m), _) => Some(mib(in_range(file, &key("disk_quota_mib"), m, 1, 1 << 30)?)),
        (None, GuestSource::Embedded(_)) => None,
        (None, _) => Some(mib(DEFAULT_DISK_QUOTA_MIB)),
    };
    let max_cores = raw
        .max_cores
        .map(|n| in_range(file, &key("max_cores"), n.into(), 1, 1024).map(|n| n as u32))
        .transpose()?;
    Ok(BackendConfig {
        memory_budget_bytes,
        disk_quota_bytes,
        max_cores,
        max_instances,
        secrets,
        allow_git,
        history,
        encryption_keys,
        encryption_accept_plain,
        allow_http,
        allow_http_addresses,
        allow_force_push: raw.allow_force_push,
        dir: raw.dir.map(|d| base.join(d)),
        name,
        guest,
        limits: Limits {
            memory_bytes: mib(memory_mib),
            timeout: Duration::from_millis(timeout_ms),
        },
        guest_config,
    })
}

/// The host's environment variable `var`, named by the config key `at`.
fn env_var(var: &str, file: &str, at: &str) -> Result<String, ConfigError> {
    std::env::var(var).map_err(|_| {
        ConfigError(format!(
            "{file}: {at}: environment variable {var} is not set"
        ))
    })
}

/// A secret given as `{ env = "VAR" }` or `{ file = "path" }` (trailing
/// whitespace of a file is dropped): exactly one of the two.
fn env_or_file(
    env: Option<String>,
    path: Option<PathBuf>,
    base: &Path,
    file: &str,
    at: &str,
) -> Result<String, ConfigError> {
    match (env, path) {
        (Some(var), None) => env_var(&var, file, at),
        (None, Some(path)) => {
            let path = base.join(path);
            std::fs::read_to_string(&path)
                .map(|s| s.trim_end().to_string())
                .map_err(|e| {
                    ConfigError(format!("{file}: {at}: cannot read {}: {e}", path.display()))
                })
        }
        _ => Err(ConfigError(format!(
            "{file}: {at}: give exactly one of env = \"VAR\" or file = \"path\""
        ))),
    }
}

/// Read each key from the environment variable or file it names.
fn encryption_keys(
    raw: RawEncryption,
    base: &Path,
    key: &str,
    file: &str,
) -> Result<Vec<EncryptionKey>, ConfigError> {
    if raw.keys.is_empty() {
        return Err(ConfigError(format!(
            "{file}: {key}: empty; list at least one {{ id = \"…\", env = \"VAR\" }} or remove the encryption table"
        )));
    }
    let mut keys: Vec<EncryptionKey> = Vec::new();
    for k in raw.keys {
        let at = format!("{key}[id={:?}]", k.id);
        check_name("key id", &k.id).map_err(|e| ConfigError(format!("{file}: {at}: {e}")))?;
        if keys.iter().any(|existing| existing.id == k.id) {
            return Err(ConfigError(format!("{file}: {at}: the id is used twice")));
        }
        let text = env_or_file(k.env, k.file, base, file, &at)?;
        keys.push(
            EncryptionKey::parse(&k.id, &text)
                .map_err(|e| ConfigError(format!("{file}: {at}: {e}")))?,
        );
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/wasmstate.toml"), Overrides::default())
    }

    #[test]
    fn reads_a_full_file() {
        let config = parse(
            r#"
            listen = "0.0.0.0:7000"
            data_dir = "data"
            max_body_mib = 8
            [backends.prod]
            guest = "local"
            memory_mib = 32
            timeout_ms = 500
            [backends.prod.config]
            fsync = false
            "#,
        )
        .unwrap();
        assert_eq!(config.listen.to_string(), "0.0.0.0:7000");
        assert_eq!(config.data_dir, PathBuf::from("/etc/data"));
        assert_eq!(config.max_body_bytes, 8 << 20);
        let prod = &config.backends[0];
        assert_eq!(prod.guest, GuestSource::Embedded("local"));
        assert_eq!(prod.limits.memory_bytes, 32 << 20);
        assert_eq!(prod.limits.timeout, Duration::from_millis(500));
        assert_eq!(prod.guest_config, vec![("fsync".into(), "false".into())]);
    }

    #[test]
    fn unknown_key_names_file_line_and_key() {
        let err = parse("[backends.a]\nguest = \"local\"\nmemroy_mib = 3\n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("/etc/wasmstate.toml:3:1: "), "{msg}");
        assert!(msg.contains("memroy_mib"), "{msg}");
    }

    #[test]
    fn invalid_values_name_the_key_and_the_reason() {
        let msg = parse("[backends.a]\nguest = \"local\"\nmemory_mib = 0\n")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("backends.a.memory_mib = 0: must be between"),
            "{msg}"
        );

        let msg = parse("[backends.a]\nguest = \"nope\"\n")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("backends.a.guest = \"nope\""), "{msg}");

        let msg = parse("[backends.a]\nguest = \"missing.wasm\"\n")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("no such file"), "{msg}");

        let msg = parse("[backends.\"a/b\"]\nguest = \"local\"\n")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("contains '/'"), "{msg}");

        let msg = parse("listen = \"localhost\"\n[backends.a]\nguest = \"local\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("listen = \"localhost\": not an address"),
            "{msg}"
        );

        let msg = parse("[backends.a]\nguest = \"local\"\nallow_http = [\"http://h:1/path\"]\n")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("backends.a.allow_http: \"http://h:1/path\""),
            "{msg}"
        );

        let msg = parse("[backends.a]\nguest = \"local\"\nconfig = { x = [1] }\n")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("backends.a.config.x: array values"), "{msg}");
    }

    #[test]
    fn nested_tables_flatten_and_env_values_come_from_the_host() {
        let config = parse(
            r#"
            [backends.a]
            guest = "local"
            [backends.a.config]
            endpoints = { s3 = "http://127.0.0.1:9000" }
            secret_key = { env = "PATH" }
            "#,
        )
        .unwrap();
        let pairs = &config.backends[0].guest_config;
        assert!(pairs.contains(&("endpoints.s3".into(), "http://127.0.0.1:9000".into())));
        let path = std::env::var("PATH").unwrap();
        assert!(pairs.contains(&("secret_key".into(), path)));
        let msg = parse("[backends.a]\nguest = \"local\"\nconfig = { k = { env = \"WASMSTATE_NO_SUCH_VAR\" } }\n")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(
                "backends.a.config.k: environment variable WASMSTATE_NO_SUCH_VAR is not set"
            ),
            "{msg}"
        );
    }

    #[test]
    fn aws_guests_are_granted_their_configured_endpoints() {
        let config = parse(
            r#"
            [backends.s3]
            guest = "dynamodb"
            [backends.s3.config]
            bucket = "b"
            key = "k"
            dynamodb_table = "t"
            endpoints = { s3 = "http://127.0.0.1:5000/", dynamodb = "http://127.0.0.1:5001" }
            "#,
        )
        .unwrap();
        let grants: Vec<String> = config.backends[0]
            .allow_http
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(grants, ["http://127.0.0.1:5000", "http://127.0.0.1:5001"]);

        let config = parse("[backends.s3]\nguest = \"s3-lockfile\"\nconfig = { bucket = \"b\", key = \"k\", region = \"eu-west-1\" }\n").unwrap();
        let grants: Vec<String> = config.backends[0]
            .allow_http
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(grants, ["https://b.s3.eu-west-1.amazonaws.com:443"]);
    }

    #[test]
    fn users_and_tokens_are_checked() {
        let hash = crate::auth::hash_password("pw");
        let ok = format!(
            "[backends.prod]\nguest = \"local\"\n[[users]]\nname = \"a\"\npassword_hash = \"{hash}\"\ngrants = [\"prod:*:write\"]\n"
        );
        assert_eq!(parse(&ok).unwrap().users.len(), 1);
        let typo = ok.replace("prod:*:write", "prd:*:write");
        assert!(
            parse(&typo)
                .unwrap_err()
                .to_string()
                .contains("names backend \"prd\", which is not configured")
        );
        let plain = ok.replace(&hash, "hunter2");
        assert!(
            parse(&plain)
                .unwrap_err()
                .to_string()
                .contains("wasmstate hash-password")
        );
        let token = "[backends.prod]\nguest = \"local\"\n[[tokens]]\nname = \"ci\"\nsha256 = \"abc\"\ngrants = [\"*:*:read\"]\n";
        assert!(
            parse(token)
                .unwrap_err()
                .to_string()
                .contains("64 hex digits")
        );
    }

    #[test]
    fn strangers_guests_get_a_disk_quota_by_default_embedded_ones_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let wasm = dir.path().join("g.wasm");
        std::fs::write(&wasm, b"").unwrap();
        let config = Config::parse(
            &format!(
                "[backends.mine]\nguest = \"local\"\n[backends.theirs]\nguest = {:?}\n[backends.set]\nguest = \"local\"\ndisk_quota_mib = 5\nmemory_budget_mib = 100\nmax_cores = 3\n",
                wasm.display().to_string()
            ),
            &dir.path().join("c.toml"),
            Overrides::default(),
        )
        .unwrap();
        let quota = |name: &str| {
            config
                .backends
                .iter()
                .find(|b| b.name == name)
                .unwrap()
                .disk_quota_bytes
        };
        assert_eq!(quota("mine"), None);
        assert_eq!(quota("theirs"), Some(1024 << 20));
        assert_eq!(quota("set"), Some(5 << 20));
        let set = config.backends.iter().find(|b| b.name == "set").unwrap();
        assert_eq!(
            (set.memory_budget_bytes, set.max_cores),
            (Some(100 << 20), Some(3))
        );
        assert_eq!(config.max_guest_memory_bytes, None);
    }

    #[test]
    fn a_backend_directory_may_not_overlap_the_hosts_or_another_backends() {
        let dir = tempfile::tempdir().unwrap();
        let config = |backends: &str| {
            Config::parse(
                &format!("data_dir = \"data\"\n{backends}"),
                &dir.path().join("c.toml"),
                Overrides::default(),
            )
        };
        for (bad, what) in [
            ("dir = \"data\"", "the data directory"),
            ("dir = \".\"", "the data directory"),
            ("dir = \"data/cache\"", "compiled-guest cache"),
            ("dir = \"data/cache/x\"", "compiled-guest cache"),
            ("dir = \"data/git\"", "git clones"),
            ("dir = \"data/./guests/../history\"", "version history"),
        ] {
            let err = config(&format!("[backends.a]\nguest = \"local\"\n{bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(what), "{bad}: {err}");
        }
        let shared = config(
            "[backends.a]\nguest = \"local\"\ndir = \"s\"\n[backends.b]\nguest = \"local\"\ndir = \"s/x\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(shared.contains("backend \"b\"'s directory"), "{shared}");
        // The default layout (data/backends/NAME) and dirs elsewhere are fine.
        assert!(config("[backends.a]\nguest = \"local\"\n[backends.b]\nguest = \"local\"\ndir = \"elsewhere\"\n").is_ok());
    }

    #[test]
    fn a_file_without_backends_says_what_to_add() {
        let msg = parse("listen = \"127.0.0.1:1\"\n").unwrap_err().to_string();
        assert!(msg.contains("[backends.default]"), "{msg}");
    }

    #[test]
    fn command_line_wins_over_the_file() {
        let overrides = Overrides {
            listen: Some("127.0.0.1:9".parse().unwrap()),
            data_dir: Some(PathBuf::from("/tmp/x")),
            cache_dir: None,
        };
        let config = Config::parse(
            "listen = \"0.0.0.0:1\"\n[backends.a]\nguest = \"local\"\n",
            Path::new("c.toml"),
            overrides,
        )
        .unwrap();
        assert_eq!(config.listen.to_string(), "127.0.0.1:9");
        assert_eq!(config.data_dir, PathBuf::from("/tmp/x"));
    }

    #[test]
    fn local_guest_gets_its_own_folder_by_default() {
        let config = Config::default_with(Overrides::default());
        let dir = config.granted_dir(&config.backends[0]).unwrap();
        assert_eq!(dir, PathBuf::from("./wasmstate-data/backends/default"));
    }
}
