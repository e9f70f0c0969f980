//! One `[backends.NAME]` table, raw → validated, with the secrets and keys
//! it names resolved.

use super::cloud::{CloudLists, take_cloud_grants};
use super::raw::*;
use super::values::{env_or_file, env_var, flatten_config, in_range, mib};
use super::*;
use crate::capabilities::postgres::PgGrant;

pub(super) fn validate_backend(
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
    let origins = |list: &[String], name: &str| -> Result<Vec<Origin>, ConfigError> {
        list.iter()
            .map(|o| {
                Origin::parse(o).map_err(|e| ConfigError(format!("{file}: {}: {e}", key(name))))
            })
            .collect()
    };
    let mut allow_http = origins(&raw.allow_http, "allow_http")?;
    if allow_http.is_empty() {
        allow_http = default_http.clone();
    }
    // Requests the host signs with the backend's cloud credentials: the
    // operator's list, or the endpoints a cloud guest's own configuration
    // names (never other origins the operator lets it reach). Their
    // credential settings leave the guest's config here: a guest never
    // holds one.
    let lists = CloudLists {
        aws_sign: raw
            .aws_sign
            .as_deref()
            .map(|l| origins(l, "aws_sign"))
            .transpose()?,
        azure_sign: raw
            .azure_sign
            .as_deref()
            .map(|l| origins(l, "azure_sign"))
            .transpose()?,
        gcp_auth: raw
            .gcp_auth
            .as_deref()
            .map(|l| origins(l, "gcp_auth"))
            .transpose()?,
    };
    let clouds = take_cloud_grants(
        &guest,
        lists,
        &default_http,
        &mut guest_config,
        &mut allow_http,
        base,
    )
    .map_err(|e| ConfigError(format!("{file}: backends.{name}.{e}")))?;
    // The postgres guest's connection string (its password) is the host's.
    let postgres = PgGrant::take(
        guest == GuestSource::Embedded("postgres"),
        &mut guest_config,
    )
    .map_err(|e| ConfigError(format!("{file}: {}.{e}", key("config"))))?;
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
    let encryption = raw
        .encryption
        .map(|raw| {
            let aws = clouds.aws.as_ref().map(|grant| &grant.settings);
            super::encryption::encryption(raw, aws, base, &key("encryption"), file)
        })
        .transpose()?;
    let auth = match raw.git_auth {
        None => GitAuth::default(),
        Some(a) => {
            let env = |var: Option<String>, what: &str| {
                var.map(|var| env_var(&var, file, &format!("{}.{what}", key("git_auth"))))
                    .transpose()
            };
            let ssh_key = a.ssh_key.map(|k| base.join(k));
            if let Some(path) = &ssh_key {
                let at = format!("{}.ssh_key", key("git_auth"));
                super::values::warn_if_others_read(path, file, &at);
            }
            GitAuth {
                username: env(a.username_env, "username_env")?,
                password: env(a.password_env, "password_env")?,
                ssh_key,
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
    let lock_ttl = raw
        .lock_ttl
        .map(|text| {
            let ttl = humantime::parse_duration(&text).map_err(|e| {
                ConfigError(format!(
                    "{file}: {}: {text:?}: {e}; write a duration such as \"12h\"",
                    key("lock_ttl")
                ))
            })?;
            // A takeover releases another's lock by its ID: two servers
            // doing so at once must not both succeed, which the local
            // guest's unlock (read, then remove) cannot promise across
            // processes sharing its directory.
            if guest == GuestSource::Embedded("local") {
                return Err(ConfigError(format!(
                    "{file}: {}: the local guest cannot take a lock over safely (its unlock by \
                     ID is not atomic across servers sharing its directory); use a guest whose \
                     storage is (s3-lockfile, dynamodb, git) or remove lock_ttl",
                    key("lock_ttl")
                )));
            }
            if ttl < Duration::from_secs(60) {
                return Err(ConfigError(format!(
                    "{file}: {}: {text:?} is under a minute: a lock that young belongs to a run still under way",
                    key("lock_ttl")
                )));
            }
            Ok(ttl)
        })
        .transpose()?;
    Ok(BackendConfig {
        lock_ttl,
        memory_budget_bytes,
        disk_quota_bytes,
        max_cores,
        max_instances,
        secrets,
        allow_git,
        history,
        encryption,
        allow_http,
        allow_http_addresses,
        aws: clouds.aws,
        azure: clouds.azure,
        gcp: clouds.gcp,
        postgres,
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
