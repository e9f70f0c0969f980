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

mod chain;
