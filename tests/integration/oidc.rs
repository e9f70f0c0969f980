//! OIDC sign-in against a real HTTPS issuer on loopback: Python's
//! `http.server` over TLS with a private CA serves the discovery document
//! and the key set (no OIDC provider runs here; the two documents are all
//! the host reads), and the test mints ES256 tokens with the keys it
//! publishes. Terraform applies with a token as its password; every kind
//! of bad token is refused and changes nothing; a rotated key is picked
//! up; a flood of unknown key ids fetches the key set a bounded number of
//! times.

use crate::common::*;
use crate::terraform::{CONFIG, HTTP_BACKEND, backend_config, ok_with_env};
use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer as CertIssuer, KeyPair};
use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Serves a directory over HTTPS; logs each request's path to stderr.
const ISSUER_PY: &str = r#"
import http.server, os, ssl, sys
os.chdir(sys.argv[1])
class Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, fmt, *args):
        sys.stderr.write("GET " + self.path + "\n")
        sys.stderr.flush()
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[2], sys.argv[3])
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

/// An OIDC issuer on loopback and the signing keys it publishes.
struct TestIssuer {
    dir: tempfile::TempDir,
    url: String,
    child: Child,
    log: Arc<Mutex<String>>,
    keys: Vec<(String, KeyPair)>,
    /// Published beside the keys: an HMAC key, key-1 again marked for
    /// ES384, and a key of a kind jsonwebtoken does not know.
    odd: Vec<serde_json::Value>,
}

/// The secret of the `oct` key the issuer publishes (never to be trusted).
const HMAC_SECRET: &[u8] = b"a shared secret no issuer should publish";

impl Drop for TestIssuer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl TestIssuer {
    fn start() -> TestIssuer {
        let dir = tempdir();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let server = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        let server_key = KeyPair::generate().unwrap();
        let server_cert = server
            .signed_by(&server_key, &CertIssuer::new(ca, ca_key))
            .unwrap();
        let path = |name: &str| dir.path().join(name);
        std::fs::write(path("ca.pem"), ca_cert.pem()).unwrap();
        std::fs::write(path("server.pem"), server_cert.pem()).unwrap();
        std::fs::write(path("server.key"), server_key.serialize_pem()).unwrap();
        std::fs::write(path("issuer.py"), ISSUER_PY).unwrap();
        let site = path("site");
        std::fs::create_dir_all(site.join(".well-known")).unwrap();
        let mut child = Command::new("python3")
            .arg(path("issuer.py"))
            .args([&site, &path("server.pem"), &path("server.key")])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 runs the test issuer");
        let log = capture(child.stderr.take().unwrap());
        let mut port = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut port)
            .unwrap();
        assert!(
            !port.trim().is_empty(),
            "the test issuer did not start: {}",
            log.lock().unwrap()
        );
        let url = format!("https://127.0.0.1:{}", port.trim());
        std::fs::write(
            site.join(".well-known/openid-configuration"),
            serde_json::json!({"issuer": url, "jwks_uri": format!("{url}/jwks.json")}).to_string(),
        )
        .unwrap();
        let mut issuer = TestIssuer {
            dir,
            url,
            child,
            log,
            keys: Vec::new(),
            odd: Vec::new(),
        };
        issuer.rotate_in("key-1");
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let mut es384 = jwk("key-384", &issuer.keys[0].1);
        es384["alg"] = "ES384".into();
        issuer.odd = vec![
            serde_json::json!({"kty": "oct", "kid": "hmac", "k": b64(HMAC_SECRET)}),
            es384,
            serde_json::json!({"kty": "OKP", "crv": "X448", "kid": "unknown-kind", "x": b64(&[7; 56])}),
        ];
        issuer.rotate_in("key-1b");
        issuer
    }

    fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// Publish a new key `kid` beside the others.
    fn rotate_in(&mut self, kid: &str) {
        self.keys
            .push((kid.to_string(), KeyPair::generate().unwrap()));
        let mut keys: Vec<serde_json::Value> =
            self.keys.iter().map(|(kid, k)| jwk(kid, k)).collect();
        keys.extend(self.odd.iter().cloned());
        let jwks = self.dir.path().join("site/jwks.json");
        std::fs::write(jwks, serde_json::json!({ "keys": keys }).to_string()).unwrap();
    }

    /// Requests for the key set so far.
    fn key_fetches(&self) -> usize {
        self.log.lock().unwrap().matches("GET /jwks.json").count()
    }

    /// A token signed with key `kid`, with `claims` over the defaults.
    fn token(&self, kid: &str, claims: serde_json::Value) -> String {
        let key = &self.keys.iter().find(|(k, _)| k == kid).unwrap().1;
        sign(kid, key, &self.claims(claims))
    }

    fn claims(&self, over: serde_json::Value) -> serde_json::Value {
        let now = now();
        let mut claims = serde_json::json!({
            "iss": self.url, "aud": "wasmstate", "sub": "repo:acme/infra:ref:refs/heads/main",
            "repository": "acme/infra", "ref": "refs/heads/main", "actor": "octocat",
            "iat": now, "nbf": now, "exp": now + 600,
        });
        for (k, v) in over.as_object().unwrap() {
            claims[k] = v.clone();
        }
        claims
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn sign(kid: &str, key: &KeyPair, claims: &serde_json::Value) -> String {
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some(kid.to_string());
    let key = EncodingKey::from_ec_pem(key.serialize_pem().as_bytes()).unwrap();
    jsonwebtoken::encode(&header, claims, &key).unwrap()
}

/// The public JWK of a P-256 key.
fn jwk(kid: &str, key: &KeyPair) -> serde_json::Value {
    let point = key.public_key_raw();
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    serde_json::json!({
        "kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": kid,
        "x": b64(&point[1..33]), "y": b64(&point[33..65]),
    })
}

fn b64json(value: &serde_json::Value) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value.to_string())
}

fn server_for(issuer: &TestIssuer, data: &Path) -> Server {
    Server::with_config(
        data,
        &format!(
            "[backends.default]\nguest = \"local\"\n\
             [[oidc]]\nname = \"ci\"\nissuer = {:?}\naudiences = [\"wasmstate\"]\nca_file = {:?}\n\
             [[oidc.roles]]\nbound_claims = {{ repository = \"acme/infra\", ref = \"refs/heads/main\" }}\n\
             grants = [\"default:*:write\"]\n\
             [[oidc.roles]]\nbound_claims = {{ repository = \"acme/*\" }}\ngrants = [\"default:*:read\"]\n\
             [[oidc]]\nname = \"other\"\nissuer = \"https://127.0.0.1:1\"\naudiences = [\"wasmstate\"]\n\
             [[oidc.roles]]\nbound_claims = {{ repository = \"acme/*\" }}\ngrants = [\"default:*:write\"]\n\
             [[users]]\nname = \"alice\"\npassword_hash = {:?}\ngrants = [\"default:*:read\"]\n",
            issuer.url,
            issuer.ca_file(),
            crate::auth::hash("alice's password"),
        ),
    )
}

/// `method url` with `Authorization: Bearer token`, from loopback address
/// 127.0.0.`from` (each refusal case its own, so the sign-in throttle of
/// one does not answer for another).
fn with_token(method: &str, url: &str, token: &str, from: u8, body: Option<&[u8]>) -> u16 {
    let client = reqwest::blocking::Client::builder()
        .local_address(IpAddr::from([127, 0, 0, from]))
        .build()
        .unwrap();
    let mut request = client
        .request(method.parse().unwrap(), url)
        .bearer_auth(token);
    if let Some(body) = body {
        request = request
            .header("Content-Type", "application/json")
            .body(body.to_vec());
    }
    request.send().unwrap().status().as_u16()
}

#[test]
fn terraform_applies_with_a_ci_token_and_bad_tokens_change_nothing() {
    let mut issuer = TestIssuer::start();
    let dir = tempdir();
    let server = server_for(&issuer, &dir.path().join("data"));
    let url = server.state_url("default", "ci");

    // A CI job holding only its token plans and applies.
    let write = issuer.token("key-1", serde_json::json!({}));
    let tf = tempdir();
    std::fs::write(tf.path().join("main.tf"), format!("{HTTP_BACKEND}{CONFIG}")).unwrap();
    let tf_run = |args: &[&str]| {
        let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        if args[0] == "init" {
            all.extend(backend_config(&url));
        }
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let env = [
            ("TF_HTTP_USERNAME", "ci"),
            ("TF_HTTP_PASSWORD", write.as_str()),
        ];
        ok_with_env(tf.path(), &all, &env)
    };
    tf_run(&["init", "-input=false"]);
    tf_run(&["plan", "-input=false"]);
    tf_run(&["apply", "-auto-approve", "-input=false"]);
    let stored = with_token("GET", &url, &write, 2, None);
    assert_eq!(stored, 200);
    let bearer = format!("Bearer {write}");
    let read_state = || send_with("GET", &url, None, &[("Authorization", &bearer)]).body;
    let before = read_state();
    assert!(!before.is_empty());

    // Another repository of acme's may read, not write; one of no role's
    // claims may do nothing.
    let reader = issuer.token("key-1", serde_json::json!({"repository": "acme/web"}));
    assert_eq!(with_token("GET", &url, &reader, 3, None), 200);
    assert_eq!(with_token("POST", &url, &reader, 3, Some(&state(99))), 403);
    let stranger = issuer.token("key-1", serde_json::json!({"repository": "evil/infra"}));
    assert_eq!(with_token("GET", &url, &stranger, 4, None), 403);

    // The audit trail names the job and keeps the claims worth keeping.
    // (Under the replica's name, by default the host's.)
    let replica = std::fs::read_dir(dir.path().join("data/audit"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    // (The backend's changes, its locks, and every backend's refusals are
    // kept apart; refusals last, so the last record is the last refusal.)
    let trail = [
        "backends/default/changes",
        "backends/default/requests",
        "refusals",
    ]
    .map(|kind| std::fs::read_to_string(replica.join(format!("{kind}.jsonl"))).unwrap())
    .concat();
    let records: Vec<serde_json::Value> = trail
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let job = "oidc:ci:repo:acme/infra:ref:refs/heads/main";
    let by_job: Vec<&str> = records
        .iter()
        .filter(|r| r["caller"] == job && r["status"] == 200)
        .map(|r| r["operation"].as_str().unwrap())
        .collect();
    assert!(
        by_job.contains(&"lock") && by_job.contains(&"write") && by_job.contains(&"unlock"),
        "{trail}"
    );
    let written = records.iter().find(|r| r["operation"] == "write").unwrap();
    assert_eq!(
        written["claims"],
        serde_json::json!({"repository": "acme/infra", "ref": "refs/heads/main", "actor": "octocat"}),
        "{written}"
    );
    let refused = records.last().unwrap();
    assert_eq!(refused["status"], 403, "{refused}");
    assert_eq!(refused["claims"]["repository"], "acme/web", "{refused}");

    // Every bad token: 401, and nothing changes.
    // Users sign in beside tokens.
    let alice = base64::engine::general_purpose::STANDARD.encode("alice:alice's password");
    let alice = send_with(
        "GET",
        &url,
        None,
        &[("Authorization", &format!("Basic {alice}"))],
    );
    assert_eq!(alice.status, 200);

    let rogue = KeyPair::generate().unwrap();
    let claims = issuer.claims(serde_json::json!({}));
    let without = |claim: &str| {
        let mut c = claims.clone();
        c.as_object_mut().unwrap().remove(claim);
        sign("key-1", &issuer.keys[0].1, &c)
    };
    let bad: Vec<(&str, String)> = vec![
        (
            "wrong audience",
            issuer.token("key-1", serde_json::json!({"aud": "other"})),
        ),
        (
            "expired",
            issuer.token("key-1", serde_json::json!({"exp": now() - 3600})),
        ),
        (
            "not yet valid",
            issuer.token("key-1", serde_json::json!({"nbf": now() + 3600})),
        ),
        (
            "issued in the future",
            issuer.token("key-1", serde_json::json!({"iat": now() + 3600})),
        ),
        (
            "alg none",
            format!(
                "{}.{}.",
                b64json(&serde_json::json!({"alg": "none", "kid": "key-1"})),
                b64json(&claims)
            ),
        ),
        (
            "a rogue key reusing a known kid",
            sign("key-1", &rogue, &claims),
        ),
        (
            "HMAC keyed with the public key",
            jsonwebtoken::encode(
                &Header {
                    kid: Some("key-1".into()),
                    ..Header::new(Algorithm::HS256)
                },
                &claims,
                &EncodingKey::from_secret(issuer.keys[0].1.public_key_raw()),
            )
            .unwrap(),
        ),
        (
            "HMAC with a published oct key",
            jsonwebtoken::encode(
                &Header {
                    kid: Some("hmac".into()),
                    ..Header::new(Algorithm::HS256)
                },
                &claims,
                &EncodingKey::from_secret(HMAC_SECRET),
            )
            .unwrap(),
        ),
        (
            "a key published for ES384",
            sign("key-384", &issuer.keys[0].1, &claims),
        ),
        (
            "an unknown issuer",
            issuer.token("key-1", serde_json::json!({"iss": "https://evil.example"})),
        ),
        (
            "another configured issuer, signed with this one's key",
            issuer.token("key-1", serde_json::json!({"iss": "https://127.0.0.1:1"})),
        ),
        ("no subject", without("sub")),
        ("no audience", without("aud")),
        ("no expiry", without("exp")),
        ("a crit header", {
            let header =
                serde_json::json!({"alg": "ES256", "kid": "key-1", "crit": ["exp"], "exp": 1});
            let signing_input = format!("{}.{}", b64json(&header), b64json(&claims));
            let key =
                EncodingKey::from_ec_pem(issuer.keys[0].1.serialize_pem().as_bytes()).unwrap();
            let signature =
                jsonwebtoken::crypto::sign(signing_input.as_bytes(), &key, Algorithm::ES256)
                    .unwrap();
            format!("{signing_input}.{signature}")
        }),
    ];
    for (i, (case, token)) in bad.iter().enumerate() {
        let from = 10 + i as u8;
        assert_eq!(
            with_token("POST", &url, token, from, Some(&state(100))),
            401,
            "{case}"
        );
        assert_eq!(with_token("GET", &url, token, from, None), 401, "{case}");
    }
    let after = read_state();
    assert_eq!(after, before, "a refused token changed the state");

    // A key rotated in is picked up (the next fetch may wait out the gap
    // between two fetches of the key set).
    issuer.rotate_in("key-2");
    let rotated = issuer.token("key-2", serde_json::json!({}));
    wait_until(
        "the rotated-in key to be fetched",
        Duration::from_secs(30),
        || with_token("GET", &url, &rotated, 40, None) == 200,
    );

    // A flood of made-up key ids: the key set is fetched at most once per
    // 5 s gap, however many arrive.
    let fetches = issuer.key_fetches();
    let started = std::time::Instant::now();
    for i in 0..200 {
        let junk = sign(&format!("junk-{i}"), &rogue, &claims);
        let status = with_token("GET", &url, &junk, 50, None);
        assert!(status == 401 || status == 429, "{status}");
    }
    let gaps = started.elapsed().as_secs() / 5 + 1;
    let flood = issuer.key_fetches() - fetches;
    assert!(
        flood as u64 <= gaps,
        "{flood} key-set fetches for 200 junk tokens in {:?}",
        started.elapsed()
    );
    // A valid token is not slowed by that address's failures.
    assert_eq!(with_token("GET", &url, &write, 50, None), 200);

    // Bad tokens count against their address like wrong passwords.
    let expired = issuer.token("key-1", serde_json::json!({"exp": now() - 3600}));
    for _ in 0..6 {
        assert_eq!(with_token("GET", &url, &expired, 60, None), 401);
    }
    // Then refused unchecked, for a backoff that doubles with each failure
    // (the first is 1 s: a busy machine may let it pass before the next).
    let throttled = (0..6).any(|_| with_token("GET", &url, &expired, 60, None) == 429);
    assert!(throttled, "bad tokens were never throttled");
    assert_eq!(with_token("GET", &url, &write, 60, None), 200);

    // The console takes no token: its session would outlive it.
    let console = reqwest::blocking::Client::new()
        .post(format!("{}/ui/login", server.url))
        .header("Origin", &server.url)
        .form(&[("user", "ci"), ("password", write.as_str())])
        .send()
        .unwrap();
    assert_eq!(console.status().as_u16(), 403);
    assert!(console.headers().get("set-cookie").is_none());
    assert!(console.text().unwrap().contains("API only"));
}
