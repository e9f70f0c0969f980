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
            "PUT",
            "http://127.0.0.1:5000/states/env%3A/ws/app/terraform.tfstate.wasmstate-metadata",
        ),
        (
            "DELETE",
            "http://127.0.0.1:5000/states/app/terraform.tfstate.wasmstate-metadata",
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
        "http://127.0.0.1:5000/states/other/terraform.tfstate.wasmstate-metadata",
        "http://127.0.0.1:5000/states/app/terraform.tfstate.tflock.wasmstate-metadata",
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

fn owned(config: &[(&str, &str)]) -> Vec<(String, String)> {
    config
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Issue 47, security 1: a guest that is not first-party with a `bucket`
/// and no `key` had every object, listing and `LockID` of the bucket
/// signed. Its grant must now name its states, or it is refused at start
/// with the key to add.
#[test]
fn a_strangers_grant_must_name_its_states() {
    let refused = |config: &[(&str, &str)]| SigningScope::for_stranger(&owned(config)).unwrap_err();
    let keyless = refused(&[("bucket", "states"), ("dynamodb_table", "locks")]);
    assert!(keyless.starts_with("key: missing"), "{keyless}");
    assert!(keyless.contains("add key = "), "{keyless}");
    assert!(!keyless.contains('\n'), "{keyless}");
    for key in ["", "/a/terraform.tfstate", "tenants/acme/", "a//b"] {
        let bad = refused(&[("bucket", "states"), ("key", key)]);
        assert!(bad.starts_with("key: "), "{key:?}: {bad}");
    }
    let unprefixed = refused(&[
        ("bucket", "states"),
        ("key", "terraform.tfstate"),
        ("workspace_key_prefix", ""),
    ]);
    assert!(
        unprefixed.starts_with("workspace_key_prefix: empty"),
        "{unprefixed}"
    );
    let named = SigningScope::for_stranger(&owned(&[
        ("bucket", "states"),
        ("key", "tenants/acme/terraform.tfstate"),
    ]))
    .unwrap();
    assert_eq!(
        named.check(&request(
            "GET",
            "http://127.0.0.1:5000/states/tenants/acme/terraform.tfstate",
            &[],
            ""
        )),
        Ok(Service::S3)
    );
    // A first-party guest keeps its scope: it refuses to start without a
    // key itself.
    let first_party = scope_of(&[("bucket", "states")]);
    let other = "http://127.0.0.1:5000/states/tenants/other/terraform.tfstate";
    assert_eq!(
        first_party.check(&request("GET", other, &[], "")),
        Ok(Service::S3)
    );
}

/// A stranger's guest named `tenants/acme/terraform.tfstate` reaches that
/// state, its workspaces and their lock files, and nothing else of the
/// bucket or table: not another tenant's state, not a listing of the
/// whole bucket, not another `LockID`. And a stranger's scope that names
/// no key (were one built past `for_stranger`) reaches nothing.
#[test]
fn a_strangers_guest_is_signed_only_for_the_states_it_names() {
    let acme = SigningScope::for_stranger(&owned(&[
        ("bucket", "states"),
        ("key", "tenants/acme/terraform.tfstate"),
        ("dynamodb_table", "locks"),
        ("endpoints.dynamodb", "http://127.0.0.1:5000"),
    ]))
    .unwrap();
    let base = "http://127.0.0.1:5000/states";
    for (method, path) in [
        ("GET", "/tenants/acme/terraform.tfstate"),
        ("PUT", "/tenants/acme/terraform.tfstate.tflock"),
        ("DELETE", "/env%3A/dev/tenants/acme/terraform.tfstate"),
        // Its own workspaces: every key under `env:/` is its own, since
        // no other backend served on the bucket may have a key or prefix
        // there (`check_disjoint`, at load).
        ("GET", "?list-type=2&prefix=env%3A%2F"),
        ("GET", "?versions&prefix=tenants%2Facme%2Fterraform.tfstate"),
    ] {
        let uri = format!("{base}{path}");
        assert_eq!(
            acme.check(&request(method, &uri, &[], "")),
            Ok(Service::S3),
            "{method} {uri}"
        );
    }
    let keyless = SigningScope {
        stranger: true,
        ..scope_of(&[("bucket", "states"), ("dynamodb_table", "locks")])
    };
    for scope in [&acme, &keyless] {
        for (method, path) in [
            ("GET", "/tenants/other/terraform.tfstate"),
            ("PUT", "/tenants/other/terraform.tfstate"),
            ("DELETE", "/tenants/other/terraform.tfstate"),
            ("GET", ""),
            ("GET", "?list-type=2"),
            ("GET", "?list-type=2&prefix=tenants%2F"),
            // Outside `env:/` and its key: another backend's namespace.
            ("GET", "?list-type=2&prefix=env%3A"),
            ("GET", "?list-type=2&prefix=tenants%2Facme%2F"),
            ("GET", "?versions&prefix=tenants%2F"),
            ("GET", "?versions&prefix=env%3A%2F"),
        ] {
            let uri = format!("{base}{path}");
            assert!(
                scope.check(&request(method, &uri, &[], "")).is_err(),
                "{method} {uri} was signed"
            );
        }
    }
    let other_item = request(
        "POST",
        "http://127.0.0.1:5000/",
        &[("x-amz-target", "DynamoDB_20120810.DeleteItem")],
        r#"{"TableName":"locks","Key":{"LockID":{"S":"states/tenants/other/terraform.tfstate"}}}"#,
    );
    assert!(acme.check(&other_item).is_err());
    let own_item = request(
        "POST",
        "http://127.0.0.1:5000/",
        &[("x-amz-target", "DynamoDB_20120810.GetItem")],
        r#"{"TableName":"locks","Key":{"LockID":{"S":"states/tenants/acme/terraform.tfstate-md5"}}}"#,
    );
    assert_eq!(acme.check(&own_item), Ok(Service::DynamoDb));
}

/// Review of issue 47, F7: on `*.amazonaws.com` the service was picked
/// before the "given twice" check ran, so two `X-Amz-Target` headers
/// passed: the scope checked the first, DynamoDB might act on the other.
#[test]
fn a_target_given_twice_is_refused_on_amazonaws_too() {
    let s = scope_of(&[
        ("bucket", "states"),
        ("key", "app/terraform.tfstate"),
        ("dynamodb_table", "locks"),
    ]);
    let body = r#"{"TableName":"locks","Key":{"LockID":{"S":"states/app/terraform.tfstate"}}}"#;
    let uri = "https://dynamodb.eu-west-1.amazonaws.com/";
    let once = request(
        "POST",
        uri,
        &[("x-amz-target", "DynamoDB_20120810.GetItem")],
        body,
    );
    assert_eq!(s.check(&once), Ok(Service::DynamoDb));
    let twice = request(
        "POST",
        uri,
        &[
            ("x-amz-target", "DynamoDB_20120810.GetItem"),
            ("x-amz-target", "DynamoDB_20120810.DeleteTable"),
        ],
        body,
    );
    assert_eq!(s.check(&twice), Err("X-Amz-Target given twice".into()));
}

/// Review of issue 47: a stranger's key or prefix with a `.` or `..`
/// segment, a bucket with a `/` (its `LockID`s would be another bucket's),
/// and a workspace named `.` or `..` in its signed keys are refused: a
/// store or proxy normalising the path would take them for other keys.
#[test]
fn a_strangers_paths_have_no_dot_segments() {
    let refused = |config: &[(&str, &str)]| SigningScope::for_stranger(&owned(config)).unwrap_err();
    for key in ["../terraform.tfstate", "a/./terraform.tfstate", "a/.."] {
        let e = refused(&[("bucket", "states"), ("key", key)]);
        assert!(e.starts_with("key: "), "{key:?}: {e}");
    }
    for prefix in ["..", "a/.", "/env", "env/", "a//b"] {
        let e = refused(&[
            ("bucket", "states"),
            ("key", "terraform.tfstate"),
            ("workspace_key_prefix", prefix),
        ]);
        assert!(e.starts_with("workspace_key_prefix: "), "{prefix:?}: {e}");
    }
    let e = refused(&[("bucket", "states/tenants"), ("key", "terraform.tfstate")]);
    assert!(e.starts_with("bucket: "), "{e}");

    let acme = SigningScope::for_stranger(&owned(&[
        ("bucket", "states"),
        ("key", "acme/terraform.tfstate"),
        ("workspace_key_prefix", "acme-env"),
    ]))
    .unwrap();
    let base = "http://127.0.0.1:5000/states";
    let get = |path: &str| acme.check(&request("GET", &format!("{base}{path}"), &[], ""));
    assert_eq!(get("/acme-env/dev/acme/terraform.tfstate"), Ok(Service::S3));
    for path in [
        "/acme-env/../acme/terraform.tfstate",
        "/acme-env/%2E%2E/acme/terraform.tfstate",
        "/acme-env/./acme/terraform.tfstate",
        // Listings stay inside its namespace.
        "?list-type=2&prefix=acme-env",
        "?list-type=2&prefix=acme",
        "?versions&prefix=acme%2F",
    ] {
        assert!(get(path).is_err(), "{path} was signed");
    }
    assert_eq!(get("?list-type=2&prefix=acme-env%2F"), Ok(Service::S3));
    assert_eq!(
        get("?versions&prefix=acme%2Fterraform.tfstate"),
        Ok(Service::S3)
    );
}
