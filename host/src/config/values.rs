//! Small conversions both stages of validation share: sizes, ranges,
//! positions in the file, the guest's `config` table, and values taken from
//! the environment or files.

use super::*;

pub(super) fn mib(n: u64) -> u64 {
    n * 1024 * 1024
}

pub(super) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, col)
}

/// Flatten the guest's config table into `key = value` strings: nested
/// tables become dotted keys (`endpoints = { s3 = "…" }` → `endpoints.s3`),
/// scalars become text, and `{ env = "NAME" }` is replaced by the host's
/// environment variable NAME (so secrets stay out of config files).
pub(super) fn flatten_config(
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
            // Lists (`shared_config_files = ["…"]`) become `name.0`, `name.1`…
            toml::Value::Array(items) => {
                let table = items
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| (i.to_string(), v))
                    .collect();
                flatten_config(path, &name, table, out, file)?;
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

pub(super) fn in_range(
    file: &str,
    key: &str,
    value: u64,
    min: u64,
    max: u64,
) -> Result<u64, ConfigError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(ConfigError(format!(
            "{file}: {key} = {value}: must be between {min} and {max}"
        )))
    }
}

/// The host's environment variable `var`, named by the config key `at`.
pub(super) fn env_var(var: &str, file: &str, at: &str) -> Result<String, ConfigError> {
    std::env::var(var).map_err(|_| {
        ConfigError(format!(
            "{file}: {at}: environment variable {var} is not set"
        ))
    })
}

/// A secret given as `{ env = "VAR" }` or `{ file = "path" }` (trailing
/// whitespace of a file is dropped): exactly one of the two.
pub(super) fn env_or_file(
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
            warn_if_others_read(&path, file, at);
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

/// Say, in one log line, when a file holding a secret (a key, a password)
/// is readable by its group or by others, and how to fix it. A warning,
/// not a refusal: the secret may already be out, and a key file mounted
/// read-only (a Kubernetes secret) cannot be changed from here.
pub(super) fn warn_if_others_read(path: &Path, file: &str, at: &str) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return;
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        tracing::warn!(
            "{file}: {at}: {} holds a secret and is readable by its group or others (mode {mode:03o}): \
             run `chmod 600 {}`",
            path.display(),
            path.display()
        );
    }
}
