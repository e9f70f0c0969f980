//! The other side of an Entra ID sign-in, for the tests: a loopback server
//! playing a tenant's token endpoint (reached through the authority host)
//! and the managed-identity metadata endpoint, minting the JWTs Azurite's
//! `--oauth basic` accepts (issuer `https://sts.windows.net/<tenant>/`,
//! audience `https://storage.azure.com`, a lifetime), and checking what a
//! client sends as Entra ID does: its client ID, its secret, its
//! federated token, its certificate assertion (signature, `x5t`,
//! audience). It counts its exchanges and keeps every token it minted.
//!
//! And the TLS files Azurite serves with: a private CA, a certificate for
//! 127.0.0.1 signed by it.

use crate::common::*;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// The tenant the tests sign in to.
pub const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
/// The application signing in.
pub const CLIENT: &str = "6a1d4b1c-2f3e-4a5b-8c7d-9e0f1a2b3c4d";

/// What the fake accepts and what it saw.
#[derive(Default)]
struct State {
    life: u64,
    secret: String,
    federated: Vec<String>,
    cert_public_pem: Option<String>,
    x5t: Option<String>,
    /// Token-endpoint exchanges that minted a token.
    token_hits: u64,
    /// Managed-identity answers that minted a token.
    msi_hits: u64,
    /// Federated tokens presented, in order.
    assertions: Vec<String>,
    /// Every token minted.
    minted: Vec<String>,
    /// When each token-endpoint exchange minted one.
    minted_at: Vec<std::time::Instant>,
    /// Refusals: what a client got wrong.
    refusals: Vec<String>,
    /// Tokens still to mint already expired (said to live `life`).
    stale: u32,
}

/// A running fake Entra ID.
pub struct FakeEntra {
    /// `http://127.0.0.1:PORT`: the authority host.
    pub url: String,
    state: Arc<Mutex<State>>,
    _server: LoopbackServer,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A token as Entra ID's v1 issuer writes them for Azure Storage (HS256:
/// Azurite checks no signature), unique per call.
pub fn mint(life: i64, serial: usize) -> String {
    let issued = now() - 300;
    let claims = serde_json::json!({
        "aud": "https://storage.azure.com",
        "iss": format!("https://sts.windows.net/{TENANT}/"),
        "iat": issued, "nbf": issued, "exp": now() as i64 + life,
        "tid": TENANT, "appid": CLIENT, "oid": CLIENT,
        "uti": format!("wasmstate-test-{serial}-{}", unique()),
        "ver": "1.0",
    });
    jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(b"not checked by azurite"),
    )
    .unwrap()
}

fn json(status: u16, value: serde_json::Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json; charset=utf-8")
        .body(Full::new(Bytes::from(value.to_string())))
        .unwrap()
}

/// Entra ID's refusal, its description's lines as it writes them.
fn aadsts(status: u16, error: &str, code: u32, text: &str) -> Response<Full<Bytes>> {
    json(
        status,
        serde_json::json!({
            "error": error,
            "error_description": format!(
                "AADSTS{code}: {text}\r\nTrace ID: 0f1e2d3c-0000-0000-0000-000000000000\r\nCorrelation ID: 1a2b3c4d-0000-0000-0000-000000000000\r\nTimestamp: 2026-11-28 05:00:00Z"
            ),
            "error_codes": [code],
        }),
    )
}

impl FakeEntra {
    /// Start one minting tokens of `life` seconds, accepting client secret
    /// `secret`.
    pub fn start(life: u64, secret: &str) -> FakeEntra {
        let state = Arc::new(Mutex::new(State {
            life,
            secret: secret.to_string(),
            ..State::default()
        }));
        let shared = state.clone();
        let server = LoopbackServer::start("fake Entra ID", true, move |url| {
            let token_path = format!("/{TENANT}/oauth2/v2.0/token");
            let token_url = format!("{url}{token_path}");
            move |request: Request<hyper::body::Incoming>| {
                let state = shared.clone();
                let (token_path, token_url) = (token_path.clone(), token_url.clone());
                async move {
                    let (parts, body) = request.into_parts();
                    let body = body
                        .collect()
                        .await
                        .map(|b| b.to_bytes())
                        .unwrap_or_default();
                    let answer = if parts.uri.path() == token_path && parts.method == "POST" {
                        let form: Vec<(String, String)> = form_urlencoded::parse(&body)
                            .map(|(k, v)| (k.into_owned(), v.into_owned()))
                            .collect();
                        token(&state, &form, &token_url)
                    } else if parts.uri.path() == "/metadata/identity/oauth2/token" {
                        managed(&state, &parts)
                    } else {
                        json(404, serde_json::json!({"error": "not_found"}))
                    };
                    Ok(answer)
                }
            }
        });
        FakeEntra {
            url: server.url.clone(),
            state,
            _server: server,
        }
    }

    /// Accept `token` as a federated (workload identity) token.
    pub fn accept_federated(&self, token: &str) {
        self.state.lock().unwrap().federated.push(token.to_string());
    }

    /// Accept assertions signed by the key of a certificate with this
    /// public key (PEM) and thumbprint (`x5t`).
    pub fn accept_certificate(&self, public_pem: &str, x5t: &str) {
        let mut state = self.state.lock().unwrap();
        state.cert_public_pem = Some(public_pem.to_string());
        state.x5t = Some(x5t.to_string());
    }

    /// Mint the next `count` tokens already expired, though said to live
    /// the usual life: tokens Azure refuses before the client expects.
    pub fn mint_stale(&self, count: u32) {
        self.state.lock().unwrap().stale = count;
    }

    /// Tokens minted at the token endpoint.
    pub fn token_hits(&self) -> u64 {
        self.state.lock().unwrap().token_hits
    }

    /// When each token-endpoint exchange minted its token.
    pub fn minted_at(&self) -> Vec<std::time::Instant> {
        self.state.lock().unwrap().minted_at.clone()
    }

    /// Tokens minted at the managed-identity endpoint.
    pub fn msi_hits(&self) -> u64 {
        self.state.lock().unwrap().msi_hits
    }

    /// Federated tokens presented, in order.
    pub fn assertions(&self) -> Vec<String> {
        self.state.lock().unwrap().assertions.clone()
    }

    /// Every token minted.
    pub fn minted(&self) -> Vec<String> {
        self.state.lock().unwrap().minted.clone()
    }

    /// What clients got wrong.
    pub fn refusals(&self) -> Vec<String> {
        self.state.lock().unwrap().refusals.clone()
    }

    /// The managed-identity endpoint's URL (`msi_endpoint`).
    pub fn msi_endpoint(&self) -> String {
        format!("{}/metadata/identity/oauth2/token", self.url)
    }
}

/// A client-credentials grant, checked as Entra ID checks it.
fn token(
    state: &Mutex<State>,
    form: &[(String, String)],
    token_url: &str,
) -> Response<Full<Bytes>> {
    let get = |name: &str| {
        form.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let mut state = state.lock().unwrap();
    let state = &mut *state;
    let refuse = |state: &mut State, why: String, answer: Response<Full<Bytes>>| {
        state.refusals.push(why);
        answer
    };
    if get("grant_type") != Some("client_credentials")
        || get("scope") != Some("https://storage.azure.com/.default")
    {
        return refuse(
            state,
            format!("grant {:?} scope {:?}", get("grant_type"), get("scope")),
            aadsts(
                400,
                "invalid_request",
                900144,
                "The request body must contain the scope.",
            ),
        );
    }
    if get("client_id") != Some(CLIENT) {
        return refuse(
            state,
            format!("client {:?}", get("client_id")),
            aadsts(
                400,
                "unauthorized_client",
                700016,
                "Application was not found in the directory.",
            ),
        );
    }
    match (get("client_secret"), get("client_assertion")) {
        (Some(secret), None) if secret == state.secret => {}
        (Some(_), None) => {
            return refuse(
                state,
                "a wrong client secret".into(),
                aadsts(
                    401,
                    "invalid_client",
                    7000215,
                    "Invalid client secret provided. Ensure the secret being sent in the request is the client secret value, not the client secret ID.",
                ),
            );
        }
        (None, Some(assertion))
            if get("client_assertion_type")
                == Some("urn:ietf:params:oauth:client-assertion-type:jwt-bearer") =>
        {
            if state.federated.iter().any(|f| f == assertion) {
                state.assertions.push(assertion.to_string());
            } else if let Err(why) = certificate(state, assertion, token_url) {
                return refuse(
                    state,
                    why,
                    aadsts(
                        400,
                        "invalid_client",
                        700027,
                        "Client assertion failed signature validation.",
                    ),
                );
            }
        }
        _ => {
            return refuse(
                state,
                "no credential".into(),
                aadsts(
                    400,
                    "invalid_client",
                    7000218,
                    "The request body must contain client_assertion or client_secret.",
                ),
            );
        }
    }
    state.token_hits += 1;
    state.minted_at.push(std::time::Instant::now());
    let life = if state.stale > 0 {
        state.stale -= 1;
        -60
    } else {
        state.life as i64
    };
    let token = mint(life, state.minted.len());
    state.minted.push(token.clone());
    json(
        200,
        serde_json::json!({
            "token_type": "Bearer", "expires_in": state.life,
            "ext_expires_in": state.life, "access_token": token,
        }),
    )
}

/// A certificate's assertion: signed by its key, naming its thumbprint,
/// for this endpoint, from this client.
fn certificate(state: &State, assertion: &str, token_url: &str) -> Result<(), String> {
    let (Some(public), Some(x5t)) = (&state.cert_public_pem, &state.x5t) else {
        return Err("an unknown federated token".into());
    };
    let header = jsonwebtoken::decode_header(assertion).map_err(|e| e.to_string())?;
    if header.x5t.as_deref() != Some(x5t.as_str()) {
        return Err(format!("x5t {:?}", header.x5t));
    }
    let key = jsonwebtoken::DecodingKey::from_rsa_pem(public.as_bytes()).unwrap();
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    validation.set_audience(&[token_url]);
    validation.set_issuer(&[CLIENT]);
    let claims = jsonwebtoken::decode::<serde_json::Value>(assertion, &key, &validation)
        .map_err(|e| format!("assertion: {e}"))?
        .claims;
    if claims["sub"] != CLIENT || claims["jti"].as_str().is_none_or(str::is_empty) {
        return Err(format!("claims {claims}"));
    }
    Ok(())
}

/// The instance metadata service's managed-identity answer (numbers as
/// strings, as it writes them).
fn managed(state: &Mutex<State>, parts: &http::request::Parts) -> Response<Full<Bytes>> {
    let query: Vec<(String, String)> =
        form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
    let get = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let mut state = state.lock().unwrap();
    if parts.headers.get("metadata").is_none_or(|v| v != "true")
        || get("api-version") != Some("2018-02-01")
        || get("resource") != Some("https://storage.azure.com/")
        || get("client_id") != Some(CLIENT)
    {
        state
            .refusals
            .push(format!("managed identity: {:?}", parts.uri));
        return json(
            400,
            serde_json::json!({"error": "invalid_request", "error_description": "Identity not found"}),
        );
    }
    state.msi_hits += 1;
    let token = mint(state.life as i64, state.minted.len());
    state.minted.push(token.clone());
    json(
        200,
        serde_json::json!({
            "access_token": token, "client_id": CLIENT,
            "expires_in": state.life.to_string(),
            "expires_on": (now() + state.life).to_string(),
            "ext_expires_in": state.life.to_string(),
            "not_before": now().to_string(),
            "resource": "https://storage.azure.com/", "token_type": "Bearer",
        }),
    )
}

/// Azurite's TLS files in `dir`: `ca.pem`, `azurite.pem`, `azurite.key`.
pub fn tls_files(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let server = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let server_cert = server
        .signed_by(&server_key, &Issuer::new(ca, ca_key))
        .unwrap();
    let paths = (
        dir.join("ca.pem"),
        dir.join("azurite.pem"),
        dir.join("azurite.key"),
    );
    std::fs::write(&paths.0, ca_cert.pem()).unwrap();
    std::fs::write(&paths.1, server_cert.pem()).unwrap();
    std::fs::write(&paths.2, server_key.serialize_pem()).unwrap();
    paths
}

/// A client certificate file as Azure's tools write one (the RSA key and
/// the certificate, PEM, one file), made by `openssl`; its public key
/// (PEM) and thumbprint (`x5t`).
pub fn client_certificate(dir: &Path) -> (PathBuf, String, String) {
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
    let (key, cert) = (dir.join("client.key"), dir.join("client.crt"));
    let (key_s, cert_s) = (key.to_str().unwrap(), cert.to_str().unwrap());
    run(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        key_s,
    ]);
    run(&[
        "req",
        "-x509",
        "-new",
        "-key",
        key_s,
        "-subj",
        "/CN=wasmstate-test",
        "-days",
        "2",
        "-out",
        cert_s,
    ]);
    let public = String::from_utf8(run(&["pkey", "-in", key_s, "-pubout"])).unwrap();
    let der = run(&["x509", "-in", cert_s, "-outform", "DER"]);
    use base64::Engine as _;
    let x5t = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &der).as_ref());
    let both = dir.join("client.pem");
    let text = std::fs::read_to_string(&key).unwrap() + &std::fs::read_to_string(&cert).unwrap();
    std::fs::write(&both, text).unwrap();
    (both, public, x5t)
}

/// The client certificate [`client_certificate`] made in `dir`, exported
/// by `openssl pkcs12 -export` into `name` with `password` (empty: a PFX
/// without one), OpenSSL 3's defaults (PBES2, AES-256-CBC, a SHA-256 MAC)
/// as the portal or `az` users make one.
pub fn client_pfx(dir: &Path, name: &str, password: &str) -> PathBuf {
    let out_path = dir.join(name);
    let out = std::process::Command::new("openssl")
        .args([
            "pkcs12",
            "-export",
            "-inkey",
            "client.key",
            "-in",
            "client.crt",
        ])
        .arg("-passout")
        .arg(format!("pass:{password}"))
        .arg("-out")
        .arg(&out_path)
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl pkcs12 -export: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out_path
}
