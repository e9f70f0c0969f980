//! Contract 0.3.0 on the `azure` guest, against Azurite: the head from one
//! ranged Get Blob (ETag, `Content-Range`, the blob's MD5; the version
//! names the content, so a lock, which rewrites the blob's metadata, does
//! not change it), writes that are Azure's own compare-and-swap
//! (`If-Match`, `If-None-Match: *`, on Put Blob and on Put Block List for
//! a large state), and workspace metadata
//! in `<key>.wasmstate-metadata/<workspace>.json`, outside the
//! `<key>env:` prefix Terraform's `azurerm` backend lists workspaces by.
//! Terraform cannot be pointed at Azurite, so Microsoft's Python SDK acts
//! as it does ([`Azurite::native`]), as in `azure.rs`.
//!
//! Azurite 3.37.0 honours `If-Match` on Put Blob, Put Block List and
//! Snapshot Blob (412), and `If-None-Match: *` on Put Blob and Put Block
//! List (409 `BlobAlreadyExists`, as Azure answers).

use crate::azure::{
    CONTAINER, KEY, blob, native_bytes, native_put, props, server, settings, start, terraform_lock,
};
use crate::common::*;
use crate::gcs_conditional::{Guest, md5_hex, padded};
use std::sync::{Arc, Barrier};
use wasmstate::backend::Expect;

fn guest(azurite: &Azurite) -> Guest {
    Guest::load("azure", settings(azurite, true))
}

/// Every blob whose name starts with `prefix`, as Terraform lists them.
fn listed(azurite: &Azurite, prefix: &str) -> Vec<String> {
    let value = azurite.native_ok(CONTAINER, &["list", prefix, "false"]);
    let names = value.as_array().expect("a list").iter();
    names
        .map(|b| b["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn azure_head_agrees_with_a_read_without_reading_the_state() {
    let azurite = start();
    let guest = guest(&azurite);
    assert_eq!(guest.head("default"), None, "no state, no head");
    // A workspace created and never written is a zero-length blob: no
    // state to a read or a head, and a write expecting none replaces it.
    assert!(guest.create_workspace("made"));
    assert_eq!(props(&azurite, &blob("made"))["size"], 0);
    assert_eq!((guest.read("made"), guest.head("made")), (None, None));
    assert!(guest.write_if("made", &state(1), Expect::Absent));
    assert_eq!(guest.read("made"), Some(state(1)));

    // One Put Blob (small, and past the head's range), and blocks with a
    // block list (past 4 MiB), whose MD5 the guest sets itself.
    for (ws, size) in [("small", 0), ("large", 300 << 10), ("blocks", 9 << 20)] {
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
            "{ws}: one ranged read, not the state ({} bytes)",
            head.prefix.len()
        );
        let md5 = md5_hex(&bytes);
        assert_eq!(
            head.version,
            format!("md5-{md5}"),
            "{ws}: names the content"
        );
        assert_eq!(head.digest, Some(format!("md5:{md5}")), "{ws}");
    }

    // A state Terraform's way wrote (one Put Blob): the store's own MD5.
    let native = padded(3, 1000);
    native_put(&azurite, &blob("native"), &native, None, false);
    let head = guest.head("native").expect("a head");
    assert_eq!(head.digest, Some(format!("md5:{}", md5_hex(&native))));
    // Only the first bytes (the guest asks for 256: serial and lineage).
    assert!(
        !head.prefix.is_empty() && native.starts_with(&head.prefix),
        "the head's bytes are the state's first"
    );
}

#[test]
fn azure_a_write_expecting_a_stale_version_changes_nothing() {
    let azurite = start();
    let guest = guest(&azurite);
    assert!(guest.write_if("default", &state(1), Expect::Absent));
    assert!(!guest.write_if("default", &state(2), Expect::Absent));
    let first = guest.version("default");
    assert!(guest.write_if("default", &state(2), first.clone()));
    assert!(!guest.write_if("default", &state(3), first.clone()));
    assert_eq!(guest.read("default"), Some(state(2)));

    // Written Terraform's way in between: the version read before is
    // stale too, for a Put Blob and for a block list alike.
    let before_native = guest.version("default");
    let native = padded(5, 2000);
    native_put(&azurite, KEY, &native, None, true);
    assert!(!guest.write_if("default", &state(9), before_native.clone()));
    let big = padded(9, 9 << 20);
    assert!(!guest.write_if("default", &big, before_native));
    assert_eq!(native_bytes(&azurite, KEY), Some(native.clone()));
    assert_eq!(guest.read("default"), Some(native));

    // Locked Terraform's way: its lock info rewrites the blob's metadata
    // (a new ETag), not its state, so the version read before the lock
    // still names it, and the holder writes over it under the lease.
    let before_lock = guest.version("default");
    let id = "3c9e1f42-6a7b-4d8e-9f01-2b3c4d5e6f70";
    azurite.native_ok(CONTAINER, &["lock", KEY, &terraform_lock(id, "tf@ci")]);
    assert_eq!(guest.version("default"), before_lock);
    assert!(guest.write_locked("default", &state(10), Some(id), before_lock.clone()));
    assert!(!guest.write_locked("default", &state(11), Some(id), before_lock));
    let after = props(&azurite, KEY);
    assert_eq!(after["lease_status"], "locked", "{after}");
    assert_eq!(after["lock"]["ID"], id, "{after}");
    assert_eq!(guest.read("default"), Some(state(10)));

    // Terraform's lock on a new workspace makes a zero-length blob:
    // expecting no state, the holder's write replaces it.
    let fresh = blob("fresh");
    azurite.native_ok(CONTAINER, &["lock", &fresh, &terraform_lock(id, "tf@ci")]);
    assert!(guest.write_locked("fresh", &state(1), Some(id), Expect::Absent));
    assert_eq!(native_bytes(&azurite, &fresh), Some(state(1)));
    assert_eq!(props(&azurite, &fresh)["lease_status"], "locked");
    azurite.native_ok(CONTAINER, &["unlock", &fresh, id]);
}

#[test]
fn azure_two_hosts_racing_from_one_version_one_wins() {
    let azurite = start();
    // Each host its own engine and instances, as two replicas.
    let (mut a, mut b) = (guest(&azurite), guest(&azurite));
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
        assert_eq!(native_bytes(&azurite, KEY), Some(winner));
        (a, b) = (ga, gb);
    }
}

#[test]
fn azure_two_servers_racing_unlocked_writes_from_one_serial_one_wins() {
    let azurite = start();
    let (d1, d2) = (tempdir(), tempdir());
    let one = server(d1.path(), &azurite, false);
    let two = server(d2.path(), &azurite, false);
    let urls = [
        one.state_url("az", "default"),
        two.state_url("az", "default"),
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
        assert_eq!(native_bytes(&azurite, KEY), Some(ended[0].1.clone()));
    }
    assert_eq!(props(&azurite, KEY)["lease_status"], "unlocked");
}

#[test]
fn azure_metadata_is_compare_and_swapped_and_goes_with_its_workspace() {
    let azurite = start();
    let guest = guest(&azurite);
    let name = |ws: &str| format!("{KEY}.wasmstate-metadata/{ws}.json");
    assert_eq!(guest.metadata("default"), None);
    assert!(guest.write_metadata("default", Some(r#"{"a":1}"#), Expect::Absent));
    assert!(!guest.write_metadata("default", Some(r#"{"a":2}"#), Expect::Absent));
    let first = guest.metadata("default").expect("metadata");
    assert_eq!(first.content, r#"{"a":1}"#);
    assert_eq!(
        native_bytes(&azurite, &name("default")),
        Some(br#"{"a":1}"#.to_vec())
    );
    let stale = Expect::Version(first.version.clone());
    assert!(guest.write_metadata("default", Some(r#"{"a":3}"#), stale.clone()));
    assert!(!guest.write_metadata("default", Some(r#"{"a":4}"#), stale.clone()));
    assert!(!guest.write_metadata("default", None, stale));
    let now = guest.metadata("default").expect("metadata");
    assert_eq!(now.content, r#"{"a":3}"#);
    assert_ne!(now.version, first.version);
    assert!(guest.write_metadata("default", None, Expect::Version(now.version.clone())));
    assert_eq!(guest.metadata("default"), None);
    assert_eq!(native_bytes(&azurite, &name("default")), None);
    // Removing what is gone succeeds, whatever was expected of it.
    assert!(guest.write_metadata("default", None, Expect::Version(now.version)));
    assert!(guest.write_metadata("default", None, Expect::Absent));

    // Deleting a workspace deletes its metadata, and its state.
    assert!(guest.write_if("doomed", &state(1), Expect::Absent));
    assert!(guest.write_metadata("doomed", Some("{}"), Expect::Any));
    assert!(native_bytes(&azurite, &name("doomed")).is_some());
    guest.delete_workspace("doomed");
    assert_eq!(native_bytes(&azurite, &name("doomed")), None);
    assert_eq!(native_bytes(&azurite, &blob("doomed")), None);
    assert_eq!(guest.metadata("doomed"), None);
}

#[test]
fn terraforms_azure_listing_finds_no_metadata_blob() {
    let azurite = start();
    let guest = guest(&azurite);
    assert!(guest.create_workspace("staging"));
    for ws in ["default", "staging", "orphan"] {
        assert!(guest.write_metadata(ws, Some("{}"), Expect::Any));
    }
    // Terraform's azurerm backend lists the blobs named `<key>env:…`.
    let prefix = format!("{KEY}env:");
    assert_eq!(listed(&azurite, &prefix), [blob("staging")]);
    assert_eq!(guest.list_workspaces(), ["default", "staging"]);
    assert_eq!(
        listed(&azurite, &format!("{KEY}.")).len(),
        3,
        "the three documents are there"
    );
}
