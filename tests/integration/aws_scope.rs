//! Issue 47, security 1: what the host signs for a stranger's guest (one
//! that is not first-party). With `aws_sign` and a `bucket` but no `key`,
//! the host signed every object, listing and `LockID` of the bucket for
//! it: it could read, overwrite and delete other tenants' states with the
//! host's credentials. Its grant must now name its states (`key`), or the
//! server refuses to start, and `check-config` says what to add.

use crate::aws::{BUCKET, Locking, start_moto};
use crate::common::*;
use std::process::Command;
use std::sync::{Arc, Mutex};

/// The AWS-signing probe fixture (`tests/fixtures/aws-probe`).
const AWS_PROBE_WASM: &str = env!("WASMSTATE_FIXTURE_AWS_PROBE");

/// Another tenant's state in the shared bucket.
const OTHERS: &str = "tenants/other/terraform.tfstate";
/// The probe's own state.
const OWN: &str = "tenants/acme/terraform.tfstate";

/// A backend `name` running the probe on `url`, its config's `key` line
/// `key` (may be empty), probing `path`.
fn probe_backend(name: &str, url: &str, key: &str, path: &str) -> String {
    format!(
        "[backends.{name}]\nguest = {AWS_PROBE_WASM:?}\naws_sign = [{url:?}]\n\
         [backends.{name}.config]\nendpoint = {url:?}\nbucket = {BUCKET:?}\n{key}\
         probe_path = {path:?}\nregion = \"us-east-1\"\naccess_key = \"test\"\nsecret_key = \"test\"\n"
    )
}

/// Output and error of a finished command, as one text.
fn output(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn a_strangers_guest_must_name_its_states_and_is_signed_for_nothing_else() {
    let moto = start_moto(Locking::LockFile);
    moto.put_object(BUCKET, OTHERS, &state(7));
    moto.put_object(BUCKET, OWN, &state(1));
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = seen.clone();
    let proxy = FaultProxy::with_rule(
        &moto.url,
        Box::new(move |what: &str| {
            log.lock().unwrap().push(what.to_string());
            None
        }),
    );
    let url = &proxy.url;
    let dir = tempdir();

    // No key: refused by check-config and at start, with the key to add.
    let keyless = dir.path().join("keyless.toml");
    std::fs::write(
        &keyless,
        probe_backend("probe", url, "", &format!("/{BUCKET}/{OTHERS}")),
    )
    .unwrap();
    let expected = "backends.probe.config.key: missing";
    let (ok, text) = wasmstate(&["check-config", keyless.to_str().unwrap()]);
    assert!(!ok, "check-config passed a keyless grant: {text}");
    assert!(
        text.contains(expected) && text.contains("add key = "),
        "{text}"
    );
    let serve = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--config")
        .arg(&keyless)
        .output()
        .unwrap();
    assert!(!serve.status.success(), "{}", output(&serve));
    assert!(output(&serve).contains(expected), "{}", output(&serve));

    // A key: its own state is signed; another tenant's state and a
    // listing of the whole bucket are refused before they leave the host.
    // Each its own namespace on the bucket (refused at load otherwise).
    let layout =
        |key: &str, prefix: &str| format!("key = {key:?}\nworkspace_key_prefix = {prefix:?}\n");
    let config = [
        probe_backend(
            "own",
            url,
            &layout(OWN, "acme-env"),
            &format!("/{BUCKET}/{OWN}"),
        ),
        probe_backend(
            "others",
            url,
            &layout("tenants/b/terraform.tfstate", "b-env"),
            &format!("/{BUCKET}/{OTHERS}"),
        ),
        probe_backend(
            "listing",
            url,
            &layout("tenants/c/terraform.tfstate", "c-env"),
            &format!("/{BUCKET}?list-type=2"),
        ),
    ]
    .concat();
    let (ok, text) = wasmstate(&["check-config", &write(dir.path(), &config)]);
    assert!(ok, "{text}");
    let server = Server::with_config(&dir.path().join("served"), &config);
    let probe = |backend: &str| -> serde_json::Value {
        let answer = send("GET", &server.state_url(backend, "default"), None);
        assert_eq!(answer.status, 200, "{}", answer.text());
        let line = answer.body.split(|b| *b == b'\n').next().unwrap().to_vec();
        serde_json::from_slice(&line).unwrap()
    };
    assert_eq!(probe("own")["status"]["Ok"], 200);
    assert!(seen.lock().unwrap().iter().any(|r| r.contains(OWN)));
    for backend in ["others", "listing"] {
        let refused = probe(backend);
        assert!(refused["status"]["Err"].is_string(), "{backend}: {refused}");
    }
    let reached = seen.lock().unwrap().clone();
    assert!(
        !reached
            .iter()
            .any(|r| r.contains(OTHERS) || r.contains("list-type")),
        "a request outside the guest's states reached the store: {reached:?}"
    );
    let log = server.log_text();
    assert!(log.contains("outside the backend's state layout"), "{log}");
    assert!(log.contains("reaches beyond the backend's states"), "{log}");
    assert_eq!(moto.object(BUCKET, OTHERS), Some(state(7)));
}

/// `config` written to `dir/wasmstate.toml`; its path.
fn write(dir: &std::path::Path, config: &str) -> String {
    let path = dir.join("wasmstate.toml");
    std::fs::write(&path, config).unwrap();
    path.to_str().unwrap().to_string()
}

/// Review of issue 47, F1 and F2: a stranger's grant that named a key
/// still reached other tenants' states when its layout overlapped theirs
/// (`key = "terraform.tfstate"`, `workspace_key_prefix = "tenants"`: its
/// workspace `other` is the state `tenants/other/terraform.tfstate`), and
/// listed every workspace of a first-party backend sharing the default
/// prefix `env:`. A stranger's layout must now be a namespace of its own
/// on its bucket: `check-config` and `serve` refuse an overlap, naming
/// both backends; a disjoint one serves, and its listings stay in it.
#[test]
fn a_strangers_layout_overlapping_another_backends_is_refused_at_load() {
    let moto = start_moto(Locking::LockFile);
    moto.put_object(BUCKET, OTHERS, &state(7));
    moto.put_object(BUCKET, "env:/prod/app/terraform.tfstate", &state(8));
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = seen.clone();
    let proxy = FaultProxy::with_rule(
        &moto.url,
        Box::new(move |what: &str| {
            log.lock().unwrap().push(what.to_string());
            None
        }),
    );
    let url = &proxy.url;
    let dir = tempdir();
    let first_party = crate::aws::backend_config(url, Locking::LockFile, "");
    let refused = |name: &str, config: &str, other: &str| {
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, config).unwrap();
        let (ok, text) = wasmstate(&["check-config", path.to_str().unwrap()]);
        assert!(!ok, "check-config passed an overlapping layout: {text}");
        for needed in [
            format!("backends.{name} (bucket"),
            format!("backends.{other} (bucket"),
            "a namespace of its own".into(),
            "workspace_key_prefix".into(),
        ] {
            assert!(text.contains(&needed), "{needed}: {text}");
        }
        let serve = Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--config")
            .arg(&path)
            .output()
            .unwrap();
        assert!(!serve.status.success(), "{}", output(&serve));
        assert!(
            output(&serve).contains("a namespace of its own"),
            "{}",
            output(&serve)
        );
    };
    // Its workspace `other` is another stranger's default state.
    let overlap = [
        probe_backend(
            "overlap",
            url,
            "key = \"terraform.tfstate\"\nworkspace_key_prefix = \"tenants\"\n",
            &format!("/{BUCKET}/{OTHERS}"),
        ),
        probe_backend(
            "other",
            url,
            &format!("key = {OTHERS:?}\nworkspace_key_prefix = \"other-env\"\n"),
            &format!("/{BUCKET}/{OTHERS}"),
        ),
    ]
    .concat();
    refused("overlap", &overlap, "other");
    // Both under the default prefix `env:`: the first-party backend's
    // workspaces would be listed, and named, by the stranger.
    let listing = |prefix: &str| {
        probe_backend(
            "listing",
            url,
            &format!("key = {OWN:?}\n{prefix}"),
            &format!("/{BUCKET}?list-type=2&prefix=env%3A%2F"),
        )
    };
    refused("listing", &format!("{first_party}{}", listing("")), "aws");
    assert!(
        seen.lock().unwrap().is_empty(),
        "{:?}",
        seen.lock().unwrap()
    );

    // A prefix of its own: served, and its listing of `env:/` (another
    // backend's namespace) refused before it leaves the host.
    let config = format!(
        "{first_party}{}",
        listing("workspace_key_prefix = \"acme-env\"\n")
    );
    let server = Server::with_config(&dir.path().join("served"), &config);
    let answer = send("GET", &server.state_url("listing", "default"), None);
    assert_eq!(answer.status, 200, "{}", answer.text());
    let line = answer.body.split(|b| *b == b'\n').next().unwrap().to_vec();
    let probe: serde_json::Value = serde_json::from_slice(&line).unwrap();
    assert!(probe["status"]["Err"].is_string(), "{probe}");
    let reached = seen.lock().unwrap().clone();
    assert!(
        !reached.iter().any(|r| r.contains("list-type")),
        "a listing of another backend's namespace reached the store: {reached:?}"
    );
    assert!(
        server
            .log_text()
            .contains("reaches beyond the backend's states"),
        "{}",
        server.log_text()
    );
}
