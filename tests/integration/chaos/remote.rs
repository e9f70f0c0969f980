//! The checker on remote storage: the AWS guests on moto, git on a daemon
//! and over HTTP, PostgreSQL, Azure on Azurite and Cloud Storage on
//! fake-gcs-server (the last three and git over HTTP behind a proxy
//! injecting storage faults).

use super::*;

/// [`run_clean`], behind `proxy`, which must have injected faults.
fn run_clean_behind(setup: Setup, proxy: &FaultProxy) {
    run_clean(setup);
    let injected = proxy.injected.lock().unwrap();
    println!(
        "{} storage faults injected, the first: {:?}",
        injected.len(),
        injected.iter().take(5).collect::<Vec<_>>()
    );
    assert!(!injected.is_empty(), "the proxy injected no storage fault");
}

/// A backend's `settings` with the endpoint under `key` reached through
/// `proxy` in place of `upstream`.
fn through(
    settings: Vec<(String, String)>,
    key: &str,
    upstream: &str,
    proxy: &FaultProxy,
) -> Vec<(String, String)> {
    settings
        .into_iter()
        .map(|(k, v)| {
            let v = if k == key {
                v.replace(upstream, &proxy.url)
            } else {
                v
            };
            (k, v)
        })
        .collect()
}

/// Both AWS guests on moto, behind a proxy that throttles, fails, and
/// applies-then-drops a share of their storage requests, with the hosts
/// killed and reloaded as for every guest; `s3-lockfile` sealed, on a
/// bucket with versioning.
#[test]
fn chaos_s3_lockfile_and_dynamodb_on_moto() {
    let dir = tempdir();
    let key = key_file(dir.path());
    for (locking, encryption) in [
        (crate::aws::Locking::LockFile, sealed(&key)),
        (crate::aws::Locking::DynamoDb, String::new()),
    ] {
        let moto = crate::aws::start_moto(locking);
        // Sealed, the hosts started afresh seed their rollback check from
        // the bucket's versions: under faults and kills too, it must never
        // refuse a state the history allows.
        if locking == crate::aws::Locking::LockFile {
            moto.enable_versioning(crate::aws::BUCKET);
        }
        let mut setup = Setup::new(String::new());
        // Terraform's own `backend "s3"` (`use_lockfile`) on the same
        // bucket, taking the same `.tflock` objects straight from S3.
        if locking == crate::aws::Locking::LockFile {
            setup.native = Some(Native::S3LockFile {
                s3: moto.url.clone(),
                bucket: crate::aws::BUCKET.into(),
                key: crate::aws::KEY.into(),
            });
        }
        let proxy = FaultProxy::random(&moto.url, setup.seed, 3);
        setup.config = backend_table(
            BACKEND,
            locking.guest(),
            &encryption,
            &crate::aws::settings(&proxy.url, locking),
        );
        run_clean_behind(setup, &proxy);
    }
}

#[test]
fn chaos_git_on_git_daemon() {
    let dir = tempdir();
    let daemon = GitDaemon::start(dir.path());
    bare_repo(dir.path(), "chaos");
    let key = key_file(dir.path());
    run_clean(Setup::new(format!(
        "[backends.{BACKEND}]\nguest = \"git\"\n{}[backends.{BACKEND}.config]\nrepository = {:?}\n",
        sealed(&key),
        daemon.url("chaos")
    )));
}

/// `git` over smart HTTP (lighttpd and `git http-backend`, with
/// credentials only the hosts hold) behind the fault proxy: fetches and
/// pushes that fail, are throttled, or are applied and their answer lost.
///
/// It found three ways a host got stuck on a workspace after the faults
/// stopped, each fixed: a clone left without objects by a cut-off fetch,
/// a clone whose creation a kill cut off, and ref lock files a killed host
/// left in its clone (every fetch then failed as "locked").
#[test]
fn chaos_git_over_http_behind_a_fault_proxy() {
    let dir = tempdir();
    let web = GitHttp::start(dir.path(), "ci", "s3cret");
    bare_repo(&dir.path().join("repos"), "chaos");
    let mut setup = Setup::new(String::new());
    let proxy = FaultProxy::random(&format!("http://127.0.0.1:{}", web.port), setup.seed, 3);
    let repository = format!("{}/git/chaos.git", proxy.url);
    setup.config = format!(
        "[backends.{BACKEND}]\nguest = \"git\"\n\
         git_auth = {{ username_env = \"GIT_USER\", password_env = \"GIT_TOKEN\" }}\n\
         [backends.{BACKEND}.config]\nrepository = {repository:?}\n"
    );
    setup.env = vec![("GIT_USER", "ci"), ("GIT_TOKEN", "s3cret")];
    run_clean_behind(setup, &proxy);
}

/// `postgres` on a real PostgreSQL: three hosts holding Terraform's
/// advisory locks in their lock sessions, killed (`-9`: the session and
/// its locks die with the host; another host takes them over) and
/// reloaded under concurrent clients, some reloads with `conn_str`
/// written another way; sealed, so the rollback check runs too. Beside
/// them, a native Terraform `backend "pg"` client takes the same advisory
/// locks straight from PostgreSQL: never at the same time as a wasmstate
/// client.
#[test]
fn chaos_postgres_with_advisory_locks() {
    let dir = tempdir();
    let pg = Postgres::start();
    let key = key_file(dir.path());
    let config = |conn_str: &str| {
        format!(
            "[backends.{BACKEND}]\nguest = \"postgres\"\n{}[backends.{BACKEND}.config]\nconn_str = {conn_str:?}\n",
            sealed(&key),
        )
    };
    let mut setup = Setup::new(config(&pg.conn_str()));
    setup.native = Some(Native::Pg {
        conn_str: pg.conn_str(),
        schema: "terraform_remote_state".into(),
    });
    setup.reload_variants = vec![
        config(&pg.conn_str()),
        config(&format!("{}&keepalives_idle=30", pg.conn_str())),
    ];
    run_clean(setup);
}

/// `azure` on Azurite behind the fault proxy (throttled, failed, and
/// applied-then-dropped blob requests), sealed with snapshots as the
/// history, three hosts killed and reloaded under concurrent clients.
#[test]
fn chaos_azure_on_azurite_behind_a_fault_proxy() {
    let dir = tempdir();
    let azurite = crate::azure::start();
    let key = key_file(dir.path());
    let mut setup = Setup::new(String::new());
    let upstream = azurite.endpoint();
    let origin = upstream.trim_end_matches(&format!("/{}", crate::common::azurite::ACCOUNT));
    let proxy = FaultProxy::random(origin, setup.seed, 3);
    let settings = through(
        crate::azure::settings(&azurite, true),
        "blob_endpoint",
        origin,
        &proxy,
    );
    setup.config = backend_table(BACKEND, "azure", &sealed(&key), &settings);
    run_clean_behind(setup, &proxy);
}

/// `gcs` on fake-gcs-server (a versioned bucket) behind the fault proxy
/// (throttled, failed, and applied-then-dropped object requests), sealed,
/// three hosts killed and reloaded under concurrent clients: generations
/// (`ifGenerationMatch`) are the only thing keeping unlocked racers apart.
///
/// fake-gcs-server deletes an object whatever generation the delete names
/// (a `DELETE` with a wrong `ifGenerationMatch` answers 200 and the object
/// is gone; Cloud Storage answers 412), so a holder's UNLOCK that read its
/// lock just before a force-unlock removed it deleted the next holder's
/// lock: the first 60 s run found that twice ("the lock was granted to two
/// holders at once", each beside a FORCE-UNLOCK overlapping an UNLOCK).
/// The proxy keeps that precondition as Cloud Storage does
/// ([`FaultProxy::random_gcs`]); the guest's delete was conditional all
/// along.
#[test]
fn chaos_gcs_on_fake_gcs_server_behind_a_fault_proxy() {
    let dir = tempdir();
    let gcs = crate::gcs::start(true);
    let key = key_file(dir.path());
    let mut setup = Setup::new(String::new());
    let proxy = FaultProxy::random_gcs(&gcs.url, setup.seed, 3);
    let settings = through(
        crate::gcs::settings(&gcs),
        "storage_custom_endpoint",
        &gcs.url,
        &proxy,
    );
    setup.config = backend_table(BACKEND, "gcs", &sealed(&key), &settings);
    run_clean_behind(setup, &proxy);
}
