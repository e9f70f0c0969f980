//! The `postgres` guest's history, kept in the database beside Terraform's
//! `states` (`wasmstate_state_versions`), written in each change's own
//! transaction: every replica lists, diffs and restores the same versions,
//! refuses the same rollback, the table holds at most `history` versions of
//! a workspace, a refused write leaves none, and Terraform's own
//! `backend "pg"` works on the same database as before.

use crate::common::*;
use crate::terraform::{CONFIG, ok};
use std::path::Path;

const SCHEMA: &str = "terraform_remote_state";

/// A host serving `pg` on `pg`'s database, with `extra` backend lines.
fn host(data: &Path, pg: &Postgres, extra: &str) -> Server {
    let server = Server::with_config(
        data,
        &format!(
            "[backends.pg]\nguest = \"postgres\"\n{extra}[backends.pg.config]\nconn_str = {:?}\nschema_name = {SCHEMA:?}\n",
            pg.conn_str()
        ),
    );
    // Who keeps the history is known once the probe at start has run; a
    // write before it would be copied into the host's own folder too.
    wait_until(
        "the history probe's log line",
        std::time::Duration::from_secs(60),
        || server.log_text().contains("version history"),
    );
    server
}

/// A state with one output, so two versions have a diff.
fn state_by(serial: u64, lineage: &str, who: &str) -> Vec<u8> {
    format!(
        r#"{{"version":4,"terraform_version":"1.11.4","serial":{serial},"lineage":"{lineage}","outputs":{{"who":{{"value":"{who}","type":"string"}}}},"resources":[]}}"#
    )
    .into_bytes()
}

/// `(id, serial)` of each version `server` lists for `ws`, and where it
/// says they come from.
fn listed(server: &Server, ws: &str) -> (Vec<(String, u64)>, String) {
    let answer = send(
        "GET",
        &format!("{}/versions", server.state_url("pg", ws)),
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

/// Rows of the versions table for `ws`: `serial|bytes`, newest first.
fn rows(pg: &Postgres, ws: &str) -> Vec<String> {
    let out = pg.query(&format!(
        "select coalesce(serial::text, '-') || '|' || bytes from {SCHEMA}.wasmstate_state_versions where name = '{ws}' order by id desc"
    ));
    out.lines().map(str::to_string).collect()
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

#[test]
fn every_replica_lists_diffs_and_restores_the_same_postgres_versions() {
    let pg = Postgres::start();
    let (a_dir, b_dir) = (tempdir(), tempdir());
    let a = host(a_dir.path(), &pg, "");
    let b = host(b_dir.path(), &pg, "");
    assert!(
        b.log_text().contains("kept by the storage itself"),
        "{}",
        b.log_text()
    );
    let url_a = a.state_url("pg", "default");
    for (serial, who) in [(1, "first"), (2, "second")] {
        let sent = send("POST", &url_a, Some(&state_by(serial, "L", who)));
        assert_eq!(sent.status, 200, "{}", sent.text());
    }
    // Through B, which wrote nothing: A's versions, newest first.
    let (versions, source) = listed(&b, "default");
    assert_eq!(source, "storage");
    let serials: Vec<u64> = versions.iter().map(|(_, s)| *s).collect();
    assert_eq!(serials, [2, 1], "{versions:?}");
    assert_eq!(listed(&a, "default").0, versions, "both list the same");
    assert_eq!(rows(&pg, "default").len(), 2);
    for dir in [&a_dir, &b_dir] {
        assert_eq!(files_under(&dir.path().join("history")), 0, "no copy");
    }
    let (newest, oldest) = (&versions[0].0, &versions[1].0);
    let url_b = b.state_url("pg", "default");
    let read = send("GET", &format!("{url_b}/versions/{oldest}"), None);
    assert_eq!(read.body, state_by(1, "L", "first"), "byte-exact");
    let unknown = send("GET", &format!("{url_b}/versions/999999"), None);
    assert_eq!(unknown.status, 404, "{}", unknown.text());
    let diff = send(
        "GET",
        &format!(
            "{}/ui/api/backends/pg/default/diff?from={oldest}&to={newest}",
            b.url
        ),
        None,
    );
    assert_eq!(diff.status, 200, "{}", diff.text());
    assert_eq!(diff.json()["outputs_changed"], serde_json::json!(["who"]));

    // Restored through B: serial 3 with the first outputs, seen through A,
    // and itself a version both list.
    let (ok, out) = wasmstate(&[
        "state", "restore", "default", oldest, "-b", "pg", "--server", &b.url,
    ]);
    assert!(ok && out.contains("as serial 3"), "{out}");
    let current = send("GET", &url_a, None).json();
    assert_eq!(
        (
            current["serial"].as_u64(),
            &current["outputs"]["who"]["value"]
        ),
        (Some(3), &serde_json::json!("first"))
    );
    let (after, _) = listed(&a, "default");
    assert_eq!(after.len(), 3, "{after:?}");
    assert_eq!(&after[1..], &versions[..]);

    // A delete keeps the versions and marks itself (0 bytes, listed to no
    // one); a second delete of nothing marks nothing.
    assert_eq!(send("DELETE", &url_a, None).status, 200);
    let _ = send("DELETE", &url_b, None);
    let marked = rows(&pg, "default");
    assert_eq!(marked.len(), 4, "{marked:?}");
    assert_eq!(marked[0], "-|0", "{marked:?}");
    assert!(marked[1].starts_with("3|"), "{marked:?}");
    assert_eq!(listed(&b, "default").0, after);
}

#[test]
fn the_table_keeps_history_versions_and_none_of_a_refused_write() {
    let pg = Postgres::start();
    let data = tempdir();
    let server = host(data.path(), &pg, "history = 3\n");
    let url = server.state_url("pg", "prod");
    for serial in 1..=5 {
        let sent = send("POST", &url, Some(&state_by(serial, "L", "x")));
        assert_eq!(sent.status, 200, "{}", sent.text());
    }
    let kept: Vec<String> = rows(&pg, "prod")
        .iter()
        .map(|r| r.split('|').next().unwrap().to_string())
        .collect();
    assert_eq!(kept, ["5", "4", "3"], "the newest `history` of them");
    assert_eq!(
        listed(&server, "prod").0.len(),
        3,
        "listed as the table holds"
    );

    // Refused writes: under another's lock, with a lock id nobody holds,
    // and stale (an older serial of the lineage) leave no version.
    let holder = lock_info("c0ffee00-0000-4000-8000-0000000000a1", "ci@a");
    assert_eq!(send("LOCK", &url, Some(&holder)).status, 200);
    let held = send("POST", &url, Some(&state_by(6, "L", "intruder")));
    assert_eq!(held.status / 100, 4, "{}", held.text());
    let wrong = send(
        "POST",
        &format!("{url}?ID=c0ffee00-0000-4000-8000-0000000000ff"),
        Some(&state_by(6, "L", "wrong id")),
    );
    assert_eq!(wrong.status / 100, 4, "{}", wrong.text());
    assert_eq!(send("UNLOCK", &url, Some(&holder)).status, 200);
    let stale = send("POST", &url, Some(&state_by(2, "L", "stale")));
    assert_eq!(stale.status, 409, "{}", stale.text());
    let not_locked = send(
        "POST",
        &format!("{url}?ID=c0ffee00-0000-4000-8000-0000000000a1"),
        Some(&state_by(6, "L", "after unlock")),
    );
    assert_eq!(not_locked.status / 100, 4, "{}", not_locked.text());
    let n = state_by(5, "L", "x").len();
    assert_eq!(rows(&pg, "prod"), [5, 4, 3].map(|s| format!("{s}|{n}")));
    assert_eq!(send("GET", &url, None).body, state_by(5, "L", "x"));
}

/// With encryption on, the versions are the sealed envelopes storage
/// holds; an older envelope put back in `states` is refused by every
/// replica, one that never served the workspace included; a state deleted
/// and pushed again is a new life everywhere.
#[test]
fn every_replica_refuses_the_same_rollback_on_postgres() {
    let pg = Postgres::start();
    let keys = tempdir();
    let key = key_file(keys.path());
    let sealed = format!("encryption = {{ keys = [{{ id = \"k1\", file = {key:?} }}] }}\n");
    let (a_dir, b_dir, c_dir) = (tempdir(), tempdir(), tempdir());
    let a = host(a_dir.path(), &pg, &sealed);
    let b = host(b_dir.path(), &pg, &sealed);
    let url_a = a.state_url("pg", "default");
    for serial in [1, 2] {
        let sent = send("POST", &url_a, Some(&state_by(serial, "L", "secret-a")));
        assert_eq!(sent.status, 200, "{}", sent.text());
    }
    assert_eq!(
        send("GET", &b.state_url("pg", "default"), None).json()["serial"],
        2
    );
    // The history holds what storage holds: envelopes, no clear text.
    let kept = pg.query(&format!(
        "select string_agg(data, '') from {SCHEMA}.wasmstate_state_versions"
    ));
    assert!(
        kept.contains("wasmstate_encrypted") && !kept.contains("secret-a"),
        "{kept}"
    );

    // Serial 1's envelope put back behind every server's back.
    pg.query(&format!(
        "update {SCHEMA}.states set data = (select data from {SCHEMA}.wasmstate_state_versions where name = 'default' and serial = 1) where name = 'default'"
    ));
    let c = host(c_dir.path(), &pg, &sealed);
    for (who, server) in [("writer", &a), ("reader", &b), ("fresh replica", &c)] {
        let read = send("GET", &server.state_url("pg", "default"), None);
        assert_eq!(
            read.status,
            500,
            "{who} served the rollback: {}",
            read.text()
        );
        assert!(read.text().contains("rollback"), "{who}: {}", read.text());
    }

    // Deleted and pushed again at a lower serial: a new life, served by
    // every replica, including one that never saw the workspace.
    assert_eq!(send("DELETE", &url_a, None).status, 200);
    let pushed = send("POST", &url_a, Some(&state_by(1, "L", "again")));
    assert_eq!(pushed.status, 200, "{}", pushed.text());
    let d_dir = tempdir();
    let d = host(d_dir.path(), &pg, &sealed);
    for (who, server) in [("A", &a), ("B", &b), ("C", &c), ("new", &d)] {
        let read = send("GET", &server.state_url("pg", "default"), None);
        assert_eq!(read.status, 200, "{who}: {}", read.text());
        assert_eq!(read.json()["outputs"]["who"]["value"], "again", "{who}");
    }
}

/// Terraform's own `backend "pg"` on a database whose schema holds the
/// versions table (with versions in it): init, apply and state pull work
/// as before, and never touch it.
#[test]
fn native_pg_works_beside_the_versions_table() {
    let pg = Postgres::start();
    let data = tempdir();
    let server = host(data.path(), &pg, "");
    let url = server.state_url("pg", "default");
    assert_eq!(
        send("POST", &url, Some(&state_by(1, "L", "wasmstate"))).status,
        200
    );
    let before = rows(&pg, "default");
    assert_eq!(before.len(), 1);
    let native = tempdir();
    std::fs::write(
        native.path().join("main.tf"),
        format!(
            "terraform {{\n  backend \"pg\" {{\n    conn_str    = {:?}\n    schema_name = {SCHEMA:?}\n  }}\n}}\n{CONFIG}",
            pg.conn_str()
        ),
    )
    .unwrap();
    ok(native.path(), &["init", "-input=false"]);
    ok(
        native.path(),
        &[
            "apply",
            "-auto-approve",
            "-input=false",
            "-var",
            "value=native",
        ],
    );
    let pull = crate::terraform::run(native.path(), &["state", "pull"]);
    assert!(
        pull.status.success(),
        "{}",
        String::from_utf8_lossy(&pull.stderr)
    );
    let pulled: serde_json::Value = serde_json::from_slice(&pull.stdout).unwrap();
    assert_eq!(pulled["outputs"]["value"]["value"], "native", "{pulled}");
    assert_eq!(rows(&pg, "default"), before, "native Terraform wrote none");
    // wasmstate serves what native Terraform wrote.
    let served = send("GET", &url, None).json();
    assert_eq!(served["serial"], pulled["serial"]);
}

/// A role that may not create the versions table, on a database where no
/// one made it (a deployment from before it): each replica keeps the
/// versions in its own folder from the very first write, and says so at
/// start. Before, the probe at start found no table, said "kept by the
/// storage itself", and the writes then kept no version anywhere.
#[test]
fn a_role_that_may_not_make_the_table_keeps_versions_per_replica() {
    let pg = Postgres::start();
    pg.query(&format!(
        "create schema {SCHEMA};
         create sequence public.global_states_id_seq as bigint;
         create table {SCHEMA}.states (
             id bigint not null default nextval('public.global_states_id_seq') primary key,
             name text unique, data text);
         create unique index states_by_name on {SCHEMA}.states (name);
         create table {SCHEMA}.wasmstate_locks (
             name text primary key, key bigint not null, info jsonb not null,
             holder text not null, created timestamptz not null default now());
         create role limited login;
         grant usage on schema {SCHEMA} to limited;
         grant select, insert, update, delete on all tables in schema {SCHEMA} to limited;
         grant usage on sequence public.global_states_id_seq to limited;"
    ));
    let conn = pg.conn_str().replace("wasmstate@", "limited@");
    let data = tempdir();
    let server = Server::with_config(
        data.path(),
        &format!(
            "[backends.pg]\nguest = \"postgres\"\n[backends.pg.config]\nconn_str = {conn:?}\nschema_name = {SCHEMA:?}\n"
        ),
    );
    wait_until(
        "the history probe's log line",
        std::time::Duration::from_secs(60),
        || server.log_text().contains("version history"),
    );
    assert!(
        !server.log_text().contains("kept by the storage itself"),
        "{}",
        server.log_text()
    );
    let url = server.state_url("pg", "default");
    for serial in [1, 2] {
        let sent = send("POST", &url, Some(&state_by(serial, "L", "limited")));
        assert_eq!(sent.status, 200, "{}", sent.text());
    }
    let (versions, source) = listed(&server, "default");
    assert_eq!(source, "replica");
    let serials: Vec<u64> = versions.iter().map(|(_, s)| *s).collect();
    assert_eq!(serials, [2, 1], "every write kept, here");
    assert_eq!(
        pg.query(&format!(
            "select to_regclass('{SCHEMA}.wasmstate_state_versions') is null"
        )),
        "t",
        "nothing made by a role that may not"
    );
}

/// Two replicas writing the same workspace at once, sealed: the versions
/// table's order (a sequence) is the commit order, because each version is
/// taken under the row lock of its write. So the newest version is what
/// `states` holds, and every replica, a fresh one included, serves it (no
/// verdict of "rollback" from a list ordered otherwise). A version id of
/// one workspace read as another's is not served.
#[test]
fn concurrent_writes_through_two_replicas_list_in_commit_order() {
    let pg = Postgres::start();
    let keys = tempdir();
    let key = key_file(keys.path());
    let sealed =
        format!("history = 100\nencryption = {{ keys = [{{ id = \"k1\", file = {key:?} }}] }}\n");
    let (a_dir, b_dir, c_dir) = (tempdir(), tempdir(), tempdir());
    let a = host(a_dir.path(), &pg, &sealed);
    let b = host(b_dir.path(), &pg, &sealed);
    let urls = [a.state_url("pg", "default"), b.state_url("pg", "default")];
    // The row made first: two creations at once are refused as
    // Terraform's creation key is (423, retry), which is not the point here.
    let first = send("POST", &urls[0], Some(&state_by(1, "L", "first")));
    assert_eq!(first.status, 200, "{}", first.text());
    std::thread::scope(|scope| {
        for (n, url) in urls.iter().enumerate() {
            scope.spawn(move || {
                // Serials interleave: a writes odd ones, b even ones; the
                // stale-write guard may refuse some (409), never more.
                for round in 0..15u64 {
                    let serial = 2 * round + 2 + n as u64;
                    let sent = send("POST", url, Some(&state_by(serial, "L", "race")));
                    assert!(
                        sent.status == 200 || sent.status == 409,
                        "{}: {}",
                        sent.status,
                        sent.text()
                    );
                }
            });
        }
    });
    let same = pg.query(&format!(
        "select (select data from {SCHEMA}.states where name = 'default') =
                (select data from {SCHEMA}.wasmstate_state_versions where name = 'default'
                 order by id desc limit 1)"
    ));
    assert_eq!(same, "t", "the newest version is the state committed last");
    let c = host(c_dir.path(), &pg, &sealed);
    let newest = listed(&c, "default").0[0].1;
    for (who, server) in [("a", &a), ("b", &b), ("fresh", &c)] {
        let read = send("GET", &server.state_url("pg", "default"), None);
        assert_eq!(read.status, 200, "{who}: {}", read.text());
        assert_eq!(read.json()["serial"], newest, "{who}");
    }

    // Another workspace asked for default's version: not served.
    let other = c.state_url("pg", "other");
    let sent = send("POST", &other, Some(&state_by(1, "M", "other")));
    assert_eq!(sent.status, 200, "{}", sent.text());
    let id = &listed(&c, "default").0[0].0;
    let crossed = send("GET", &format!("{other}/versions/{id}"), None);
    assert_eq!(crossed.status, 404, "{}", crossed.text());
}

/// The versions table made beforehand by another role, as operating.md
/// says, but not yet granted to the serving role: a write is refused
/// whole (the state is as it was) with the grant to make; once granted as
/// the docs say, writes keep their versions.
#[test]
fn a_versions_table_not_granted_refuses_the_write_whole_and_says_what_to_grant() {
    let pg = Postgres::start();
    {
        // Made by the owner (who may), serial 1 written through it.
        let data = tempdir();
        let owner = host(data.path(), &pg, "");
        let url = owner.state_url("pg", "default");
        let sent = send("POST", &url, Some(&state_by(1, "L", "before")));
        assert_eq!(sent.status, 200, "{}", sent.text());
    }
    pg.query(&format!(
        "create role limited login;
         grant usage on schema {SCHEMA} to limited;
         grant select, insert, update, delete on {SCHEMA}.states, {SCHEMA}.wasmstate_locks to limited;
         grant usage on sequence public.global_states_id_seq to limited;"
    ));
    let conn = pg.conn_str().replace("wasmstate@", "limited@");
    let data = tempdir();
    let server = Server::with_config(
        data.path(),
        &format!(
            "[backends.pg]\nguest = \"postgres\"\n[backends.pg.config]\nconn_str = {conn:?}\nschema_name = {SCHEMA:?}\n"
        ),
    );
    let url = server.state_url("pg", "default");
    let refused = send("POST", &url, Some(&state_by(2, "L", "after")));
    assert_eq!(refused.status / 100, 5, "{}", refused.text());
    assert!(
        refused.text().contains("grant") && refused.text().contains("USAGE on its id sequence"),
        "{}",
        refused.text()
    );
    let current = send("GET", &url, None).json();
    assert_eq!(
        current["outputs"]["who"]["value"], "before",
        "nothing written"
    );
    assert_eq!(rows(&pg, "default").len(), 1);

    pg.query(&format!(
        "grant select, insert, update, delete on {SCHEMA}.wasmstate_state_versions to limited;
         grant usage on sequence {SCHEMA}.wasmstate_state_versions_id_seq to limited;"
    ));
    let sent = send("POST", &url, Some(&state_by(2, "L", "after")));
    assert_eq!(sent.status, 200, "{}", sent.text());
    assert_eq!(rows(&pg, "default").len(), 2);
}
