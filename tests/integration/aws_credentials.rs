//! AWS credentials held, refreshed and used by the host; never by a guest.
//!
//! moto plays AWS: S3, STS (AssumeRole, AssumeRoleWithWebIdentity) and IAM,
//! and after setup it checks every request's SigV4 signature against the
//! keys and roles it knows, so a state that round-trips proves the host
//! signed with valid credentials from the source under test. ECS's and
//! EC2's credential endpoints, which nothing here provides, are a small
//! loopback server speaking their documented protocol.

use crate::common::*;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const BUCKET: &str = "wasmstate-states";
const KEY: &str = "app/terraform.tfstate";
const ROLE: &str = "state-writer";
const ALLOW_ALL: &str =
    r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}"#;
const TRUST_ALL: &str = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"AWS":"*"},"Action":["sts:AssumeRole","sts:AssumeRoleWithWebIdentity"]}]}"#;

/// Keys as AWS hands them out.
#[derive(Clone, Debug)]
struct Keys {
    access_key: String,
    secret_key: String,
    token: Option<String>,
    /// ISO 8601, for the credential endpoints' answers.
    expiration: String,
}

/// moto with a bucket, an IAM user allowed everything (its keys), a role
/// anyone may assume, a session of that role taken out before signatures
/// were checked (for the credential endpoints to hand out), and signature
/// checking on (unless `check` is false).
struct Aws {
    moto: Moto,
    user: Keys,
    session: Keys,
    role_arn: String,
}

/// The text of the first `<tag>…</tag>` in `xml`.
pub(crate) fn between(xml: &str, tag: &str) -> String {
    let open = format!("<{tag}>");
    let start = xml
        .find(&open)
        .unwrap_or_else(|| panic!("no <{tag}> in {xml}"))
        + open.len();
    let end = start + xml[start..].find(&format!("</{tag}>")).unwrap();
    xml[start..end].to_string()
}

impl Aws {
    fn start() -> Aws {
        Aws::start_checking(true)
    }

    fn start_checking(check: bool) -> Aws {
        let moto = Moto::start();
        moto.create_bucket(BUCKET);
        moto.query("iam", "CreateUser", &[("UserName", "terraform")]);
        let key = moto.query("iam", "CreateAccessKey", &[("UserName", "terraform")]);
        moto.query(
            "iam",
            "PutUserPolicy",
            &[
                ("UserName", "terraform"),
                ("PolicyName", "all"),
                ("PolicyDocument", ALLOW_ALL),
            ],
        );
        let role = moto.query(
            "iam",
            "CreateRole",
            &[("RoleName", ROLE), ("AssumeRolePolicyDocument", TRUST_ALL)],
        );
        moto.query(
            "iam",
            "PutRolePolicy",
            &[
                ("RoleName", ROLE),
                ("PolicyName", "all"),
                ("PolicyDocument", ALLOW_ALL),
            ],
        );
        let role_arn = between(&role, "Arn");
        let assumed = moto.query(
            "sts",
            "AssumeRole",
            &[("RoleArn", &role_arn), ("RoleSessionName", "endpoint")],
        );
        if check {
            moto.check_signatures();
        }
        Aws {
            user: Keys {
                access_key: between(&key, "AccessKeyId"),
                secret_key: between(&key, "SecretAccessKey"),
                token: None,
                expiration: String::new(),
            },
            session: Keys {
                access_key: between(&assumed, "AccessKeyId"),
                secret_key: between(&assumed, "SecretAccessKey"),
                token: Some(between(&assumed, "SessionToken")),
                expiration: between(&assumed, "Expiration"),
            },
            role_arn,
            moto,
        }
    }

    /// A config with one `s3-lockfile` backend on this moto, its
    /// credentials from `credentials` (lines of its config table).
    fn config(&self, credentials: &str) -> String {
        let url = &self.moto.url;
        format!(
            "[backends.aws]\nguest = \"s3-lockfile\"\n[backends.aws.config]\n\
             bucket = {BUCKET:?}\nkey = {KEY:?}\nregion = \"us-east-1\"\nuse_path_style = true\n\
             endpoints = {{ s3 = {url:?}, sts = {url:?} }}\n{credentials}\n"
        )
    }

    /// `GET url` signed with `keys`, as an AWS client would send it.
    fn signed_get(&self, url: &str, keys: &Keys) -> Answer {
        use aws_sigv4::http_request::{
            PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest,
            SigningSettings, UriPathNormalizationMode, sign,
        };
        let credentials = aws_credential_types::Credentials::new(
            &keys.access_key,
            &keys.secret_key,
            keys.token.clone(),
            None,
            "test",
        );
        let identity = credentials.into();
        let mut settings = SigningSettings::default();
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region("us-east-1")
            .name("s3")
            .time(std::time::SystemTime::now())
            .settings(settings)
            .build()
            .unwrap()
            .into();
        let signable =
            SignableRequest::new("GET", url, std::iter::empty(), SignableBody::Bytes(&[])).unwrap();
        let (instructions, _) = sign(signable, &params).unwrap().into_parts();
        let mut request = http::Request::builder().uri(url).body(()).unwrap();
        instructions.apply_to_request_http1x(&mut request);
        let headers: Vec<(String, String)> = request
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
            .collect();
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        send_with("GET", url, None, &headers)
    }

    /// The stored state of `workspace`, read with the user's keys.
    fn stored(&self, workspace: &str) -> Option<Vec<u8>> {
        let key = match workspace {
            "default" => KEY.to_string(),
            ws => format!("env:/{ws}/{KEY}"),
        };
        let answer = self.signed_get(&format!("{}/{BUCKET}/{key}", self.moto.url), &self.user);
        (answer.status == 200).then_some(answer.body)
    }
}

/// A server on `config` with `env` (and the standard chain kept off the
/// machine's own files and EC2's address unless `env` says otherwise).
fn serve(root: &Path, config: &str, env: &[(&str, &str)]) -> Server {
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let path = root.join("wasmstate.toml");
    std::fs::write(&path, config).unwrap();
    let home = root.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let mut all: Vec<(&str, &str)> = vec![
        ("HOME", home.to_str().unwrap()),
        ("AWS_CONFIG_FILE", "/nonexistent/aws/config"),
        (
            "AWS_SHARED_CREDENTIALS_FILE",
            "/nonexistent/aws/credentials",
        ),
    ];
    if !env.iter().any(|(k, _)| k.starts_with("AWS_EC2_METADATA")) {
        all.push(("AWS_EC2_METADATA_DISABLED", "true"));
    }
    all.extend_from_slice(env);
    Server::with_config_env(&data, &path, &all)
}

/// Write serial `serial` to `default` and read it back; the bytes moto
/// holds are the state.
fn round_trip(aws: &Aws, server: &Server, serial: u64) {
    round_trip_in(aws, server, "default", serial);
}

/// [`round_trip`] in `workspace`.
fn round_trip_in(aws: &Aws, server: &Server, workspace: &str, serial: u64) {
    let url = server.state_url("aws", workspace);
    let write = send("POST", &url, Some(&state(serial)));
    assert_eq!(write.status, 200, "write: {}", write.text());
    let read = send("GET", &url, None);
    assert_eq!(read.body, state(serial), "read: {}", read.text());
    assert_eq!(aws.stored(workspace), Some(state(serial)), "moto's copy");
}

#[test]
fn moto_refuses_what_is_not_signed_with_keys_it_knows() {
    let aws = Aws::start();
    let root = tempdir();
    let server = serve(
        root.path(),
        &aws.config(&format!(
            "access_key = {:?}\nsecret_key = {:?}",
            aws.user.access_key, aws.user.secret_key
        )),
        &[],
    );
    round_trip(&aws, &server, 1);
    // The check is on: a made-up signature, or unknown keys, are refused.
    assert_eq!(aws.moto.object(BUCKET, KEY), None);
    let stranger = Keys {
        access_key: "AKIAIOSFODNN7EXAMPLE".into(),
        secret_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
        token: None,
        expiration: String::new(),
    };
    let answer = aws.signed_get(&format!("{}/{BUCKET}/{KEY}", aws.moto.url), &stranger);
    assert_eq!(answer.status, 403, "{}", answer.text());
}

#[test]
fn an_assumed_role_is_refreshed_before_it_expires_and_terraform_applies_through_it() {
    let aws = Aws::start();
    let root = tempdir();
    let server = serve(
        root.path(),
        &aws.config(&format!(
            "access_key = {:?}\nsecret_key = {:?}\n\
             sts_region = \"us-east-1\"\n\
             assume_role = {{ role_arn = {:?}, session_name = \"ci\", duration = \"20s\", \
             external_id = \"wasmstate-test\", source_identity = \"alice\", policy = {ALLOW_ALL:?}, \
             policy_arns = [\"arn:aws:iam::aws:policy/AdministratorAccess\"], \
             tags = {{ team = \"infra\" }}, transitive_tag_keys = [\"team\"] }}",
            aws.user.access_key, aws.user.secret_key, aws.role_arn
        )),
        &[],
    );
    let work = tempdir();
    crate::terraform::apply_and_check(work.path(), &server.state_url("aws", "default"), &server);
    // The credentials last 20 s and are fetched again after half of that:
    // keep writing until a second fetch happened, every write succeeding.
    let fetches = || {
        server
            .log_text()
            .lines()
            .filter(|l| l.contains("AWS credentials fetched") && l.contains("assume_role"))
            .count()
    };
    let mut requests = 0;
    let mut serial = 100;
    wait_until(
        "the role's credentials to be fetched again",
        Duration::from_secs(90),
        || {
            serial += 1;
            requests += 2;
            round_trip_in(&aws, &server, "refresh", serial);
            fetches() >= 2
        },
    );
    // Cached in between: far fewer fetches than requests.
    assert!(
        fetches() * 4 <= requests,
        "{} fetches for {requests} requests",
        fetches()
    );
}

#[test]
fn a_web_identity_token_file_is_exchanged_for_a_role() {
    // moto checking signatures refuses every unsigned call, and
    // AssumeRoleWithWebIdentity is unsigned by design: here it does not
    // check. (That STS's session keys are used and signed right is checked
    // with AssumeRole, whose answer has the same form.)
    let aws = Aws::start_checking(false);
    let root = tempdir();
    let token = root.path().join("token");
    std::fs::write(
        &token,
        "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJyZXBvIn0.c2lnbmF0dXJl\n",
    )
    .unwrap();
    let config = aws.config(&format!(
        "assume_role_with_web_identity = {{ role_arn = {:?}, web_identity_token_file = {token:?}, \
         session_name = \"gha\", duration = \"1h\" }}",
        aws.role_arn
    ));
    let server = serve(root.path(), &config, &[]);
    round_trip(&aws, &server, 1);
    assert!(
        server
            .log_text()
            .contains(&format!("assume_role_with_web_identity {}", aws.role_arn)),
        "{}",
        server.log_text()
    );
    drop(server);

    // The token itself in the config (usually `{ env = … }`).
    let inline = aws.config(&format!(
        "assume_role_with_web_identity = {{ role_arn = {:?}, web_identity_token = {{ env = \"CI_OIDC_TOKEN\" }} }}",
        aws.role_arn
    ));
    let server = serve(
        &root.path().join("inline"),
        &inline,
        &[(
            "CI_OIDC_TOKEN",
            "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJjaSJ9.c2ln",
        )],
    );
    round_trip(&aws, &server, 2);
    drop(server);

    // Without the file: a clear error naming it, no state changed.
    std::fs::remove_file(&token).unwrap();
    let server = serve(root.path(), &config, &[]);
    let answer = send("GET", &server.state_url("aws", "default"), None);
    assert!(answer.status >= 500, "{} {}", answer.status, answer.text());
    let text = answer.text();
    assert!(
        text.contains("cannot read the web identity token file") && text.contains("token"),
        "{text}"
    );
    assert_eq!(aws.stored("default"), Some(state(2)));
}

#[test]
fn a_named_profile_from_shared_files() {
    let aws = Aws::start();
    let root = tempdir();
    let credentials = root.path().join("credentials");
    std::fs::write(
        &credentials,
        format!(
            "[default]\naws_access_key_id = AKIANOTTHISONE\naws_secret_access_key = wrong\n\n\
             [ci]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
            aws.user.access_key, aws.user.secret_key
        ),
    )
    .unwrap();
    let server = serve(
        root.path(),
        &aws.config(&format!(
            "profile = \"ci\"\nshared_credentials_files = [{credentials:?}]"
        )),
        &[],
    );
    round_trip(&aws, &server, 1);
    // The same from a shared config file's `[profile …]` section.
    let config_file = root.path().join("config");
    std::fs::write(
        &config_file,
        format!(
            "[profile deploy]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
            aws.user.access_key, aws.user.secret_key
        ),
    )
    .unwrap();
    let server = serve(
        &root.path().join("from-config"),
        &aws.config(&format!(
            "profile = \"deploy\"\nshared_config_files = [{config_file:?}]"
        )),
        &[],
    );
    round_trip(&aws, &server, 2);
    // A profile that is not there: the error names it.
    let server = serve(
        &root.path().join("missing"),
        &aws.config(&format!(
            "profile = \"nope\"\nshared_credentials_files = [{credentials:?}]"
        )),
        &[],
    );
    let answer = send("GET", &server.state_url("aws", "default"), None);
    assert!(answer.status >= 500, "{}", answer.text());
    assert!(answer.text().contains("nope"), "{}", answer.text());
}

/// What the credential endpoint was asked: request lines with the headers
/// that matter.
type Seen = Arc<Mutex<Vec<String>>>;

/// A loopback server speaking the ECS container credentials and EC2
/// instance metadata (IMDSv2) protocols, handing out `keys`.
fn credential_endpoint(keys: &Keys, ecs_token: &'static str) -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen: Seen = Arc::default();
    let body = serde_json::json!({
        "Code": "Success",
        "Type": "AWS-HMAC",
        "AccessKeyId": keys.access_key,
        "SecretAccessKey": keys.secret_key,
        "Token": keys.token,
        "Expiration": keys.expiration,
        "LastUpdated": "2026-01-01T00:00:00Z",
    })
    .to_string();
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
            let line = head.lines().next().unwrap_or_default().to_string();
            let header = |name: &str| {
                head.lines()
                    .find_map(|l| l.strip_prefix(&format!("{name}: ")))
                    .map(str::to_string)
            };
            log.lock().unwrap().push(format!(
                "{line} auth={:?} imds-token={:?}",
                header("authorization"),
                header("x-aws-ec2-metadata-token")
            ));
            let imds_ok = header("x-aws-ec2-metadata-token").as_deref() == Some("imds-session");
            let (status, answer) = match line.split(' ').take(2).collect::<Vec<_>>()[..] {
                ["put", "/latest/api/token"] => ("200 OK", "imds-session".to_string()),
                ["get", "/latest/meta-data/iam/security-credentials/"] if imds_ok => {
                    ("200 OK", "state-host".to_string())
                }
                [
                    "get",
                    "/latest/meta-data/iam/security-credentials/state-host",
                ] if imds_ok => ("200 OK", body.clone()),
                ["get", "/creds"] if header("authorization").as_deref() == Some(ecs_token) => {
                    ("200 OK", body.clone())
                }
                ["get", _] if !imds_ok && line.contains("/latest/") => {
                    ("401 Unauthorized", String::new())
                }
                _ => ("404 Not Found", String::new()),
            };
            // IMDSv2 says how long its session token lives.
            let ttl = if line.starts_with("put ") {
                "x-aws-ec2-metadata-token-ttl-seconds: 21600\r\n"
            } else {
                ""
            };
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\n{ttl}content-length: {}\r\nconnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    (url, seen)
}

#[test]
fn the_standard_chain_finds_container_credentials() {
    let aws = Aws::start();
    let (url, seen) = credential_endpoint(&aws.session, "ecs-auth-token");
    let root = tempdir();
    let full_uri = format!("{url}/creds");
    let server = serve(
        root.path(),
        &aws.config(""),
        &[
            ("AWS_CONTAINER_CREDENTIALS_FULL_URI", &full_uri),
            ("AWS_CONTAINER_AUTHORIZATION_TOKEN", "ecs-auth-token"),
        ],
    );
    round_trip(&aws, &server, 1);
    let asked = seen.lock().unwrap().clone();
    assert!(
        asked
            .iter()
            .any(|l| l.starts_with("get /creds") && l.contains("ecs-auth-token")),
        "{asked:?}"
    );
}

#[test]
fn the_standard_chain_finds_instance_credentials_with_imdsv2() {
    let aws = Aws::start();
    let (url, seen) = credential_endpoint(&aws.session, "unused");
    let root = tempdir();
    let server = serve(
        root.path(),
        &aws.config(""),
        &[("AWS_EC2_METADATA_SERVICE_ENDPOINT", &url)],
    );
    round_trip(&aws, &server, 1);
    let asked = seen.lock().unwrap().clone();
    // IMDSv2: a session token first, then every read carries it.
    assert!(asked[0].starts_with("put /latest/api/token"), "{asked:?}");
    assert!(
        asked.iter().any(|l| l
            .starts_with("get /latest/meta-data/iam/security-credentials/state-host")
            && l.contains("imds-session")),
        "{asked:?}"
    );
}

/// The AWS-signing probe fixture (`tests/fixtures/aws-probe`).
const AWS_PROBE_WASM: &str = env!("WASMSTATE_FIXTURE_AWS_PROBE");

#[test]
fn a_guest_granted_signed_requests_never_holds_a_credential() {
    let aws = Aws::start();
    let root = tempdir();
    let url = &aws.moto.url;
    let config = format!(
        "[backends.probe]\nguest = {AWS_PROBE_WASM:?}\naws_sign = [{url:?}]\n\
         [backends.probe.config]\nendpoint = {url:?}\nbucket = {BUCKET:?}\nkey = {KEY:?}\nregion = \"us-east-1\"\n\
         access_key = {:?}\nsecret_key = {:?}\n\
         assume_role = {{ role_arn = {:?} }}\nendpoints = {{ sts = {url:?} }}\n",
        aws.user.access_key, aws.user.secret_key, aws.role_arn
    );
    let server = serve(
        root.path(),
        &config,
        &[("AWS_SECRET_ACCESS_KEY", &aws.user.secret_key)],
    );
    let answer = send("GET", &server.state_url("probe", "default"), None);
    assert_eq!(answer.status, 200, "{}", answer.text());
    let (json, memory) = answer
        .body
        .split_at(answer.body.iter().position(|b| *b == b'\n').unwrap());
    let seen: serde_json::Value = serde_json::from_slice(json).unwrap();
    // Its unsigned request went out signed by the host, with the role.
    assert_eq!(seen["status"]["Ok"], 200, "{seen}");
    // Its config has what it needs and nothing else; no environment, no
    // secrets by any name.
    let mut config: Vec<(String, String)> = serde_json::from_value(seen["config"].clone()).unwrap();
    config.sort();
    let expected = [
        ("bucket", BUCKET),
        ("endpoint", url),
        ("key", KEY),
        ("region", "us-east-1"),
    ];
    assert_eq!(
        config,
        expected.map(|(k, v)| (k.to_string(), v.to_string())),
        "{seen}"
    );
    assert_eq!(seen["env"], serde_json::json!({}));
    assert_eq!(seen["secrets"], serde_json::json!({}));
    // Nowhere in all it can see: the configured keys, or any session key.
    let everything = &answer.body;
    let contains = |needle: &str| {
        everything
            .windows(needle.len())
            .any(|w| w == needle.as_bytes())
    };
    assert!(
        memory.len() > 1 << 20,
        "a {} byte memory dump",
        memory.len()
    );
    for secret in [&aws.user.access_key, &aws.user.secret_key] {
        assert!(!contains(secret), "the guest holds {secret}");
    }
    assert!(!contains("ASIA"), "the guest holds a session key id");
    assert!(!contains("AWS4-HMAC-SHA256"), "the guest holds a signature");
}

#[test]
fn the_standard_chain_reads_the_environment() {
    let aws = Aws::start();
    let root = tempdir();
    let token = aws.session.token.clone().unwrap();
    let server = serve(
        root.path(),
        &aws.config(""),
        &[
            ("AWS_ACCESS_KEY_ID", &aws.session.access_key),
            ("AWS_SECRET_ACCESS_KEY", &aws.session.secret_key),
            ("AWS_SESSION_TOKEN", &token),
        ],
    );
    round_trip(&aws, &server, 1);
}

#[test]
fn the_standard_chain_takes_a_web_identity_from_the_environment() {
    // EKS (IRSA) and CI with OIDC: a token file and a role in the
    // environment, STS's endpoint from AWS_ENDPOINT_URL_STS. Unsigned, so
    // moto does not check (see above).
    let aws = Aws::start_checking(false);
    let root = tempdir();
    let token = root.path().join("token");
    std::fs::write(&token, "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJpcnNhIn0.c2ln").unwrap();
    let server = serve(
        root.path(),
        &aws.config(""),
        &[
            ("AWS_WEB_IDENTITY_TOKEN_FILE", token.to_str().unwrap()),
            ("AWS_ROLE_ARN", &aws.role_arn),
            ("AWS_ROLE_SESSION_NAME", "irsa"),
            ("AWS_ENDPOINT_URL_STS", &aws.moto.url),
        ],
    );
    round_trip(&aws, &server, 1);
    assert!(
        server.log_text().contains("AWS credentials fetched"),
        "{}",
        server.log_text()
    );
}

#[test]
fn with_no_source_of_credentials_the_error_says_where_it_looked() {
    let aws = Aws::start();
    let root = tempdir();
    let server = serve(root.path(), &aws.config(""), &[]);
    let answer = send("GET", &server.state_url("aws", "default"), None);
    assert!(answer.status >= 500, "{} {}", answer.status, answer.text());
    let text = answer.text();
    assert!(
        text.contains("no AWS credentials for backend")
            && text.contains("the standard chain (environment, shared files, web identity, ECS, EC2 instance metadata)"),
        "{text}"
    );
    // And the log says it once per attempt, without any key.
    assert!(server.log_text().contains("cannot sign an AWS request"));
}
