//! The `s3-lockfile` and `dynamodb` guests against moto (S3 and DynamoDB on
//! a loopback port), and side by side with Terraform's native
//! `backend "s3"` on the same bucket: each side honours the other's locks
//! and reads the other's state, in the same workspace layout.

use crate::common::*;
use crate::terraform::apply_and_check;
use std::path::Path;

pub(crate) const BUCKET: &str = "wasmstate-states";
const TABLE: &str = "terraform-locks";
pub(crate) const KEY: &str = "app/terraform.tfstate";

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Locking {
    LockFile,
    DynamoDb,
}

impl Locking {
    pub(crate) fn guest(self) -> &'static str {
        match self {
            Locking::LockFile => "s3-lockfile",
            Locking::DynamoDb => "dynamodb",
        }
    }
}

pub(crate) fn start_moto(locking: Locking) -> Moto {
    let moto = Moto::start();
    moto.create_bucket(BUCKET);
    if locking == Locking::DynamoDb {
        moto.create_lock_table(TABLE);
    }
    moto
}

/// The guest's settings, as `KEY=VALUE` pairs.
pub(crate) fn settings(moto_url: &str, locking: Locking) -> Vec<(String, String)> {
    let mut pairs = vec![
        ("bucket", BUCKET.to_string()),
        ("key", KEY.to_string()),
        ("region", "us-east-1".to_string()),
        ("endpoints.s3", moto_url.to_string()),
        ("use_path_style", "true".to_string()),
        ("access_key", "test".to_string()),
        ("secret_key", "test".to_string()),
    ];
    if locking == Locking::DynamoDb {
        pairs.push(("dynamodb_table", TABLE.to_string()));
        pairs.push(("endpoints.dynamodb", moto_url.to_string()));
    }
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// The config of backend `aws` on `s3_url` (moto, or a proxy in front of
/// it), with `extra` backend keys.
pub(crate) fn backend_config(s3_url: &str, locking: Locking, extra: &str) -> String {
    backend_table("aws", locking.guest(), extra, &settings(s3_url, locking))
}

fn server(data: &Path, s3_url: &str, locking: Locking) -> Server {
    Server::with_config(data, &backend_config(s3_url, locking, ""))
}

fn kit(locking: Locking) {
    let moto = start_moto(locking);
    // The history case runs against S3 object versions with s3-lockfile;
    // dynamodb's bucket keeps none, as a bucket may.
    if locking == Locking::LockFile {
        moto.enable_versioning(BUCKET);
    }
    let mut args = vec!["guest".to_string(), "test".into(), locking.guest().into()];
    for (k, v) in settings(&moto.url, locking) {
        args.push("--config".into());
        args.push(format!("{k}={v}"));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, out) = wasmstate(&args);
    assert!(ok, "{out}");
    assert!(summary(&out).ends_with("passed, 0 failed"), "{out}");
}

#[test]
fn s3_lockfile_passes_the_kit() {
    kit(Locking::LockFile);
}

#[test]
fn dynamodb_passes_the_kit() {
    kit(Locking::DynamoDb);
}

#[test]
fn terraform_through_s3_lockfile() {
    let moto = start_moto(Locking::LockFile);
    let (data, work) = (tempdir(), tempdir());
    let server = server(data.path(), &moto.url, Locking::LockFile);
    apply_and_check(work.path(), &server.state_url("aws", "default"), &server);
    assert!(
        moto.object(BUCKET, KEY).is_some(),
        "state at the configured key"
    );
}

#[test]
fn terraform_through_dynamodb() {
    let moto = start_moto(Locking::DynamoDb);
    let (data, work) = (tempdir(), tempdir());
    let server = server(data.path(), &moto.url, Locking::DynamoDb);
    apply_and_check(work.path(), &server.state_url("aws", "default"), &server);
    assert!(
        moto.object(BUCKET, KEY).is_some(),
        "state at the configured key"
    );
}

/// Terraform's own `backend "s3"` on the same bucket, key and lock layout.
pub(crate) fn native_backend(moto_url: &str, locking: Locking) -> String {
    let lock = match locking {
        Locking::LockFile => "    use_lockfile = true".to_string(),
        Locking::DynamoDb => format!("    dynamodb_table = \"{TABLE}\""),
    };
    format!(
        r#"terraform {{
  backend "s3" {{
    bucket                      = "{BUCKET}"
    key                         = "{KEY}"
    region                      = "us-east-1"
    endpoints                   = {{ s3 = "{moto_url}", dynamodb = "{moto_url}" }}
    use_path_style              = true
    access_key                  = "test"
    secret_key                  = "test"
    skip_credentials_validation = true
    skip_requesting_account_id  = true
    skip_metadata_api_check     = true
    skip_region_validation      = true
{lock}
  }}
}}
"#
    )
}

fn interop(locking: Locking) {
    let moto = start_moto(locking);
    let data = tempdir();
    let server = server(data.path(), &moto.url, locking);
    let lock_released = || match locking {
        Locking::LockFile => moto.object(BUCKET, &format!("{KEY}.tflock")).is_none(),
        Locking::DynamoDb => {
            let item = moto.dynamodb(
                "GetItem",
                serde_json::json!({
                    "TableName": TABLE,
                    "Key": {"LockID": {"S": format!("{BUCKET}/{KEY}")}},
                    "ConsistentRead": true
                }),
            );
            item.get("Item").is_none()
        }
    };
    let staging_stored = || {
        moto.object(BUCKET, &format!("env:/staging/{KEY}"))
            .is_some()
    };
    crate::side_by_side::check(
        &server,
        "aws",
        crate::side_by_side::Native {
            backend_block: native_backend(&moto.url, locking),
            lock_released: &lock_released,
            staging_stored: &staging_stored,
            holder_shown: true,
        },
    );
}

#[test]
fn s3_lockfile_interoperates_with_native_terraform() {
    interop(Locking::LockFile);
}

#[test]
fn dynamodb_interoperates_with_native_terraform() {
    interop(Locking::DynamoDb);
}

#[test]
fn dynamodb_digest_guards_reads_and_goes_with_the_state() {
    let moto = start_moto(Locking::DynamoDb);
    let data = tempdir();
    let server = server(data.path(), &moto.url, Locking::DynamoDb);
    let url = server.state_url("aws", "default");
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);
    let digest_id = format!("{BUCKET}/{KEY}-md5");
    let digest = |moto: &Moto| {
        moto.dynamodb(
            "GetItem",
            serde_json::json!({"TableName": TABLE, "Key": {"LockID": {"S": digest_id}}, "ConsistentRead": true}),
        )["Item"]["Digest"]["S"]
            .as_str()
            .map(str::to_string)
    };
    // The digest Terraform's native backend would write: hex md5 of the state.
    use md5::{Digest, Md5};
    assert_eq!(digest(&moto), Some(hex::encode(Md5::digest(state(1)))));

    // A state that does not match its digest is not handed to Terraform.
    moto.dynamodb(
        "PutItem",
        serde_json::json!({"TableName": TABLE, "Item": {"LockID": {"S": digest_id}, "Digest": {"S": "0123456789abcdef0123456789abcdef"}}}),
    );
    let answer = send("GET", &url, None);
    assert_eq!(answer.status, 503, "{}", answer.text());
    assert!(
        answer.text().contains("does not have the expected content"),
        "{}",
        answer.text()
    );
    assert!(
        answer.text().contains(&hex::encode(Md5::digest(state(1)))),
        "names the digest to set: {}",
        answer.text()
    );

    // Deleting the state deletes its digest too.
    assert_eq!(send("DELETE", &url, None).status, 200);
    assert_eq!(digest(&moto), None);
    assert_eq!(send("GET", &url, None).status, 404);
}

#[test]
fn an_s3_store_without_conditional_writes_fails_clearly_at_lock_time() {
    let moto = start_moto(Locking::LockFile);
    let store = NoConditionalWrites::start(&moto.url);
    let data = tempdir();
    let server = server(data.path(), &store.url, Locking::LockFile);
    let url = server.state_url("aws", "default");
    // A write sent without a lock runs under a lock the server takes for
    // it (so replicas cannot both pass the stale-write guard): on a store
    // that cannot lock, it fails as clearly as a LOCK, and writes nothing.
    for (method, body) in [("LOCK", lock_info("l", "me@host")), ("POST", state(1))] {
        let answer = send(method, &url, Some(&body));
        assert_eq!(answer.status, 500, "{method}: {}", answer.text());
        assert!(
            answer
                .text()
                .contains("does not support conditional writes"),
            "{method}: {}",
            answer.text()
        );
        assert!(answer.text().contains("501"), "{method}: {}", answer.text());
    }
    assert_eq!(moto.object(BUCKET, KEY), None, "nothing was written");
}

/// An S3-compatible store that, like some older ones, answers conditional
/// writes with 501 Not Implemented: a proxy in front of moto.
struct NoConditionalWrites {
    url: String,
    _runtime: tokio::runtime::Runtime,
}

impl NoConditionalWrites {
    fn start(upstream: &str) -> Self {
        use axum::body::Bytes;
        use axum::http::{HeaderMap, Method, StatusCode, Uri};
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let upstream = upstream.to_string();
        let app = axum::Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let upstream = upstream.clone();
                async move {
                    if method == Method::PUT && headers.contains_key("if-none-match") {
                        return (
                            StatusCode::NOT_IMPLEMENTED,
                            "<Error><Code>NotImplemented</Code></Error>".to_string(),
                        )
                            .into_response();
                    }
                    let client = reqwest::Client::new();
                    let mut request = client
                        .request(method, format!("{upstream}{uri}"))
                        .body(body);
                    for (k, v) in headers.iter() {
                        if k != "host" {
                            request = request.header(k, v);
                        }
                    }
                    let response = request.send().await.unwrap();
                    let status = StatusCode::from_u16(response.status().as_u16()).unwrap();
                    (status, response.bytes().await.unwrap()).into_response()
                }
            },
        );
        runtime.spawn(async move { axum::serve(listener, app).await });
        NoConditionalWrites {
            url,
            _runtime: runtime,
        }
    }
}

use axum::response::IntoResponse;
