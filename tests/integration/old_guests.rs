//! Guests built for contract 0.2.1 (`tests/fixtures/v0.2.1/`) served by
//! the current host through its 0.2.1 adapter, against real storage: the
//! `postgres` guest on a real PostgreSQL and the `git` guest on a real git
//! remote, through the HTTP door. Every write, read, lock and listing here
//! goes through the adapter's `postgres` or `git` imports, which call the
//! current capabilities: without the adapter such a guest does not link.

use crate::common::*;
use std::time::Duration;

/// The `postgres` guest as the 0.2.1 SDK built it.
const V0_2_1_POSTGRES_WASM: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/v0.2.1/postgres.wasm"
);

/// The `git` guest as the 0.2.1 SDK built it.
const V0_2_1_GIT_WASM: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/v0.2.1/git.wasm"
);

/// Write, read, a client's lock (refusing an unlocked write, taking one
/// under it), unlock, on workspace `ws` of backend `old`; then the
/// history the guest keeps lists both writes, newest first.
fn write_read_lock(url: &str) {
    let url = url.to_string();
    assert_eq!(send("GET", &url, None).status, 404, "no state yet");
    let written = send("POST", &url, Some(&state(1)));
    assert_eq!(written.status, 200, "{}", written.text());
    assert_eq!(send("GET", &url, None).body, state(1));
    let held = lock_info("c0ffee00-0000-4000-8000-0000000000a1", "ci@a");
    assert_eq!(send("LOCK", &url, Some(&held)).status, 200);
    let other = send("LOCK", &url, Some(&lock_info("other", "ci@b")));
    assert_eq!(other.status, 423, "{}", other.text());
    assert_eq!(other.json()["Who"], "ci@a");
    let unlocked = send("POST", &url, Some(&state(2)));
    assert_eq!(unlocked.status, 423, "{}", unlocked.text());
    let under_lock = format!("{url}?ID=c0ffee00-0000-4000-8000-0000000000a1");
    let written = send("POST", &under_lock, Some(&state(2)));
    assert_eq!(written.status, 200, "{}", written.text());
    assert_eq!(send("UNLOCK", &url, Some(&held)).status, 200);
    assert_eq!(send("GET", &url, None).body, state(2));
    // A stale write (serial 1 again) is refused by the guard.
    assert_eq!(send("POST", &url, Some(&state(1))).status, 409);
    let (_, serials) = versions(&url);
    assert_eq!(serials[..2], [2, 1], "{serials:?}");
}

/// The real server (`wasmstate serve`'s own [`wasmstate::server::serve`])
/// in this process, serving the 0.2.1 `postgres` guest from its file as
/// backend `old` with a database granted. Only the embedded `postgres`
/// guest is granted one from a config file, so the grant is made here as
/// the config makes it for that one.
struct InProcess {
    url: String,
    _rt: tokio::runtime::Runtime,
    _data: tempfile::TempDir,
}

impl InProcess {
    fn postgres(wasm: &str, pg: &Postgres, schema: &str) -> InProcess {
        use wasmstate::capabilities::postgres::PgGrant;
        use wasmstate::config::{Config, Overrides};
        let data = tempdir();
        let port = free_port();
        let mut config = Config::default_with(Overrides {
            listen: Some(format!("127.0.0.1:{port}").parse().unwrap()),
            data_dir: Some(data.path().join("data")),
            cache_dir: None,
        });
        let mut guest_config = vec![
            ("conn_str".to_string(), pg.conn_str()),
            ("schema_name".to_string(), schema.to_string()),
        ];
        let grant = PgGrant::take(true, &mut guest_config).unwrap();
        let backend = &mut config.backends[0];
        backend.name = "old".into();
        backend.guest = wasmstate::guests::GuestSource::File(wasm.into());
        backend.guest_config = guest_config;
        backend.postgres = grant;
        let rt = tokio::runtime::Runtime::new().unwrap();
        let served = rt.spawn(wasmstate::server::serve(config, None));
        let url = format!("http://127.0.0.1:{port}");
        let healthz = format!("{url}/healthz");
        wait_until("the server to listen", Duration::from_secs(60), || {
            assert!(!served.is_finished(), "the server stopped before listening");
            reqwest::blocking::get(&healthz).is_ok_and(|r| r.status().is_success())
        });
        InProcess {
            url,
            _rt: rt,
            _data: data,
        }
    }

    fn state_url(&self, ws: &str) -> String {
        format!("{}/states/old/{ws}", self.url)
    }
}

#[test]
fn a_0_2_1_postgres_guest_keeps_states_and_locks_in_a_real_database() {
    let pg = Postgres::start();
    let schema = "old_guest";
    let server = InProcess::postgres(V0_2_1_POSTGRES_WASM, &pg, schema);
    // The lock is the host's, kept in the database for every replica:
    // seen there while held.
    let url = server.state_url("prod");
    let held = lock_info("c0ffee00-0000-4000-8000-0000000000b1", "ci@a");
    let locked = send("LOCK", &url, Some(&held));
    assert_eq!(locked.status, 200, "{}", locked.text());
    assert_eq!(
        pg.query(&format!(
            "select count(*) from {schema}.wasmstate_locks where name = 'prod'"
        )),
        "1"
    );
    assert_eq!(send("UNLOCK", &url, Some(&held)).status, 200);
    assert_eq!(
        pg.query(&format!("select count(*) from {schema}.wasmstate_locks")),
        "0"
    );
    write_read_lock(&url);
    // The state is Terraform's row, as the pg backend keeps it.
    let stored = pg.query(&format!(
        "select data from {schema}.states where name = 'prod'"
    ));
    assert_eq!(stored.as_bytes(), state(2));
    let listed = send("GET", &format!("{}/workspaces/old", server.url), None);
    assert!(listed.text().contains("\"prod\""), "{}", listed.text());
}

#[test]
fn a_0_2_1_git_guest_keeps_states_and_locks_on_a_real_remote() {
    let dir = tempdir();
    let daemon = GitDaemon::start(dir.path());
    let repo = bare_repo(dir.path(), "old");
    let remote = daemon.url("old");
    let data = tempdir();
    let server = Server::with_config(
        data.path(),
        &format!(
            "[backends.old]\nguest = {V0_2_1_GIT_WASM:?}\nallow_git = [{remote:?}]\n\
             git_refs = [\"refs/heads/main\", \"refs/heads/locks/**\"]\n\
             git_paths = [\"*.tfstate\", \"*.tfstate.lock\"]\n\
             [backends.old.config]\nrepository = {remote:?}\n"
        ),
    );
    // A lock is a branch on the remote, seen by plain git while held.
    let url = server.state_url("old", "prod");
    let held = lock_info("c0ffee00-0000-4000-8000-0000000000c1", "ci@a");
    let locked = send("LOCK", &url, Some(&held));
    assert_eq!(locked.status, 200, "{}", locked.text());
    let branches = git(&repo, &["branch", "--list", "locks/*"]);
    assert!(branches.contains("locks/prod.tfstate"), "{branches}");
    assert_eq!(send("UNLOCK", &url, Some(&held)).status, 200);
    let branches = git(&repo, &["branch", "--list", "locks/*"]);
    assert!(branches.trim().is_empty(), "{branches}");
    write_read_lock(&url);
    // The state is a file on main, as plain git sees it.
    let stored = git(&repo, &["show", "main:prod.tfstate"]);
    assert_eq!(stored.as_bytes(), state(2));
}
