//! What the host signs, and what it refuses to, for a backend's guest.

use super::*;

/// The scope of a configuration given as `(key, value)` pairs.
fn scope_of(config: &[(&str, &str)]) -> SigningScope {
    let config: Vec<(String, String)> = config
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    SigningScope::from_config(&config)
}

fn scope() -> SigningScope {
    scope_of(&[
        ("bucket", "states"),
        ("key", "app/terraform.tfstate"),
        ("dynamodb_table", "locks"),
        ("endpoints.dynamodb", "http://127.0.0.1:5000"),
    ])
}

fn request(
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> http::Request<bytes::Bytes> {
    let mut builder = http::Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(bytes::Bytes::from(body.to_string())).unwrap()
}

#[test]
fn a_state_stores_own_calls_are_signed() {
    let s = scope();
    for (method, uri) in [
        (
            "GET",
            "http://127.0.0.1:5000/states/app/terraform.tfstate?x-id=GetObject",
        ),
        (
            "PUT",
            "http://127.0.0.1:5000/states/app/terraform.tfstate.tflock?x-id=PutObject",
        ),
        (
            "HEAD",
            "http://127.0.0.1:5000/states/env%3A/ws/app/terraform.tfstate",
        ),
        (
            "POST",
            "http://127.0.0.1:5000/states/env%3A/ws/app/terraform.tfstate?uploads",
        ),
        (
            "GET",
            "http://127.0.0.1:5000/states?list-type=2&prefix=env%3A%2F",
        ),
        (
            "GET",
            "https://states.s3.us-east-1.amazonaws.com/app/terraform.tfstate",
        ),
    ] {
        assert_eq!(
            s.check(&request(method, uri, &[], "")),
            Ok(Service::S3),
            "{method} {uri}"
        );
    }
    let get_item = request(
        "POST",
        "http://127.0.0.1:5000/",
        &[("x-amz-target", "DynamoDB_20120810.GetItem")],
        r#"{"TableName":"locks","Key":{"LockID":{"S":"states/app/terraform.tfstate-md5"}}}"#,
    );
    assert_eq!(s.check(&get_item), Ok(Service::DynamoDb));
    let put_item = request(
        "POST",
        "http://127.0.0.1:5000/",
        &[("x-amz-target", "DynamoDB_20120810.PutItem")],
        r#"{"TableName":"locks","Item":{"LockID":{"S":"states/env:/ws/app/terraform.tfstate"},"Info":{"S":"{}"}}}"#,
    );
    assert_eq!(s.check(&put_item), Ok(Service::DynamoDb));
}

/// Another backend sharing the bucket, the prefix or the table, but not
/// the key, is out of reach (it was: every key under `env:/`, every
/// item of the table).
#[test]
fn other_backends_in_a_shared_bucket_and_table_are_out_of_reach() {
    let s = scope();
    for uri in [
        "http://127.0.0.1:5000/states/env%3A/ws/other/terraform.tfstate",
        "http://127.0.0.1:5000/states/env%3A/ws/app/terraform.tfstate.bak",
        "http://127.0.0.1:5000/states/env%3A/a/b/app/terraform.tfstate",
        "http://127.0.0.1:5000/states/env%3A//app/terraform.tfstate",
        "http://127.0.0.1:5000/states/other/terraform.tfstate.tflock",
    ] {
        assert!(
            s.check(&request("GET", uri, &[], "")).is_err(),
            "{uri} was signed"
        );
    }
    for (target, body) in [
        (
            "GetItem",
            r#"{"TableName":"locks","Key":{"LockID":{"S":"states/other/terraform.tfstate-md5"}}}"#,
        ),
        (
            "DeleteItem",
            r#"{"TableName":"locks","Key":{"LockID":{"S":"other-bucket/app/terraform.tfstate"}}}"#,
        ),
        (
            "PutItem",
            r#"{"TableName":"locks","Item":{"LockID":{"S":"states/env:/ws/other.tfstate"}}}"#,
        ),
        ("GetItem", r#"{"TableName":"locks","Key":{}}"#),
        ("UpdateItem", r#"{"TableName":"locks"}"#),
    ] {
        let r = request(
            "POST",
            "http://127.0.0.1:5000/",
            &[("x-amz-target", &format!("DynamoDB_20120810.{target}"))],
            body,
        );
        assert!(s.check(&r).is_err(), "{target} {body} was signed");
    }
    // Creating, deleting or configuring the bucket, or opening a state.
    let state = "http://127.0.0.1:5000/states/app/terraform.tfstate";
    for r in [
        request("PUT", "http://127.0.0.1:5000/states", &[], ""),
        request("DELETE", "http://127.0.0.1:5000/states/", &[], ""),
        request("PUT", state, &[("x-amz-acl", "public-read")], ""),
        request("PUT", state, &[("x-amz-grant-read", "uri=AllUsers")], ""),
        request(
            "PUT",
            state,
            &[("x-amz-object-lock-mode", "COMPLIANCE")],
            "",
        ),
        request("PUT", state, &[("x-amz-tagging", "a=b")], ""),
    ] {
        assert!(
            s.check(&r).is_err(),
            "{} {} {:?} was signed",
            r.method(),
            r.uri(),
            r.headers()
        );
    }
    // Listings beyond the backend's states; a PutItem whose Key is the
    // backend's but whose Item (what is written) is another's; a key
    // with a second leading slash.
    let put_other = request(
        "POST",
        "http://127.0.0.1:5000/",
        &[("x-amz-target", "DynamoDB_20120810.PutItem")],
        r#"{"TableName":"locks","Key":{"LockID":{"S":"states/app/terraform.tfstate"}},"Item":{"LockID":{"S":"states/other/terraform.tfstate-md5"}}}"#,
    );
    for r in [
        request("GET", "http://127.0.0.1:5000/states?list-type=2", &[], ""),
        request(
            "GET",
            "http://127.0.0.1:5000/states?list-type=2&prefix=other%2F",
            &[],
            "",
        ),
        request("GET", "http://127.0.0.1:5000/states", &[], ""),
        request(
            "GET",
            "http://127.0.0.1:5000/states?uploads&prefix=other",
            &[],
            "",
        ),
        request(
            "GET",
            "https://states.s3.us-east-1.amazonaws.com//app/terraform.tfstate",
            &[],
            "",
        ),
        put_other,
    ] {
        assert!(
            s.check(&r).is_err(),
            "{} {} was signed",
            r.method(),
            r.uri()
        );
    }
    assert!(
        s.check(&request(
            "GET",
            "http://127.0.0.1:5000/states?uploads&prefix=app%2Fterraform.tfstate",
            &[],
            ""
        ))
        .is_ok()
    );
    // A parameter or the target given twice: the check reads one value.
    assert!(
        s.check(&request(
            "GET",
            "http://127.0.0.1:5000/states?list-type=2&prefix=env%3A%2F&prefix=",
            &[],
            ""
        ))
        .is_err()
    );
    let twice = request(
        "POST",
        "http://127.0.0.1:5000/",
        &[
            ("x-amz-target", "DynamoDB_20120810.GetItem"),
            ("x-amz-target", "DynamoDB_20120810.DeleteTable"),
        ],
        r#"{"TableName":"locks","Key":{"LockID":{"S":"states/app/terraform.tfstate"}}}"#,
    );
    assert!(s.check(&twice).is_err());
    // An endpoint named like the bucket, path-style: the bucket is the
    // path's first segment.
    let minio = scope_of(&[
        ("bucket", "tfstate"),
        ("key", "terraform.tfstate"),
        ("workspace_key_prefix", ""),
        ("use_path_style", "true"),
    ]);
    let get = |uri: &str| minio.check(&request("GET", uri, &[], ""));
    assert!(get("https://tfstate.minio.example/victim/terraform.tfstate").is_err());
    assert!(get("https://tfstate.minio.example/tfstate/terraform.tfstate").is_ok());

    // No workspace prefix: `<workspace>/<key>`.
    let bare = scope_of(&[
        ("bucket", "states"),
        ("key", "terraform.tfstate"),
        ("workspace_key_prefix", ""),
    ]);
    let get = |uri: &str| bare.check(&request("GET", uri, &[], ""));
    assert!(get("http://127.0.0.1:5000/states/ws/terraform.tfstate").is_ok());
    assert!(get("http://127.0.0.1:5000/states/ws/other.tfstate").is_err());
}

#[test]
fn anything_else_is_refused_before_it_is_signed() {
    let s = scope();
    let refused = [
        request("GET", "http://127.0.0.1:5000/other-bucket/secret", &[], ""),
        request("GET", "http://127.0.0.1:5000/states/other/key", &[], ""),
        request("PUT", "http://127.0.0.1:5000/states?policy", &[], "{}"),
        request(
            "GET",
            "http://127.0.0.1:5000/states/app/terraform.tfstate?acl",
            &[],
            "",
        ),
        request(
            "PUT",
            "http://127.0.0.1:5000/states/app/terraform.tfstate",
            &[("x-amz-copy-source", "/other-bucket/secret")],
            "",
        ),
        request(
            "POST",
            "http://127.0.0.1:5000/",
            &[("x-amz-target", "DynamoDB_20120810.GetItem")],
            r#"{"TableName":"someone-elses","Key":{}}"#,
        ),
        request(
            "POST",
            "http://127.0.0.1:5000/",
            &[("x-amz-target", "DynamoDB_20120810.DeleteTable")],
            r#"{"TableName":"locks"}"#,
        ),
        request(
            "POST",
            "http://127.0.0.1:5000/",
            &[(
                "x-amz-target",
                "AWSSecurityTokenServiceV20110615.GetSessionToken",
            )],
            "",
        ),
        request(
            "POST",
            "https://sts.amazonaws.com/",
            &[],
            "Action=GetSessionToken",
        ),
        request(
            "GET",
            "https://iam.amazonaws.com/?Action=ListUsers",
            &[],
            "",
        ),
    ];
    for r in refused {
        assert!(
            s.check(&r).is_err(),
            "{} {} {:?} was signed",
            r.method(),
            r.uri(),
            r.headers()
        );
    }
    // No bucket configured: nothing for S3 at all.
    let none = SigningScope::default();
    assert!(
        none.check(&request("GET", "http://127.0.0.1:5000/states/x", &[], ""))
            .is_err()
    );
}

/// The history a versioned bucket keeps is read, never changed: a guest
/// cannot have a version deleted, versioning suspended, or another
/// backend's versions listed.
#[test]
fn object_versions_are_read_and_never_removed() {
    let s = scope();
    for (method, uri) in [
        ("GET", "http://127.0.0.1:5000/states?versioning"),
        (
            "GET",
            "http://127.0.0.1:5000/states?versions&prefix=app%2Fterraform.tfstate",
        ),
        (
            "GET",
            "http://127.0.0.1:5000/states?versions&prefix=env%3A%2Fws%2Fapp%2Fterraform.tfstate&key-marker=k&version-id-marker=v",
        ),
        (
            "GET",
            "http://127.0.0.1:5000/states/app/terraform.tfstate?versionId=abc&x-id=GetObject",
        ),
    ] {
        assert_eq!(
            s.check(&request(method, uri, &[], "")),
            Ok(Service::S3),
            "{method} {uri}"
        );
    }
    for (method, uri) in [
        (
            "DELETE",
            "http://127.0.0.1:5000/states/app/terraform.tfstate?versionId=abc",
        ),
        (
            "PUT",
            "http://127.0.0.1:5000/states/app/terraform.tfstate?versionId=abc",
        ),
        ("PUT", "http://127.0.0.1:5000/states?versioning"),
        (
            "PUT",
            "http://127.0.0.1:5000/states/app/terraform.tfstate?versioning",
        ),
        (
            "GET",
            "http://127.0.0.1:5000/states/app/terraform.tfstate?versions&prefix=app%2Fterraform.tfstate",
        ),
        ("GET", "http://127.0.0.1:5000/states?versioning&prefix=x"),
        ("GET", "http://127.0.0.1:5000/states?versions&prefix=other"),
        ("GET", "http://127.0.0.1:5000/states?versions"),
        (
            "GET",
            "http://127.0.0.1:5000/other-bucket/app/terraform.tfstate?versionId=abc",
        ),
    ] {
        assert!(
            s.check(&request(method, uri, &[], "")).is_err(),
            "{method} {uri} was signed"
        );
    }
}
