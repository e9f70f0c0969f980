//! `[[oidc]]`: issuers whose tokens sign callers in, raw → validated.

use super::ConfigError;
use crate::auth::Grant;
use crate::auth::oidc::{OidcConfig, OidcRole};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOidc {
    name: String,
    issuer: String,
    audiences: Vec<String>,
    jwks_url: Option<String>,
    ca_file: Option<PathBuf>,
    #[serde(default)]
    roles: Vec<RawOidcRole>,
    audit_claims: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOidcRole {
    bound_claims: BTreeMap<String, String>,
    grants: Vec<String>,
}

/// Parses the grants of `who`.
pub(super) type GrantParser<'a> = &'a dyn Fn(&str, &[String]) -> Result<Vec<Grant>, ConfigError>;

/// Check every `[[oidc]]`; `grants` parses a role's grants.
pub(super) fn validate_oidc(
    raw: Vec<RawOidc>,
    base: &Path,
    file: &str,
    grants: GrantParser<'_>,
) -> Result<Vec<OidcConfig>, ConfigError> {
    let mut issuers: Vec<OidcConfig> = Vec::new();
    for o in raw {
        let who = format!("oidc {:?}", o.name);
        let fail = |what: String| ConfigError(format!("{file}: {who}: {what}"));
        if o.name.is_empty() || issuers.iter().any(|i| i.name == o.name) {
            return Err(fail(
                "needs a name of its own (shown in logs as oidc:<name>:<sub>)".into(),
            ));
        }
        https("issuer", &o.issuer).map_err(&fail)?;
        if issuers.iter().any(|i| i.issuer == o.issuer) {
            return Err(fail(format!("issuer {:?} is configured twice", o.issuer)));
        }
        if let Some(url) = &o.jwks_url {
            https("jwks_url", url).map_err(&fail)?;
        }
        if o.audiences.is_empty() || o.audiences.iter().any(String::is_empty) {
            return Err(fail(
                "audiences must name at least one audience, e.g. [\"wasmstate\"]".into(),
            ));
        }
        let ca_file = o.ca_file.map(|p| base.join(p));
        if let Some(path) = &ca_file
            && !path.is_file()
        {
            return Err(fail(format!("ca_file = {}: no such file", path.display())));
        }
        let mut roles = Vec::new();
        for (i, role) in o.roles.into_iter().enumerate() {
            // An issuer such as GitHub's signs every repository's jobs, and
            // `aud` is chosen by the job: a role bound to nothing would
            // grant to anyone on that service.
            if role.bound_claims.is_empty() {
                return Err(fail(format!(
                    "roles[{i}]: bound_claims is empty: it would match every token the issuer \
                     signs (for GitHub, every repository's jobs); bind at least one claim, \
                     e.g. {{ repository = \"acme/infra\" }}"
                )));
            }
            if let Some((claim, _)) = role
                .bound_claims
                .iter()
                .find(|(_, pattern)| pattern.chars().all(|c| c == '*'))
            {
                return Err(fail(format!(
                    "roles[{i}]: bound_claims.{claim} matches any value: bind it to something, \
                     e.g. \"acme/*\" (prefer ids, such as GitHub's repository_owner_id, which \
                     cannot be renamed and re-registered)"
                )));
            }
            roles.push(OidcRole {
                grants: grants(&format!("{who}: roles[{i}]"), &role.grants)?,
                bound_claims: role.bound_claims.into_iter().collect(),
            });
        }
        issuers.push(OidcConfig {
            name: o.name,
            issuer: o.issuer,
            audiences: o.audiences,
            jwks_url: o.jwks_url,
            ca_file,
            roles,
            audit_claims: o.audit_claims.unwrap_or_else(|| {
                crate::auth::oidc::DEFAULT_AUDIT_CLAIMS
                    .iter()
                    .map(|c| c.to_string())
                    .collect()
            }),
        });
    }
    Ok(issuers)
}

/// `url` is an `https://` URL with a host.
fn https(key: &str, url: &str) -> Result<(), String> {
    match url::Url::parse(url) {
        Ok(u) if u.scheme() == "https" && u.host().is_some() => Ok(()),
        _ => Err(format!(
            "{key} = {url:?}: must be an https:// URL (keys are fetched over HTTPS only)"
        )),
    }
}
