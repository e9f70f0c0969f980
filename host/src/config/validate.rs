//! Raw → validated: the server-wide keys, the network table, and the
//! checks that look across backends.

use super::backend::validate_backend;
use super::raw::*;
use super::values::{in_range, mib};
use super::*;

pub(super) fn validate(
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
    let oidc = super::oidc::validate_oidc(raw.oidc, base, file, &grants)?;
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
            let key = file_at("key", t.key)?;
            super::values::warn_if_others_read(&key, file, "tls.key");
            Ok(TlsConfig {
                cert: file_at("cert", t.cert)?,
                key,
                client_ca: t.client_ca.map(|c| file_at("client_ca", c)).transpose()?,
            })
        })
        .transpose()?;
    let network = validate_network(raw.network, file)?;
    let audit = validate_audit(raw.audit, file)?;
    let config = Config {
        audit,
        network,
        max_guest_memory_bytes,
        git_clone_max_bytes,
        marketplace: raw.marketplace,
        tls,
        users,
        tokens,
        oidc,
        listen,
        data_dir,
        cache_dir,
        max_body_bytes: mib(max_body) as usize,
        max_instances,
        backends,
    };
    check_granted_dirs(&config, file)?;
    check_signing_layouts(&config, file)?;
    if let Some(buffered) = config.network.max_buffered_bytes {
        let floor = super::buffered_floor(config.max_body_bytes);
        if buffered < floor {
            return Err(ConfigError(format!(
                "{file}: network.max_buffered_mib = {} is less than two of the largest bodies plus 64 MiB ({} MiB with max_body_mib = {}); raise it or lower max_body_mib",
                buffered >> 20,
                floor.div_ceil(1 << 20),
                config.max_body_bytes >> 20
            )));
        }
    }
    Ok(config)
}

fn validate_audit(raw: RawAudit, file: &str) -> Result<crate::audit::AuditSettings, ConfigError> {
    let defaults = crate::audit::AuditSettings::default();
    let max_bytes = match raw.max_mib {
        Some(m) => mib(in_range(file, "audit.max_mib", m, 1, 1 << 20)?),
        None => defaults.max_bytes,
    };
    let files = match raw.files {
        Some(n) => in_range(file, "audit.files", n, 2, 100)? as usize,
        None => defaults.files,
    };
    let replica = match raw.replica {
        Some(name) => {
            check_name("audit.replica", &name)
                .map_err(|e| ConfigError(format!("{file}: audit.replica: {e}")))?;
            name
        }
        None => defaults.replica,
    };
    Ok(crate::audit::AuditSettings {
        max_bytes,
        files,
        stdout: raw.stdout,
        replica,
    })
}

/// `path` with symlinks resolved as far as it exists, and `..` removed, so
/// two spellings of one place compare equal.
pub(super) fn resolved(path: &Path) -> PathBuf {
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
/// version history, the audit trail) nor another backend's directory: a guest able to
/// write there could change what the host runs or what others store.
pub(super) fn check_granted_dirs(config: &Config, file: &str) -> Result<(), ConfigError> {
    let data = resolved(&config.data_dir);
    let own = [
        (resolved(&config.cache_dir()), "the compiled-guest cache"),
        (resolved(&data.join("git")), "the git clones"),
        (resolved(&data.join("guests")), "the installed guests"),
        (resolved(&data.join("history")), "the version history"),
        (resolved(&data.join("audit")), "the audit trail"),
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
    let refuse = |name: &str, dir: &Path, what: &str| {
        Err(ConfigError(format!(
            "{file}: backends.{name}.dir = {}: overlaps {what}; give each backend a directory of its own, outside the host's",
            dir.display()
        )))
    };
    for (name, dir) in &dirs {
        if data.starts_with(dir) {
            return refuse(name, dir, &format!("the data directory {}", data.display()));
        }
        if let Some((_, what)) = own.iter().find(|(host, _)| overlap(dir, host)) {
            return refuse(name, dir, what);
        }
    }
    // Backends among themselves, in O(n log n) for thousands of tenants:
    // in path order (component by component), whatever lies between a
    // directory and one inside it is inside it too, so an overlap shows
    // between neighbours. The pair named is the first such in config order.
    let mut by_path: Vec<(usize, &Path)> = dirs
        .iter()
        .enumerate()
        .map(|(i, (_, d))| (i, d.as_path()))
        .collect();
    by_path.sort_by(|a, b| a.1.cmp(b.1).then(a.0.cmp(&b.0)));
    let first = by_path
        .windows(2)
        .filter(|pair| overlap(pair[0].1, pair[1].1))
        .map(|pair| (pair[0].0.min(pair[1].0), pair[0].0.max(pair[1].0)))
        .min();
    if let Some((i, j)) = first {
        let (name, dir) = &dirs[i];
        return refuse(name, dir, &format!("backend {:?}'s directory", dirs[j].0));
    }
    Ok(())
}

/// A stranger's AWS signing grant must be a namespace of its own on its
/// bucket: its layout must not overlap that of any other backend whose S3
/// requests the host signs, or of a first-party AWS guest
/// ([`crate::capabilities::aws::check_disjoint`]).
fn check_signing_layouts(config: &Config, file: &str) -> Result<(), ConfigError> {
    use crate::capabilities::aws::{SigningScope, check_disjoint};
    let scopes: Vec<(&str, SigningScope)> = config
        .backends
        .iter()
        .filter_map(|b| match &b.aws {
            Some(grant) => Some((b.name.as_str(), grant.scope.clone())),
            None if crate::guests::cloud(&b.guest) == crate::guests::Cloud::Aws => {
                Some((b.name.as_str(), SigningScope::from_config(&b.guest_config)))
            }
            None => None,
        })
        .collect();
    let named: Vec<(&str, &SigningScope)> = scopes.iter().map(|(n, s)| (*n, s)).collect();
    check_disjoint(&named).map_err(|e| ConfigError(format!("{file}: {e}")))
}

pub(super) fn validate_network(raw: RawNetwork, file: &str) -> Result<NetworkConfig, ConfigError> {
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
        max_buffered_bytes: raw
            .max_buffered_mib
            .map(|mib| count("max_buffered_mib", Some(mib), 0).map(|m| (m as u64) << 20))
            .transpose()?,
    })
}
