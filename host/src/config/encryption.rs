//! A backend's `encryption` table, raw → validated: each key's material
//! read from its file or variable, or its KMS key checked, and where the
//! host's AWS credentials for KMS come from.
//!
//! ```toml
//! encryption = { keys = [
//!   { id = "2026-12", aws_kms = "arn:aws:kms:eu-west-1:111122223333:key/…" },
//!   { id = "k1", file = "/etc/wasmstate/k1.key" },
//! ], data_key_cache_seconds = 300 }
//! ```

use super::raw::RawEncryption;
use super::values::{env_or_file, flatten_config};
use super::{ConfigError, check_name};
use crate::capabilities::aws::AwsSettings;
use crate::capabilities::aws::settings::take_from_config;
use crate::store::envelope::parse_material;
use crate::store::keys::aws_kms::AwsKmsKey;
use crate::store::keys::{DEFAULT_CACHE, EncryptionSpec, KeySource, KeySpec};
use std::path::Path;
use std::time::Duration;

/// The longest a data key may be kept: a revoked key must stop working
/// within the hour.
const MAX_CACHE_SECONDS: u64 = 3600;

/// Validate `raw`, the table at `at` (`backends.NAME.encryption`).
/// `backend_aws`: the backend's own AWS credential settings, used for
/// KMS unless the table has its own `aws` settings.
pub(super) fn encryption(
    raw: RawEncryption,
    backend_aws: Option<&AwsSettings>,
    base: &Path,
    at: &str,
    file: &str,
) -> Result<EncryptionSpec, ConfigError> {
    let fail = |key: &str, e: String| ConfigError(format!("{file}: {at}.{key}: {e}"));
    if raw.keys.is_empty() {
        return Err(fail(
            "keys",
            "empty; list at least one { id = \"…\", file = \"…\" } (or env = \"VAR\", or aws_kms = \"arn:…\"), or remove the encryption table".into(),
        ));
    }
    let aws = match raw.aws {
        Some(table) => {
            let mut pairs = Vec::new();
            flatten_config(&format!("{at}.aws"), "", table, &mut pairs, file)?;
            let settings = take_from_config(&mut pairs, base).map_err(|e| fail("aws", e))?;
            if let Some((key, _)) = pairs.iter().find(|(k, _)| k != "region") {
                return Err(fail(
                    &format!("aws.{key}"),
                    "not a credential setting (profile, access_key/secret_key, assume_role, assume_role_with_web_identity, shared_config_files, sts_region, endpoints.sts)".into(),
                ));
            }
            settings
        }
        None => backend_aws.cloned().unwrap_or_default(),
    };
    let mut keys: Vec<KeySpec> = Vec::new();
    for k in raw.keys {
        let here = format!("keys[id={:?}]", k.id);
        check_name("key id", &k.id).map_err(|e| fail(&here, e))?;
        if keys.iter().any(|existing| existing.id == k.id) {
            return Err(fail(&here, "the id is used twice".into()));
        }
        let source = match k.aws_kms {
            Some(arn) => {
                if k.env.is_some() || k.file.is_some() {
                    return Err(fail(
                        &here,
                        "give one of aws_kms = \"arn:…\", file = \"path\" or env = \"VAR\"".into(),
                    ));
                }
                let region = AwsKmsKey::region_of(&arn).map_err(|e| fail(&here, e))?;
                KeySource::AwsKms(Box::new(AwsKmsKey {
                    arn,
                    region,
                    endpoint: k.endpoint,
                    settings: aws.clone(),
                }))
            }
            None => {
                if k.endpoint.is_some() {
                    return Err(fail(
                        &here,
                        "endpoint is for aws_kms keys; a file or env key has none".into(),
                    ));
                }
                let text = env_or_file(k.env, k.file, base, file, &format!("{at}.{here}"))?;
                KeySource::Material(parse_material(&k.id, &text).map_err(|e| fail(&here, e))?)
            }
        };
        keys.push(KeySpec { id: k.id, source });
    }
    let data_key_cache = match raw.data_key_cache_seconds {
        None => DEFAULT_CACHE,
        Some(s) if s <= MAX_CACHE_SECONDS => Duration::from_secs(s),
        Some(s) => {
            return Err(fail(
                "data_key_cache_seconds",
                format!(
                    "{s} is more than {MAX_CACHE_SECONDS}; a revoked KMS key must stop opening states within the hour"
                ),
            ));
        }
    };
    Ok(EncryptionSpec {
        keys,
        accept_plain: raw.accept_plain,
        data_key_cache,
    })
}
