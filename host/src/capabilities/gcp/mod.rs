//! Google Cloud credentials, held by the host and never by a guest.
//!
//! A `gcs` backend's `access_token` or `credentials` (a service-account
//! key, or an authorized user's refresh token) leave its configuration
//! before the guest sees it ([`GcpGrant::take`]); without either, the host
//! reads them as Terraform's gcs backend does (`GOOGLE_OAUTH_ACCESS_TOKEN`,
//! `GOOGLE_BACKEND_CREDENTIALS`, `GOOGLE_CREDENTIALS`,
//! `GOOGLE_APPLICATION_CREDENTIALS`) and last asks the metadata server.
//! The host mints and refreshes the access token ([`token`]) and adds it
//! only to requests that stay on the backend's state objects ([`scope`]).

mod scope;
pub mod token;

use crate::policy::Origin;
pub use token::TokenSource;

/// Keys of a backend's `config` table holding Google credentials.
pub const CREDENTIAL_KEYS: &[&str] = &["access_token", "credentials"];

/// Google's JSON API, where `storage_custom_endpoint` is not set.
const DEFAULT_ENDPOINT: &str = "https://storage.googleapis.com/storage/v1/";

/// What a backend is granted: requests to `origins`, on the state and lock
/// objects under one prefix of one bucket, carry an access token from
/// `source`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcpGrant {
    /// Origins whose requests carry the token.
    pub origins: Vec<Origin>,
    /// `bucket`.
    pub bucket: String,
    /// `prefix`, as Terraform cleans it (no leading `/`, a trailing one
    /// unless empty).
    pub prefix: String,
    /// The JSON API's path (`/storage/v1`), from `storage_custom_endpoint`.
    pub api_path: String,
    /// The upload API's path (`/upload/storage/v1`).
    pub upload_path: String,
    /// `kms_encryption_key`: the only KMS key an upload may name.
    pub kms_key: Option<String>,
    /// Where the token comes from.
    pub source: TokenSource,
}

impl GcpGrant {
    /// The grant of a backend whose requests to `origins` carry a token:
    /// the credential settings are taken out of `guest_config` (relative
    /// paths from `base`), the bucket, prefix and endpoint are read and
    /// left, and `origins` become reachable in `allow_http`. `None` (and
    /// nothing taken) without origins.
    pub fn take(
        origins: Vec<Origin>,
        guest_config: &mut Vec<(String, String)>,
        allow_http: &mut Vec<Origin>,
        base: &std::path::Path,
    ) -> Result<Option<GcpGrant>, String> {
        if origins.is_empty() {
            return Ok(None);
        }
        // A bearer token is the credential itself: it goes only where
        // nobody on the path can read it.
        super::confidential(&origins, "storage_custom_endpoint")?;
        let taken = super::take_settings(guest_config, CREDENTIAL_KEYS);
        let given = |name: &str| super::setting(&taken, name);
        let (source, ambient) =
            TokenSource::resolve(given("access_token"), given("credentials"), base)?;
        // The host's own identity (its environment, the metadata server)
        // goes only to Google, or to this machine; another endpoint must
        // be given credentials of its own.
        if ambient
            && let Some(origin) = origins
                .iter()
                .find(|o| !super::takes_host_identity(o, &[".googleapis.com"]))
        {
            return Err(format!(
                "credentials: {}://{} is not Google's; give this backend its own access_token or credentials instead of the host's environment or metadata server",
                origin.scheme, origin.host
            ));
        }
        let setting = |name: &str| super::setting(guest_config, name);
        let bucket = setting("bucket").ok_or("bucket: required")?;
        let prefix = match setting("prefix")
            .unwrap_or_default()
            .trim_start_matches('/')
        {
            "" => String::new(),
            p if p.ends_with('/') => p.to_string(),
            p => format!("{p}/"),
        };
        let endpoint = setting("storage_custom_endpoint").unwrap_or(DEFAULT_ENDPOINT.into());
        let uri: http::Uri = endpoint
            .parse()
            .map_err(|e| format!("storage_custom_endpoint: {endpoint:?} is not a URL: {e}"))?;
        let api_path = uri.path().trim_end_matches('/').to_string();
        // As the guest derives it: `…/storage/v1` → `…/upload/storage/v1`.
        let upload_path = match api_path.strip_suffix("/storage/v1") {
            Some(root) => format!("{root}/upload/storage/v1"),
            None => format!("{api_path}/upload"),
        };
        super::reach(&origins, allow_http);
        Ok(Some(GcpGrant {
            origins,
            bucket,
            prefix,
            api_path,
            upload_path,
            kms_key: setting("kms_encryption_key"),
            source,
        }))
    }
}

/// A request the host let through.
#[derive(Debug, PartialEq, Eq)]
pub enum Authorized {
    /// Send it.
    Plain,
    /// Send it, then remember the session its answer's `Location` names
    /// ([`GcpAuth::session_started`]).
    StartsSession,
}

/// Why a request was not given a token.
#[derive(Debug)]
pub enum Refusal {
    /// It leaves the grant's scope: never sent.
    OutOfScope(String),
    /// No token could be had (the token endpoint failed or refused).
    NoToken(String),
}

/// One backend's token: the grant, and the token last minted, shared by
/// every request of the backend.
pub struct GcpAuth {
    grant: GcpGrant,
    tokens: token::Cache,
    /// Resumable uploads the host started (their `upload_id`), and when:
    /// the only sessions a guest may send to.
    sessions: std::sync::Mutex<Vec<(String, std::time::Instant)>>,
}

/// How long a resumable upload's session stays usable here (Google keeps
/// one a week; a state's upload takes minutes).
const SESSION_LIFE: std::time::Duration = std::time::Duration::from_secs(3600);
/// Most sessions remembered per backend.
const MAX_SESSIONS: usize = 256;

impl GcpAuth {
    /// The authorizer of `grant`, calling token endpoints with `http`;
    /// nothing is fetched yet.
    pub fn new(backend: &str, grant: &GcpGrant, http: reqwest::Client) -> GcpAuth {
        GcpAuth {
            grant: grant.clone(),
            tokens: token::Cache::new(backend, grant.source.clone(), http),
            sessions: std::sync::Mutex::default(),
        }
    }

    /// Whether requests to `uri` go through this authorizer (and so must
    /// stay in its scope).
    pub fn covers(&self, uri: &http::Uri) -> bool {
        self.grant.origins.iter().any(|o| o.matches(uri))
    }

    /// Whether the scope check of `method uri` needs the body (an upload
    /// names its object there).
    pub fn needs_body(&self, method: &http::Method, uri: &http::Uri) -> bool {
        scope::needs_body(&self.grant, method, uri)
    }

    /// Authorize `parts` (with `body` when [`needs_body`](Self::needs_body)
    /// said so): refused unless it stays on the grant's state and lock
    /// objects; then given the bearer token, except a resumable upload's
    /// session requests, which the session itself authorizes. The guest's
    /// own `Authorization` is removed.
    pub async fn authorize(
        &self,
        parts: &mut http::request::Parts,
        body: Option<&[u8]>,
    ) -> Result<Authorized, Refusal> {
        parts.headers.remove(http::header::AUTHORIZATION);
        let known = |id: &str| self.known_session(id);
        let request = (&parts.method, &parts.uri, &parts.headers);
        let access =
            scope::check(&self.grant, request, body, &known).map_err(Refusal::OutOfScope)?;
        match access {
            scope::Access::Session => Ok(Authorized::Plain),
            scope::Access::Bearer | scope::Access::Initiation => {
                let token = self.tokens.get().await.map_err(Refusal::NoToken)?;
                let value = format!("Bearer {token}").parse().map_err(|_| {
                    Refusal::NoToken("the access token does not fit in a header".into())
                })?;
                parts.headers.insert(http::header::AUTHORIZATION, value);
                Ok(if access == scope::Access::Initiation {
                    Authorized::StartsSession
                } else {
                    Authorized::Plain
                })
            }
        }
    }

    /// Remember the session a resumable upload's initiation answered with
    /// (its `Location`'s `upload_id`).
    pub fn session_started(&self, location: &str) {
        let Ok(uri) = location.parse::<http::Uri>() else {
            return;
        };
        let id = form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
            .find(|(k, _)| k == "upload_id")
            .map(|(_, v)| v.into_owned());
        if let Some(id) = id {
            let now = std::time::Instant::now();
            let mut sessions = self.sessions.lock().expect("not poisoned");
            sessions.retain(|(_, at)| now.duration_since(*at) < SESSION_LIFE);
            if sessions.len() >= MAX_SESSIONS {
                sessions.remove(0);
            }
            sessions.push((id, now));
        }
    }

    fn known_session(&self, id: &str) -> bool {
        let now = std::time::Instant::now();
        self.sessions
            .lock()
            .expect("not poisoned")
            .iter()
            .any(|(known, at)| known == id && now.duration_since(*at) < SESSION_LIFE)
    }
}

/// The HTTP client of the host's own Google calls (token endpoints, the
/// metadata server): rustls, no redirects, a deadline.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .use_rustls_tls()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(std::time::Duration::from_secs(20))
        .build()
        .expect("a client with rustls builds")
}
