//! The AWS standard chain on the host: container and instance metadata
//! endpoints, the environment, a web identity from the environment, and
//! what a guest granted signed requests can (not) see of it.

use super::*;

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
