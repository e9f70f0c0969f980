//! AWS KMS as a key service: `GenerateDataKey` (AES-256) on every write,
//! `Decrypt` on a read whose data key is not cached, both with the
//! state's encryption context ([`Context::pairs`]) and pinned to the
//! configured key, so a wrapped key that storage swapped for one under
//! another KMS key the host may use is refused by KMS itself.
//!
//! Credentials are the host's, through the same chain as the AWS guests
//! ([`crate::capabilities::aws::chain`]): the backend's own AWS settings
//! when it has them (an `s3-lockfile` or `dynamodb` backend), else those
//! under `encryption.aws`, else the standard chain (environment, shared
//! files, web identity, ECS, EC2 instance metadata).

use super::{Context, DataKey, KeyError, KeyFuture, KeyProvider};
use crate::capabilities::aws::{AwsSettings, chain};
use aws_sdk_kms::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_kms::primitives::Blob;
use aws_sdk_kms::types::DataKeySpec;
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::OnceCell;

/// The most one KMS call may take, retries included: well inside
/// Terraform's own HTTP timeout, so a stuck KMS is a 503, not a hang.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts per call (the SDK's standard retry: throttling, 5xx, network).
const ATTEMPTS: u32 = 3;

/// A KMS key as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsKmsKey {
    /// `arn:aws:kms:REGION:ACCOUNT:key/ID`. Not an alias: a data key must
    /// be unwrapped by the key that wrapped it, and an alias can be
    /// pointed at another key (KMS's own rotation keeps the key's ARN).
    pub arn: String,
    /// The key's region, from its ARN.
    pub region: String,
    /// Another KMS endpoint (a VPC endpoint, a test server).
    pub endpoint: Option<String>,
    /// Where the host's credentials come from.
    pub settings: AwsSettings,
}

impl AwsKmsKey {
    /// The region of a KMS key ARN; `Err` says what an ARN looks like.
    pub fn region_of(arn: &str) -> Result<String, String> {
        let parts: Vec<&str> = arn.splitn(6, ':').collect();
        match parts.as_slice() {
            ["arn", partition, "kms", region, account, resource]
                if partition.starts_with("aws")
                    && !region.is_empty()
                    && !account.is_empty()
                    && resource.len() > 4
                    && resource.starts_with("key/") =>
            {
                Ok(region.to_string())
            }
            ["arn", _, "kms", _, _, resource] if resource.starts_with("alias/") => Err(format!(
                "aws_kms: {arn:?} is an alias; give the key's own ARN (…:key/KEY-ID): states sealed \
                 through an alias stop opening once it points at another key (KMS's automatic \
                 rotation keeps the key's ARN; to move to a new key, add it in front and run \
                 `wasmstate state reseal`)"
            )),
            _ => Err(format!(
                "aws_kms: {arn:?} is not a KMS key ARN; write \"arn:aws:kms:REGION:ACCOUNT:key/KEY-ID\""
            )),
        }
    }
}

/// One KMS key, its client made on first use (building the credential
/// chain may read files and the environment; a backend that never seals
/// with this key never does).
pub struct AwsKms {
    key: AwsKmsKey,
    client: OnceCell<aws_sdk_kms::Client>,
}

impl AwsKms {
    /// The provider of `key`; nothing is fetched yet.
    pub fn new(key: AwsKmsKey) -> Self {
        AwsKms {
            key,
            client: OnceCell::new(),
        }
    }

    async fn client(&self) -> &aws_sdk_kms::Client {
        self.client
            .get_or_init(|| async {
                let http = crate::capabilities::aws::http_client();
                let mut settings = self.key.settings.clone();
                settings.region = self.key.region.clone();
                let chain = chain::build(&settings, http.clone()).await;
                let mut config = aws_sdk_kms::Config::builder()
                    .behavior_version(aws_sdk_kms::config::BehaviorVersion::latest())
                    .region(aws_sdk_kms::config::Region::new(self.key.region.clone()))
                    .http_client(http)
                    .retry_config(
                        aws_sdk_kms::config::retry::RetryConfig::standard()
                            .with_max_attempts(ATTEMPTS),
                    )
                    .timeout_config(
                        aws_sdk_kms::config::timeout::TimeoutConfig::builder()
                            .operation_timeout(CALL_TIMEOUT)
                            .build(),
                    );
                config.set_credentials_provider(Some(chain.provider));
                if let Some(endpoint) = &self.key.endpoint {
                    config = config.endpoint_url(endpoint);
                }
                aws_sdk_kms::Client::from_conf(config.build())
            })
            .await
    }

    /// A failed call, as one line that names the key and the cause.
    fn failure<E>(&self, call: &str, error: SdkError<E>) -> KeyError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let code = error.code().map(str::to_string);
        let refused = matches!(
            code.as_deref(),
            Some("InvalidCiphertextException" | "IncorrectKeyException")
        );
        let cause = match (&error, code) {
            (SdkError::ServiceError(_), Some(code)) => format!(
                "{code}: {}",
                error.message().unwrap_or("no message from KMS")
            ),
            // An answer the SDK could not read as KMS's own JSON error (a
            // proxy's page, an XML error): its status and first words.
            (SdkError::ServiceError(_), None) => match error.raw_response() {
                Some(raw) => {
                    let body = raw.body().bytes().unwrap_or_default();
                    let text = String::from_utf8_lossy(&body[..body.len().min(400)]);
                    format!(
                        "HTTP {}: {}",
                        raw.status().as_u16(),
                        text.split_whitespace().collect::<Vec<_>>().join(" ")
                    )
                }
                None => DisplayErrorContext(&error).to_string(),
            },
            (SdkError::DispatchFailure(_), _) => {
                format!("cannot reach KMS: {}", DisplayErrorContext(&error))
            }
            (SdkError::TimeoutError(_), _) => {
                format!("KMS did not answer within {CALL_TIMEOUT:?}")
            }
            _ => DisplayErrorContext(&error).to_string(),
        };
        let line = format!("KMS {call} with {} failed: {cause}", self.key.arn);
        if refused {
            KeyError::Refused(format!(
                "{line} (the wrapped data key is not this key's for this state: the stored state was altered or moved)"
            ))
        } else {
            KeyError::Unavailable(line)
        }
    }
}

fn context_map(context: &Context) -> HashMap<String, String> {
    context
        .pairs()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

fn thirty_two(bytes: Option<&Blob>, what: &str) -> Result<[u8; 32], KeyError> {
    let bytes = bytes.map(|b| b.as_ref()).unwrap_or_default();
    bytes.try_into().map_err(|_| {
        KeyError::Unavailable(format!(
            "KMS returned a {what} of {} bytes, not the 32 of an AES-256 key",
            bytes.len()
        ))
    })
}

impl KeyProvider for AwsKms {
    fn describe(&self) -> String {
        format!("AWS KMS {}", self.key.arn)
    }

    fn generate<'a>(&'a self, context: &'a Context) -> KeyFuture<'a, DataKey> {
        Box::pin(async move {
            let answer = self
                .client()
                .await
                .generate_data_key()
                .key_id(&self.key.arn)
                .key_spec(DataKeySpec::Aes256)
                .set_encryption_context(Some(context_map(context)))
                .send()
                .await
                .map_err(|e| self.failure("GenerateDataKey", e))?;
            let plain = thirty_two(answer.plaintext(), "data key")?;
            let wrapped = answer
                .ciphertext_blob()
                .map(|b| b.as_ref().to_vec())
                .filter(|w| !w.is_empty())
                .ok_or_else(|| {
                    KeyError::Unavailable("KMS returned no wrapped data key".to_string())
                })?;
            Ok(DataKey { plain, wrapped })
        })
    }

    fn unwrap<'a>(&'a self, wrapped: &'a [u8], context: &'a Context) -> KeyFuture<'a, [u8; 32]> {
        Box::pin(async move {
            let answer = self
                .client()
                .await
                .decrypt()
                .key_id(&self.key.arn)
                .ciphertext_blob(Blob::new(wrapped))
                .set_encryption_context(Some(context_map(context)))
                .send()
                .await
                .map_err(|e| self.failure("Decrypt", e))?;
            thirty_two(answer.plaintext(), "data key")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_region_comes_from_the_arn() {
        assert_eq!(
            AwsKmsKey::region_of("arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab").unwrap(),
            "eu-west-1"
        );
        assert_eq!(
            AwsKmsKey::region_of("arn:aws-us-gov:kms:us-gov-west-1:1:key/abc").unwrap(),
            "us-gov-west-1"
        );
        let alias = AwsKmsKey::region_of("arn:aws:kms:eu-west-1:1:alias/state").unwrap_err();
        assert!(
            alias.contains("is an alias") && alias.contains("key/KEY-ID"),
            "{alias}"
        );
        for bad in [
            "1234abcd-12ab",
            "arn:aws:s3:eu-west-1:1:key/x",
            "arn:aws:kms::1:key/x",
            "arn:aws:kms:eu-west-1:1:grant/x",
            "arn:aws:kms:eu-west-1:1:key/",
        ] {
            let err = AwsKmsKey::region_of(bad).unwrap_err();
            assert!(err.contains("not a KMS key ARN"), "{bad}: {err}");
        }
    }

    /// Nothing listens on port 9 of loopback: the call fails at once, as
    /// a 503-class error that names the key.
    #[tokio::test]
    async fn an_unreachable_kms_is_unavailable_and_named() {
        let arn = "arn:aws:kms:eu-west-1:123456789012:key/abc";
        let kms = AwsKms::new(AwsKmsKey {
            arn: arn.into(),
            region: "eu-west-1".into(),
            endpoint: Some("http://127.0.0.1:9".into()),
            settings: AwsSettings {
                static_keys: Some(crate::capabilities::aws::settings::StaticKeys {
                    access_key: "AKIDEXAMPLE".into(),
                    secret_key: "secret".into(),
                    token: None,
                }),
                ..AwsSettings::default()
            },
        });
        let context = Context {
            backend: "prod".into(),
            workspace: "net".into(),
            lineage: None,
            serial: Some(1),
        };
        let Err(KeyError::Unavailable(e)) = kms.generate(&context).await else {
            panic!("an unreachable KMS must be unavailable");
        };
        assert!(e.contains(arn) && e.contains("GenerateDataKey"), "{e}");
    }
}
