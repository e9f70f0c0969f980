//! Where a Google access token comes from, and the one a backend holds.
//!
//! Sources, in the order Terraform's gcs backend and Google's Application
//! Default Credentials try them: a token given as is; a credentials file
//! (a service account's key: a JWT signed RS256 with its key, exchanged at
//! its `token_uri`; or an authorized user's refresh token); the metadata
//! server of the VM or pod the host runs on.

use serde::Deserialize;
use std::fmt;
use std::time::{Duration, SystemTime};

/// The scope the host asks for: read and write objects, nothing else of
/// the project.
const SCOPE: &str = "https://www.googleapis.com/auth/devstorage.read_write";
/// Google's token endpoint, when a credentials file names none.
const GOOGLE_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";
/// A token is minted again when less than this (or half its life) is left.
const REFRESH_MARGIN: Duration = Duration::from_secs(5 * 60);

/// Where a backend's access token comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `access_token` (or `GOOGLE_OAUTH_ACCESS_TOKEN`): used as is.
    Static(String),
    /// A service account's key: `client_email`, `private_key` (PEM).
    ServiceAccount {
        /// `client_email`.
        email: String,
        /// `private_key_id`, sent as the JWT's `kid`.
        key_id: Option<String>,
        /// `private_key`, PEM.
        private_key: String,
        /// `token_uri`.
        token_uri: String,
    },
    /// An authorized user's refresh token (`gcloud auth
    /// application-default login`).
    AuthorizedUser {
        /// `client_id`.
        client_id: String,
        /// `client_secret`.
        client_secret: String,
        /// `refresh_token`.
        refresh_token: String,
        /// `token_uri`.
        token_uri: String,
    },
    /// The metadata server (`GCE_METADATA_HOST`, else
    /// `metadata.google.internal`).
    Metadata {
        /// Host (and port) of the metadata server.
        host: String,
    },
}

impl fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenSource::Static(_) => f.write_str("Static(** redacted **)"),
            TokenSource::ServiceAccount {
                email, token_uri, ..
            } => write!(f, "ServiceAccount({email} at {token_uri})"),
            TokenSource::AuthorizedUser { token_uri, .. } => {
                write!(f, "AuthorizedUser(at {token_uri})")
            }
            TokenSource::Metadata { host } => write!(f, "Metadata({host})"),
        }
    }
}

/// A credentials file as Google writes them.
#[derive(Deserialize)]
struct CredentialsFile {
    #[serde(rename = "type")]
    kind: String,
    client_email: Option<String>,
    private_key_id: Option<String>,
    private_key: Option<String>,
    client_id: Option<String>,
    client_secret: Option<String>,
    refresh_token: Option<String>,
    token_uri: Option<String>,
}

impl TokenSource {
    /// The source a backend's settings name (`access_token`, then
    /// `credentials`: a path or the JSON itself), else the environment's,
    /// else the metadata server; and whether it is the host's own identity
    /// (the environment's or the metadata server's) rather than one the
    /// backend's config names. `Err` says what to fix.
    pub fn resolve(
        access_token: Option<String>,
        credentials: Option<String>,
        base: &std::path::Path,
    ) -> Result<(TokenSource, bool), String> {
        let ambient = access_token.is_none() && credentials.is_none();
        Ok((
            Self::resolve_from(access_token, credentials, base)?,
            ambient,
        ))
    }

    fn resolve_from(
        access_token: Option<String>,
        credentials: Option<String>,
        base: &std::path::Path,
    ) -> Result<TokenSource, String> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if let Some(token) = access_token.or_else(|| env("GOOGLE_OAUTH_ACCESS_TOKEN")) {
            return Ok(TokenSource::Static(token.trim().to_string()));
        }
        let (what, given) = match credentials {
            Some(c) => ("credentials", Some(c)),
            None => match env("GOOGLE_BACKEND_CREDENTIALS") {
                Some(c) => ("GOOGLE_BACKEND_CREDENTIALS", Some(c)),
                None => match env("GOOGLE_CREDENTIALS") {
                    Some(c) => ("GOOGLE_CREDENTIALS", Some(c)),
                    None => (
                        "GOOGLE_APPLICATION_CREDENTIALS",
                        env("GOOGLE_APPLICATION_CREDENTIALS"),
                    ),
                },
            },
        };
        match given {
            Some(text) => parse_credentials(what, &text, base),
            None => Ok(TokenSource::Metadata {
                host: env("GCE_METADATA_HOST").unwrap_or("metadata.google.internal".into()),
            }),
        }
    }
}

/// A credentials file's source: `text` is its JSON, or a path to it.
fn parse_credentials(
    what: &str,
    text: &str,
    base: &std::path::Path,
) -> Result<TokenSource, String> {
    let json = if text.trim_start().starts_with('{') {
        text.to_string()
    } else {
        let path = base.join(text.trim());
        std::fs::read_to_string(&path)
            .map_err(|e| format!("{what}: cannot read {}: {e}", path.display()))?
    };
    let file: CredentialsFile = serde_json::from_str(&json)
        .map_err(|e| format!("{what}: not a Google credentials file: {e}"))?;
    let need = |field: Option<String>, name: &str| {
        field.ok_or_else(|| format!("{what}: a {} key without {name}", file.kind))
    };
    match file.kind.as_str() {
        "service_account" => {
            let private_key = need(file.private_key.clone(), "private_key")?;
            // Checked now, so a bad key fails at start, not at a request.
            jsonwebtoken::EncodingKey::from_rsa_pem(private_key.as_bytes())
                .map_err(|e| format!("{what}: private_key is not an RSA key in PEM: {e}"))?;
            Ok(TokenSource::ServiceAccount {
                email: need(file.client_email.clone(), "client_email")?,
                key_id: file.private_key_id.clone(),
                private_key,
                token_uri: file.token_uri.clone().unwrap_or(GOOGLE_TOKEN_URI.into()),
            })
        }
        "authorized_user" => Ok(TokenSource::AuthorizedUser {
            client_id: need(file.client_id.clone(), "client_id")?,
            client_secret: need(file.client_secret.clone(), "client_secret")?,
            refresh_token: need(file.refresh_token.clone(), "refresh_token")?,
            token_uri: file.token_uri.clone().unwrap_or(GOOGLE_TOKEN_URI.into()),
        }),
        other => Err(format!(
            "{what}: credentials of type {other:?} are not supported; give a service account's key (type service_account), an authorized user's (authorized_user), or an access_token"
        )),
    }
}

/// A token endpoint's answer (OAuth 2.0, RFC 6749 §5.1).
#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    expires_in: Option<u64>,
}

/// One backend's current token, minted again before it expires.
pub struct Cache {
    backend: String,
    source: TokenSource,
    http: reqwest::Client,
    current: tokio::sync::Mutex<Option<(String, Option<SystemTime>)>>,
}

impl Cache {
    /// An empty cache for `source`.
    pub fn new(backend: &str, source: TokenSource, http: reqwest::Client) -> Cache {
        Cache {
            backend: backend.to_string(),
            source,
            http,
            current: tokio::sync::Mutex::new(None),
        }
    }

    /// A token not yet due for refresh, minted if needed.
    /// One caller mints at a time; the others wait for its token.
    pub async fn get(&self) -> Result<String, String> {
        let mut current = self.current.lock().await;
        let now = SystemTime::now();
        if let Some((token, expiry)) = &*current
            && expiry.is_none_or(|refresh_at| now < refresh_at)
        {
            return Ok(token.clone());
        }
        // The cause goes to the log only: a token endpoint's answer may
        // echo what was sent to it.
        let (token, life) = self.mint().await.map_err(|e| {
            tracing::warn!(backend = %self.backend, "cannot get a Google access token: {e}");
            "cannot get a Google access token (the server's log says why)".to_string()
        })?;
        // Minted again five minutes before it expires, or halfway through
        // a shorter life.
        let refresh_at = life.map(|life| now + life - REFRESH_MARGIN.min(life / 2));
        *current = Some((token.clone(), refresh_at));
        Ok(token)
    }

    async fn mint(&self) -> Result<(String, Option<Duration>), String> {
        let request = match &self.source {
            TokenSource::Static(token) => return Ok((token.clone(), None)),
            TokenSource::ServiceAccount {
                email,
                key_id,
                private_key,
                token_uri,
            } => {
                let assertion = service_account_jwt(email, key_id.as_deref(), private_key, token_uri)?;
                self.http.post(token_uri).form(&[
                    ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
                    ("assertion", assertion.as_str()),
                ])
            }
            TokenSource::AuthorizedUser {
                client_id,
                client_secret,
                refresh_token,
                token_uri,
            } => self.http.post(token_uri).form(&[
                ("grant_type", "refresh_token"),
                ("client_id", client_id.as_str()),
                ("client_secret", client_secret.as_str()),
                ("refresh_token", refresh_token.as_str()),
            ]),
            TokenSource::Metadata { host } => self
                .http
                .get(format!(
                    "http://{host}/computeMetadata/v1/instance/service-accounts/default/token?scopes={SCOPE}"
                ))
                .header("Metadata-Flavor", "Google"),
        };
        let answer = request.send().await.map_err(|e| format!("{e}"))?;
        let status = answer.status();
        if !status.is_success() {
            let text = answer.text().await.unwrap_or_default();
            let text: String = text.chars().take(200).collect();
            return Err(format!("the token endpoint answered {status}: {text}"));
        }
        let token: TokenAnswer = answer
            .json()
            .await
            .map_err(|e| format!("the token endpoint's answer is not a token: {e}"))?;
        Ok((
            token.access_token,
            token.expires_in.map(Duration::from_secs),
        ))
    }
}

/// The assertion a service account exchanges for a token (Google's
/// "OAuth 2.0 for server to server applications"): one hour, our scope.
fn service_account_jwt(
    email: &str,
    key_id: Option<&str>,
    private_key: &str,
    token_uri: &str,
) -> Result<String, String> {
    #[derive(serde::Serialize)]
    struct Claims<'a> {
        iss: &'a str,
        scope: &'a str,
        aud: &'a str,
        iat: u64,
        exp: u64,
    }
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_err(|_| "the clock is before 1970".to_string())?
        .as_secs();
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = key_id.map(str::to_string);
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(private_key.as_bytes())
        .map_err(|e| format!("the service account's private_key: {e}"))?;
    jsonwebtoken::encode(
        &header,
        &Claims {
            iss: email,
            scope: SCOPE,
            aud: token_uri,
            iat: now,
            exp: now + 3600,
        },
        &key,
    )
    .map_err(|e| format!("signing the service account's assertion: {e}"))
}
