//! Where a backend's AWS credentials come from, as Terraform's `backend
//! "s3"` names its settings. Plain data: the config layer fills it in, the
//! credential chain ([`super::chain`]) reads it.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// Keys of a backend's `config` table that hold credential settings. The
/// host takes them out before the guest sees its configuration: a guest
/// never holds a credential.
pub const CREDENTIAL_KEYS: &[&str] = &[
    "access_key",
    "secret_key",
    "token",
    "profile",
    "shared_config_files",
    "shared_credentials_files",
    "assume_role",
    "assume_role_with_web_identity",
    "sts_region",
];

/// `endpoints = { sts = "…" }`: the one endpoint the host itself calls.
pub const STS_ENDPOINT_KEY: &str = "sts";

/// One backend's credential settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AwsSettings {
    /// Region for signing and for STS (`region`, default `us-east-1`).
    pub region: String,
    /// `access_key`, `secret_key`, `token`.
    pub static_keys: Option<StaticKeys>,
    /// `profile`: a profile of the shared config and credentials files.
    pub profile: Option<String>,
    /// `shared_config_files` (default `~/.aws/config`).
    pub shared_config_files: Vec<PathBuf>,
    /// `shared_credentials_files` (default `~/.aws/credentials`).
    pub shared_credentials_files: Vec<PathBuf>,
    /// `assume_role { … }`: a role assumed with the credentials above.
    pub assume_role: Option<AssumeRole>,
    /// `assume_role_with_web_identity { … }`.
    pub web_identity: Option<WebIdentity>,
    /// `endpoints.sts`.
    pub sts_endpoint: Option<String>,
    /// `sts_region` (default: `region`).
    pub sts_region: Option<String>,
}

/// Long-lived (or session) keys written in the config, usually as
/// `{ env = "…" }`.
#[derive(Clone, PartialEq, Eq)]
pub struct StaticKeys {
    /// `access_key`.
    pub access_key: String,
    /// `secret_key`.
    pub secret_key: String,
    /// `token`.
    pub token: Option<String>,
}

impl fmt::Debug for StaticKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticKeys")
            .field("access_key", &self.access_key)
            .field("secret_key", &"** redacted **")
            .field("token", &self.token.as_ref().map(|_| "** redacted **"))
            .finish()
    }
}

/// Terraform's `assume_role` block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AssumeRole {
    /// `role_arn`.
    pub role_arn: String,
    /// `session_name` (default `wasmstate`).
    pub session_name: Option<String>,
    /// `external_id`.
    pub external_id: Option<String>,
    /// `duration` (`"1h"`, `"15m"`; default: STS's, one hour).
    pub duration: Option<Duration>,
    /// `policy`: an inline session policy (JSON).
    pub policy: Option<String>,
    /// `policy_arns`.
    pub policy_arns: Vec<String>,
    /// `tags`: session tags.
    pub tags: Vec<(String, String)>,
    /// `transitive_tag_keys`.
    pub transitive_tag_keys: Vec<String>,
    /// `source_identity`.
    pub source_identity: Option<String>,
}

/// Terraform's `assume_role_with_web_identity` block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WebIdentity {
    /// `role_arn`.
    pub role_arn: String,
    /// `session_name` (default `wasmstate`).
    pub session_name: Option<String>,
    /// `web_identity_token`: the token itself (usually `{ env = … }`).
    pub token: Option<String>,
    /// `web_identity_token_file`: read again at every refresh (the
    /// orchestrator rotates it).
    pub token_file: Option<PathBuf>,
    /// `duration`.
    pub duration: Option<Duration>,
    /// `policy`.
    pub policy: Option<String>,
    /// `policy_arns`.
    pub policy_arns: Vec<String>,
}

/// Whether `key` (a top-level key of a backend's `config` table) holds a
/// credential setting.
pub fn is_credential_key(key: &str) -> bool {
    CREDENTIAL_KEYS.contains(&key)
}

/// Take the credential settings out of a guest's flattened `config`
/// (`assume_role.role_arn`, `shared_config_files.0`, `endpoints.sts`…),
/// leaving the rest for the guest. `region` is read and left. Relative
/// paths are taken from `base`. `Err` names the key and what to write.
pub fn take_from_config(
    pairs: &mut Vec<(String, String)>,
    base: &std::path::Path,
) -> Result<AwsSettings, String> {
    let mut taken = Vec::new();
    pairs.retain(|(key, value)| {
        let top = key.split('.').next().unwrap_or_default();
        let ours = is_credential_key(top) || key == &format!("endpoints.{STS_ENDPOINT_KEY}");
        if ours {
            taken.push((key.clone(), value.clone()));
        }
        !ours
    });
    let region = pairs
        .iter()
        .find(|(k, _)| k == "region")
        .map_or("us-east-1".to_string(), |(_, v)| v.clone());
    let mut s = AwsSettings {
        region,
        ..AwsSettings::default()
    };
    let mut keys = (None, None, None);
    let path = |v: &str| base.join(v);
    for (key, value) in taken {
        let (head, rest) = key.split_once('.').unwrap_or((&key, ""));
        match (head, rest) {
            ("access_key", "") => keys.0 = Some(value),
            ("secret_key", "") => keys.1 = Some(value),
            ("token", "") => keys.2 = Some(value),
            ("profile", "") => s.profile = Some(value),
            ("sts_region", "") => s.sts_region = Some(value),
            ("endpoints", STS_ENDPOINT_KEY) => s.sts_endpoint = Some(value),
            ("shared_config_files", n) if is_index(n) => s.shared_config_files.push(path(&value)),
            ("shared_credentials_files", n) if is_index(n) => {
                s.shared_credentials_files.push(path(&value))
            }
            ("assume_role", field) => {
                let role = s.assume_role.get_or_insert_with(AssumeRole::default);
                assume_role_field(role, field, value)
                    .map_err(|e| format!("assume_role.{field}: {e}"))?
            }
            ("assume_role_with_web_identity", field) => {
                let web = s.web_identity.get_or_insert_with(WebIdentity::default);
                web_identity_field(web, field, value, base)
                    .map_err(|e| format!("assume_role_with_web_identity.{field}: {e}"))?
            }
            _ => return Err(format!("{key}: not a credential setting wasmstate knows")),
        }
    }
    s.static_keys = match keys {
        (Some(access_key), Some(secret_key), token) => Some(StaticKeys {
            access_key,
            secret_key,
            token,
        }),
        (None, None, None) => None,
        _ => {
            return Err(
                "access_key, secret_key: set both (and token for session keys), or neither".into(),
            );
        }
    };
    if let Some(role) = &s.assume_role
        && role.role_arn.is_empty()
    {
        return Err("assume_role.role_arn: required (\"arn:aws:iam::ACCOUNT:role/NAME\")".into());
    }
    if let Some(web) = &s.web_identity {
        if web.role_arn.is_empty() {
            return Err("assume_role_with_web_identity.role_arn: required".into());
        }
        if web.token.is_some() == web.token_file.is_some() {
            return Err("assume_role_with_web_identity: set one of web_identity_token or web_identity_token_file".into());
        }
    }
    Ok(s)
}

fn is_index(n: &str) -> bool {
    !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
}

fn duration(value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value)
        .map_err(|e| format!("{value:?} is not a duration ({e}); write e.g. \"1h\" or \"15m\""))
}

fn assume_role_field(role: &mut AssumeRole, field: &str, value: String) -> Result<(), String> {
    let (name, rest) = field.split_once('.').unwrap_or((field, ""));
    match (name, rest) {
        ("role_arn", "") => role.role_arn = value,
        ("session_name", "") => role.session_name = Some(value),
        ("external_id", "") => role.external_id = Some(value),
        ("duration", "") => role.duration = Some(duration(&value)?),
        ("policy", "") => role.policy = Some(value),
        ("source_identity", "") => role.source_identity = Some(value),
        ("policy_arns", n) if is_index(n) => role.policy_arns.push(value),
        ("transitive_tag_keys", n) if is_index(n) => role.transitive_tag_keys.push(value),
        ("tags", tag) if !tag.is_empty() => role.tags.push((tag.to_string(), value)),
        _ => return Err("unknown setting".into()),
    }
    Ok(())
}

fn web_identity_field(
    web: &mut WebIdentity,
    field: &str,
    value: String,
    base: &std::path::Path,
) -> Result<(), String> {
    let (name, rest) = field.split_once('.').unwrap_or((field, ""));
    match (name, rest) {
        ("role_arn", "") => web.role_arn = value,
        ("session_name", "") => web.session_name = Some(value),
        ("web_identity_token", "") => web.token = Some(value),
        ("web_identity_token_file", "") => web.token_file = Some(base.join(value)),
        ("duration", "") => web.duration = Some(duration(&value)?),
        ("policy", "") => web.policy = Some(value),
        ("policy_arns", n) if is_index(n) => web.policy_arns.push(value),
        _ => return Err("unknown setting".into()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn credential_settings_leave_the_guests_config() {
        let mut config = pairs(&[
            ("bucket", "b"),
            ("region", "eu-west-1"),
            ("access_key", "AKIAEXAMPLE"),
            ("secret_key", "s3cr3t"),
            (
                "assume_role.role_arn",
                "arn:aws:iam::123456789012:role/state",
            ),
            ("assume_role.duration", "15m"),
            ("assume_role.tags.team", "infra"),
            (
                "assume_role.policy_arns.0",
                "arn:aws:iam::aws:policy/ReadOnly",
            ),
            ("endpoints.s3", "http://127.0.0.1:9000"),
            ("endpoints.sts", "http://127.0.0.1:9001"),
            ("shared_config_files.0", "aws/config"),
        ]);
        let s = take_from_config(&mut config, Path::new("/etc/wasmstate")).unwrap();
        assert_eq!(
            config,
            pairs(&[
                ("bucket", "b"),
                ("region", "eu-west-1"),
                ("endpoints.s3", "http://127.0.0.1:9000")
            ])
        );
        assert_eq!(s.region, "eu-west-1");
        assert_eq!(s.static_keys.as_ref().unwrap().secret_key, "s3cr3t");
        let role = s.assume_role.unwrap();
        assert_eq!(role.duration, Some(Duration::from_secs(900)));
        assert_eq!(role.tags, vec![("team".to_string(), "infra".to_string())]);
        assert_eq!(role.policy_arns.len(), 1);
        assert_eq!(s.sts_endpoint.as_deref(), Some("http://127.0.0.1:9001"));
        assert_eq!(
            s.shared_config_files,
            vec![PathBuf::from("/etc/wasmstate/aws/config")]
        );
        // Debug output never shows the secret.
        assert!(!format!("{:?}", s.static_keys).contains("s3cr3t"));
    }

    #[test]
    fn mistakes_name_the_key() {
        let err =
            |list: &[(&str, &str)]| take_from_config(&mut pairs(list), Path::new("/")).unwrap_err();
        assert!(err(&[("access_key", "a")]).contains("set both"));
        assert!(err(&[("assume_role.duration", "soon")]).contains("assume_role.duration"));
        assert!(err(&[("assume_role.session_name", "x")]).contains("role_arn: required"));
        assert!(err(&[("assume_role.colour", "x")]).contains("assume_role.colour"));
        assert!(
            err(&[("assume_role_with_web_identity.role_arn", "arn")])
                .contains("web_identity_token or web_identity_token_file")
        );
    }
}
