//! The `postgres` guest against a real PostgreSQL, and side by side with
//! Terraform's native `backend "pg"` on the same database: each side reads
//! the state the other wrote and each side's lock stops the other. Locks
//! taken through one replica are reported and released through another,
//! and a replica that dies leaves its locks held for the others.

use crate::common::*;
use crate::terraform::{CONFIG, apply_and_check, ok, run};
use std::path::Path;
use std::time::Duration;

fn server(data: &Path, pg: &Postgres, schema: &str) -> Server {
    Server::with_config(
        data,
        &format!(
            "[backends.pg]\nguest = \"postgres\"\n[backends.pg.config]\nconn_str = {:?}\nschema_name = {schema:?}\n",
            pg.conn_str()
        ),
    )
}

/// Terraform's own `backend "pg"` on the same database and schema.
fn native_block(pg: &Postgres, schema: &str) -> String {
    format!(
        "terraform {{\n  backend \"pg\" {{\n    conn_str    = {:?}\n    schema_name = {schema:?}\n  }}\n}}\n",
        pg.conn_str()
    )
}

#[test]
fn postgres_passes_the_kit() {
    let pg = Postgres::start();
    let conn = format!("conn_str={}", pg.conn_str());
    let (ok, out) = wasmstate(&[
        "guest",
        "test",
        "postgres",
        "--config",
        &conn,
        "--config",
        "schema_name=kit",
    ]);
    assert!(ok, "{out}");
    assert_eq!(summary(&out), "33 passed, 0 failed", "{out}");
    // Terraform's tables, made as its pg backend makes them, and wasmstate's.
    assert_eq!(
        pg.query("select count(*) from information_schema.tables where table_schema = 'kit' and table_name in ('states', 'wasmstate_locks', 'wasmstate_state_versions', 'wasmstate_workspace_metadata')"),
        "4"
    );
    // The kit's history case wrote and read versions there.
    let kept: u64 = pg
        .query("select count(*) from kit.wasmstate_state_versions where bytes > 0")
        .parse()
        .unwrap();
    assert!(kept >= 3, "{kept} versions kept");
}

#[test]
fn terraform_through_postgres_keeps_terraforms_rows() {
    let pg = Postgres::start();
    let (data, work) = (tempdir(), tempdir());
    let server = server(data.path(), &pg, "terraform_remote_state");
    apply_and_check(work.path(), &server.state_url("pg", "default"), &server);
    let stored = pg.query("select data from terraform_remote_state.states where name = 'default'");
    let served = send("GET", &server.state_url("pg", "default"), None).text();
    assert_eq!(stored, served.trim_end());
    // Nothing stays locked: no lock row, no advisory lock.
    wait_until(
        "the advisory lock's release",
        Duration::from_secs(10),
        || pg.query("select count(*) from pg_locks where locktype = 'advisory'") == "0",
    );
    assert_eq!(
        pg.query("select count(*) from terraform_remote_state.wasmstate_locks"),
        "0"
    );
}

#[test]
fn postgres_interoperates_with_native_terraform() {
    let pg = Postgres::start();
    let data = tempdir();
    let schema = "terraform_remote_state";
    let server = server(data.path(), &pg, schema);
    let lock_released = || {
        pg.query("select count(*) from pg_locks l join pg_stat_activity a using (pid) where l.locktype = 'advisory' and a.application_name <> 'wasmstate-lock'") == "0"
    };
    let staging_stored = || {
        pg.query(&format!(
            "select count(*) from {schema}.states where name = 'staging'"
        )) == "1"
    };
    crate::side_by_side::check(
        &server,
        "pg",
        crate::side_by_side::Native {
            backend_block: native_block(&pg, schema),
            lock_released: &lock_released,
            staging_stored: &staging_stored,
            holder_shown: false,
        },
    );
}

/// A lock taken through one replica is seen, refused and released through
/// another; native Terraform stays blocked until the release, then the
/// holding replica lets go of the advisory lock within its sweep.
#[test]
fn a_lock_taken_through_one_replica_is_released_through_another() {
    let pg = Postgres::start();
    let schema = "terraform_remote_state";
    let (a_dir, b_dir) = (tempdir(), tempdir());
    let (a, b) = (
        server(a_dir.path(), &pg, schema),
        server(b_dir.path(), &pg, schema),
    );
    let (url_a, url_b) = (a.state_url("pg", "default"), b.state_url("pg", "default"));
    assert_eq!(send("POST", &url_a, Some(&state(1))).status, 200);
    let ours = lock_info("c0ffee00-0000-4000-8000-000000000001", "ci@a");
    assert_eq!(send("LOCK", &url_a, Some(&ours)).status, 200);
    let theirs = lock_info("c0ffee00-0000-4000-8000-000000000002", "ci@b");
    let refused = send("LOCK", &url_b, Some(&theirs));
    assert_eq!(refused.status, 423, "{}", refused.text());
    assert_eq!(refused.json()["Who"], "ci@a");
    // A native client is blocked while the lock is held.
    let native = tempdir();
    std::fs::write(
        native.path().join("main.tf"),
        format!("{}{CONFIG}", native_block(&pg, schema)),
    )
    .unwrap();
    ok(native.path(), &["init", "-input=false"]);
    let blocked = run(native.path(), &["plan", "-input=false", "-lock-timeout=0s"]);
    assert!(
        !blocked.status.success(),
        "native Terraform ignored the lock"
    );
    // Released through the other replica.
    assert_eq!(send("UNLOCK", &url_b, Some(&ours)).status, 200);
    assert_eq!(send("LOCK", &url_b, Some(&theirs)).status, 200);
    assert_eq!(send("UNLOCK", &url_a, Some(&theirs)).status, 200);
    wait_until(
        "replica a's sweep to release the advisory lock",
        Duration::from_secs(15),
        || pg.query("select count(*) from pg_locks where locktype = 'advisory'") == "0",
    );
    let plan = run(native.path(), &["plan", "-input=false", "-lock-timeout=0s"]);
    assert!(
        plan.status.success(),
        "{}",
        String::from_utf8_lossy(&plan.stderr)
    );
}

/// A replica that dies holding a lock: its session ends and with it the
/// advisory lock; the lock row keeps wasmstate's clients out, and the
/// other replica takes the advisory lock over, so native Terraform stays
/// out too.
#[test]
fn a_dead_replicas_lock_is_taken_over_by_another() {
    let pg = Postgres::start();
    let schema = "terraform_remote_state";
    let (a_dir, b_dir) = (tempdir(), tempdir());
    let a = server(a_dir.path(), &pg, schema);
    let b = server(b_dir.path(), &pg, schema);
    let url_a = a.state_url("pg", "default");
    assert_eq!(send("POST", &url_a, Some(&state(1))).status, 200);
    let ours = lock_info("c0ffee00-0000-4000-8000-000000000003", "ci@a");
    assert_eq!(send("LOCK", &url_a, Some(&ours)).status, 200);
    let _ = a.terminate(Duration::from_secs(10));
    wait_until(
        "replica a's lock session to end",
        Duration::from_secs(15),
        || {
            pg.query(
                "select count(*) from pg_stat_activity where application_name = 'wasmstate-lock'",
            ) == "0"
        },
    );
    // Replica b, writing under the lock: refused (503, retried) until its
    // sweep has taken the advisory lock over, then accepted.
    let url_b = b.state_url("pg", "default");
    let under_lock = format!("{url_b}?ID=c0ffee00-0000-4000-8000-000000000003");
    wait_until(
        "a write under the taken-over lock",
        Duration::from_secs(20),
        || {
            let answer = send("POST", &under_lock, Some(&state(2)));
            assert!(matches!(answer.status, 200 | 503), "{}", answer.text());
            answer.status == 200
        },
    );
    let refused = send("LOCK", &url_b, Some(&lock_info("other", "ci@b")));
    assert_eq!(refused.status, 423, "{}", refused.text());
    assert_eq!(refused.json()["Who"], "ci@a");
    assert_eq!(
        pg.query("select count(*) from pg_locks l join pg_stat_activity a using (pid) where l.locktype = 'advisory' and a.application_name = 'wasmstate-lock'"),
        "1"
    );
    assert_eq!(send("UNLOCK", &url_b, Some(&ours)).status, 200);
}

/// A team on Terraform's `backend "pg"` moves onto wasmstate with
/// `terraform init -migrate-state`, and back, losing nothing.
#[test]
fn a_team_moves_from_native_pg_to_wasmstate_and_back() {
    let pg = Postgres::start();
    let data = tempdir();
    let server = server(data.path(), &pg, "wasmstate_side");
    let stored_back = || {
        serde_json::from_str(&pg.query("select data from back_side.states where name = 'default'"))
            .unwrap()
    };
    crate::side_by_side::moves_there_and_back(
        &server.state_url("pg", "moved"),
        &native_block(&pg, "native_side"),
        &native_block(&pg, "back_side"),
        &stored_back,
    );
    assert_eq!(
        pg.query("select count(*) from wasmstate_side.states where name = 'moved'"),
        "1"
    );
}

/// A workspace created empty (as Terraform's pg backend creates one) takes
/// a state of another lineage, as `terraform state push` would: nothing
/// in the empty state is lost.
#[test]
fn a_workspace_created_empty_takes_a_migrated_state() {
    let pg = Postgres::start();
    let data = tempdir();
    let server = server(data.path(), &pg, "terraform_remote_state");
    let created = send("PUT", &format!("{}/workspaces/pg/fresh", server.url), None);
    assert!(created.status / 100 == 2, "{}", created.text());
    let empty: serde_json::Value = serde_json::from_str(
        &pg.query("select data from terraform_remote_state.states where name = 'fresh'"),
    )
    .unwrap();
    assert_eq!(empty["serial"], 1, "{empty}");
    let url = server.state_url("pg", "fresh");
    let mut kept: serde_json::Value = serde_json::from_slice(&state(7)).unwrap();
    kept["outputs"] = serde_json::json!({"x": {"value": "y", "type": "string"}});
    let kept = serde_json::to_vec(&kept).unwrap();
    let pushed = send("POST", &url, Some(&kept));
    assert_eq!(pushed.status, 200, "{}", pushed.text());
    assert_eq!(send("GET", &url, None).body, kept);
    // A state with something in it is not replaced by another lineage.
    let mut other: serde_json::Value = serde_json::from_slice(&state(8)).unwrap();
    other["lineage"] = "another-lineage".into();
    let refused = send("POST", &url, Some(&serde_json::to_vec(&other).unwrap()));
    assert_eq!(refused.status, 409, "{}", refused.text());
}

/// A reload (SIGHUP) keeps the lock session that holds the backend's
/// advisory locks: the same database session holds the key before and
/// after, so there is no moment a native client could take it.
#[test]
fn a_reload_keeps_the_session_that_holds_the_locks() {
    let pg = Postgres::start();
    let data = tempdir();
    let server = server(data.path(), &pg, "terraform_remote_state");
    let url = server.state_url("pg", "default");
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);
    let ours = lock_info("c0ffee00-0000-4000-8000-000000000004", "ci@a");
    assert_eq!(send("LOCK", &url, Some(&ours)).status, 200);
    let holder = || {
        pg.query("select l.pid from pg_locks l join pg_stat_activity a using (pid) where l.locktype = 'advisory' and a.application_name = 'wasmstate-lock'")
    };
    let before = holder();
    assert!(!before.is_empty());
    crate::marketplace::reload(&server, 1);
    // The next request runs on the reloaded backend.
    assert_eq!(send("GET", &url, None).status, 200);
    assert_eq!(holder(), before, "the reload ended the lock session");
    assert_eq!(send("UNLOCK", &url, Some(&ours)).status, 200);
}

/// Terraform through wasmstate, meeting a lock native Terraform holds,
/// reads the 423's holder body (a LockInfo whose `Created` it can parse,
/// though an advisory lock records no time) and says who holds the lock.
#[test]
fn terraform_through_wasmstate_says_who_holds_a_native_lock() {
    use std::io::Write as _;
    let pg = Postgres::start();
    let schema = "terraform_remote_state";
    let data = tempdir();
    let server = server(data.path(), &pg, schema);
    let via = tempdir();
    std::fs::write(
        via.path().join("main.tf"),
        format!("{}{CONFIG}", crate::terraform::HTTP_BACKEND),
    )
    .unwrap();
    crate::terraform::init(via.path(), &server.state_url("pg", "default"), &[]);
    let native = tempdir();
    std::fs::write(
        native.path().join("main.tf"),
        format!("{}{CONFIG}", native_block(&pg, schema)),
    )
    .unwrap();
    ok(native.path(), &["init", "-input=false"]);
    let (mut holder, output) =
        crate::terraform::capture_terraform(native.path(), &["apply", "-var", "value=native"]);
    wait_until(
        "native apply's approval prompt",
        Duration::from_secs(60),
        || output.lock().unwrap().contains("Enter a value:"),
    );
    let blocked = run(via.path(), &["plan", "-input=false", "-lock-timeout=0s"]);
    holder.stdin.take().unwrap().write_all(b"no\n").unwrap();
    holder.wait().unwrap();
    let said = String::from_utf8_lossy(&blocked.stderr);
    assert!(!blocked.status.success(), "{said}");
    assert!(!said.contains("failed to unmarshal"), "{said}");
    // Terraform 1.11 prints the holder's ID (later ones its whole
    // LockInfo): for a native holder, which records none, it says who.
    let said = said.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        said.contains("already locked: ID=none recorded; locked")
            && said.contains("by a Terraform pg backend client (database session"),
        "Terraform did not say who holds the lock: {said}"
    );
}

/// With encryption at rest, a workspace created through the API holds
/// Terraform's plain empty state (as Terraform's pg backend writes one):
/// it reads as a workspace without a state and takes its first write (of
/// any lineage), which is sealed; a plain state that holds anything is
/// still refused.
#[test]
fn a_workspace_created_under_encryption_reads_empty_and_takes_its_first_write() {
    let pg = Postgres::start();
    let data = tempdir();
    let key = key_file(data.path());
    let server = Server::with_config(
        data.path(),
        &format!(
            "[backends.pg]\nguest = \"postgres\"\nencryption = {{ keys = [{{ id = \"k1\", file = {key:?} }}] }}\n\
             [backends.pg.config]\nconn_str = {:?}\nschema_name = \"sealed\"\n",
            pg.conn_str()
        ),
    );
    let created = send("PUT", &format!("{}/workspaces/pg/fresh", server.url), None);
    assert_eq!(created.status, 201, "{}", created.text());
    let stored = || pg.query("select data from sealed.states where name = 'fresh'");
    let empty: serde_json::Value = serde_json::from_str(&stored()).unwrap();
    assert_eq!(
        (&empty["serial"], &empty["resources"]),
        (&serde_json::json!(1), &serde_json::json!([]))
    );
    let url = server.state_url("pg", "fresh");
    // Read as no state (never served or judged: storage could plant one),
    // as a workspace without a state answers.
    let read = send("GET", &url, None);
    let absent = send("GET", &server.state_url("pg", "never-created"), None);
    assert_eq!(read.status, absent.status, "{}", read.text());
    assert_ne!(read.status, 200, "{}", read.text());

    let mut first: serde_json::Value = serde_json::from_slice(&state(7)).unwrap();
    first["outputs"] = serde_json::json!({"pw": {"value": "hunter2", "type": "string"}});
    let first = serde_json::to_vec(&first).unwrap();
    let written = send("POST", &url, Some(&first));
    assert_eq!(written.status, 200, "{}", written.text());
    assert_eq!(send("GET", &url, None).body, first);
    assert!(
        !stored().contains("hunter2"),
        "the first write was not sealed"
    );

    pg.query(
        r#"insert into sealed.states (name, data) values ('planted', '{"version":4,"serial":1,"lineage":"x","outputs":{"pw":{"value":"planted","type":"string"}},"resources":[]}')"#,
    );
    let planted = send("GET", &server.state_url("pg", "planted"), None);
    assert_eq!(planted.status, 500, "{}", planted.text());
    assert!(planted.text().contains("not sealed"), "{}", planted.text());
}

/// A state larger than the guest memory budget is refused (503) before it
/// is fetched: the host's memory does not grow by it.
#[test]
fn a_state_past_the_memory_budget_is_not_fetched() {
    let pg = Postgres::start();
    let data = tempdir();
    let server = Server::with_config(
        data.path(),
        &format!(
            "max_guest_memory_mib = 128\nmax_instances = 4\n[backends.pg]\nguest = \"postgres\"\n[backends.pg.config]\nconn_str = {:?}\n",
            pg.conn_str()
        ),
    );
    let small = server.state_url("pg", "default");
    assert_eq!(send("POST", &small, Some(&state(1))).status, 200);
    pg.query(
        "insert into terraform_remote_state.states (name, data) values ('big', repeat('x', 256 * 1024 * 1024))",
    );
    reset_peak_rss(server.pid());
    let before = peak_rss_kib(server.pid());
    let big = send("GET", &server.state_url("pg", "big"), None);
    let grown_mib = (peak_rss_kib(server.pid()) - before) / 1024;
    assert!(
        grown_mib < 96,
        "the host fetched the state past its budget: its peak grew by {grown_mib} MiB ({} {})",
        big.status,
        big.text()
    );
    assert_eq!(big.status, 503, "{}", big.text());
    assert!(big.text().contains("memory budget"), "{}", big.text());
    assert_eq!(send("GET", &small, None).body, state(1));
}
