//! History served by the storage, not by one replica's disk: several hosts
//! on one moto bucket with versioning list the same versions in the same
//! order, diff and restore each other's writes, and a host started with an
//! empty data directory loses none. With encryption on, every replica
//! refuses the same rollback; without versioning, the server says where
//! its history is kept.

use crate::aws::{BUCKET, KEY, Locking, backend_config, start_moto};
use crate::common::*;
use std::path::Path;
use std::time::Duration;

/// A state with one output, so two versions have a diff.
fn state_by(serial: u64, lineage: &str, who: &str) -> Vec<u8> {
    format!(
        r#"{{"version":4,"terraform_version":"1.11.4","serial":{serial},"lineage":"{lineage}","outputs":{{"who":{{"value":"{who}","type":"string"}}}},"resources":[]}}"#
    )
    .into_bytes()
}

/// A host on the shared bucket, waited for until it has said who keeps its
/// history (so its first write is not copied into its own data directory).
fn host(data: &Path, moto: &Moto, locking: Locking, extra: &str) -> Server {
    let server = Server::with_config(data, &backend_config(&moto.url, locking, extra));
    said_who_keeps_history(&server);
    server
}

/// Wait until `server` has logged who keeps its history (the probe at
/// start), failing with its log.
fn said_who_keeps_history(server: &Server) {
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while !server.log_text().contains("version history") {
        assert!(
            std::time::Instant::now() < until,
            "no history probe's log line: {}",
            server.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The config lines that seal a backend's states with a new key in `dir`.
fn sealed_with_key_in(dir: &Path) -> String {
    let key = key_file(dir);
    format!("encryption = {{ keys = [{{ id = \"k1\", file = {key:?} }}] }}\n")
}

/// `wasmstate state versions default -b aws` against `server`: its output.
fn state_versions(server: &Server) -> String {
    let (ok, out) = wasmstate(&[
        "state",
        "versions",
        "default",
        "-b",
        "aws",
        "--server",
        &server.url,
    ]);
    assert!(ok, "{out}");
    out
}

/// `(id, serial)` of each version a host lists, and its history header.
fn listed(server: &Server) -> (Vec<(String, u64)>, String) {
    let answer = send(
        "GET",
        &format!("{}/versions", server.state_url("aws", "default")),
        None,
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
    let source = answer
        .headers
        .get("wasmstate-history")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let versions = answer
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["id"].as_str().unwrap().to_string(),
                v["serial"].as_u64().unwrap(),
            )
        })
        .collect();
    (versions, source)
}

/// Return once the wall clock has moved into the next second.
fn next_second() {
    let second = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    let now = second();
    wait_until("the next second", Duration::from_secs(5), || second() > now);
}

fn files_under(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.path().is_dir() {
            true => files_under(&e.path()),
            false => 1,
        })
        .sum()
}

fn every_replica_sees_every_version(locking: Locking) {
    let moto = start_moto(locking);
    moto.enable_versioning(BUCKET);
    let dirs = [tempdir(), tempdir(), tempdir()];
    let mut hosts: Vec<Server> = dirs
        .iter()
        .map(|d| host(d.path(), &moto, locking, ""))
        .collect();
    assert!(
        hosts[0].log_text().contains("kept by the storage itself"),
        "{}",
        hosts[0].log_text()
    );
    // Each host writes one version.
    for (i, server) in hosts.iter().enumerate() {
        let serial = i as u64 + 1;
        let url = server.state_url("aws", "default");
        let sent = send(
            "POST",
            &url,
            Some(&state_by(serial, "shared", &format!("host-{i}"))),
        );
        assert_eq!(sent.status, 200, "{}", sent.text());
    }
    let (first, source) = listed(&hosts[0]);
    assert_eq!(source, "storage");
    let serials: Vec<u64> = first.iter().map(|(_, s)| *s).collect();
    assert_eq!(serials, [3, 2, 1], "{first:?}");
    for other in &hosts[1..] {
        assert_eq!(
            listed(other).0,
            first,
            "every replica lists the same, in order"
        );
    }
    // No replica kept a copy of its own: the storage keeps them.
    for dir in &dirs {
        assert_eq!(files_under(&dir.path().join("history")), 0);
    }
    // Read and diff, through one host, the versions the others wrote.
    let oldest = &first[2].0;
    let middle = &first[1].0;
    let url = hosts[2].state_url("aws", "default");
    let read = send("GET", &format!("{url}/versions/{oldest}"), None);
    assert_eq!(read.body, state_by(1, "shared", "host-0"), "byte-exact");
    let diff = send(
        "GET",
        &format!(
            "{}/ui/api/backends/aws/default/diff?from={oldest}&to={middle}",
            hosts[2].url
        ),
        None,
    );
    assert_eq!(diff.status, 200, "{}", diff.text());
    assert_eq!(diff.json()["outputs_changed"], serde_json::json!(["who"]));

    // Restore host 0's version through host 2: serial 4, host 0's outputs.
    let (ok, out) = wasmstate(&[
        "state",
        "restore",
        "default",
        oldest,
        "-b",
        "aws",
        "--server",
        &hosts[2].url,
    ]);
    assert!(ok && out.contains("as serial 4"), "{out}");
    let current = send("GET", &hosts[1].state_url("aws", "default"), None).json();
    assert_eq!(
        (
            current["serial"].as_u64(),
            &current["outputs"]["who"]["value"]
        ),
        (Some(4), &serde_json::json!("host-0"))
    );

    // A pod restarted with an empty data directory loses nothing.
    drop(hosts.remove(1));
    let fresh = tempdir();
    let restarted = host(fresh.path(), &moto, locking, "");
    let (after, _) = listed(&restarted);
    assert_eq!(after.len(), 4, "{after:?}");
    assert_eq!(
        &after[1..],
        &first[..],
        "the same versions below the restore"
    );
    let out = state_versions(&restarted);
    assert!(out.contains("kept by the storage itself"), "{out}");
    assert!(out.contains(oldest.as_str()), "{out}");
}

#[test]
fn every_replica_lists_restores_and_keeps_s3_versions() {
    every_replica_sees_every_version(Locking::LockFile);
}

#[test]
fn every_replica_lists_restores_and_keeps_s3_versions_with_dynamodb_locks() {
    every_replica_sees_every_version(Locking::DynamoDb);
}

/// With encryption on, an older envelope put back as the newest object (a
/// rollback the seal cannot tell) is refused by every replica, including one
/// that never served the workspace; a state deleted and started again is
/// not.
#[test]
fn every_replica_refuses_the_same_rollback() {
    let moto = start_moto(Locking::LockFile);
    moto.enable_versioning(BUCKET);
    let keys = tempdir();
    let sealed = sealed_with_key_in(keys.path());
    let (a_dir, b_dir) = (tempdir(), tempdir());
    let a = host(a_dir.path(), &moto, Locking::LockFile, &sealed);
    let b = host(b_dir.path(), &moto, Locking::LockFile, &sealed);
    let url_a = a.state_url("aws", "default");
    for serial in [1, 2] {
        assert_eq!(
            send("POST", &url_a, Some(&state_by(serial, "L", "a"))).status,
            200
        );
    }
    assert_eq!(
        send("GET", &b.state_url("aws", "default"), None).json()["serial"],
        2
    );

    // Serial 1's envelope put back behind every server's back.
    let ids = moto.version_ids(BUCKET, KEY);
    let old = moto
        .object_version(BUCKET, KEY, ids.last().unwrap())
        .unwrap();
    moto.put_object(BUCKET, KEY, &old);
    let fresh_dir = tempdir();
    let fresh = host(fresh_dir.path(), &moto, Locking::LockFile, &sealed);
    for (who, server) in [("writer", &a), ("reader", &b), ("fresh replica", &fresh)] {
        let read = send("GET", &server.state_url("aws", "default"), None);
        assert!(
            read.status >= 500,
            "{who} served the rollback: {}",
            read.text()
        );
        assert!(read.text().contains("rollback"), "{who}: {}", read.text());
    }

    // Deleted and started again, lower serial, same lineage: a new life.
    // S3 times its versions to the second, and a delete marker sharing a
    // second with a version is taken as the newer (the check starts later,
    // never refuses more): each step in a second of its own makes the new
    // life start exactly at the marker.
    next_second();
    let delete = send("DELETE", &url_a, None);
    assert_eq!(delete.status, 200, "{}", delete.text());
    next_second();
    assert_eq!(
        send("POST", &url_a, Some(&state_by(1, "L", "again"))).status,
        200
    );
    let other_dir = tempdir();
    let other = host(other_dir.path(), &moto, Locking::LockFile, &sealed);
    let read = send("GET", &other.state_url("aws", "default"), None);
    assert_eq!(read.status, 200, "{}", read.text());
    assert_eq!(read.json()["outputs"]["who"]["value"], "again");
}

/// Replica B serves lineage L at serial 3; through replica A the state is
/// deleted and a backup of L at serial 1 pushed. B, like A, serves the
/// backup and takes the next write (it consults the storage's history
/// before refusing, as a restart would). `backend`: both hosts' backend.
fn b_follows_a_delete_and_push(a: &Server, b: &Server, backend: &str) {
    let (url_a, url_b) = (
        a.state_url(backend, "default"),
        b.state_url(backend, "default"),
    );
    for serial in 1..=3 {
        let sent = send("POST", &url_a, Some(&state_by(serial, "L", "a")));
        assert_eq!(sent.status, 200, "{}", sent.text());
    }
    let read = send("GET", &url_b, None);
    assert_eq!(read.json()["serial"], 3, "{}", read.text());
    let deleted = send("DELETE", &url_a, None);
    assert_eq!(deleted.status, 200, "{}", deleted.text());
    let pushed = send("POST", &url_a, Some(&state_by(1, "L", "backup")));
    assert_eq!(pushed.status, 200, "{}", pushed.text());
    for (who, url) in [("B", &url_b), ("A", &url_a), ("B again", &url_b)] {
        let read = send("GET", url, None);
        assert_eq!(read.status, 200, "{who}: {}", read.text());
        assert_eq!(read.json()["outputs"]["who"]["value"], "backup", "{who}");
    }
    // S3 times versions to the second and takes a delete marker as newer
    // than a version of its second: the next write in a second of its own
    // is seen after the delete, as a rollback of it would be.
    next_second();
    let next = send("POST", &url_b, Some(&state_by(2, "L", "b")));
    assert_eq!(next.status, 200, "{}", next.text());
    assert_eq!(send("GET", &url_a, None).json()["serial"], 2);
}

/// Issue 47, data 4: B answered 500 "older than serial 3" to every GET and
/// POST until it restarted, though the bucket's versions show the delete.
/// A real rollback after that is still refused by both.
#[test]
fn a_state_deleted_and_pushed_again_through_another_replica_is_served_by_every_replica() {
    let moto = start_moto(Locking::LockFile);
    moto.enable_versioning(BUCKET);
    let keys = tempdir();
    let sealed = sealed_with_key_in(keys.path());
    let (a_dir, b_dir) = (tempdir(), tempdir());
    let a = host(a_dir.path(), &moto, Locking::LockFile, &sealed);
    let b = host(b_dir.path(), &moto, Locking::LockFile, &sealed);
    b_follows_a_delete_and_push(&a, &b, "aws");
    // The backup (serial 1, the newest version but one) put back over
    // serial 2 behind both servers' backs: a rollback in the same life.
    let ids = moto.version_ids(BUCKET, KEY);
    let backup = moto.object_version(BUCKET, KEY, &ids[1]).unwrap();
    moto.put_object(BUCKET, KEY, &backup);
    for (who, server) in [("A", &a), ("B", &b)] {
        let read = send("GET", &server.state_url("aws", "default"), None);
        assert_eq!(
            read.status,
            500,
            "{who} served the rollback: {}",
            read.text()
        );
        assert!(read.text().contains("rollback"), "{who}: {}", read.text());
    }
}

/// The bucket of [`a_delete_and_push_within_a_second_is_seen_on_gcs`].
const GCS_BUCKET: &str = "wasmstate-history";

/// Issue 47, data 4, on GCS: object versioning keeps no delete markers, and
/// a delete followed by a new state within a second looked like an
/// overwrite by the generations' times, so B kept refusing even with the
/// history shared. The `gcs` guest deletes through an empty generation,
/// which every replica's check reads as the delete.
#[test]
fn a_delete_and_push_within_a_second_is_seen_on_gcs() {
    let gcs = FakeGcs::start();
    gcs.create_bucket(GCS_BUCKET, true);
    let keys = tempdir();
    let settings: Vec<(String, String)> = [
        ("bucket", GCS_BUCKET.to_string()),
        ("prefix", "team".to_string()),
        ("storage_custom_endpoint", gcs.endpoint()),
        ("access_token", "fake".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let config = backend_table("gcs", "gcs", &sealed_with_key_in(keys.path()), &settings);
    let (a_dir, b_dir) = (tempdir(), tempdir());
    let a = Server::with_config(a_dir.path(), &config);
    let b = Server::with_config(b_dir.path(), &config);
    said_who_keeps_history(&a);
    said_who_keeps_history(&b);
    assert!(
        b.log_text().contains("kept by the storage itself"),
        "{}",
        b.log_text()
    );
    b_follows_a_delete_and_push(&a, &b, "gcs");
}

/// A state force-pushed (older on purpose, `allow_force_push` on) is the
/// start of a replica's check, not a rollback from the newer states before
/// it: a replica without that setting reads it.
#[test]
fn a_force_pushed_state_is_not_taken_for_a_rollback() {
    let moto = start_moto(Locking::LockFile);
    moto.enable_versioning(BUCKET);
    let keys = tempdir();
    let sealed = sealed_with_key_in(keys.path());
    let forcing_dir = tempdir();
    let forcing = host(
        forcing_dir.path(),
        &moto,
        Locking::LockFile,
        &format!("allow_force_push = true\n{sealed}"),
    );
    let url = forcing.state_url("aws", "default");
    for serial in [5, 3, 4] {
        let sent = send(
            "POST",
            &url,
            Some(&state_by(serial, "L", &format!("s{serial}"))),
        );
        assert_eq!(sent.status, 200, "{}", sent.text());
    }
    let strict_dir = tempdir();
    let strict = host(strict_dir.path(), &moto, Locking::LockFile, &sealed);
    let read = send("GET", &strict.state_url("aws", "default"), None);
    assert_eq!(read.status, 200, "{}", read.text());
    assert_eq!(read.json()["serial"], 4);
}

/// A bucket without versioning keeps no history: the server says so, and
/// says the versions it lists are this replica's own.
#[test]
fn a_bucket_without_versioning_says_history_is_per_replica() {
    let moto = start_moto(Locking::LockFile);
    let data = tempdir();
    let server = host(data.path(), &moto, Locking::LockFile, "");
    let log = server.log_text();
    assert!(log.contains("has versioning off"), "{log}");
    assert!(log.contains("kept by this replica"), "{log}");
    let url = server.state_url("aws", "default");
    assert_eq!(send("POST", &url, Some(&state_by(1, "L", "a"))).status, 200);
    let (versions, source) = listed(&server);
    assert_eq!((versions.len(), source.as_str()), (1, "replica"));
    assert_eq!(files_under(&data.path().join("history")), 1);
    let out = state_versions(&server);
    assert!(out.contains("kept by this replica"), "{out}");
}

/// The policy Terraform's S3 backend documents: states, and nothing of the
/// bucket's history.
const LEAST_PRIVILEGE: &str = r#"{"Version":"2012-10-17","Statement":[
  {"Effect":"Allow","Action":"s3:ListBucket","Resource":"arn:aws:s3:::wasmstate-states"},
  {"Effect":"Allow","Action":["s3:GetObject","s3:PutObject","s3:DeleteObject"],"Resource":"arn:aws:s3:::wasmstate-states/*"}]}"#;

/// Credentials with Terraform's least-privilege policy (no
/// s3:GetBucketVersioning, s3:ListBucketVersions or s3:GetObjectVersion),
/// checked by moto, on a versioned bucket: states are served, and the
/// history is this replica's, with the log naming the permissions to grant.
#[test]
fn a_policy_without_the_history_permissions_keeps_history_per_replica() {
    let moto = start_moto(Locking::LockFile);
    moto.enable_versioning(BUCKET);
    moto.query("iam", "CreateUser", &[("UserName", "narrow")]);
    let key = moto.query("iam", "CreateAccessKey", &[("UserName", "narrow")]);
    moto.query(
        "iam",
        "PutUserPolicy",
        &[
            ("UserName", "narrow"),
            ("PolicyName", "states"),
            ("PolicyDocument", LEAST_PRIVILEGE),
        ],
    );
    moto.check_signatures();
    let settings: Vec<(String, String)> = crate::aws::settings(&moto.url, Locking::LockFile)
        .into_iter()
        .map(|(k, v)| match k.as_str() {
            "access_key" => (k, crate::aws_credentials::between(&key, "AccessKeyId")),
            "secret_key" => (k, crate::aws_credentials::between(&key, "SecretAccessKey")),
            _ => (k, v),
        })
        .collect();
    let config = backend_table("aws", "s3-lockfile", "", &settings);
    let data = tempdir();
    let server = Server::with_config(data.path(), &config);
    said_who_keeps_history(&server);
    let log = server.log_text();
    assert!(log.contains("s3:GetBucketVersioning"), "{log}");
    assert!(log.contains("kept by this replica"), "{log}");
    let url = server.state_url("aws", "default");
    let sent = send("POST", &url, Some(&state_by(1, "L", "narrow")));
    assert_eq!(sent.status, 200, "{}", sent.text());
    assert_eq!(
        send("GET", &url, None).json()["outputs"]["who"]["value"],
        "narrow"
    );
    let (versions, source) = listed(&server);
    assert_eq!((versions.len(), source.as_str()), (1, "replica"));
}
