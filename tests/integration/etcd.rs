//! The example third-party guest (`examples/etcd-guest`) against a real etcd
//! (Debian's etcd-server, installed when missing) on loopback ports.

use crate::common::*;

/// `wasmstate guest test` on the etcd guest, with `extra` arguments.
fn kit(etcd: &Etcd, extra: &[&str]) -> (bool, String) {
    let endpoint = format!("endpoint={}", etcd.url);
    let mut args = vec!["guest", "test", ETCD_GUEST_WASM, "--config", &endpoint];
    args.extend_from_slice(extra);
    wasmstate(&args)
}

#[test]
fn the_etcd_guest_passes_the_kit() {
    let etcd = Etcd::start();
    let (ok, out) = kit(&etcd, &["--allow-http", &etcd.url]);
    assert!(ok, "{out}");
    assert!(summary(&out).ends_with("passed, 0 failed"), "{out}");
}

#[test]
fn without_a_grant_the_etcd_guest_cannot_reach_etcd() {
    let etcd = Etcd::start();
    let (ok, out) = kit(&etcd, &[]);
    assert!(!ok, "{out}");
    assert!(out.contains("the host refused the request"), "{out}");
    assert!(
        out.contains(&format!("allow_http = [\"{}\"]", etcd.url)),
        "{out}"
    );
}

#[test]
fn terraform_apply_through_the_etcd_guest() {
    let etcd = Etcd::start();
    let data = tempdir();
    let server = Server::with_config(
        data.path(),
        &format!(
            "[backends.etcd]\nguest = \"{ETCD_GUEST_WASM}\"\nallow_http = [\"{url}\"]\n[backends.etcd.config]\nendpoint = \"{url}\"\n",
            url = etcd.url
        ),
    );
    let url = server.state_url("etcd", "tf");
    let work = tempdir();
    crate::terraform::apply_and_check(work.path(), &url, &server);
}

/// The key `key` in `etcd`, read through its JSON gateway.
fn etcd_value(etcd: &Etcd, key: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let answer: serde_json::Value = reqwest::blocking::Client::new()
        .post(format!("{}/v3/kv/range", etcd.url))
        .json(&serde_json::json!({ "key": b64.encode(key) }))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let value = answer["kvs"].get(0)?["value"].as_str().unwrap_or("");
    Some(b64.decode(value).unwrap())
}

/// The etcd guest on `etcd`, loaded as `serve` loads it.
fn etcd_guest(etcd: &Etcd) -> (wasmstate::conformance::LoadedGuest, tokio::runtime::Runtime) {
    use wasmstate::conformance::{GuestUnderTest, load_guest};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let loaded = rt
        .block_on(load_guest(&GuestUnderTest {
            guest: wasmstate::guests::GuestSource::File(ETCD_GUEST_WASM.into()),
            config: vec![("endpoint".into(), etcd.url.clone())],
            dir: None,
            allow_http: vec![wasmstate::policy::Origin::parse(&etcd.url).unwrap()],
            aws_sign: Vec::new(),
            allow_git: Vec::new(),
            git_refs: Vec::new(),
            git_paths: Vec::new(),
            limits: wasmstate::config::Limits::default(),
        }))
        .unwrap_or_else(|e| panic!("loading the etcd guest: {e:#}"));
    (loaded, rt)
}

#[test]
fn the_state_version_is_the_manifest_revision_and_metadata_a_key_beside_it() {
    use wasmstate::backend::{Expect, Storage};
    let etcd = Etcd::start();
    let (guest, rt) = etcd_guest(&etcd);
    let s = &guest.storage;
    let write = |body: Vec<u8>, expect| rt.block_on(s.write_if("ws", body.into(), None, expect));
    assert!(write(state(1), Expect::Absent).unwrap());
    let head = rt.block_on(s.head("ws")).unwrap().unwrap();
    assert_eq!(head.prefix, state(1));
    assert_eq!(head.size, state(1).len() as u64);
    // A stale revision, or no state over one: refused, nothing changed.
    assert!(write(state(2), Expect::Version(head.version.clone())).unwrap());
    assert!(!write(state(3), Expect::Version(head.version.clone())).unwrap());
    assert!(!write(state(3), Expect::Absent).unwrap());
    assert_eq!(rt.block_on(s.read("ws")).unwrap().unwrap(), state(2));
    let meta = |content: Option<&str>, expect| {
        rt.block_on(s.write_metadata("ws", content.map(str::to_string), expect))
            .unwrap()
    };
    assert!(meta(Some(r#"{"tags":["a"]}"#), Expect::Absent));
    assert!(!meta(Some("{}"), Expect::Absent));
    let first = rt.block_on(s.read_metadata("ws")).unwrap().unwrap();
    assert_eq!(
        etcd_value(&etcd, "wasmstate/metadata/ws").unwrap(),
        br#"{"tags":["a"]}"#
    );
    assert!(meta(
        Some(r#"{"tags":["b"]}"#),
        Expect::Version(first.version.clone())
    ));
    assert!(!meta(None, Expect::Version(first.version)));
    // Deleting the workspace takes its metadata along.
    rt.block_on(s.delete_workspace("ws")).unwrap();
    assert!(rt.block_on(s.read_metadata("ws")).unwrap().is_none());
    assert!(etcd_value(&etcd, "wasmstate/metadata/ws").is_none());
}

#[test]
fn two_servers_on_one_etcd_racing_one_serial_answer_200_and_409() {
    let etcd = Etcd::start();
    let config = format!(
        "[backends.etcd]\nguest = \"{ETCD_GUEST_WASM}\"\nallow_http = [\"{url}\"]\n[backends.etcd.config]\nendpoint = \"{url}\"\n",
        url = etcd.url
    );
    let dirs = [tempdir(), tempdir()];
    let servers: Vec<Server> = dirs
        .iter()
        .map(|d| Server::with_config(d.path(), &config))
        .collect();
    let urls: Vec<String> = servers
        .iter()
        .map(|s| s.state_url("etcd", "race"))
        .collect();
    assert_eq!(send("POST", &urls[0], Some(&state(0))).status, 200);
    for serial in 1..=8u64 {
        let bodies: Vec<Vec<u8>> = (0..2)
            .map(|h| {
                format!(r#"{{"version":4,"serial":{serial},"lineage":"test-lineage","by":{h}}}"#)
                    .into_bytes()
            })
            .collect();
        let start = std::sync::Barrier::new(2);
        let statuses: Vec<u16> = std::thread::scope(|scope| {
            let racers: Vec<_> = (0..2)
                .map(|h| {
                    let (start, url, body) = (&start, &urls[h], &bodies[h]);
                    scope.spawn(move || {
                        start.wait();
                        send("POST", url, Some(body)).status
                    })
                })
                .collect();
            racers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let mut sorted = statuses.clone();
        sorted.sort();
        assert_eq!(sorted, [200, 409], "serial {serial}: {statuses:?}");
        let winner = statuses.iter().position(|s| *s == 200).unwrap();
        assert_eq!(send("GET", &urls[1 - winner], None).body, bodies[winner]);
    }
}
