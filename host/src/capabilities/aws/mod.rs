//! AWS credentials, held by the host and never by a guest.
//!
//! The host resolves each backend's credentials with AWS's standard chain
//! plus Terraform's s3 backend settings ([`settings`], [`chain`]), caches
//! them and refreshes them before they expire ([`AwsSigner`]), and signs
//! (SigV4) the guest's outgoing requests to the AWS endpoints the backend
//! is granted (`aws_sign`). A guest sends unsigned requests and never sees
//! a key, not even a session key; and the host signs only what a state
//! store needs, on the bucket and table the backend names ([`scope`]).

pub mod chain;
mod scope;
pub mod settings;
mod sign;
mod sts;

pub use scope::{Service, SigningScope, check_disjoint};
pub use settings::AwsSettings;

use crate::policy::Origin;
use aws_credential_types::Credentials;
use aws_smithy_runtime_api::client::http::SharedHttpClient;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// What a backend is granted: requests to `origins` are signed with
/// credentials from `settings`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsGrant {
    /// Origins whose requests the host signs.
    pub origins: Vec<Origin>,
    /// Where the credentials come from.
    pub settings: AwsSettings,
    /// What of those origins the signed requests may reach.
    pub scope: SigningScope,
}

impl AwsGrant {
    /// The grant of a backend whose requests to `origins` are signed: its
    /// credential settings are taken out of `guest_config` (relative paths
    /// from `base`), and `origins` become reachable in `allow_http`. `None`
    /// (and nothing taken) without origins. A guest that is not
    /// `first_party` must name its states ([`SigningScope::for_stranger`]).
    pub fn take(
        origins: Vec<Origin>,
        first_party: bool,
        guest_config: &mut Vec<(String, String)>,
        allow_http: &mut Vec<Origin>,
        base: &std::path::Path,
    ) -> Result<Option<AwsGrant>, String> {
        if origins.is_empty() {
            return Ok(None);
        }
        // The host never lends its identity to a guest's STS or IAM call.
        if let Some(origin) = origins.iter().find(|o| {
            o.host
                .split('.')
                .any(|label| matches!(label, "sts" | "iam") || label.starts_with("sts-"))
        }) {
            return Err(format!(
                "aws_sign: {}://{} is an STS or IAM endpoint; the host signs only S3 and DynamoDB requests for a guest",
                origin.scheme, origin.host
            ));
        }
        let scope = match first_party {
            true => SigningScope::from_config(guest_config),
            false => SigningScope::for_stranger(guest_config)?,
        };
        let settings = settings::take_from_config(guest_config, base)?;
        for origin in &origins {
            if !allow_http.contains(origin) {
                allow_http.push(origin.clone());
            }
        }
        Ok(Some(AwsGrant {
            origins,
            settings,
            scope,
        }))
    }
}

/// The HTTP client of the host's own AWS calls (STS, ECS, instance
/// metadata): hyper with rustls and ring, the system's roots.
pub fn http_client() -> SharedHttpClient {
    use aws_smithy_http_client::{Builder, tls};
    Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https()
}

/// The most that is kept of credentials' remaining life before they are
/// fetched again.
const REFRESH_MARGIN: Duration = Duration::from_secs(5 * 60);

/// One backend's signer: its grant, its credential chain, and the
/// credentials last fetched, shared by every request of the backend.
pub struct AwsSigner {
    origins: Vec<Origin>,
    scope: SigningScope,
    region: String,
    chain: chain::Chain,
    backend: Arc<str>,
    current: tokio::sync::Mutex<Option<Fetched>>,
}

struct Fetched {
    credentials: Credentials,
    at: SystemTime,
}

impl Fetched {
    /// Still good for a while: more than the margin (five minutes, or half
    /// the credentials' life when that is shorter) left before expiry.
    fn fresh(&self, now: SystemTime) -> bool {
        let Some(expiry) = self.credentials.expiry() else {
            return true;
        };
        let life = expiry.duration_since(self.at).unwrap_or_default();
        let margin = REFRESH_MARGIN.min(life / 2);
        now + margin < expiry
    }
}

impl AwsSigner {
    /// The signer of `backend` for `grant`; nothing is fetched yet.
    pub async fn new(backend: &str, grant: &AwsGrant, http: SharedHttpClient) -> AwsSigner {
        AwsSigner {
            origins: grant.origins.clone(),
            scope: grant.scope.clone(),
            region: grant.settings.region.clone(),
            chain: chain::build(&grant.settings, http).await,
            backend: Arc::from(backend),
            current: tokio::sync::Mutex::new(None),
        }
    }

    /// Whether requests to `uri` are signed.
    pub fn signs(&self, uri: &http::Uri) -> bool {
        self.origins.iter().any(|o| o.matches(uri))
    }

    /// Sign `request` (its whole body in hand) with this backend's current
    /// credentials, replacing any signature the guest put on it, if it is
    /// within the backend's [`SigningScope`]. `Err`: one line saying why it
    /// was refused, or naming the credential source and what to fix.
    /// The payload's hash is the backend's host `work` (a big body takes
    /// a core for a while).
    pub async fn sign(
        &self,
        mut request: http::Request<bytes::Bytes>,
        work: &crate::work::HostWork,
    ) -> Result<http::Request<bytes::Bytes>, String> {
        // "denied" tells the guest's SDK error apart from network trouble:
        // a refusal is final, not worth retrying.
        let service = self
            .scope
            .check(&request)
            .map_err(|why| format!("denied by the host's signing scope: {why}"))?;
        let credentials = self.credentials().await?;
        let region = self.region.clone();
        let signing = work.run(request.body().len(), move || {
            sign::sign(&mut request, &credentials, &region, service.signing_name())
                .map(|()| request)
        });
        signing.await.map_err(|e| e.to_string())?
    }

    /// The cached credentials, fetched again when they near expiry. One
    /// fetch at a time: concurrent requests wait for it.
    async fn credentials(&self) -> Result<Credentials, String> {
        use aws_credential_types::provider::ProvideCredentials;
        let mut current = self.current.lock().await;
        let now = SystemTime::now();
        if let Some(fetched) = current.as_ref()
            && fetched.fresh(now)
        {
            return Ok(fetched.credentials.clone());
        }
        let credentials = self
            .chain
            .provider
            .provide_credentials()
            .await
            .map_err(|e| {
                format!(
                    "no AWS credentials for backend {:?} from {}: {}",
                    self.backend,
                    self.chain.description,
                    one_line(&e)
                )
            })?;
        let expires_in = credentials
            .expiry()
            .and_then(|e| e.duration_since(now).ok())
            .map(|d| d.as_secs());
        tracing::info!(
            backend = %self.backend,
            source = %self.chain.description,
            expires_in_secs = ?expires_in,
            "AWS credentials fetched"
        );
        *current = Some(Fetched {
            credentials: credentials.clone(),
            at: now,
        });
        Ok(credentials)
    }
}

/// An error and its causes on one line.
pub(crate) fn one_line(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let next = e.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        cause = e.source();
    }
    text.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fetched(life_secs: Option<u64>) -> Fetched {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        Fetched {
            credentials: Credentials::new(
                "a",
                "s",
                None,
                life_secs.map(|s| at + Duration::from_secs(s)),
                "test",
            ),
            at,
        }
    }

    #[test]
    fn credentials_are_fetched_again_before_they_expire() {
        let after = |f: &Fetched, secs: u64| f.at + Duration::from_secs(secs);
        // An hour: kept until five minutes before the end.
        let hour = fetched(Some(3600));
        assert!(hour.fresh(after(&hour, 3000)));
        assert!(!hour.fresh(after(&hour, 3301)));
        // Twenty seconds: kept for the first half.
        let short = fetched(Some(20));
        assert!(short.fresh(after(&short, 9)));
        assert!(!short.fresh(after(&short, 11)));
        // Static keys never expire.
        let forever = fetched(None);
        assert!(forever.fresh(after(&forever, 10_000_000)));
    }
}
