//! An issuer's signing keys: found through its discovery document (or a
//! configured `jwks_url`), fetched over HTTPS, cached for as long as the
//! answer says (within bounds), and fetched again when they expire or a
//! token names a key the cache does not have, at most once per
//! [`REFRESH_GAP`]: a flood of tokens with made-up key ids costs the
//! issuer one fetch per gap. An issuer that is down leaves the cached keys
//! working.

use jsonwebtoken::jwk::{Jwk, JwkSet};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

/// Least time between two fetches of one issuer's keys.
pub const REFRESH_GAP: Duration = Duration::from_secs(5);
/// How long keys are kept when the issuer says nothing (Cache-Control).
const DEFAULT_TTL: Duration = Duration::from_secs(3600);
/// Bounds on what the issuer may ask for.
const MIN_TTL: Duration = Duration::from_secs(60);
const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Largest discovery document or key set read.
const MAX_DOCUMENT_BYTES: usize = 1 << 20;
/// How long one fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// How long past their expiry keys stay in use while fetching them again
/// fails (an issuer down); after that a key the issuer may have withdrawn
/// is no longer trusted.
const MAX_STALE: Duration = Duration::from_secs(24 * 3600);

/// The keys of one issuer.
pub struct Keys {
    client: reqwest::Client,
    issuer: String,
    jwks_url: Option<String>,
    cached: RwLock<Cached>,
    /// When a fetch last started; held while one runs.
    last_fetch: tokio::sync::Mutex<Option<Instant>>,
    /// A background fetch is under way (one at a time).
    refreshing: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Cached {
    keys: Vec<Jwk>,
    expires: Option<Instant>,
}

impl Keys {
    /// The keys of `issuer`, from `jwks_url` or its discovery document,
    /// trusting `extra_roots` (PEM) beside the usual ones.
    pub fn new(
        issuer: &str,
        jwks_url: Option<&str>,
        extra_roots: Option<&[u8]>,
    ) -> anyhow::Result<Keys> {
        let mut client = reqwest::Client::builder()
            .https_only(true)
            .redirect(reqwest::redirect::Policy::none())
            .timeout(FETCH_TIMEOUT)
            .use_rustls_tls();
        if let Some(pem) = extra_roots {
            for cert in reqwest::Certificate::from_pem_bundle(pem)? {
                client = client.add_root_certificate(cert);
            }
        }
        Ok(Keys {
            client: client.build()?,
            issuer: issuer.to_string(),
            jwks_url: jwks_url.map(str::to_string),
            cached: RwLock::default(),
            last_fetch: tokio::sync::Mutex::new(None),
            refreshing: Default::default(),
        })
    }

    /// The key named `kid`: from the cache (fetched again in the
    /// background once expired), or, if the cache does not have it, after
    /// fetching the keys again (unless that was done within the gap).
    pub async fn key(self: &Arc<Self>, kid: &str) -> Option<Jwk> {
        let (found, expired) = self.cached(kid);
        if let Some(key) = found {
            use std::sync::atomic::Ordering;
            if expired && !self.refreshing.swap(true, Ordering::AcqRel) {
                let keys = self.clone();
                tokio::spawn(async move {
                    keys.refresh().await;
                    keys.refreshing.store(false, Ordering::Release);
                });
            }
            return Some(key);
        }
        self.refresh().await;
        self.cached(kid).0
    }

    fn cached(&self, kid: &str) -> (Option<Jwk>, bool) {
        let cached = self.cached.read().unwrap_or_else(PoisonError::into_inner);
        let key = cached
            .keys
            .iter()
            .find(|k| k.common.key_id.as_deref() == Some(kid))
            .cloned();
        let now = Instant::now();
        let expired = cached.expires.is_none_or(|at| now >= at);
        let withdrawn = cached.expires.is_none_or(|at| now >= at + MAX_STALE);
        (key.filter(|_| !withdrawn), expired)
    }

    /// Fetch the keys again, unless a fetch started within the gap (one
    /// running now is waited for).
    async fn refresh(&self) {
        let mut last = self.last_fetch.lock().await;
        if last.is_some_and(|at| at.elapsed() < REFRESH_GAP) {
            return;
        }
        *last = Some(Instant::now());
        match self.fetch().await {
            Ok((set, ttl)) => {
                *self.cached.write().unwrap_or_else(PoisonError::into_inner) = Cached {
                    keys: set.keys,
                    expires: Some(Instant::now() + ttl),
                };
            }
            Err(e) => tracing::warn!(
                issuer = ?self.issuer,
                "cannot fetch the issuer's signing keys (the cached ones stay in use for up to 24 h past their expiry): {e:#}"
            ),
        }
    }

    async fn fetch(&self) -> anyhow::Result<(JwkSet, Duration)> {
        let url = match &self.jwks_url {
            Some(url) => url.clone(),
            None => self.discover().await?,
        };
        let (body, ttl) = self.get(&url).await?;
        #[derive(serde::Deserialize)]
        struct RawSet {
            keys: Vec<serde_json::Value>,
        }
        let raw: RawSet = serde_json::from_slice(&body)
            .map_err(|e| anyhow::anyhow!("{url:?}: not a JSON Web Key Set: {e}"))?;
        // One key of a kind this host does not know (another curve, an
        // encryption key) must not take the issuer's other keys with it.
        let keys = raw
            .keys
            .into_iter()
            .filter(|k| k.get("use").is_none_or(|u| u == "sig"))
            .filter_map(|k| serde_json::from_value::<Jwk>(k).ok())
            .collect();
        Ok((JwkSet { keys }, ttl))
    }

    /// The `jwks_uri` of the issuer's discovery document.
    async fn discover(&self) -> anyhow::Result<String> {
        #[derive(serde::Deserialize)]
        struct Discovery {
            issuer: String,
            jwks_uri: String,
        }
        let url = format!(
            "{}/.well-known/openid-configuration",
            self.issuer.trim_end_matches('/')
        );
        let (body, _) = self.get(&url).await?;
        let found: Discovery = serde_json::from_slice(&body)
            .map_err(|e| anyhow::anyhow!("{url:?}: not an OpenID discovery document: {e}"))?;
        // OpenID Connect Discovery 1.0, 4.3: the document names its issuer.
        anyhow::ensure!(
            found.issuer == self.issuer,
            "{url} names issuer {:?}, not {:?}",
            found.issuer,
            self.issuer
        );
        // Keys from the issuer's own host: a discovery document cannot send
        // the host to fetch from elsewhere (set jwks_url for that).
        let host = |u: &str| {
            reqwest::Url::parse(u)
                .ok()
                .and_then(|u| u.host_str().map(str::to_string))
        };
        anyhow::ensure!(
            host(&found.jwks_uri).is_some() && host(&found.jwks_uri) == host(&self.issuer),
            "{url:?} puts the keys at {:?}, not on the issuer's host; set jwks_url to allow it",
            found.jwks_uri
        );
        Ok(found.jwks_uri)
    }

    /// GET `url`: its body (at most [`MAX_DOCUMENT_BYTES`]) and how long
    /// it may be kept.
    async fn get(&self, url: &str) -> anyhow::Result<(Vec<u8>, Duration)> {
        let mut answer = self.client.get(url).send().await?.error_for_status()?;
        let ttl = answer
            .headers()
            .get(reqwest::header::CACHE_CONTROL)
            .and_then(|v| v.to_str().ok())
            .and_then(max_age)
            .map_or(DEFAULT_TTL, |ttl| ttl.clamp(MIN_TTL, MAX_TTL));
        let mut body = Vec::new();
        while let Some(chunk) = answer.chunk().await? {
            anyhow::ensure!(
                body.len() + chunk.len() <= MAX_DOCUMENT_BYTES,
                "{url:?}: larger than {MAX_DOCUMENT_BYTES} bytes"
            );
            body.extend_from_slice(&chunk);
        }
        Ok((body, ttl))
    }
}

/// `max-age` of a Cache-Control header.
fn max_age(header: &str) -> Option<Duration> {
    header.split(',').find_map(|directive| {
        let seconds = directive.trim().strip_prefix("max-age=")?;
        seconds.parse().ok().map(Duration::from_secs)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_age_is_read_from_cache_control() {
        assert_eq!(
            max_age("public, max-age=300, must-revalidate"),
            Some(Duration::from_secs(300))
        );
        assert_eq!(max_age("no-cache"), None);
    }
}
