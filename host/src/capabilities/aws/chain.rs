//! One backend's credential chain, built from its settings the way
//! Terraform's s3 backend builds it: a source (static keys, a named
//! profile, or the standard chain: environment, shared files, web identity
//! from the environment, ECS, EC2 instance metadata), replaced by a web
//! identity role when one is configured, with `assume_role` on top.

use super::settings::AwsSettings;
use super::sts::{AssumeRoleProvider, WebIdentityProvider};
use aws_config::default_provider::credentials::DefaultCredentialsChain;
use aws_config::profile::ProfileFileCredentialsProvider;
use aws_config::provider_config::ProviderConfig;
use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use aws_runtime::env_config::file::{EnvConfigFileKind, EnvConfigFiles};
use aws_smithy_runtime_api::client::http::SharedHttpClient;
use aws_types::region::Region;

/// A provider, and how to name it in errors and logs.
pub struct Chain {
    /// Where credentials come from.
    pub provider: SharedCredentialsProvider,
    /// E.g. "assume_role arn:… over profile \"ci\"".
    pub description: String,
}

/// Build the chain for `settings`; `http` carries the host's own calls
/// (STS, ECS, instance metadata), never a guest's.
pub async fn build(settings: &AwsSettings, http: SharedHttpClient) -> Chain {
    let region = Region::new(settings.region.clone());
    let providers = ProviderConfig::without_region()
        .with_region(Some(region))
        .with_http_client(http.clone());
    let mut chain = if let Some(keys) = &settings.static_keys {
        Chain {
            provider: SharedCredentialsProvider::new(Credentials::new(
                &keys.access_key,
                &keys.secret_key,
                keys.token.clone(),
                None,
                "wasmstate-config",
            )),
            description: "access_key/secret_key from the config".into(),
        }
    } else if settings.profile.is_some()
        || !settings.shared_config_files.is_empty()
        || !settings.shared_credentials_files.is_empty()
    {
        let mut files = EnvConfigFiles::builder();
        if settings.shared_config_files.is_empty() {
            files = files.include_default_config_file(true);
        }
        if settings.shared_credentials_files.is_empty() {
            files = files.include_default_credentials_file(true);
        }
        for file in &settings.shared_config_files {
            files = files.with_file(EnvConfigFileKind::Config, file);
        }
        for file in &settings.shared_credentials_files {
            files = files.with_file(EnvConfigFileKind::Credentials, file);
        }
        let mut builder = ProfileFileCredentialsProvider::builder()
            .configure(&providers)
            .profile_files(files.build());
        let name = settings.profile.as_deref().unwrap_or("default");
        builder = builder.profile_name(name);
        Chain {
            provider: SharedCredentialsProvider::new(builder.build()),
            description: format!("profile {name:?} of the shared config and credentials files"),
        }
    } else {
        let standard = DefaultCredentialsChain::builder()
            .configure(providers)
            .build()
            .await;
        Chain {
            provider: SharedCredentialsProvider::new(standard),
            description: "the standard chain (environment, shared files, web identity, ECS, EC2 instance metadata)".into(),
        }
    };
    if let Some(web) = &settings.web_identity {
        chain = Chain {
            provider: SharedCredentialsProvider::new(WebIdentityProvider {
                client: sts(settings, http.clone(), None),
                web: web.clone(),
            }),
            description: format!("assume_role_with_web_identity {}", web.role_arn),
        };
    }
    if let Some(role) = &settings.assume_role {
        chain = Chain {
            provider: SharedCredentialsProvider::new(AssumeRoleProvider {
                client: sts(settings, http, Some(chain.provider)),
                role: role.clone(),
            }),
            description: format!("assume_role {} over {}", role.role_arn, chain.description),
        };
    }
    chain
}

/// An STS client: the backend's STS region and endpoint, the source
/// credentials when the call is signed.
fn sts(
    settings: &AwsSettings,
    http: SharedHttpClient,
    source: Option<SharedCredentialsProvider>,
) -> aws_sdk_sts::Client {
    let region = settings.sts_region.as_deref().unwrap_or(&settings.region);
    let signed = source.is_some();
    let mut config = aws_sdk_sts::Config::builder()
        .behavior_version(aws_sdk_sts::config::BehaviorVersion::latest())
        .region(Region::new(region.to_string()))
        .http_client(http);
    config.set_credentials_provider(source);
    if !signed {
        // AssumeRoleWithWebIdentity is unsigned.
        config = config.allow_no_auth();
    }
    if let Some(endpoint) = &settings.sts_endpoint {
        config = config.endpoint_url(endpoint);
    }
    aws_sdk_sts::Client::from_conf(config.build())
}
