//! A backend's Entra ID access token for Azure Storage: minted by the way
//! [`entra`](super::entra) chose, cached, minted again before it expires
//! (or at once after Azure refused it).
//!
//! The exchanges at a tenant's token endpoint (a client secret, or a
//! client assertion: the federated token, or a JWT signed with the
//! certificate's key) are OAuth 2.0 client-credentials grants, made with
//! the `oauth2` crate over the host's reqwest client; the managed-identity
//! endpoint is a plain GET with `Metadata: true`, as Azure documents it.

use super::entra::{App, FederatedToken, Way};
use oauth2::basic::BasicClient;
use oauth2::{AuthType, ClientId, ClientSecret, RequestTokenError, Scope, TokenResponse, TokenUrl};
use serde::Deserialize;
use std::time::{Duration, SystemTime};

/// The scope of a token for Azure Storage (every cloud).
const SCOPE: &str = "https://storage.azure.com/.default";
/// The resource the managed-identity endpoint is asked for.
const RESOURCE: &str = "https://storage.azure.com/";
/// OAuth 2.0 JWT client assertions (RFC 7523).
const JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
/// A token is minted again when less than this (or half its life) is left.
const REFRESH_MARGIN: Duration = Duration::from_secs(5 * 60);
/// Longest life the host believes a token has: Entra ID's live one to 24
/// hours, and an absurd `expires_in` would overflow the clock (a panic).
const MAX_LIFE: Duration = Duration::from_secs(24 * 60 * 60);
/// Most of a token endpoint's answer the host reads: a token answer is a
/// few KiB, and a broken or hostile endpoint must not fill the memory.
const MAX_ANSWER: usize = 256 * 1024;

/// One backend's current token, shared by its requests.
pub struct Cache {
    way: Way,
    http: reqwest::Client,
    /// The token and when to mint the next one.
    current: tokio::sync::Mutex<Option<(String, SystemTime)>>,
}

impl Cache {
    /// An empty cache for `way`; nothing is fetched yet.
    pub fn new(way: Way) -> Cache {
        // Over plain http (the metadata endpoint, App Service's, a loopback
        // token endpoint) a proxy would see the token or the secret in the
        // clear, and Azure documents that IMDS requests bypass proxies.
        let direct = match &way {
            Way::Managed { .. } => true,
            Way::Secret { app, .. } | Way::Federated { app, .. } | Way::Certificate { app, .. } => {
                app.token_url.to_ascii_lowercase().starts_with("http://")
            }
        };
        Cache {
            way,
            http: http_client(direct),
            current: tokio::sync::Mutex::new(None),
        }
    }

    /// A token not yet due for refresh, minted if needed; one caller mints
    /// at a time, the others wait for its token. `Err` names the way of
    /// signing in, the client, the tenant and the token endpoint's answer,
    /// never a secret or a token.
    pub async fn get(&self) -> Result<String, String> {
        let mut current = self.current.lock().await;
        let now = SystemTime::now();
        if let Some((token, refresh_at)) = &*current
            && now < *refresh_at
        {
            return Ok(token.clone());
        }
        let (token, life) = self.mint().await.map_err(|e| {
            format!(
                "cannot get an Entra ID token with {}: {e}",
                self.way.describe()
            )
        })?;
        // Minted again five minutes before it expires, or halfway through
        // a shorter life.
        let life = life.min(MAX_LIFE);
        let refresh_at = now + life - REFRESH_MARGIN.min(life / 2);
        *current = Some((token.clone(), refresh_at));
        Ok(token)
    }

    /// Azure refused `token` (401): the next request mints another, unless
    /// one was minted meanwhile.
    pub async fn forget(&self, token: &str) {
        let mut current = self.current.lock().await;
        if current.as_ref().is_some_and(|(t, _)| t == token) {
            *current = None;
        }
    }

    async fn mint(&self) -> Result<(String, Duration), String> {
        match &self.way {
            Way::Secret { app, secret } => self.exchange(app, Some(secret), None).await,
            Way::Federated { app, token } => {
                // Re-read each time: the platform rotates the file.
                let assertion = match token {
                    FederatedToken::Fixed(token) => token.clone(),
                    FederatedToken::File(path) => tokio::fs::read_to_string(path)
                        .await
                        .map_err(|e| {
                            format!(
                                "cannot read the federated token file {}: {e}",
                                path.display()
                            )
                        })?
                        .trim()
                        .to_string(),
                };
                self.exchange(app, None, Some(assertion)).await
            }
            Way::Certificate {
                app, key_pem, x5t, ..
            } => {
                let assertion = certificate_assertion(app, key_pem, x5t)?;
                self.exchange(app, None, Some(assertion)).await
            }
            Way::Managed {
                endpoint,
                client_id,
                identity_header,
            } => {
                self.managed(endpoint, client_id.as_deref(), identity_header.as_deref())
                    .await
            }
        }
    }

    /// A client-credentials grant at `app`'s token endpoint.
    async fn exchange(
        &self,
        app: &App,
        secret: Option<&str>,
        assertion: Option<String>,
    ) -> Result<(String, Duration), String> {
        let url = TokenUrl::new(app.token_url.clone())
            .map_err(|e| format!("the token endpoint {} is not a URL: {e}", app.token_url))?;
        let mut client = BasicClient::new(ClientId::new(app.client_id.clone()))
            .set_token_uri(url)
            .set_auth_type(AuthType::RequestBody);
        if let Some(secret) = secret {
            client = client.set_client_secret(ClientSecret::new(secret.to_string()));
        }
        let mut request = client
            .exchange_client_credentials()
            .add_scope(Scope::new(SCOPE.into()));
        if let Some(assertion) = &assertion {
            request = request
                .add_extra_param("client_assertion_type", JWT_BEARER)
                .add_extra_param("client_assertion", assertion.as_str());
        }
        // What was sent is kept out of what is said, whatever the endpoint
        // echoes.
        let scrub = |text: String| {
            [secret, assertion.as_deref()]
                .into_iter()
                .flatten()
                .filter(|s| !s.is_empty())
                .fold(text, |t, s| t.replace(s, "***"))
        };
        // reqwest's own adapter would read any answer whole: this one
        // stops at MAX_ANSWER.
        let bounded = Bounded(self.http.clone());
        match request.request_async(&bounded).await {
            Ok(answer) => Ok((
                answer.access_token().secret().clone(),
                answer.expires_in().unwrap_or(Duration::from_secs(3600)),
            )),
            Err(RequestTokenError::ServerResponse(e)) => {
                // Entra ID's description: "AADSTS7000215: Invalid client
                // secret provided. …\r\nTrace ID: …": its first line.
                let description = e
                    .error_description()
                    .map(|d| d.lines().next().unwrap_or_default().trim().to_string())
                    .unwrap_or_default();
                Err(scrub(format!(
                    "the token endpoint refused: {} {description}",
                    e.error()
                )))
            }
            Err(RequestTokenError::Request(e)) => Err(scrub(format!(
                "cannot reach the token endpoint: {}",
                chain(&e)
            ))),
            Err(RequestTokenError::Parse(e, _)) => Err(format!(
                "the token endpoint's answer is not a token (at {})",
                e.path()
            )),
            Err(RequestTokenError::Other(e)) => Err(scrub(format!("the token endpoint: {e}"))),
        }
    }

    /// A token from the managed-identity endpoint (the instance metadata
    /// service's form, or App Service's with its header).
    async fn managed(
        &self,
        endpoint: &str,
        client_id: Option<&str>,
        identity_header: Option<&str>,
    ) -> Result<(String, Duration), String> {
        let version = if identity_header.is_some() {
            "2019-08-01"
        } else {
            "2018-02-01"
        };
        let mut query = vec![("api-version", version), ("resource", RESOURCE)];
        if let Some(id) = client_id {
            query.push(("client_id", id));
        }
        let mut request = self.http.get(endpoint).query(&query);
        request = match identity_header {
            Some(header) => request.header("X-IDENTITY-HEADER", header),
            None => request.header("Metadata", "true"),
        };
        let answer = request
            .send()
            .await
            .map_err(|e| format!("cannot reach the managed-identity endpoint: {}", chain(&e)))?;
        let status = answer.status();
        let body = read_bounded(answer)
            .await
            .map_err(|e| format!("reading the managed-identity endpoint's answer: {e}"))?;
        if !status.is_success() {
            #[derive(Deserialize)]
            struct Refusal {
                error: Option<String>,
                error_description: Option<String>,
            }
            let said = serde_json::from_slice::<Refusal>(&body)
                .map(|r| {
                    format!(
                        "{} {}",
                        r.error.unwrap_or_default(),
                        r.error_description.unwrap_or_default()
                    )
                })
                .unwrap_or_default();
            return Err(format!(
                "the managed-identity endpoint answered {status}: {}",
                said.trim()
            ));
        }
        #[derive(Deserialize)]
        struct Answer {
            access_token: String,
            expires_in: Option<Number>,
            expires_on: Option<Number>,
        }
        /// The endpoint writes numbers as strings.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Number {
            Int(u64),
            Text(String),
        }
        let number = |n: Option<Number>| match n {
            Some(Number::Int(n)) => Some(n),
            Some(Number::Text(t)) => t.trim().parse().ok(),
            None => None,
        };
        // The error's position only: its message may quote the token.
        let answer: Answer = serde_json::from_slice(&body).map_err(|e| {
            format!(
                "the managed-identity endpoint's answer is not a token ({:?} error at line {} column {})",
                e.classify(),
                e.line(),
                e.column()
            )
        })?;
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let life = match (number(answer.expires_in), number(answer.expires_on)) {
            (Some(life), _) => life,
            (None, Some(on)) => on.saturating_sub(now),
            (None, None) => 3600,
        };
        Ok((answer.access_token, Duration::from_secs(life)))
    }
}

/// The assertion a client certificate signs in with (Entra ID's
/// "certificate credentials"): RS256, `x5t` the certificate's thumbprint,
/// ten minutes, for the tenant's token endpoint.
fn certificate_assertion(app: &App, key_pem: &str, x5t: &str) -> Result<String, String> {
    #[derive(serde::Serialize)]
    struct Claims<'a> {
        aud: &'a str,
        iss: &'a str,
        sub: &'a str,
        jti: String,
        nbf: u64,
        iat: u64,
        exp: u64,
    }
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_err(|_| "the clock is before 1970".to_string())?;
    let secs = now.as_secs();
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.x5t = Some(x5t.to_string());
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(key_pem.as_bytes())
        .map_err(|e| format!("the client certificate's key: {e}"))?;
    // Unique per assertion: Entra ID refuses one seen before.
    let jti = format!("{}-{}", now.as_nanos(), std::process::id());
    jsonwebtoken::encode(
        &header,
        &Claims {
            aud: &app.token_url,
            iss: &app.client_id,
            sub: &app.client_id,
            jti,
            nbf: secs,
            iat: secs,
            exp: secs + 600,
        },
        &key,
    )
    .map_err(|e| format!("signing the client assertion: {e}"))
}

/// The host's client for `oauth2`, reading answers up to [`MAX_ANSWER`].
struct Bounded(reqwest::Client);

impl<'c> oauth2::AsyncHttpClient<'c> for Bounded {
    type Error = std::io::Error;
    type Future = std::pin::Pin<
        Box<dyn Future<Output = Result<oauth2::HttpResponse, std::io::Error>> + Send + Sync + 'c>,
    >;

    fn call(&'c self, request: oauth2::HttpRequest) -> Self::Future {
        Box::pin(async move {
            let failed = |e: &dyn std::error::Error| std::io::Error::other(chain(e));
            let request = reqwest::Request::try_from(request).map_err(|e| failed(&e))?;
            let answer = self.0.execute(request).await.map_err(|e| failed(&e))?;
            let mut response = http::Response::builder().status(answer.status());
            for (name, value) in answer.headers() {
                response = response.header(name, value);
            }
            let body = read_bounded(answer).await.map_err(std::io::Error::other)?;
            response.body(body).map_err(|e| failed(&e))
        })
    }
}

/// A token endpoint's answer, refused past [`MAX_ANSWER`] bytes.
async fn read_bounded(mut answer: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = answer.chunk().await.map_err(|e| chain(&e))? {
        if body.len() + chunk.len() > MAX_ANSWER {
            return Err(format!("its answer is over {} KiB", MAX_ANSWER / 1024));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// An error and its causes, on one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The client of the host's Entra ID calls: rustls, no redirects (a token
/// request is never sent on elsewhere), a deadline, the roots the guests'
/// requests trust (Mozilla's, and `SSL_CERT_FILE`'s); `direct`: never
/// through the environment's proxy.
fn http_client(direct: bool) -> reqwest::Client {
    let mut builder = reqwest::Client::builder();
    if direct {
        builder = builder.no_proxy();
    }
    let mut builder = builder
        .use_rustls_tls()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20));
    for cert in super::super::extra_roots() {
        if let Ok(cert) = reqwest::Certificate::from_der(&cert) {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().expect("a client with rustls builds")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A managed-identity endpoint on loopback answering one request with
    /// `body` (JSON); its URL, and the thread to join.
    fn endpoint(body: Vec<u8>) -> (String, std::thread::JoinHandle<()>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/token", listener.local_addr().unwrap());
        let thread = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap() == 1 {
                head.push(byte[0]);
            }
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(&body);
        });
        (url, thread)
    }

    async fn join(thread: std::thread::JoinHandle<()>) {
        tokio::task::spawn_blocking(move || thread.join().unwrap())
            .await
            .unwrap();
    }

    fn managed(endpoint: String) -> Cache {
        Cache::new(Way::Managed {
            endpoint,
            client_id: None,
            identity_header: None,
        })
    }

    /// An absurd lifetime is a token of at most a day, not a panic (the
    /// clock would overflow) that takes the request down.
    #[tokio::test]
    async fn an_absurd_token_life_is_bounded() {
        let body = br#"{"access_token":"t","expires_in":"18446744073709551615"}"#;
        let (url, thread) = endpoint(body.to_vec());
        let cache = managed(url);
        let got = tokio::spawn(async move { cache.get().await }).await;
        join(thread).await;
        assert_eq!(got.expect("no panic"), Ok("t".to_string()));
    }

    /// A token endpoint's answer is read up to a bound, not whole into
    /// memory whatever its size.
    #[tokio::test]
    async fn a_huge_answer_is_refused_unread() {
        let mut body = br#"{"access_token":""#.to_vec();
        body.resize(body.len() + 8 * 1024 * 1024, b'a');
        body.extend_from_slice(br#"","expires_in":"3600"}"#);
        let (url, thread) = endpoint(body);
        let e = managed(url).get().await.unwrap_err();
        // The runtime closes the connection the host left while it waits.
        join(thread).await;
        assert!(e.contains("KiB"), "{e}");
    }
}
