//! The config file as written: serde's view, before any check.

use super::MarketplaceConfig;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) listen: Option<String>,
    pub(super) data_dir: Option<PathBuf>,
    pub(super) cache_dir: Option<PathBuf>,
    pub(super) max_body_mib: Option<u64>,
    pub(super) max_instances: Option<u32>,
    pub(super) max_guest_memory_mib: Option<u64>,
    pub(super) git_clone_max_mib: Option<u64>,
    #[serde(default)]
    pub(super) backends: BTreeMap<String, RawBackend>,
    #[serde(default)]
    pub(super) users: Vec<RawUser>,
    #[serde(default)]
    pub(super) tokens: Vec<RawToken>,
    #[serde(default)]
    pub(super) oidc: Vec<super::oidc::RawOidc>,
    pub(super) tls: Option<RawTls>,
    #[serde(default)]
    pub(super) marketplace: MarketplaceConfig,
    #[serde(default)]
    pub(super) network: RawNetwork,
    #[serde(default)]
    pub(super) audit: RawAudit,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAudit {
    pub(super) max_mib: Option<u64>,
    pub(super) files: Option<u64>,
    #[serde(default)]
    pub(super) stdout: bool,
    pub(super) replica: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNetwork {
    #[serde(default)]
    pub(super) server_names: Vec<String>,
    pub(super) header_read_timeout_secs: Option<u64>,
    pub(super) keepalive_timeout_secs: Option<u64>,
    pub(super) body_timeout_secs: Option<u64>,
    pub(super) max_connections: Option<u64>,
    pub(super) max_connections_per_address: Option<u64>,
    pub(super) shutdown_timeout_secs: Option<u64>,
    pub(super) max_buffered_mib: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub(super) cert: PathBuf,
    pub(super) key: PathBuf,
    pub(super) client_ca: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSecret {
    pub(super) env: Option<String>,
    pub(super) file: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGitAuth {
    pub(super) username_env: Option<String>,
    pub(super) password_env: Option<String>,
    pub(super) ssh_key: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEncryption {
    pub(super) keys: Vec<RawKey>,
    #[serde(default)]
    pub(super) accept_plain: bool,
    pub(super) data_key_cache_seconds: Option<u64>,
    pub(super) aws: Option<toml::Table>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawKey {
    pub(super) id: String,
    pub(super) env: Option<String>,
    pub(super) file: Option<PathBuf>,
    pub(super) aws_kms: Option<String>,
    pub(super) endpoint: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUser {
    pub(super) name: String,
    pub(super) password_hash: String,
    pub(super) grants: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawToken {
    pub(super) name: String,
    pub(super) sha256: String,
    pub(super) grants: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBackend {
    pub(super) guest: String,
    pub(super) dir: Option<PathBuf>,
    pub(super) memory_mib: Option<u64>,
    pub(super) timeout_ms: Option<u64>,
    #[serde(default)]
    pub(super) allow_http: Vec<String>,
    pub(super) aws_sign: Option<Vec<String>>,
    pub(super) azure_sign: Option<Vec<String>>,
    pub(super) gcp_auth: Option<Vec<String>>,
    #[serde(default)]
    pub(super) allow_http_addresses: Vec<String>,
    #[serde(default)]
    pub(super) allow_force_push: bool,
    pub(super) history: Option<u64>,
    pub(super) encryption: Option<RawEncryption>,
    #[serde(default)]
    pub(super) allow_git: Vec<String>,
    pub(super) git_refs: Option<Vec<String>>,
    pub(super) git_paths: Option<Vec<String>>,
    pub(super) git_auth: Option<RawGitAuth>,
    #[serde(default)]
    pub(super) secrets: BTreeMap<String, RawSecret>,
    pub(super) max_instances: Option<u32>,
    pub(super) memory_budget_mib: Option<u64>,
    pub(super) disk_quota_mib: Option<u64>,
    pub(super) max_cores: Option<u32>,
    pub(super) lock_ttl: Option<String>,
    #[serde(default)]
    pub(super) config: toml::Table,
}
