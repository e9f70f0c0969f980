//! Contract 0.3.0 on the `postgres` guest, against a real PostgreSQL: the
//! head from one statement (size and md5 computed by the database, the
//! first bytes decoded as a read decodes them), writes conditional on the
//! row's version (`xmin`) checked in the write's own transaction, and
//! workspace metadata in `<schema>.wasmstate_workspace_metadata`, removed
//! with its workspace. The guest is loaded as `serve` loads it (the kit's
//! pipeline) and called through the host's `Storage` trait; two loads are
//! two replicas (each its own engine, pool and lock session).

use crate::common::*;
use crate::terraform::{CONFIG, ok};
use md5::{Digest, Md5};
use std::sync::{Arc, Barrier};
use wasmstate::backend::{Expect, Head, Metadata, Storage, StorageError};
use wasmstate::config::Limits;
use wasmstate::conformance::{GuestUnderTest, LoadedGuest, load_guest};
use wasmstate::guests::GuestSource;

const SCHEMA: &str = "terraform_remote_state";

/// A guest loaded as `serve` loads it, with its runtime.
pub struct Loaded {
    pub loaded: LoadedGuest,
    pub rt: tokio::runtime::Runtime,
}

impl Loaded {
    /// The embedded guest `name` with `config`.
    pub fn load(name: &'static str, config: Vec<(String, String)>) -> Loaded {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let loaded = rt
            .block_on(load_guest(&GuestUnderTest {
                guest: GuestSource::Embedded(name),
                config,
                dir: None,
                allow_http: Vec::new(),
                aws_sign: Vec::new(),
                allow_git: Vec::new(),
                git_refs: Vec::new(),
                git_paths: Vec::new(),
                limits: Limits::default(),
            }))
            .unwrap_or_else(|e| panic!("loading {name}: {e:#}"));
        Loaded { loaded, rt }
    }

    pub fn head(&self, ws: &str) -> Option<Head> {
        self.rt.block_on(self.loaded.storage.head(ws)).unwrap()
    }

    pub fn read(&self, ws: &str) -> Option<Vec<u8>> {
        self.rt.block_on(self.loaded.storage.read(ws)).unwrap()
    }

    pub fn write_if(&self, ws: &str, state: &[u8], expect: Expect) -> bool {
        self.try_write_if(ws, state, None, expect).unwrap()
    }

    pub fn try_write_if(
        &self,
        ws: &str,
        state: &[u8],
        lock_id: Option<&str>,
        expect: Expect,
    ) -> Result<bool, StorageError> {
        let write = self
            .loaded
            .storage
            .write_if(ws, state.to_vec().into(), lock_id, expect);
        self.rt.block_on(write)
    }

    /// What a write must expect to replace the stored state.
    pub fn version(&self, ws: &str) -> Expect {
        Expect::Version(self.head(ws).expect("a stored state").version)
    }

    pub fn metadata(&self, ws: &str) -> Result<Option<Metadata>, StorageError> {
        self.rt.block_on(self.loaded.storage.read_metadata(ws))
    }

    pub fn write_metadata(&self, ws: &str, content: Option<&str>, expect: Expect) -> bool {
        let write = self
            .loaded
            .storage
            .write_metadata(ws, content.map(str::to_string), expect);
        self.rt.block_on(write).unwrap()
    }

    pub fn create_workspace(&self, ws: &str) -> bool {
        let storage = &self.loaded.storage;
        self.rt.block_on(storage.create_workspace(ws)).unwrap()
    }

    pub fn delete_workspace(&self, ws: &str) {
        let storage = &self.loaded.storage;
        self.rt.block_on(storage.delete_workspace(ws)).unwrap()
    }
}

fn pg_config(pg: &Postgres, schema: &str) -> Vec<(String, String)> {
    vec![
        ("conn_str".into(), pg.conn_str()),
        ("schema_name".into(), schema.into()),
    ]
}

fn load(pg: &Postgres) -> Loaded {
    Loaded::load("postgres", pg_config(pg, SCHEMA))
}

/// A state of `serial` padded to about `size` bytes.
pub fn padded(serial: u64, size: usize) -> Vec<u8> {
    let head = format!(
        r#"{{"version":4,"terraform_version":"1.11.4","serial":{serial},"lineage":"test-lineage","outputs":{{}},"resources":[],"pad":""#
    );
    let mut text = head.into_bytes();
    text.resize(size.max(text.len()), b'x');
    text.extend_from_slice(b"\"}");
    text
}

fn md5_hex(bytes: &[u8]) -> String {
    hex::encode(Md5::digest(bytes))
}

/// The `xmin` of `name`'s row, as the database tells it.
fn xmin(pg: &Postgres, name: &str) -> String {
    pg.query(&format!(
        "select xmin from {SCHEMA}.states where name = '{name}'"
    ))
}

/// Versions kept of `name` in the database.
fn kept(pg: &Postgres, name: &str) -> u64 {
    pg.query(&format!(
        "select count(*) from {SCHEMA}.wasmstate_state_versions where name = '{name}'"
    ))
    .parse()
    .unwrap()
}

#[test]
fn the_postgres_head_agrees_with_a_read_and_leaves_the_data_in_the_database() {
    let pg = Postgres::start();
    let guest = load(&pg);
    assert_eq!(guest.head("default"), None, "no row, no head");
    // A created, never written workspace holds Terraform's empty state:
    // a state to the head as to a read.
    assert!(guest.create_workspace("made"));
    let made = guest.head("made").expect("an empty state is a state");
    assert_eq!(
        Some(made.size as usize),
        guest.read("made").map(|s| s.len())
    );
    assert!(!guest.write_if("made", &state(1), Expect::Absent));

    // A small state, one past the head's 64 KiB, and one that is not
    // UTF-8 (kept base64-encoded in the text column).
    let binary: Vec<u8> = (0..=255u8).cycle().take(100 << 10).collect();
    for (ws, bytes) in [
        ("small", padded(7, 0)),
        ("large", padded(7, 300 << 10)),
        ("binary", binary),
    ] {
        assert!(guest.write_if(ws, &bytes, Expect::Absent), "{ws}");
        let head = guest.head(ws).expect("a head");
        assert_eq!(guest.read(ws).as_deref(), Some(&bytes[..]), "{ws}");
        assert_eq!(head.size, bytes.len() as u64, "{ws}");
        assert_eq!(
            head.digest,
            Some(format!("md5:{}", md5_hex(&bytes))),
            "{ws}"
        );
        assert_eq!(head.version, xmin(&pg, ws), "{ws}: the row's version");
        assert_eq!(
            head.prefix,
            bytes[..bytes.len().min(64 << 10)],
            "{ws}: the head's bytes are the state's first, decoded"
        );
        assert!(!guest.write_if(ws, &bytes, Expect::Absent), "{ws}");
    }
    assert!(
        guest.read("binary").is_some()
            && pg.query(
                "select left(data, 17) from terraform_remote_state.states where name = 'binary'"
            ) == "wasmstate-base64:",
        "the binary state is kept encoded"
    );
}

#[test]
fn a_postgres_write_expecting_a_stale_version_changes_nothing() {
    let pg = Postgres::start();
    let guest = load(&pg);
    assert!(guest.write_if("default", &state(1), Expect::Absent));
    let first = guest.version("default");
    assert!(guest.write_if("default", &state(2), first.clone()));
    let versions = kept(&pg, "default");
    assert!(!guest.write_if("default", &state(3), first.clone()));
    assert!(!guest.write_if("default", &state(3), Expect::Version("junk".into())));
    assert_eq!(guest.read("default"), Some(state(2)));
    assert_eq!(
        kept(&pg, "default"),
        versions,
        "no version kept for a refusal"
    );

    // Terraform's own pg backend writes in between: its UPDATE makes a new
    // row version, so the version read before it is stale too.
    let before_native = guest.version("default");
    let dir = tempdir();
    std::fs::write(
        dir.path().join("main.tf"),
        format!(
            "terraform {{\n  backend \"pg\" {{\n    conn_str    = {:?}\n    schema_name = {SCHEMA:?}\n  }}\n}}\n{CONFIG}",
            pg.conn_str()
        ),
    )
    .unwrap();
    ok(dir.path(), &["init", "-input=false"]);
    ok(dir.path(), &["apply", "-auto-approve", "-input=false"]);
    let native = pg.query(&format!(
        "select data from {SCHEMA}.states where name = 'default'"
    ));
    assert!(native.contains("terraform_data"), "{native}");
    let versions = kept(&pg, "default");
    assert!(!guest.write_if("default", &state(9), before_native));
    let stored = String::from_utf8(guest.read("default").unwrap()).unwrap();
    assert_eq!(stored.trim_end(), native, "Terraform's state stays");
    assert_eq!(kept(&pg, "default"), versions);

    // The current version is accepted, with its history copy.
    let current = guest.version("default");
    assert!(guest.write_if("default", &state(10), current));
    assert_eq!(guest.read("default"), Some(state(10)));
    assert_eq!(kept(&pg, "default"), versions + 1);
    // Terraform reads what the conditional write stored.
    let pulled = ok(dir.path(), &["state", "pull"]);
    let pulled: serde_json::Value = serde_json::from_str(&pulled).unwrap();
    assert_eq!(pulled["serial"], 10);
}

#[test]
fn the_lock_rule_comes_before_the_expectation() {
    let pg = Postgres::start();
    let guest = load(&pg);
    assert!(guest.write_if("default", &state(1), Expect::Absent));
    let current = guest.version("default");
    let info: wasmstate::backend::LockInfo =
        serde_json::from_slice(&lock_info("holder", "ci@a")).unwrap();
    guest
        .rt
        .block_on(guest.loaded.storage.lock("default", info))
        .unwrap();
    // Someone else's lock: locked, not "changed", whatever is expected.
    let refused = guest.try_write_if("default", &state(2), None, current.clone());
    assert!(
        matches!(refused, Err(StorageError::Locked(_))),
        "{refused:?}"
    );
    // The holder's write: the expectation decides.
    let stale = Expect::Version("1".into());
    assert_eq!(
        guest.try_write_if("default", &state(2), Some("holder"), stale),
        Ok(false)
    );
    assert_eq!(
        guest.try_write_if("default", &state(2), Some("holder"), current),
        Ok(true)
    );
    assert_eq!(guest.read("default"), Some(state(2)));
}

#[test]
fn two_postgres_replicas_racing_from_one_version_one_wins() {
    let pg = Postgres::start();
    let (mut a, mut b) = (load(&pg), load(&pg));
    assert!(a.write_if("default", &state(1), Expect::Absent));
    for round in 0..8u64 {
        // Both read the head before either writes.
        let from = a.version("default");
        assert_eq!(b.version("default"), from);
        let versions = kept(&pg, "default");
        let barrier = Arc::new(Barrier::new(2));
        let race = |guest: Loaded, body: Vec<u8>| {
            let (barrier, from) = (barrier.clone(), from.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let won = guest.write_if("default", &body, from);
                (guest, won)
            })
        };
        let ours = padded(round + 2, 100);
        let theirs = padded(round + 2, 200);
        let (one, two) = (race(a, ours.clone()), race(b, theirs.clone()));
        let ((ga, won_a), (gb, won_b)) = (one.join().unwrap(), two.join().unwrap());
        assert!(won_a != won_b, "round {round}: {won_a} and {won_b}");
        let winner = if won_a { ours } else { theirs };
        assert_eq!(gb.read("default"), Some(winner), "round {round}");
        assert_eq!(kept(&pg, "default"), versions + 1, "one history copy");
        (a, b) = (ga, gb);
    }
    // Racing to create a workspace: one insert wins.
    let barrier = Arc::new(Barrier::new(2));
    let racers: Vec<_> = [a, b]
        .into_iter()
        .enumerate()
        .map(|(i, guest)| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                guest.write_if("fresh", &padded(1, 100 * (i + 1)), Expect::Absent)
            })
        })
        .collect();
    let won: Vec<bool> = racers.into_iter().map(|r| r.join().unwrap()).collect();
    assert_eq!(won.iter().filter(|w| **w).count(), 1, "{won:?}");
}

#[test]
fn two_postgres_servers_racing_unlocked_writes_from_one_serial_one_wins() {
    let pg = Postgres::start();
    let config = format!(
        "[backends.pg]\nguest = \"postgres\"\n[backends.pg.config]\nconn_str = {:?}\nschema_name = {SCHEMA:?}\n",
        pg.conn_str()
    );
    let (d1, d2) = (tempdir(), tempdir());
    let servers = [
        Server::with_config(d1.path(), &config),
        Server::with_config(d2.path(), &config),
    ];
    let urls: Vec<String> = servers.iter().map(|s| s.state_url("pg", "race")).collect();
    assert_eq!(send("POST", &urls[0], Some(&state(1))).status, 200);
    let versions = kept(&pg, "race");
    for round in 0..8u64 {
        let barrier = Arc::new(Barrier::new(2));
        let racers: Vec<_> = urls
            .iter()
            .enumerate()
            .map(|(i, url)| {
                let (url, barrier) = (url.clone(), barrier.clone());
                let body = padded(round + 2, 100 * (i + 1));
                std::thread::spawn(move || {
                    barrier.wait();
                    let answer = send("POST", &url, Some(&body));
                    (answer.status, answer.text(), body)
                })
            })
            .collect();
        let mut ended: Vec<(u16, String, Vec<u8>)> =
            racers.into_iter().map(|r| r.join().unwrap()).collect();
        ended.sort_by_key(|(status, ..)| *status);
        let statuses: Vec<u16> = ended.iter().map(|(s, ..)| *s).collect();
        assert_eq!(statuses, [200, 409], "round {round}: {ended:?}");
        let stored = pg.query(&format!(
            "select data from {SCHEMA}.states where name = 'race'"
        ));
        assert_eq!(stored.as_bytes(), &ended[0].2[..], "the winner's");
        // One write committed: one version kept.
        assert_eq!(kept(&pg, "race"), versions + round + 1, "round {round}");
    }
}

#[test]
fn postgres_metadata_is_compare_and_swapped_and_goes_with_its_workspace() {
    let pg = Postgres::start();
    let (guest, other) = (load(&pg), load(&pg));
    // Asked before anything was made: none, and nothing made.
    assert_eq!(guest.metadata("staging"), Ok(None));
    assert!(guest.create_workspace("staging"));
    assert!(guest.write_metadata("staging", Some(r#"{"tags":["a"]}"#), Expect::Absent));
    assert!(!guest.write_metadata("staging", Some("{}"), Expect::Absent));
    // Every replica reads the same.
    let first = other.metadata("staging").unwrap().expect("kept");
    assert_eq!(first.content, r#"{"tags":["a"]}"#);
    assert_eq!(
        pg.query(&format!(
            "select version from {SCHEMA}.wasmstate_workspace_metadata where name = 'staging'"
        )),
        first.version
    );
    let v1 = Expect::Version(first.version.clone());
    assert!(other.write_metadata("staging", Some(r#"{"tags":["b"]}"#), v1.clone()));
    assert!(!guest.write_metadata("staging", Some(r#"{"tags":["c"]}"#), v1.clone()));
    assert!(
        !guest.write_metadata("staging", None, v1.clone()),
        "stale remove"
    );
    assert!(!guest.write_metadata("staging", None, Expect::Absent));
    assert!(!guest.write_metadata("staging", Some("{}"), Expect::Version("x".into())));
    let second = guest.metadata("staging").unwrap().unwrap();
    assert_eq!(second.content, r#"{"tags":["b"]}"#);
    // Removed and written again: a version once seen never comes back.
    assert!(guest.write_metadata("staging", None, Expect::Version(second.version.clone())));
    assert_eq!(guest.metadata("staging"), Ok(None));
    assert!(
        guest.write_metadata("staging", None, Expect::Any),
        "nothing to remove"
    );
    assert!(guest.write_metadata("staging", None, Expect::Absent));
    assert!(guest.write_metadata("staging", Some(r#"{"tags":["a"]}"#), Expect::Absent));
    let third = guest.metadata("staging").unwrap().unwrap();
    assert!(third.version != first.version && third.version != second.version);
    assert!(!guest.write_metadata("staging", Some("{}"), v1));

    // Deleting the workspace removes its metadata, in its transaction;
    // another workspace's stays.
    assert!(guest.write_metadata("default", Some("{}"), Expect::Any));
    guest.delete_workspace("staging");
    assert_eq!(other.metadata("staging"), Ok(None));
    assert_eq!(
        pg.query(&format!(
            "select string_agg(name, ',') from {SCHEMA}.wasmstate_workspace_metadata"
        )),
        "default"
    );
    // Terraform's table holds no trace of it.
    assert_eq!(
        pg.query(&format!(
            "select count(*) from {SCHEMA}.states where name = 'staging'"
        )),
        "0"
    );
}

/// A role that may not create the metadata table (a deployment that made
/// Terraform's tables beforehand) is told what to do, at read and write,
/// instead of a bare database error; its states are served as before.
#[test]
fn a_role_that_may_not_make_the_metadata_table_is_told_so() {
    let pg = Postgres::start();
    pg.query(
        "create role limited login;
         create schema tf;
         create sequence public.global_states_id_seq as bigint;
         create table tf.states (id bigint not null default nextval('public.global_states_id_seq') primary key, name text unique, data text);
         create unique index states_by_name on tf.states (name);
         create table tf.wasmstate_locks (name text primary key, key bigint not null, info jsonb not null, holder text not null, created timestamptz not null default now());
         grant usage on schema tf to limited;
         grant select, insert, update, delete on tf.states, tf.wasmstate_locks to limited;
         grant usage on sequence public.global_states_id_seq to limited;
         revoke create on schema public from public;",
    );
    let conn_str = pg.conn_str().replace("wasmstate@", "limited@");
    let config = vec![
        ("conn_str".to_string(), conn_str),
        ("schema_name".to_string(), "tf".to_string()),
    ];
    let guest = Loaded::load("postgres", config);
    let told = |answer: Result<Option<Metadata>, StorageError>| {
        let why = format!("{answer:?}");
        assert!(
            why.contains("wasmstate_workspace_metadata") && why.contains("operating.md"),
            "{why}"
        );
        assert!(!why.contains("db error"), "{why}");
    };
    told(guest.metadata("default"));
    assert!(guest.write_if("default", &state(1), Expect::Absent));
    let write = guest
        .rt
        .block_on(
            guest
                .loaded
                .storage
                .write_metadata("default", Some("{}".into()), Expect::Any),
        )
        .map(|_| None);
    told(write);
    told(guest.metadata("default"));
    // Made beforehand, with its grants: kept in the database.
    pg.query(
        "create table tf.wasmstate_workspace_metadata (name text primary key, content text not null, version bigint not null);
         grant select, insert, update, delete on tf.wasmstate_workspace_metadata to limited;",
    );
    let guest = Loaded::load(
        "postgres",
        vec![
            (
                "conn_str".to_string(),
                pg.conn_str().replace("wasmstate@", "limited@"),
            ),
            ("schema_name".to_string(), "tf".to_string()),
        ],
    );
    assert!(guest.write_metadata("default", Some("{}"), Expect::Absent));
    assert_eq!(guest.metadata("default").unwrap().unwrap().content, "{}");
}
