//! Issue 44, item 2: workspace metadata (tags, terraform-version,
//! created-at) is the storage's, kept through the guest (contract 0.3.0),
//! so replicas on one storage agree with no shared data directory; a
//! workspace deleted anywhere loses it, a create racing a delete keeps
//! its fresh tags, and what 0.2.x servers kept in `<data_dir>/tfe/
//! workspaces.json` is used, then moved to the storage.

use super::{Fixture, fixture_with, names, text};
use crate::aws::{Locking, settings, start_moto};
use crate::common::*;
use std::path::Path;

const OTHER_LOCAL: &str = "[backends.other]\nguest = \"local\"\n";

/// Another server on `a`'s config (so its storage), with its own data
/// directory.
fn replica(a: &Fixture) -> Fixture {
    let data = tempdir();
    let server = Server::with_config_file(data.path(), &a._data.path().join("wasmstate.toml"));
    let port = server.url.rsplit(':').next().unwrap().to_string();
    Fixture {
        host: format!("wasmstate.example:{port}"),
        server,
        ci: a.ci.clone(),
        foreign: a.foreign.clone(),
        alice: a.alice.clone(),
        _data: data,
    }
}

/// Workspaces of `acme` carrying `tag`, as `f` lists them.
fn tagged(f: &Fixture, tag: &str) -> Vec<String> {
    let list = f.api(
        "GET",
        &format!("organizations/acme/workspaces?search%5Btags%5D={tag}"),
        &f.ci,
        None,
    );
    assert_eq!(list.status, 200, "{}", list.text());
    names(&list.json())
}

/// `name`'s tags as `f` shows them (`None`: no such workspace).
fn tags_of(f: &Fixture, name: &str) -> Option<Vec<String>> {
    let doc = f.api(
        "GET",
        &format!("organizations/acme/workspaces/{name}"),
        &f.ci,
        None,
    );
    if doc.status == 404 {
        return None;
    }
    assert_eq!(doc.status, 200, "{}", doc.text());
    let tags = doc.json()["data"]["attributes"]["tag-names"].clone();
    Some(serde_json::from_value(tags).unwrap())
}

fn tag_body(tags: &[&str]) -> String {
    let tags: Vec<String> = tags
        .iter()
        .map(|t| format!(r#"{{"type":"tags","attributes":{{"name":"{t}"}}}}"#))
        .collect();
    format!(r#"{{"data":[{}]}}"#, tags.join(","))
}

fn create_body(name: &str, tags: &[&str]) -> String {
    format!(
        r#"{{"data":{{"type":"workspaces","attributes":{{"name":"{name}"}},"relationships":{{"tags":{}}}}}}}"#,
        tag_body(tags)
    )
}

fn no_metadata_file(f: &Fixture) -> bool {
    !f._data.path().join("tfe").join("workspaces.json").exists()
}

/// The cloud block with tags through A, workspaces selected and tagged
/// through B, each seeing the other's tags; nothing in either data dir.
fn agree_through_terraform(a: &Fixture, b: &Fixture) {
    let work = a.workdir(&a.cloud("tags = [\"app\"]"));
    let out = a.tf(work.path(), &a.ci, &["init", "-input=true"], "dev\n");
    assert!(out.status.success(), "{}", text(&out));
    a.ok(work.path(), &["workspace", "new", "prod"]);
    a.ok(work.path(), &["apply", "-auto-approve", "-input=false"]);
    assert_eq!(tagged(b, "app"), ["dev", "prod"]);

    // Terraform through B finds both by their tags (A's) and applies.
    let there = b.workdir(&b.cloud("tags = [\"app\"]"));
    let out = b.tf(there.path(), &b.ci, &["init", "-input=true"], "1\n");
    assert!(out.status.success(), "{}", text(&out));
    let list = b.ok(there.path(), &["workspace", "list"]);
    assert!(list.contains("dev") && list.contains("prod"), "{list}");
    b.ok(there.path(), &["workspace", "select", "prod"]);
    b.ok(
        there.path(),
        &["apply", "-auto-approve", "-input=false", "-var", "value=b"],
    );

    // A tag added at B and a terraform-version set at A, each seen at the
    // other.
    let id = b.workspace_id("dev");
    let added = b.api(
        "POST",
        &format!("workspaces/{id}/relationships/tags"),
        &b.ci,
        Some(&tag_body(&["blue"])),
    );
    assert_eq!(added.status, 204, "{}", added.text());
    assert_eq!(tagged(a, "blue"), ["dev"]);
    let patched = a.api(
        "PATCH",
        &format!("workspaces/{id}"),
        &a.ci,
        Some(r#"{"data":{"type":"workspaces","attributes":{"terraform-version":"1.11.4"}}}"#),
    );
    assert_eq!(patched.status, 200, "{}", patched.text());
    let seen = b
        .api("GET", &format!("workspaces/{id}"), &b.ci, None)
        .json();
    assert_eq!(seen["data"]["attributes"]["terraform-version"], "1.11.4");
    assert_eq!(
        seen["data"]["attributes"]["tag-names"],
        serde_json::json!(["app", "blue"])
    );
    assert!(no_metadata_file(a) && no_metadata_file(b));
}

#[test]
fn replicas_on_one_local_dir_agree_on_tags_with_no_shared_data_dir() {
    let store = tempdir();
    let backends = format!(
        "[backends.acme]\nguest = \"local\"\ndir = {:?}\n{OTHER_LOCAL}",
        store.path()
    );
    let a = fixture_with(&backends, "");
    let b = replica(&a);
    agree_through_terraform(&a, &b);
}

/// Replicas on s3-lockfile (moto): they agree on tags; an http-door
/// `DELETE /states/...`, which is the workspace there, takes the tags
/// with it; and a TFE create racing a delete on the other replica keeps
/// its fresh tags, at both.
#[test]
fn replicas_on_s3_lockfile_agree_and_a_create_racing_a_delete_keeps_its_tags() {
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
    let a = fixture_with(&backends, "");
    let b = replica(&a);
    agree_through_terraform(&a, &b);

    // Deleting prod's state at A's http door deletes the workspace on
    // s3-lockfile: pushed again at the http door, it has no tags.
    let deleted = a.http("DELETE", "/states/acme/prod", None);
    assert_eq!(deleted.status, 200, "{}", deleted.text());
    assert_eq!(tags_of(&b, "prod"), None, "prod is gone");
    assert_eq!(
        a.http("POST", "/states/acme/prod", Some(&state(1))).status,
        200
    );
    assert_eq!(tags_of(&a, "prod"), Some(vec![]));
    assert_eq!(tags_of(&b, "prod"), Some(vec![]));
    assert!(!tagged(&b, "app").contains(&"prod".to_string()));

    race_creates_and_deletes(&a, &b);
}

/// Rounds of a TFE delete of `race` at `a` racing a TFE create of it with
/// a fresh tag at `b`: whichever comes first, a workspace created shows
/// its creator's tags, and only them, at both replicas; one deleted after
/// the create is gone at both.
fn race_creates_and_deletes(a: &Fixture, b: &Fixture) {
    for round in 0..6 {
        let old = format!("old-{round}");
        let fresh = format!("fresh-{round}");
        if tags_of(a, "race").is_none() {
            let made = a.api(
                "POST",
                "organizations/acme/workspaces",
                &a.ci,
                Some(&create_body("race", &[&old])),
            );
            assert_eq!(made.status, 201, "{}", made.text());
        }
        let (deleted, created) = std::thread::scope(|s| {
            let delete = s.spawn(|| {
                a.api("DELETE", "organizations/acme/workspaces/race", &a.ci, None)
                    .status
            });
            let create = s.spawn(|| {
                b.api(
                    "POST",
                    "organizations/acme/workspaces",
                    &b.ci,
                    Some(&create_body("race", &[&fresh])),
                )
                .status
            });
            (delete.join().unwrap(), create.join().unwrap())
        });
        assert!(
            [204, 404].contains(&deleted),
            "round {round}: delete {deleted}"
        );
        assert!(
            [201, 422].contains(&created),
            "round {round}: create {created}"
        );
        let (at_a, at_b) = (tags_of(a, "race"), tags_of(b, "race"));
        assert_eq!(at_a, at_b, "round {round}: the replicas disagree");
        match at_a {
            // Created after the delete: its own tags, nothing of the old.
            Some(tags) => assert_eq!(tags, std::slice::from_ref(&fresh), "round {round}"),
            // Refused as taken, then deleted.
            None => assert_eq!(created, 422, "round {round}: created, then lost"),
        }
    }
}

/// What a 0.2.x server wrote in `<data_dir>/tfe/workspaces.json`.
fn old_file(data: &Path, content: &str) {
    let dir = data.join("tfe");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("workspaces.json"), content).unwrap();
}

/// Upgrading: tags kept in the old per-replica file are used, and moved
/// to the storage by the workspace's next change, so the other replicas
/// see them from then on and nobody's tags vanish.
#[test]
fn tags_in_the_old_file_are_used_then_moved_to_the_storage() {
    let store = tempdir();
    let backends = format!(
        "[backends.acme]\nguest = \"local\"\ndir = {:?}\n{OTHER_LOCAL}",
        store.path()
    );
    let a = fixture_with(&backends, "");
    assert_eq!(
        a.http("POST", "/states/acme/net", Some(&state(1))).status,
        200
    );
    let config = a._data.path().join("wasmstate.toml");
    let data = a._data.path().to_path_buf();
    let Fixture {
        server,
        ci,
        foreign,
        alice,
        _data,
        ..
    } = a;
    drop(server);
    old_file(
        &data,
        r#"{"acme":{"net":{"tags":["network"],"terraform_version":"1.9.0","created_at":"2026-01-01T00:00:00Z"}}}"#,
    );
    let server = Server::with_config_file(&data, &config);
    let port = server.url.rsplit(':').next().unwrap().to_string();
    let a = Fixture {
        host: format!("wasmstate.example:{port}"),
        server,
        ci,
        foreign,
        alice,
        _data,
    };
    // The cloud block selects it by its old tag.
    assert_eq!(tagged(&a, "network"), ["net"]);
    let work = a.workdir(&a.cloud("tags = [\"network\"]"));
    let out = a.tf(work.path(), &a.ci, &["init", "-input=true"], "1\n");
    assert!(out.status.success(), "{}", text(&out));
    let list = a.ok(work.path(), &["workspace", "list"]);
    assert!(list.contains("net"), "{list}");

    // Its next change moves it to the storage, old tags kept.
    let id = a.workspace_id("net");
    let added = a.api(
        "POST",
        &format!("workspaces/{id}/relationships/tags"),
        &a.ci,
        Some(&tag_body(&["prod"])),
    );
    assert_eq!(added.status, 204, "{}", added.text());
    let b = replica(&a);
    assert_eq!(tagged(&b, "network"), ["net"]);
    assert_eq!(
        tags_of(&b, "net"),
        Some(vec!["network".into(), "prod".into()])
    );
    let seen = b
        .api("GET", &format!("workspaces/{id}"), &b.ci, None)
        .json();
    assert_eq!(seen["data"]["attributes"]["terraform-version"], "1.9.0");
    assert_eq!(
        seen["data"]["attributes"]["created-at"],
        "2026-01-01T00:00:00Z"
    );
    let left = std::fs::read_to_string(data.join("tfe").join("workspaces.json")).unwrap();
    assert!(!left.contains("network"), "moved out of the file: {left}");
}

/// A guest built for contract 0.2.1 keeps no metadata: the server says so
/// once at start, naming the backend, and keeps its tags in this
/// replica's file, as before.
#[test]
fn a_guest_that_keeps_no_metadata_is_named_and_its_tags_stay_in_the_file() {
    let old_guest = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/v0.2.1/local.wasm"
    );
    let store = tempdir();
    let backends = format!(
        "[backends.acme]\nguest = {old_guest:?}\ndir = {:?}\n{OTHER_LOCAL}",
        store.path()
    );
    let a = fixture_with(&backends, "");
    let made = a.api(
        "POST",
        "organizations/acme/workspaces",
        &a.ci,
        Some(&create_body("net", &["network"])),
    );
    assert_eq!(made.status, 201, "{}", made.text());
    assert_eq!(tagged(&a, "network"), ["net"]);
    let file = std::fs::read_to_string(a._data.path().join("tfe").join("workspaces.json")).unwrap();
    assert!(file.contains("network"), "{file}");
    let log = a.server.log_text();
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("keeps no workspace metadata"))
        .collect();
    assert_eq!(warned.len(), 1, "{log}");
    assert!(warned[0].contains("acme"), "{}", warned[0]);
    assert!(warned[0].contains("0.2.1"), "{}", warned[0]);
    // Another replica on the same storage: its own file, so not these tags.
    let b = replica(&a);
    assert_eq!(tagged(&b, "network"), Vec::<String>::new());
}
