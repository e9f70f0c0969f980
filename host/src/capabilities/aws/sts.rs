//! The two STS calls behind Terraform's `assume_role` and
//! `assume_role_with_web_identity`, as credential providers: every setting
//! Terraform has (session tags, source identity, inline and managed
//! policies, duration) goes into the call.

use super::settings::{AssumeRole, WebIdentity};
use aws_credential_types::Credentials;
use aws_credential_types::provider::{self, ProvideCredentials, error::CredentialsError, future};
use aws_sdk_sts::types::{PolicyDescriptorType, Tag};
use std::time::SystemTime;

/// The session name when the config gives none.
const SESSION_NAME: &str = "wasmstate";

/// `AssumeRole`, signed with the source credentials the STS client holds.
#[derive(Debug)]
pub struct AssumeRoleProvider {
    /// STS, configured with the source credentials.
    pub client: aws_sdk_sts::Client,
    /// What to assume.
    pub role: AssumeRole,
}

impl ProvideCredentials for AssumeRoleProvider {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        future::ProvideCredentials::new(self.assume())
    }
}

impl AssumeRoleProvider {
    async fn assume(&self) -> provider::Result {
        let r = &self.role;
        let mut call = self
            .client
            .assume_role()
            .role_arn(&r.role_arn)
            .role_session_name(r.session_name.as_deref().unwrap_or(SESSION_NAME))
            .set_external_id(r.external_id.clone())
            .set_policy(r.policy.clone())
            .set_source_identity(r.source_identity.clone())
            .set_duration_seconds(r.duration.map(seconds));
        for arn in &r.policy_arns {
            call = call.policy_arns(PolicyDescriptorType::builder().arn(arn).build());
        }
        for (key, value) in &r.tags {
            let tag = Tag::builder()
                .key(key)
                .value(value)
                .build()
                .map_err(|e| CredentialsError::invalid_configuration(e.to_string()))?;
            call = call.tags(tag);
        }
        for key in &r.transitive_tag_keys {
            call = call.transitive_tag_keys(key);
        }
        let out = call
            .send()
            .await
            .map_err(|e| sts_failure("AssumeRole", &r.role_arn, e))?;
        session(out.credentials, "assume_role")
    }
}

/// `AssumeRoleWithWebIdentity`: unsigned; the token is read at every call,
/// since orchestrators rotate the file.
#[derive(Debug)]
pub struct WebIdentityProvider {
    /// STS, without credentials.
    pub client: aws_sdk_sts::Client,
    /// What to assume, and the token.
    pub web: WebIdentity,
}

impl ProvideCredentials for WebIdentityProvider {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        future::ProvideCredentials::new(self.assume())
    }
}

impl WebIdentityProvider {
    async fn assume(&self) -> provider::Result {
        let w = &self.web;
        let token = match (&w.token, &w.token_file) {
            (Some(token), _) => token.clone(),
            (None, Some(file)) => std::fs::read_to_string(file)
                .map_err(|e| {
                    CredentialsError::invalid_configuration(format!(
                        "cannot read the web identity token file {}: {e}; check web_identity_token_file and that the orchestrator mounts it",
                        file.display()
                    ))
                })?
                .trim()
                .to_string(),
            (None, None) => {
                return Err(CredentialsError::invalid_configuration(
                    "no web identity token configured",
                ));
            }
        };
        let mut call = self
            .client
            .assume_role_with_web_identity()
            .role_arn(&w.role_arn)
            .role_session_name(w.session_name.as_deref().unwrap_or(SESSION_NAME))
            .web_identity_token(token)
            .set_policy(w.policy.clone())
            .set_duration_seconds(w.duration.map(seconds));
        for arn in &w.policy_arns {
            call = call.policy_arns(PolicyDescriptorType::builder().arn(arn).build());
        }
        let out = call
            .send()
            .await
            .map_err(|e| sts_failure("AssumeRoleWithWebIdentity", &w.role_arn, e))?;
        session(out.credentials, "assume_role_with_web_identity")
    }
}

fn seconds(d: std::time::Duration) -> i32 {
    d.as_secs().min(i32::MAX as u64) as i32
}

/// STS's answer as credentials that expire when it says.
fn session(
    credentials: Option<aws_sdk_sts::types::Credentials>,
    source: &'static str,
) -> provider::Result {
    let c = credentials
        .ok_or_else(|| CredentialsError::unhandled("STS answered without credentials"))?;
    let expires = SystemTime::try_from(c.expiration)
        .map_err(|_| CredentialsError::unhandled("STS answered with an expiration out of range"))?;
    Ok(Credentials::new(
        c.access_key_id,
        c.secret_access_key,
        Some(c.session_token),
        Some(expires),
        source,
    ))
}

/// One line on what STS said, with what to check.
fn sts_failure<E: std::error::Error + Send + Sync + 'static>(
    call: &str,
    role_arn: &str,
    error: E,
) -> CredentialsError {
    CredentialsError::provider_error(format!(
        "{call} for {role_arn} failed: {}; check that the role exists, trusts the source identity, and (for a short duration) that it is within the role's limits",
        super::one_line(&error)
    ))
}
