//! Google's side of the host's credentials, on loopback: an OAuth 2.0
//! token endpoint (RFC 6749, with Google's JWT-bearer grant for service
//! accounts, RFC 7523), the metadata server's token path, and in front of
//! fake-gcs-server a gate that forwards only requests carrying a token it
//! minted (or a resumable upload's session URL). No Google service runs
//! here; these are the documented protocols, as the host speaks them.

use super::fault_proxy::forward;
use super::loopback::LoopbackServer;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A running front; stopped when dropped.
pub struct GoogleFront {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    shared: Arc<Shared>,
    _server: LoopbackServer,
}

struct Shared {
    upstream: String,
    /// The service account's public key (PEM), for its assertions.
    public_key: Mutex<Option<String>>,
    lifetime_secs: u64,
    refuse: AtomicBool,
    minted: Mutex<Vec<String>>,
    serial: AtomicU64,
    /// Requests refused at the gate: `METHOD path (authorization)`.
    unauthorized: Mutex<Vec<String>>,
    /// Requests forwarded, with the token they carried.
    forwarded: Mutex<Vec<String>>,
}

impl GoogleFront {
    /// A front for fake-gcs-server at `upstream` (`http://127.0.0.1:PORT`)
    /// minting tokens that live `lifetime_secs`.
    pub fn start(upstream: &str, lifetime_secs: u64) -> GoogleFront {
        let shared = Arc::new(Shared {
            upstream: upstream
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string(),
            public_key: Mutex::default(),
            lifetime_secs,
            refuse: AtomicBool::new(false),
            minted: Mutex::default(),
            serial: AtomicU64::new(0),
            unauthorized: Mutex::default(),
            forwarded: Mutex::default(),
        });
        let served = shared.clone();
        let server = LoopbackServer::start("Google front", true, |url| {
            let token_url = format!("{url}/token");
            move |request| handle(request, served.clone(), token_url.clone())
        });
        GoogleFront {
            url: server.url.clone(),
            shared,
            _server: server,
        }
    }

    /// The token endpoint's URL (a service account key's `token_uri`).
    pub fn token_uri(&self) -> String {
        format!("{}/token", self.url)
    }

    /// `host:port`, as `GCE_METADATA_HOST` names the metadata server.
    pub fn metadata_host(&self) -> String {
        self.url.trim_start_matches("http://").to_string()
    }

    /// Accept service-account assertions signed by `public_key` (PEM).
    pub fn trust_key(&self, public_key: String) {
        *self.shared.public_key.lock().unwrap() = Some(public_key);
    }

    /// Refuse (or again grant) every token request.
    pub fn refuse_tokens(&self, refuse: bool) {
        self.shared.refuse.store(refuse, Ordering::SeqCst);
    }

    /// How many tokens were minted.
    pub fn minted(&self) -> usize {
        self.shared.minted.lock().unwrap().len()
    }

    /// Requests the gate refused for want of a minted token.
    pub fn unauthorized(&self) -> Vec<String> {
        self.shared.unauthorized.lock().unwrap().clone()
    }

    /// Requests forwarded to fake-gcs-server: `METHOD path token`.
    pub fn forwarded(&self) -> Vec<String> {
        self.shared.forwarded.lock().unwrap().clone()
    }
}

fn answer(status: StatusCode, body: String) -> Result<Response<Full<Bytes>>, std::io::Error> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(std::io::Error::other)
}

async fn handle(
    request: Request<Incoming>,
    shared: Arc<Shared>,
    token_url: String,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let path = request.uri().path().to_string();
    if path == "/token" || path == "/computeMetadata/v1/instance/service-accounts/default/token" {
        let metadata = path != "/token";
        let flavor = request
            .headers()
            .get("metadata-flavor")
            .is_some_and(|v| v == "Google");
        let body = request
            .into_body()
            .collect()
            .await
            .map_err(std::io::Error::other)?;
        let form: Vec<(String, String)> = form_urlencoded::parse(&body.to_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let field = |name: &str| form.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let valid = if shared.refuse.load(Ordering::SeqCst) {
            Err("refused by the test".to_string())
        } else if metadata {
            flavor
                .then_some(())
                .ok_or("no Metadata-Flavor: Google".to_string())
        } else {
            check_grant(&shared, &token_url, &field)
        };
        if let Err(why) = valid {
            return answer(
                StatusCode::BAD_REQUEST,
                serde_json::json!({"error": "invalid_grant", "error_description": why}).to_string(),
            );
        }
        let token = format!("ya29.test-{}", shared.serial.fetch_add(1, Ordering::SeqCst));
        shared.minted.lock().unwrap().push(token.clone());
        return answer(
            StatusCode::OK,
            serde_json::json!({"access_token": token, "expires_in": shared.lifetime_secs, "token_type": "Bearer"})
                .to_string(),
        );
    }
    let auth = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let token = auth.strip_prefix("Bearer ").unwrap_or("");
    let session = request
        .uri()
        .query()
        .is_some_and(|q| q.contains("upload_id="));
    let what = format!("{} {} {token}", request.method(), request.uri());
    if !session && !shared.minted.lock().unwrap().iter().any(|t| t == token) {
        shared.unauthorized.lock().unwrap().push(what);
        return answer(
            StatusCode::UNAUTHORIZED,
            "{\"error\":{\"code\":401}}".into(),
        );
    }
    shared.forwarded.lock().unwrap().push(what);
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    match forward(
        Request::from_parts(parts, Full::new(body)),
        &shared.upstream,
    )
    .await
    {
        Ok(answered) => Ok(answered),
        Err(e) => answer(StatusCode::BAD_GATEWAY, format!("front: upstream: {e}")),
    }
}

/// A service account's assertion, checked as Google does: RS256 with the
/// account's key, for this endpoint, asking for storage.
fn check_grant(
    shared: &Shared,
    token_url: &str,
    field: &dyn Fn(&str) -> Option<String>,
) -> Result<(), String> {
    if field("grant_type").as_deref() != Some("urn:ietf:params:oauth:grant-type:jwt-bearer") {
        return Err("unsupported grant_type".into());
    }
    let assertion = field("assertion").ok_or("no assertion")?;
    let key = shared
        .public_key
        .lock()
        .unwrap()
        .clone()
        .ok_or("no service account here")?;
    let key = jsonwebtoken::DecodingKey::from_rsa_pem(key.as_bytes()).map_err(|e| e.to_string())?;
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    validation.set_audience(&[token_url]);
    let claims = jsonwebtoken::decode::<serde_json::Value>(&assertion, &key, &validation)
        .map_err(|e| format!("assertion: {e}"))?
        .claims;
    let scope = claims["scope"].as_str().unwrap_or("");
    if !scope.contains("devstorage") {
        return Err(format!("scope {scope:?} does not reach storage"));
    }
    Ok(())
}

/// A service account's key file (Google's JSON) for `token_uri`, with a
/// fresh RSA key made by `openssl`; and the public half, PEM.
pub fn service_account_key(dir: &std::path::Path, token_uri: &str) -> (std::path::PathBuf, String) {
    let private = dir.join("sa.pem");
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .output()
            .expect("openssl runs");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    run(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        private.to_str().unwrap(),
    ]);
    let public =
        String::from_utf8(run(&["pkey", "-in", private.to_str().unwrap(), "-pubout"])).unwrap();
    let key = serde_json::json!({
        "type": "service_account",
        "project_id": "wasmstate-test",
        "private_key_id": "key-1",
        "private_key": std::fs::read_to_string(&private).unwrap(),
        "client_email": "terraform@wasmstate-test.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": token_uri,
    });
    let file = dir.join("sa.json");
    std::fs::write(&file, key.to_string()).unwrap();
    (file, public)
}
