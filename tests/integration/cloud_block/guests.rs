//! The cloud block over other guests than `local`: `postgres` (with two
//! replicas on one database) and `s3-lockfile` (on moto). Workspaces,
//! states, locks and (contract 0.3.0) tags are the storage's, so every
//! replica agrees on them.

use super::{Fixture, fixture_with, names, text};
use crate::aws::{BUCKET, KEY, Locking, settings, start_moto};
use crate::common::*;

const OTHER_LOCAL: &str = "[backends.other]\nguest = \"local\"\n";

/// Tags strategy: `init` creates `dev` (tagged), `workspace new prod`,
/// an apply in each with a sensitive output, `state pull` is the http
/// door's GET, and a lock at the http door stops the cloud block.
fn workspaces_apply_pull_and_a_lock(f: &Fixture) {
    let work = f.workdir(&f.cloud("tags = [\"app\"]"));
    let dir = work.path();
    let out = f.tf(dir, &f.ci, &["init", "-input=true"], "dev\n");
    assert!(out.status.success(), "{}", text(&out));
    f.ok(dir, &["workspace", "new", "prod"]);
    f.ok(
        dir,
        &["apply", "-auto-approve", "-input=false", "-var", "value=p"],
    );
    f.ok(dir, &["workspace", "select", "dev"]);
    f.ok(dir, &["apply", "-auto-approve", "-input=false"]);
    let outputs: serde_json::Value =
        serde_json::from_str(&f.ok(dir, &["output", "-json"])).unwrap();
    assert_eq!(outputs["secret"]["value"], "s3cret-one");
    let pulled: serde_json::Value = serde_json::from_str(&f.ok(dir, &["state", "pull"])).unwrap();
    let stored = f.http("GET", "/states/acme/dev", None);
    assert_eq!(stored.status, 200, "{}", stored.text());
    assert_eq!(pulled, stored.json());
    assert_eq!(
        f.http("GET", "/states/acme/prod", None).json()["outputs"]["value"]["value"],
        "p"
    );

    let lock = lock_info("http-door-run", "someone@laptop");
    assert_eq!(f.http("LOCK", "/states/acme/dev", Some(&lock)).status, 200);
    let refused = f.tf(
        dir,
        &f.ci,
        &[
            "apply",
            "-auto-approve",
            "-input=false",
            "-lock-timeout=0s",
            "-var",
            "value=two",
        ],
        "",
    );
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("workspace already locked"),
        "{}",
        text(&refused)
    );
    assert_eq!(
        f.http("UNLOCK", "/states/acme/dev", Some(&lock)).status,
        200
    );
    assert_eq!(stored.body, f.http("GET", "/states/acme/dev", None).body);
}

#[test]
fn the_cloud_block_over_s3_lockfile() {
    let moto = start_moto(Locking::LockFile);
    let backends = format!(
        "{}{OTHER_LOCAL}",
        backend_table(
            "acme",
            "s3-lockfile",
            "",
            &settings(&moto.url, Locking::LockFile)
        )
    );
    let f = fixture_with(&backends, "");
    workspaces_apply_pull_and_a_lock(&f);
    // In the bucket, where Terraform's own s3 backend keeps workspaces.
    let object = moto
        .object(BUCKET, &format!("env:/dev/{KEY}"))
        .expect("dev's state in the bucket");
    assert!(String::from_utf8_lossy(&object).contains("s3cret-one"));
}

#[test]
fn the_cloud_block_over_postgres_with_two_replicas() {
    let pg = Postgres::start();
    let backends = format!(
        "[backends.acme]\nguest = \"postgres\"\n[backends.acme.config]\nconn_str = {:?}\nschema_name = \"cloud\"\n{OTHER_LOCAL}",
        pg.conn_str()
    );
    let a = fixture_with(&backends, "");
    workspaces_apply_pull_and_a_lock(&a);
    assert_eq!(
        pg.query("select count(*) from cloud.states where name in ('dev', 'prod')"),
        "2"
    );

    // Replica B: the same config and storage, its own data directory.
    let data = tempdir();
    let server = Server::with_config_file(data.path(), &a._data.path().join("wasmstate.toml"));
    let port = server.url.rsplit(':').next().unwrap().to_string();
    let b = Fixture {
        host: format!("wasmstate.example:{port}"),
        server,
        ci: a.ci.clone(),
        foreign: a.foreign.clone(),
        alice: a.alice.clone(),
        _data: data,
    };
    // A workspace created at A is listed at B, with its state...
    let listed = b.api("GET", "organizations/acme/workspaces", &b.ci, None);
    let listed = names(&listed.json());
    assert!(
        listed.contains(&"dev".to_string()) && listed.contains(&"prod".to_string()),
        "{listed:?}"
    );
    assert_eq!(
        b.http("GET", "/states/acme/dev", None).body,
        a.http("GET", "/states/acme/dev", None).body
    );
    // ...and its tags, kept in the database's metadata table (B has no
    // data directory of A's).
    let tagged = b.api(
        "GET",
        "organizations/acme/workspaces?search%5Btags%5D=app",
        &b.ci,
        None,
    );
    assert_eq!(names(&tagged.json()), ["dev", "prod"]);
    assert_eq!(
        pg.query("select count(*) from cloud.wasmstate_workspace_metadata"),
        "2"
    );
    assert!(!b._data.path().join("tfe").join("workspaces.json").exists());

    // A lock taken at A stops an apply through B; released, B applies.
    let id = a.workspace_id("dev");
    let locked = a.api(
        "POST",
        &format!("workspaces/{id}/actions/lock"),
        &a.ci,
        None,
    );
    assert_eq!(locked.status, 200, "{}", locked.text());
    let work = b.workdir(&b.cloud("name = \"dev\""));
    b.ok(work.path(), &["init", "-input=false"]);
    let refused = b.tf(
        work.path(),
        &b.ci,
        &[
            "apply",
            "-auto-approve",
            "-input=false",
            "-lock-timeout=0s",
            "-var",
            "value=b",
        ],
        "",
    );
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("workspace already locked"),
        "{}",
        text(&refused)
    );
    let unlocked = a.api(
        "POST",
        &format!("workspaces/{id}/actions/unlock"),
        &a.ci,
        None,
    );
    assert_eq!(unlocked.status, 200, "{}", unlocked.text());
    b.ok(
        work.path(),
        &["apply", "-auto-approve", "-input=false", "-var", "value=b"],
    );
    assert_eq!(
        a.http("GET", "/states/acme/dev", None).json()["outputs"]["value"]["value"],
        "b"
    );
}
