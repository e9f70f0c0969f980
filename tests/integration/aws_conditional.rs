//! Contract 0.3.0 on the AWS guests (`s3-lockfile`, `dynamodb`), against
//! moto: the head from one ranged GET, writes that are S3's own
//! compare-and-swap (`If-Match` / `If-None-Match: *`), and workspace
//! metadata in `<state key>.wasmstate-metadata`, which Terraform's native
//! `backend "s3"` never lists. The guests are loaded as `serve` loads them
//! (the kit's pipeline) and called through the host's `Storage` trait.
//!
//! moto 5.2.5 honours `If-Match` and `If-None-Match: *` on PutObject, and
//! `If-None-Match: *` on CompleteMultipartUpload, but ignores `If-Match`
//! there: so the races below use states one PUT carries, and a multipart
//! write's stale expectation is only shown refused by the guest's look
//! before its upload (on S3 itself the completion's `If-Match` makes it
//! atomic).

use crate::aws::{BUCKET, KEY, Locking, native_backend, settings, start_moto};
use crate::common::*;
use crate::terraform::{CONFIG, ok};
use md5::{Digest, Md5};
use std::sync::{Arc, Barrier};
use wasmstate::backend::{Expect, Storage};
use wasmstate::config::Limits;
use wasmstate::conformance::{GuestUnderTest, LoadedGuest, load_guest};
use wasmstate::guests::GuestSource;

const BOTH: [Locking; 2] = [Locking::LockFile, Locking::DynamoDb];

/// The guest on `moto`, loaded as `serve` loads it, with its runtime.
struct Guest {
    loaded: LoadedGuest,
    rt: tokio::runtime::Runtime,
}

impl Guest {
    fn load(moto: &Moto, locking: Locking) -> Guest {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let loaded = rt
            .block_on(load_guest(&GuestUnderTest {
                guest: GuestSource::Embedded(locking.guest()),
                config: settings(&moto.url, locking),
                dir: None,
                allow_http: Vec::new(),
                aws_sign: Vec::new(),
                allow_git: Vec::new(),
                git_refs: Vec::new(),
                git_paths: Vec::new(),
                limits: Limits::default(),
            }))
            .unwrap_or_else(|e| panic!("loading {}: {e:#}", locking.guest()));
        Guest { loaded, rt }
    }

    fn head(&self, ws: &str) -> Option<wasmstate::backend::Head> {
        self.rt.block_on(self.loaded.storage.head(ws)).unwrap()
    }

    fn read(&self, ws: &str) -> Option<Vec<u8>> {
        self.rt.block_on(self.loaded.storage.read(ws)).unwrap()
    }

    fn write_if(&self, ws: &str, state: &[u8], expect: Expect) -> bool {
        let write = self
            .loaded
            .storage
            .write_if(ws, state.to_vec().into(), None, expect);
        self.rt.block_on(write).unwrap()
    }

    fn version(&self, ws: &str) -> Expect {
        Expect::Version(self.head(ws).expect("a stored state").version)
    }

    fn metadata(&self, ws: &str) -> Option<wasmstate::backend::Metadata> {
        self.rt
            .block_on(self.loaded.storage.read_metadata(ws))
            .unwrap()
    }

    fn write_metadata(&self, ws: &str, content: Option<&str>, expect: Expect) -> bool {
        let write = self
            .loaded
            .storage
            .write_metadata(ws, content.map(str::to_string), expect);
        self.rt.block_on(write).unwrap()
    }
}

/// A state of `serial` padded to about `size` bytes.
fn padded(serial: u64, lineage: &str, size: usize) -> Vec<u8> {
    let head = format!(
        r#"{{"version":4,"terraform_version":"1.11.4","serial":{serial},"lineage":"{lineage}","outputs":{{}},"resources":[],"pad":""#
    );
    let mut text = head.into_bytes();
    text.resize(size.max(text.len()), b'x');
    text.extend_from_slice(b"\"}");
    text
}

fn md5_hex(bytes: &[u8]) -> String {
    hex::encode(Md5::digest(bytes))
}

/// The dynamodb guest's digest item: (`Digest`, `Pending` tags).
fn digest_item(moto: &Moto) -> (Option<String>, Vec<String>) {
    let item = moto.dynamodb(
        "GetItem",
        serde_json::json!({
            "TableName": "terraform-locks",
            "Key": {"LockID": {"S": format!("{BUCKET}/{KEY}-md5")}},
            "ConsistentRead": true
        }),
    );
    let digest = item["Item"]["Digest"]["S"].as_str().map(str::to_string);
    let pending = item["Item"]["Pending"]["SS"]
        .as_array()
        .map(|tags| {
            tags.iter()
                .filter_map(|t| t.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    (digest, pending)
}

#[test]
fn the_head_agrees_with_a_read_without_reading_the_state() {
    for locking in BOTH {
        let moto = start_moto(locking);
        let guest = Guest::load(&moto, locking);
        assert_eq!(
            guest.head("default"),
            None,
            "{locking:?}: no state, no head"
        );
        // A created, never written workspace holds an empty object: no
        // state to a read, none to a head, and a write expecting none
        // replaces it.
        let storage = &guest.loaded.storage;
        assert!(guest.rt.block_on(storage.create_workspace("made")).unwrap());
        assert_eq!(guest.read("made"), None);
        assert_eq!(guest.head("made"), None, "{locking:?}");
        assert!(guest.write_if("made", &state(1), Expect::Absent));
        assert_eq!(guest.read("made"), Some(state(1)));

        // One PUT (small, and past the head's range), and a multipart
        // upload (past 8 MiB), whose ETag is no digest of the bytes.
        for (ws, size, single_part) in [
            ("small", 0, true),
            ("large", 300 << 10, true),
            ("multipart", 9 << 20, false),
        ] {
            let bytes = padded(7, "head-lineage", size);
            assert!(
                guest.write_if(ws, &bytes, Expect::Absent),
                "{locking:?} {ws}"
            );
            let head = guest.head(ws).expect("a head");
            assert_eq!(guest.read(ws).as_deref(), Some(&bytes[..]), "{ws}");
            assert_eq!(head.size, bytes.len() as u64, "{locking:?} {ws}");
            assert!(
                !head.prefix.is_empty() && bytes.starts_with(&head.prefix),
                "{locking:?} {ws}: the head's bytes are the state's first"
            );
            assert!(
                head.prefix.len() <= 64 << 10,
                "{locking:?} {ws}: one ranged GET, not the state ({} bytes)",
                head.prefix.len()
            );
            if single_part {
                let md5 = md5_hex(&bytes);
                assert_eq!(head.version, format!("\"{md5}\""), "{ws}: the ETag");
                assert_eq!(head.digest, Some(format!("md5:{md5}")), "{locking:?} {ws}");
            } else {
                assert!(head.version.ends_with("-2\""), "{}", head.version);
                assert_eq!(head.digest, None, "{ws}: a multipart ETag is no MD5");
            }
        }
    }
}

#[test]
fn a_write_expecting_a_stale_version_changes_nothing() {
    for locking in BOTH {
        let moto = start_moto(locking);
        let guest = Guest::load(&moto, locking);
        assert!(guest.write_if("default", &state(1), Expect::Absent));
        assert!(
            !guest.write_if("default", &state(2), Expect::Absent),
            "{locking:?}"
        );
        let first = guest.version("default");
        assert!(guest.write_if("default", &state(2), first.clone()));
        assert!(
            !guest.write_if("default", &state(3), first.clone()),
            "{locking:?}"
        );
        assert_eq!(guest.read("default"), Some(state(2)), "{locking:?}");
        let stale_tags = |moto: &Moto| digest_item(moto).1;
        if locking == Locking::DynamoDb {
            assert_eq!(digest_item(&moto).0, Some(md5_hex(&state(2))));
            assert_eq!(
                stale_tags(&moto),
                Vec::<String>::new(),
                "refused: withdrawn"
            );
        }

        // Native Terraform writes in between: the version read before it
        // is stale too.
        let before_native = guest.version("default");
        let dir = tempdir();
        std::fs::write(
            dir.path().join("main.tf"),
            format!("{}{CONFIG}", native_backend(&moto.url, locking)),
        )
        .unwrap();
        ok(dir.path(), &["init", "-input=false"]);
        ok(dir.path(), &["apply", "-auto-approve", "-input=false"]);
        let native = moto.object(BUCKET, KEY).expect("native state");
        assert_ne!(native, state(2));
        assert!(
            !guest.write_if("default", &state(9), before_native),
            "{locking:?}"
        );
        assert_eq!(guest.read("default"), Some(native.clone()), "{locking:?}");
        if locking == Locking::DynamoDb {
            assert_eq!(digest_item(&moto).0, Some(md5_hex(&native)));
        }

        // A multipart write expecting a stale version uploads nothing.
        let big = padded(9, "test-lineage", 9 << 20);
        assert!(!guest.write_if("default", &big, first), "{locking:?}");
        assert_eq!(guest.read("default"), Some(native), "{locking:?}");

        // The current version is accepted, and the digest follows.
        let current = guest.version("default");
        assert!(guest.write_if("default", &state(10), current));
        assert_eq!(guest.read("default"), Some(state(10)));
        if locking == Locking::DynamoDb {
            assert_eq!(digest_item(&moto).0, Some(md5_hex(&state(10))));
            assert_eq!(stale_tags(&moto), Vec::<String>::new());
        }
    }
}

#[test]
fn two_hosts_racing_from_one_version_one_wins() {
    for locking in BOTH {
        let moto = start_moto(locking);
        // Each host its own engine and instances, as two replicas.
        let (mut a, mut b) = (Guest::load(&moto, locking), Guest::load(&moto, locking));
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
            let ours = padded(round + 2, "test-lineage", 100);
            let theirs = padded(round + 2, "test-lineage", 200);
            let (one, two) = (race(a, ours.clone()), race(b, theirs.clone()));
            let ((ga, won_a), (gb, won_b)) = (one.join().unwrap(), two.join().unwrap());
            assert!(
                won_a != won_b,
                "{locking:?} round {round}: {won_a} and {won_b}"
            );
            let winner = if won_a { ours } else { theirs };
            assert_eq!(ga.read("default"), Some(winner.clone()), "{locking:?}");
            if locking == Locking::DynamoDb {
                assert_eq!(digest_item(&moto).0, Some(md5_hex(&winner)));
            }
            (a, b) = (ga, gb);
        }
    }
}

#[test]
fn two_servers_racing_unlocked_writes_from_one_serial_one_wins_without_a_lock() {
    let moto = start_moto(Locking::LockFile);
    // Every lock object ever written stays in the key's history.
    moto.enable_versioning(BUCKET);
    let config = crate::aws::backend_config(&moto.url, Locking::LockFile, "");
    let (d1, d2) = (tempdir(), tempdir());
    let one = Server::with_config(d1.path(), &config);
    let two = Server::with_config(d2.path(), &config);
    let urls = [
        one.state_url("aws", "default"),
        two.state_url("aws", "default"),
    ];
    assert_eq!(send("POST", &urls[0], Some(&state(1))).status, 200);
    for round in 0..6u64 {
        let barrier = Arc::new(Barrier::new(2));
        let racers: Vec<_> = urls
            .iter()
            .enumerate()
            .map(|(i, url)| {
                let (url, barrier) = (url.clone(), barrier.clone());
                let body = padded(round + 2, "test-lineage", 100 * (i + 1));
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
            moto.object(BUCKET, KEY),
            Some(ended[0].1.clone()),
            "the winner's"
        );
    }
    assert_eq!(
        moto.version_ids(BUCKET, &format!("{KEY}.tflock")),
        Vec::<String>::new(),
        "no host took a lock for an unlocked write"
    );
}

#[test]
fn metadata_is_compare_and_swapped_and_goes_with_its_workspace() {
    for locking in BOTH {
        let moto = start_moto(locking);
        let guest = Guest::load(&moto, locking);
        assert_eq!(guest.metadata("default"), None);
        assert!(guest.write_metadata("default", Some(r#"{"a":1}"#), Expect::Absent));
        assert!(!guest.write_metadata("default", Some(r#"{"a":2}"#), Expect::Absent));
        let first = guest.metadata("default").expect("metadata");
        assert_eq!(first.content, r#"{"a":1}"#);
        assert_eq!(
            moto.object(BUCKET, &format!("{KEY}.wasmstate-metadata")),
            Some(br#"{"a":1}"#.to_vec()),
            "beside the state"
        );
        let stale = Expect::Version(first.version.clone());
        assert!(guest.write_metadata("default", Some(r#"{"a":3}"#), stale.clone()));
        assert!(!guest.write_metadata("default", Some(r#"{"a":4}"#), stale.clone()));
        assert!(!guest.write_metadata("default", None, stale), "{locking:?}");
        let now = guest.metadata("default").expect("metadata");
        assert_eq!(now.content, r#"{"a":3}"#, "{locking:?}");
        assert_ne!(now.version, first.version);
        assert!(guest.write_metadata("default", None, Expect::Version(now.version)));
        assert_eq!(guest.metadata("default"), None);
        assert!(guest.write_metadata("default", None, Expect::Absent));

        // Deleting a workspace deletes its metadata, and its state.
        let storage = &guest.loaded.storage;
        let key = format!("env:/doomed/{KEY}.wasmstate-metadata");
        assert!(
            guest
                .rt
                .block_on(storage.create_workspace("doomed"))
                .unwrap()
        );
        assert!(guest.write_metadata("doomed", Some("{}"), Expect::Any));
        assert!(moto.object(BUCKET, &key).is_some());
        guest
            .rt
            .block_on(storage.delete_workspace("doomed"))
            .unwrap();
        assert_eq!(moto.object(BUCKET, &key), None, "{locking:?}");
        assert_eq!(moto.object(BUCKET, &format!("env:/doomed/{KEY}")), None);
    }
}

#[test]
fn native_terraform_lists_no_metadata_object_as_a_workspace() {
    let moto = start_moto(Locking::LockFile);
    let guest = Guest::load(&moto, Locking::LockFile);
    let storage = &guest.loaded.storage;
    assert!(
        guest
            .rt
            .block_on(storage.create_workspace("staging"))
            .unwrap()
    );
    for ws in ["default", "staging", "orphan"] {
        assert!(guest.write_metadata(ws, Some("{}"), Expect::Any));
    }
    let dir = tempdir();
    std::fs::write(
        dir.path().join("main.tf"),
        format!("{}{CONFIG}", native_backend(&moto.url, Locking::LockFile)),
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
    let ours = guest.rt.block_on(storage.list_workspaces()).unwrap();
    assert!(!ours.iter().any(|w| w == "orphan"), "{ours:?}");
}
