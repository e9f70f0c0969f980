//! The `postgres` guest's locks while rows come and go: whenever wasmstate
//! holds a lock on a workspace, Terraform's own `backend "pg"` cannot take
//! it, whatever rows are deleted or written meanwhile, whichever replica
//! deletes them, and across a reload that changes the connection string.
//!
//! Terraform's pg client (`internal/backend/remote-state/pg/client.go`)
//! locks a workspace with `SELECT id, pg_try_advisory_lock(id),
//! pg_try_advisory_lock(-1) FROM states WHERE name = $1`, and, finding no
//! row, with `pg_try_advisory_lock(-1)` alone, which it keeps.

use crate::common::*;
use crate::terraform::{CONFIG, ok, run};
use std::path::Path;
use std::time::Duration;

const SCHEMA: &str = "terraform_remote_state";

/// A wasmstate config serving backend `pg` on `conn_str`'s database.
fn config(conn_str: &str, schema: &str) -> String {
    format!(
        "[backends.pg]\nguest = \"postgres\"\n[backends.pg.config]\nconn_str = {conn_str:?}\nschema_name = {schema:?}\n"
    )
}

fn server(data: &Path, pg: &Postgres, schema: &str) -> Server {
    Server::with_config(data, &config(&pg.conn_str(), schema))
}

/// A directory where native Terraform (`backend "pg"`) is initialised on
/// `schema`.
fn native(pg: &Postgres, schema: &str) -> tempfile::TempDir {
    let dir = tempdir();
    std::fs::write(
        dir.path().join("main.tf"),
        format!(
            "terraform {{\n  backend \"pg\" {{\n    conn_str    = {:?}\n    schema_name = {schema:?}\n  }}\n}}\n{CONFIG}",
            pg.conn_str()
        ),
    )
    .unwrap();
    ok(dir.path(), &["init", "-input=false"]);
    dir
}

/// Native Terraform's plan of `default` cannot take the lock.
fn assert_native_blocked(dir: &Path, when: &str) {
    let plan = run(dir, &["plan", "-input=false", "-lock-timeout=0s"]);
    let said = String::from_utf8_lossy(&plan.stderr);
    assert!(
        !plan.status.success() && said.contains("Error acquiring the state lock"),
        "native Terraform took the lock wasmstate holds, {when}: {said}"
    );
}

/// Native Terraform's plan of `default` runs (the lock is free).
fn assert_native_runs(dir: &Path) {
    let plan = run(dir, &["plan", "-input=false", "-lock-timeout=0s"]);
    assert!(
        plan.status.success(),
        "{}",
        String::from_utf8_lossy(&plan.stderr)
    );
}

fn no_advisory_locks(pg: &Postgres) -> bool {
    pg.query("select count(*) from pg_locks where locktype = 'advisory'") == "0"
}

/// An admin deletes the state under the lock (through the other replica),
/// then the lock's holder writes again (a row with a new id): native
/// Terraform stays out all along, and gets in after the unlock.
#[test]
fn a_lock_stays_held_when_its_state_is_deleted_and_written_again() {
    let pg = Postgres::start();
    let (a_dir, b_dir) = (tempdir(), tempdir());
    let (a, b) = (
        server(a_dir.path(), &pg, SCHEMA),
        server(b_dir.path(), &pg, SCHEMA),
    );
    let (url_a, url_b) = (a.state_url("pg", "default"), b.state_url("pg", "default"));
    assert_eq!(send("POST", &url_a, Some(&state(1))).status, 200);
    let id = "c0ffee00-0000-4000-8000-000000000011";
    let ours = lock_info(id, "ci@a");
    assert_eq!(send("LOCK", &url_a, Some(&ours)).status, 200);
    let native = native(&pg, SCHEMA);
    assert_native_blocked(native.path(), "while the state's row is there");

    let deleted = send("DELETE", &format!("{url_b}?ID={id}"), None);
    assert_eq!(deleted.status, 200, "{}", deleted.text());
    let rows = format!("select count(*) from {SCHEMA}.states where name = 'default'");
    assert_eq!(pg.query(&rows), "0");
    assert_native_blocked(native.path(), "after its row was deleted");

    let written = send("POST", &format!("{url_a}?ID={id}"), Some(&state(1)));
    assert_eq!(written.status, 200, "{}", written.text());
    assert_eq!(pg.query(&rows), "1");
    assert_native_blocked(native.path(), "after a row with a new id was written");
    // Still wasmstate's lock, as every replica reports it.
    let refused = send("LOCK", &url_b, Some(&lock_info("other", "ci@b")));
    assert_eq!(refused.status, 423, "{}", refused.text());
    assert_eq!(refused.json()["Who"], "ci@a");

    assert_eq!(send("UNLOCK", &url_a, Some(&ours)).status, 200);
    wait_until(
        "the replicas' sweeps to release the lock's keys",
        Duration::from_secs(15),
        || no_advisory_locks(&pg),
    );
    assert_native_runs(native.path());
}

/// Whether Terraform's pg client could lock workspace `name` now: its own
/// statements, in a session of their own (ended at once, so whatever it
/// took is released).
fn native_could_lock(pg: &Postgres, schema: &str, name: &str) -> bool {
    pg.query(&format!(
        "select coalesce((select pg_try_advisory_lock(id) and pg_try_advisory_lock(-1) \
         from {schema}.states where name = '{name}'), pg_try_advisory_lock(-1))"
    )) == "t"
}

/// Replica b deletes a workspace (`delete_workspace`) after replica a
/// looked up its row's id to lock it and before a took that key: a takes
/// the key a native client would try now (-1), not the deleted row's id.
///
/// The interleaving is made, not hoped for: replica a connects as a role
/// under a row-level security policy that makes its lock session's lookup
/// of a row sleep while a gate row exists (its snapshot is taken before the
/// sleep, so it sees the row b deletes meanwhile).
#[test]
fn a_workspace_deleted_between_a_locks_lookup_and_its_key_is_locked_as_it_is_now() {
    let pg = Postgres::start();
    let schema = "raced";
    let (a_dir, b_dir) = (tempdir(), tempdir());
    let b = server(b_dir.path(), &pg, schema);
    assert_eq!(
        send("POST", &b.state_url("pg", "team"), Some(&state(1))).status,
        200
    );
    pg.query(&format!(
        "create role locker login in role pg_read_all_stats;
         grant usage, create on schema {schema} to locker;
         grant all on all tables in schema {schema} to locker;
         grant usage, select on sequence public.global_states_id_seq to locker;
         create table public.gate (closed boolean);
         grant select on public.gate to locker;
         create function public.pause() returns boolean language plpgsql as $$
         begin
           if current_setting('application_name') = 'wasmstate-lock'
              and exists (select 1 from public.gate) then
             perform pg_sleep(3);
           end if;
           return true;
         end $$;
         alter table {schema}.states enable row level security;
         create policy slow on {schema}.states using (public.pause());"
    ));
    let as_locker = format!(
        "postgres://locker@127.0.0.1:{}/postgres?sslmode=disable",
        pg.port
    );
    let a = Server::with_config(a_dir.path(), &config(&as_locker, schema));
    let url_a = a.state_url("pg", "team");
    assert_eq!(send("GET", &url_a, None).status, 200, "replica a reads");

    pg.query("insert into public.gate values (true)");
    let id = "c0ffee00-0000-4000-8000-000000000012";
    let ours = lock_info(id, "ci@a");
    let locking = {
        let (url, body) = (url_a.clone(), ours.clone());
        std::thread::spawn(move || send("LOCK", &url, Some(&body)))
    };
    wait_until(
        "replica a's lock session to be looking the row up",
        Duration::from_secs(20),
        || {
            pg.query(
                "select count(*) from pg_stat_activity where application_name = 'wasmstate-lock' and wait_event = 'PgSleep'",
            ) == "1"
        },
    );
    let deleted = send("DELETE", &format!("{}/workspaces/pg/team", b.url), None);
    assert_eq!(deleted.status, 200, "{}", deleted.text());
    pg.query("delete from public.gate");
    let locked = locking.join().unwrap();
    assert_eq!(locked.status, 200, "{}", locked.text());

    assert!(
        !native_could_lock(&pg, schema, "team"),
        "a native client could lock the workspace wasmstate holds"
    );
    assert_eq!(
        pg.query(&format!(
            "select key from {schema}.wasmstate_locks where name = 'team'"
        )),
        "-1"
    );
    assert_eq!(send("UNLOCK", &url_a, Some(&ours)).status, 200);
    assert!(native_could_lock(&pg, schema, "team"));
}

/// A reload (SIGHUP) that changes `conn_str` (the same database, as a
/// rotated password would leave it) keeps the locks held: the replaced
/// store's session holds them, no request needed, until each is released.
#[test]
fn a_reload_that_changes_conn_str_keeps_the_locks_held() {
    let pg = Postgres::start();
    let data = tempdir();
    let server = server(data.path(), &pg, SCHEMA);
    let url = server.state_url("pg", "default");
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);
    let ours = lock_info("c0ffee00-0000-4000-8000-000000000013", "ci@a");
    assert_eq!(send("LOCK", &url, Some(&ours)).status, 200);
    let holder = || {
        pg.query("select l.pid from pg_locks l join pg_stat_activity a using (pid) where l.locktype = 'advisory' and a.application_name = 'wasmstate-lock'")
    };
    let before = holder();
    assert!(!before.is_empty());
    let native = native(&pg, SCHEMA);

    let rotated = format!("{}&keepalives_idle=120", pg.conn_str());
    std::fs::write(data.path().join("wasmstate.toml"), config(&rotated, SCHEMA)).unwrap();
    crate::marketplace::reload(&server, 1);
    // No request since the reload: nothing has used the new store yet.
    assert_native_blocked(native.path(), "after a reload that changed conn_str");
    assert_eq!(holder(), before, "the lock's key changed hands");

    // Released through the new store; the replaced session lets go.
    assert_eq!(send("UNLOCK", &url, Some(&ours)).status, 200);
    wait_until(
        "the replaced session to release the key",
        Duration::from_secs(15),
        || no_advisory_locks(&pg),
    );
    assert_native_runs(native.path());
    // The new store locks as before.
    assert_eq!(send("LOCK", &url, Some(&ours)).status, 200);
    assert_native_blocked(native.path(), "under a lock taken after the reload");
    assert_eq!(send("UNLOCK", &url, Some(&ours)).status, 200);
}

/// A delete under a lock (`DELETE ?ID=`) cut by the request's deadline
/// while its lock session's `pg_try_advisory_lock(-1)` is on the wire
/// leaves no key held after the unlock: the delete runs to completion in a
/// task of its own (a dropped statement would have left the server
/// granting -1 to a session that never recorded it, refusing every native
/// lock and every unlocked write in the database until the replica
/// restarts). The slow statement is made, not hoped for: the server's role
/// finds a `pg_try_advisory_lock` that sleeps before taking -1 first on its
/// search path while a gate row exists. (Reviewer's probe of issue 47.)
#[test]
fn a_delete_under_a_lock_cut_by_its_deadline_leaves_no_key_held() {
    let pg = Postgres::start();
    let data = tempdir();
    pg.query(
        "create role slowlock login superuser;
         create table public.gate (closed boolean);
         create schema slow;
         create function slow.pg_try_advisory_lock(k bigint) returns boolean language plpgsql as $$
         begin
           if k = -1 and current_setting('application_name') = 'wasmstate-lock'
              and exists (select 1 from public.gate) then
             perform pg_catalog.pg_sleep(4);
           end if;
           return pg_catalog.pg_try_advisory_lock(k);
         end $$;
         alter role slowlock set search_path = slow, pg_catalog, public;",
    );
    let conn = format!(
        "postgres://slowlock@127.0.0.1:{}/postgres?sslmode=disable",
        pg.port
    );
    let server = Server::with_config(
        data.path(),
        &format!(
            "[backends.pg]\nguest = \"postgres\"\ntimeout_ms = 2000\n[backends.pg.config]\nconn_str = {conn:?}\n"
        ),
    );
    let url = server.state_url("pg", "team");
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);
    let id = "c0ffee00-0000-4000-8000-0000000000d1";
    let ours = lock_info(id, "ci@review");
    assert_eq!(send("LOCK", &url, Some(&ours)).status, 200);

    pg.query("insert into public.gate values (true)");
    let deleted = send("DELETE", &format!("{url}?ID={id}"), None);
    pg.query("delete from public.gate");
    wait_until(
        "the lock session's slow statement to end",
        Duration::from_secs(20),
        || {
            pg.query(
                "select count(*) from pg_stat_activity where application_name = 'wasmstate-lock' and wait_event = 'PgSleep'",
            ) == "0"
        },
    );
    let unlocked = send("UNLOCK", &url, Some(&ours));
    assert_eq!(unlocked.status, 200, "{}", unlocked.text());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let held = || {
        pg.query(
            "select string_agg(format('%s/%s by %s', l.classid, l.objid, a.application_name), ', ') \
             from pg_locks l join pg_stat_activity a on a.pid = l.pid where l.locktype = 'advisory'",
        )
    };
    while !held().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        held().is_empty(),
        "the delete (answered {} {}) was cut by its deadline; after the unlock, advisory locks are \
         still held: {} (-1 is 4294967295/4294967295; no native client can lock any workspace)",
        deleted.status,
        deleted.text(),
        held()
    );
}

/// A write without a lock (with `allow_force_push`, the host takes no
/// lock for it) holds its workspace's advisory keys for its
/// transaction: a lock asked for meanwhile through another replica is
/// refused as held by that write (retry), not by "a Terraform pg backend
/// client", which is not there. The write is held up, not hoped for: a
/// trigger sleeps in the replica's write connection while a gate row
/// exists.
#[test]
fn a_lock_refused_by_a_write_in_flight_names_the_write() {
    let pg = Postgres::start();
    let (a_dir, b_dir) = (tempdir(), tempdir());
    let forced = config(&pg.conn_str(), SCHEMA).replace(
        "guest = \"postgres\"\n",
        "guest = \"postgres\"\nallow_force_push = true\n",
    );
    let (a, b) = (
        Server::with_config(a_dir.path(), &forced),
        server(b_dir.path(), &pg, SCHEMA),
    );
    let url = a.state_url("pg", "default");
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);
    pg.query(&format!(
        "create table public.gate (closed boolean);
         create function public.pause() returns trigger language plpgsql as $$
         begin
           if current_setting('application_name') = 'wasmstate'
              and exists (select 1 from public.gate) then
             perform pg_sleep(3);
           end if;
           return new;
         end $$;
         create trigger slow before update on {SCHEMA}.states
           for each row execute function public.pause();
         insert into public.gate values (true);"
    ));
    let writing = {
        let url = url.clone();
        std::thread::spawn(move || send("POST", &url, Some(&state(2))))
    };
    wait_until(
        "the write to hold its keys",
        Duration::from_secs(20),
        || {
            pg.query(
                "select count(*) from pg_stat_activity where application_name = 'wasmstate' and wait_event = 'PgSleep'",
            ) == "1"
        },
    );
    let refused = send(
        "LOCK",
        &b.state_url("pg", "default"),
        Some(&lock_info("c0ffee00-0000-4000-8000-000000000014", "ci@a")),
    );
    pg.query("delete from public.gate");
    assert_eq!(writing.join().unwrap().status, 200);
    assert_eq!(refused.status, 423, "{}", refused.text());
    let said = refused.text();
    assert!(
        said.contains("a write through a wasmstate replica")
            && !said.contains("Terraform pg backend client"),
        "the holder of a write's keys is misnamed: {said}"
    );
}

/// A reload that gives the backend another schema while a lock is held:
/// no unlock through the new store can reach the old table's rows, so
/// the replaced store's session lets its keys go at once (it would hold
/// them until the replica restarts) and the log names the locks left.
#[test]
fn a_reload_to_another_schema_lets_the_old_keys_go_and_names_the_locks_left() {
    let pg = Postgres::start();
    let data = tempdir();
    let server = server(data.path(), &pg, SCHEMA);
    let url = server.state_url("pg", "default");
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);
    let ours = lock_info("c0ffee00-0000-4000-8000-000000000015", "ci@a");
    assert_eq!(send("LOCK", &url, Some(&ours)).status, 200);
    assert!(!no_advisory_locks(&pg));

    std::fs::write(
        data.path().join("wasmstate.toml"),
        config(&pg.conn_str(), "moved"),
    )
    .unwrap();
    crate::marketplace::reload(&server, 1);
    wait_until(
        "the replaced store's session to let its keys go",
        Duration::from_secs(15),
        || no_advisory_locks(&pg),
    );
    wait_until(
        "the log to name the lock left",
        Duration::from_secs(5),
        || server.log_text().contains("another database or schema"),
    );
    let log = server.log_text();
    assert!(
        log.contains(SCHEMA) && log.contains("wasmstate_locks (default)"),
        "{log}"
    );
    // The new schema's workspace locks as any.
    assert_eq!(send("LOCK", &url, Some(&ours)).status, 200);
    assert!(!no_advisory_locks(&pg));
}
