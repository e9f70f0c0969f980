//! Contract 0.3.0 on the `gcs` guest, against fake-gcs-server: the head
//! from one ranged `alt=media` GET (generation and MD5 from its headers),
//! writes that are GCS's own compare-and-swap (`ifGenerationMatch`, `0`
//! for none there), and workspace metadata in
//! `<prefix>wasmstate-metadata/<workspace>.json`, which Terraform's native
//! `backend "gcs"` never lists. The guest is loaded as `serve` loads it
//! (the kit's pipeline) and called through the host's `Storage` trait.
//!
//! fake-gcs-server 1.54.0 (the pinned wheel's) honours `ifGenerationMatch`
//! on multipart uploads, which is every write here up to 8 MiB, but
//! ignores it on resumable uploads, deletes, rewrite, copy and compose
//! (checked by direct requests): so a stale expectation on a state past
//! 8 MiB (which goes up resumable) or on a metadata removal cannot be
//! shown refused on it; GCS itself checks both (a resumable upload's when
//! the session completes). The large head is shown.

use crate::common::*;
use crate::gcs::{BUCKET, PREFIX, native_block, server, settings, start};
use crate::terraform::{CONFIG, ok};
use md5::{Digest, Md5};
use std::sync::{Arc, Barrier};
use wasmstate::backend::{Expect, Head, Metadata, Storage};
use wasmstate::config::Limits;
use wasmstate::conformance::{GuestUnderTest, LoadedGuest, load_guest};
use wasmstate::guests::GuestSource;

/// A guest loaded as `serve` loads it, with its own runtime: two of them
/// are two hosts (engines, instances) on one storage.
pub(crate) struct Guest {
    pub loaded: LoadedGuest,
    pub rt: tokio::runtime::Runtime,
}

impl Guest {
    /// The embedded guest `name` with `config`.
    pub fn load(name: &'static str, config: Vec<(String, String)>) -> Guest {
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
        Guest { loaded, rt }
    }

    pub fn head(&self, ws: &str) -> Option<Head> {
        self.rt.block_on(self.loaded.storage.head(ws)).unwrap()
    }

    pub fn read(&self, ws: &str) -> Option<Vec<u8>> {
        self.rt
            .block_on(self.loaded.storage.read(ws))
            .unwrap()
            .map(|b| b.to_vec())
    }

    pub fn write_if(&self, ws: &str, state: &[u8], expect: Expect) -> bool {
        self.write_locked(ws, state, None, expect)
    }

    pub fn write_locked(&self, ws: &str, state: &[u8], lock: Option<&str>, expect: Expect) -> bool {
        let write = self
            .loaded
            .storage
            .write_if(ws, state.to_vec().into(), lock, expect);
        self.rt.block_on(write).unwrap()
    }

    /// What a write must expect to replace the stored state.
    pub fn version(&self, ws: &str) -> Expect {
        Expect::Version(self.head(ws).expect("a stored state").version)
    }

    pub fn metadata(&self, ws: &str) -> Option<Metadata> {
        self.rt
            .block_on(self.loaded.storage.read_metadata(ws))
            .unwrap()
    }

    pub fn write_metadata(&self, ws: &str, content: Option<&str>, expect: Expect) -> bool {
        let write = self
            .loaded
            .storage
            .write_metadata(ws, content.map(str::to_string), expect);
        self.rt.block_on(write).unwrap()
    }

    pub fn create_workspace(&self, ws: &str) -> bool {
        self.rt
            .block_on(self.loaded.storage.create_workspace(ws))
            .unwrap()
    }

    pub fn delete_workspace(&self, ws: &str) {
        self.rt
            .block_on(self.loaded.storage.delete_workspace(ws))
            .unwrap()
    }

    pub fn list_workspaces(&self) -> Vec<String> {
        self.rt
            .block_on(self.loaded.storage.list_workspaces())
            .unwrap()
    }
}

/// A state of `serial` padded to about `size` bytes.
pub(crate) fn padded(serial: u64, size: usize) -> Vec<u8> {
    let head = format!(
        r#"{{"version":4,"terraform_version":"1.11.4","serial":{serial},"lineage":"test-lineage","outputs":{{}},"resources":[],"pad":""#
    );
    let mut text = head.into_bytes();
    text.resize(size.max(text.len()), b'x');
    text.extend_from_slice(b"\"}");
    text
}

pub(crate) fn md5_hex(bytes: &[u8]) -> String {
    hex::encode(Md5::digest(bytes))
}

fn guest(gcs: &FakeGcs) -> Guest {
    Guest::load("gcs", settings(gcs))
}

/// The live generation of `name`, from fake-gcs-server's JSON API.
fn generation(gcs: &FakeGcs, name: &str) -> Option<String> {
    let name = form_urlencoded::byte_serialize(name.as_bytes()).collect::<String>();
    let url = format!("{}/storage/v1/b/{BUCKET}/o/{name}", gcs.url);
    let answer = send("GET", &url, None);
    if answer.status == 404 {
        return None;
    }
    let object: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
    object["generation"].as_str().map(str::to_string)
}

fn state_object(ws: &str) -> String {
    format!("{PREFIX}/{ws}.tfstate")
}

#[test]
fn gcs_head_agrees_with_a_read_without_reading_the_state() {
    let gcs = start(false);
    let guest = guest(&gcs);
    assert_eq!(guest.head("default"), None, "no state, no head");
    // A workspace created and never written is an empty object: no state
    // to a read or a head, and a write expecting none replaces it.
    assert!(guest.create_workspace("made"));
    assert_eq!(gcs.object(BUCKET, &state_object("made")), Some(Vec::new()));
    assert_eq!((guest.read("made"), guest.head("made")), (None, None));
    assert!(guest.write_if("made", &state(1), Expect::Absent));
    assert_eq!(guest.read("made"), Some(state(1)));

    // One multipart upload (small, and past the head's range), and a
    // resumable one (past 8 MiB).
    for (ws, size) in [("small", 0), ("large", 300 << 10), ("resumable", 9 << 20)] {
        let bytes = padded(7, size);
        assert!(guest.write_if(ws, &bytes, Expect::Absent), "{ws}");
        let head = guest.head(ws).expect("a head");
        assert_eq!(guest.read(ws).as_deref(), Some(&bytes[..]), "{ws}");
        assert_eq!(head.size, bytes.len() as u64, "{ws}");
        assert!(
            !head.prefix.is_empty() && bytes.starts_with(&head.prefix),
            "{ws}: the head's bytes are the state's first"
        );
        assert!(
            head.prefix.len() <= 64 << 10,
            "{ws}: one ranged GET, not the state ({} bytes)",
            head.prefix.len()
        );
        assert_eq!(
            Some(head.version),
            generation(&gcs, &state_object(ws)),
            "{ws}: the generation"
        );
        assert_eq!(
            head.digest,
            Some(format!("md5:{}", md5_hex(&bytes))),
            "{ws}"
        );
    }
}

#[test]
fn gcs_a_write_expecting_a_stale_version_changes_nothing() {
    let gcs = start(false);
    let guest = guest(&gcs);
    assert!(guest.write_if("default", &state(1), Expect::Absent));
    assert!(!guest.write_if("default", &state(2), Expect::Absent));
    let first = guest.version("default");
    assert!(guest.write_if("default", &state(2), first.clone()));
    assert!(!guest.write_if("default", &state(3), first.clone()));
    assert!(!guest.write_if("default", &state(3), Expect::Version("junk".into())));
    assert_eq!(guest.read("default"), Some(state(2)));

    // Native Terraform writes in between: the version read before it is
    // stale too.
    let before_native = guest.version("default");
    let dir = tempdir();
    std::fs::write(
        dir.path().join("main.tf"),
        format!("{}{CONFIG}", native_block(&gcs, PREFIX)),
    )
    .unwrap();
    ok(dir.path(), &["init", "-input=false"]);
    ok(dir.path(), &["apply", "-auto-approve", "-input=false"]);
    let native = gcs
        .object(BUCKET, &state_object("default"))
        .expect("native state");
    assert_ne!(native, state(2));
    assert!(!guest.write_if("default", &state(9), before_native));
    assert_eq!(guest.read("default"), Some(native.clone()));
    assert!(!guest.write_if("default", &state(9), first));
    assert_eq!(gcs.object(BUCKET, &state_object("default")), Some(native));

    // The current version is accepted.
    let current = guest.version("default");
    assert!(guest.write_if("default", &state(10), current));
    assert_eq!(guest.read("default"), Some(state(10)));
}

#[test]
fn gcs_two_hosts_racing_from_one_version_one_wins() {
    let gcs = start(false);
    // Each host its own engine and instances, as two replicas.
    let (mut a, mut b) = (guest(&gcs), guest(&gcs));
    assert!(a.write_if("default", &state(1), Expect::Absent));
    for round in 0..6u64 {
        let from = a.version("default");
        let barrier = Arc::new(Barrier::new(2));
        let race = |guest: Guest, body: Vec<u8>| {
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
        assert_eq!(gcs.object(BUCKET, &state_object("default")), Some(winner));
        (a, b) = (ga, gb);
    }
}

#[test]
fn gcs_two_servers_racing_unlocked_writes_from_one_serial_one_wins_without_a_lock() {
    // Versioned: every lock object ever written would stay listed.
    let gcs = start(true);
    let (d1, d2) = (tempdir(), tempdir());
    let (one, two) = (server(d1.path(), &gcs), server(d2.path(), &gcs));
    let urls = [
        one.state_url("gcs", "default"),
        two.state_url("gcs", "default"),
    ];
    assert_eq!(send("POST", &urls[0], Some(&state(1))).status, 200);
    for round in 0..6u64 {
        let barrier = Arc::new(Barrier::new(2));
        let racers: Vec<_> = urls
            .iter()
            .enumerate()
            .map(|(i, url)| {
                let (url, barrier) = (url.clone(), barrier.clone());
                let body = padded(round + 2, 100 * (i + 1));
                std::thread::spawn(move || {
                    barrier.wait();
                    (send("POST", &url, Some(&body)).status, body)
                })
            })
            .collect();
        let mut ended: Vec<(u16, Vec<u8>)> =
            racers.into_iter().map(|r| r.join().unwrap()).collect();
        ended.sort_by_key(|(status, _)| *status);
        let statuses: Vec<u16> = ended.iter().map(|(s, _)| *s).collect();
        assert_eq!(statuses, [200, 409], "round {round}");
        assert_eq!(
            gcs.object(BUCKET, &state_object("default")),
            Some(ended[0].1.clone()),
            "the winner's"
        );
    }
    let lock = form_urlencoded::byte_serialize(format!("{PREFIX}/default.tflock").as_bytes())
        .collect::<String>();
    let listed = send(
        "GET",
        &format!(
            "{}/storage/v1/b/{BUCKET}/o?prefix={lock}&versions=true",
            gcs.url
        ),
        None,
    );
    assert_eq!(listed.status, 200);
    let listed: serde_json::Value = serde_json::from_slice(&listed.body).unwrap();
    assert_eq!(
        listed["items"].as_array().map_or(0, Vec::len),
        0,
        "no host took a lock for an unlocked write: {listed}"
    );
}

#[test]
fn gcs_metadata_is_compare_and_swapped_and_goes_with_its_workspace() {
    let gcs = start(false);
    let guest = guest(&gcs);
    let object = |ws: &str| format!("{PREFIX}/wasmstate-metadata/{ws}.json");
    assert_eq!(guest.metadata("default"), None);
    assert!(guest.write_metadata("default", Some(r#"{"a":1}"#), Expect::Absent));
    assert!(!guest.write_metadata("default", Some(r#"{"a":2}"#), Expect::Absent));
    let first = guest.metadata("default").expect("metadata");
    assert_eq!(first.content, r#"{"a":1}"#);
    assert_eq!(
        Some(first.version.clone()),
        generation(&gcs, &object("default"))
    );
    assert_eq!(
        gcs.object(BUCKET, &object("default")),
        Some(br#"{"a":1}"#.to_vec()),
        "one folder down from the states"
    );
    let stale = Expect::Version(first.version.clone());
    assert!(guest.write_metadata("default", Some(r#"{"a":3}"#), stale.clone()));
    assert!(!guest.write_metadata("default", Some(r#"{"a":4}"#), stale));
    // (A removal expecting a stale generation is a DELETE with
    // `ifGenerationMatch`, which fake-gcs-server ignores.)
    let now = guest.metadata("default").expect("metadata");
    assert_eq!(now.content, r#"{"a":3}"#);
    assert_ne!(now.version, first.version);
    assert!(guest.write_metadata("default", None, Expect::Version(now.version)));
    assert_eq!(guest.metadata("default"), None);
    assert_eq!(gcs.object(BUCKET, &object("default")), None);
    assert!(guest.write_metadata("default", None, Expect::Absent));

    // Deleting a workspace deletes its metadata, and its state.
    assert!(guest.create_workspace("doomed"));
    assert!(guest.write_if("doomed", &state(1), Expect::Absent));
    assert!(guest.write_metadata("doomed", Some("{}"), Expect::Any));
    assert!(gcs.object(BUCKET, &object("doomed")).is_some());
    guest.delete_workspace("doomed");
    assert_eq!(gcs.object(BUCKET, &object("doomed")), None);
    assert_eq!(gcs.object(BUCKET, &state_object("doomed")), None);
    assert_eq!(guest.metadata("doomed"), None);
}

#[test]
fn native_terraform_lists_no_gcs_metadata_object_as_a_workspace() {
    let gcs = start(false);
    let guest = guest(&gcs);
    assert!(guest.create_workspace("staging"));
    for ws in ["default", "staging", "orphan"] {
        assert!(guest.write_metadata(ws, Some("{}"), Expect::Any));
    }
    let dir = tempdir();
    std::fs::write(
        dir.path().join("main.tf"),
        format!("{}{CONFIG}", native_block(&gcs, PREFIX)),
    )
    .unwrap();
    ok(dir.path(), &["init", "-input=false"]);
    let listed = ok(dir.path(), &["workspace", "list"]);
    let names: Vec<&str> = listed
        .lines()
        .map(|l| l.trim_start_matches('*').trim())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(names, ["default", "staging"], "{listed}");
    let ours = guest.list_workspaces();
    assert!(
        ours.iter().all(|w| w == "default" || w == "staging"),
        "the guest lists states only: {ours:?}"
    );
}

/// The chaos run's proxy keeps the precondition fake-gcs-server ignores:
/// a delete naming another generation is refused (412) and the object
/// stays; one naming the live generation deletes it.
#[test]
fn the_chaos_proxy_keeps_cloud_storages_delete_precondition() {
    let gcs = start(false);
    let proxy = FaultProxy::random_gcs(&gcs.url, 1, 0);
    let object = format!("{}/storage/v1/b/{BUCKET}/o/proxy-check", proxy.url);
    let upload = format!(
        "{}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name=proxy-check",
        proxy.url
    );
    let created = send("POST", &upload, Some(b"x"));
    assert_eq!(created.status, 200, "{}", created.text());
    let made: serde_json::Value = serde_json::from_slice(&created.body).unwrap();
    let generation = made["generation"].as_str().unwrap().to_string();
    let stale = send("DELETE", &format!("{object}?ifGenerationMatch=1"), None);
    assert_eq!(stale.status, 412, "a delete naming another generation");
    assert_eq!(send("GET", &object, None).status, 200, "the object stays");
    let live = send(
        "DELETE",
        &format!("{object}?ifGenerationMatch={generation}"),
        None,
    );
    // Cloud Storage answers 204, fake-gcs-server 200.
    assert!(matches!(live.status, 200 | 204), "{}", live.text());
    assert_eq!(send("GET", &object, None).status, 404);
}
