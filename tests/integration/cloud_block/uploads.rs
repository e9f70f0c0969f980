//! State versions through the API itself: upload URLs are single-use
//! capabilities, inline states are written at once through the same
//! guard, and a version whose upload never came (the server killed in
//! between) never becomes current.

use super::{Fixture, fixture};
use crate::common::*;
use base64::Engine as _;

#[test]
fn upload_urls_are_single_use_and_inline_states_are_written_at_once() {
    let f = fixture();
    let created = f.api(
        "POST",
        "organizations/acme/workspaces",
        &f.ci,
        Some(r#"{"data":{"type":"workspaces","attributes":{"name":"raw"}}}"#),
    );
    assert_eq!(created.status, 201, "{}", created.text());
    let taken = f.api(
        "POST",
        "organizations/acme/workspaces",
        &f.ci,
        Some(r#"{"data":{"type":"workspaces","attributes":{"name":"raw"}}}"#),
    );
    assert_eq!(taken.status, 422);
    let id = created.json()["data"]["id"].as_str().unwrap().to_string();
    let md5 = |b: &[u8]| {
        use md5::Digest;
        hex::encode(md5::Md5::digest(b))
    };

    // A state version is created only under the caller's lock.
    let one = state(1);
    let create = |body: &[u8], serial: u64| {
        f.api(
            "POST",
            &format!("workspaces/{id}/state-versions"),
            &f.ci,
            Some(&format!(
                r#"{{"data":{{"type":"state-versions","attributes":{{"serial":{serial},"md5":"{}","lineage":"test-lineage"}}}}}}"#,
                md5(body)
            )),
        )
    };
    let unlocked = create(&one, 1);
    assert_eq!(unlocked.status, 409, "{}", unlocked.text());
    let locked = f.api(
        "POST",
        &format!("workspaces/{id}/actions/lock"),
        &f.ci,
        None,
    );
    assert_eq!(locked.status, 200, "{}", locked.text());

    // Upload mode: the URL works once, without a bearer.
    let version = f.api(
        "POST",
        &format!("workspaces/{id}/state-versions"),
        &f.ci,
        Some(&format!(
            r#"{{"data":{{"type":"state-versions","attributes":{{"serial":1,"md5":"{}","lineage":"test-lineage"}}}}}}"#,
            md5(&one)
        )),
    );
    assert_eq!(version.status, 201, "{}", version.text());
    let url = version.json()["data"]["attributes"]["hosted-state-upload-url"]
        .as_str()
        .unwrap()
        .to_string();
    let octets = [("Content-Type", "application/octet-stream")];
    assert_eq!(f.http("GET", "/states/acme/raw", None).status, 404);
    assert_eq!(send_with("PUT", &url, Some(&one), &octets).status, 200);
    assert_eq!(f.http("GET", "/states/acme/raw", None).body, one);
    assert_eq!(send_with("PUT", &url, Some(&state(9)), &octets).status, 404);
    assert_eq!(f.http("GET", "/states/acme/raw", None).body, one);

    // Inline: written by the create itself, through the same guard.
    let two = state(2);
    let inline = |body: &[u8], serial: u64| {
        f.api(
            "POST",
            &format!("workspaces/{id}/state-versions"),
            &f.ci,
            Some(&format!(
                r#"{{"data":{{"type":"state-versions","attributes":{{"serial":{serial},"md5":"{}","lineage":"test-lineage","state":"{}"}}}}}}"#,
                md5(body),
                base64::engine::general_purpose::STANDARD.encode(body)
            )),
        )
    };
    assert_eq!(inline(&two, 2).status, 201);
    assert_eq!(f.http("GET", "/states/acme/raw", None).body, two);
    let stale = inline(&one, 1);
    assert_eq!(stale.status, 409, "{}", stale.text());
    assert_eq!(f.http("GET", "/states/acme/raw", None).body, two);

    // A server killed between a create and its upload forgets the
    // pending version: the upload is refused and the old state stays.
    let three = state(3);
    let version = f.api(
        "POST",
        &format!("workspaces/{id}/state-versions"),
        &f.ci,
        Some(&format!(
            r#"{{"data":{{"type":"state-versions","attributes":{{"serial":3,"md5":"{}","lineage":"test-lineage"}}}}}}"#,
            md5(&three)
        )),
    );
    assert_eq!(version.status, 201, "{}", version.text());
    let url = version.json()["data"]["attributes"]["hosted-state-upload-url"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, capability) = url.split_once("/_tfe/").unwrap();
    let Fixture {
        server,
        ci,
        _data: data,
        ..
    } = f;
    // Killed (SIGKILL, on drop), not stopped gracefully.
    drop(server);
    let config = data.path().join("wasmstate.toml");
    let again = Server::with_config_file(data.path(), &config);
    let put = send_with(
        "PUT",
        &format!("{}/_tfe/{capability}", again.url),
        Some(&three),
        &octets,
    );
    assert_eq!(put.status, 404, "{}", put.text());
    let stored = send_with(
        "GET",
        &again.state_url("acme", "raw"),
        None,
        &[("Authorization", &format!("Bearer {ci}"))],
    );
    assert_eq!(stored.body, two);
}

/// The same with the real terraform: its apply's state version is created
/// (the create answered), its upload held on the way by a proxy, and the
/// server killed (SIGKILL) meanwhile. Restarted, the server serves the old
/// state as current, at both doors.
#[test]
fn a_server_killed_between_terraforms_create_and_upload_leaves_the_old_state() {
    let f = fixture();
    let config = f.cloud("name = \"net\"");
    let direct = f.workdir(&config);
    f.ok(direct.path(), &["init", "-input=false"]);
    f.ok(direct.path(), &["apply", "-auto-approve", "-input=false"]);
    let old = f.http("GET", "/states/acme/net", None).body;

    // A second working directory reaches the server through a proxy that
    // holds every upload PUT (upload URLs are built from the Host it
    // forwards, so they point at the proxy too).
    let proxy = FaultProxy::with_rule(
        &f.server.url,
        Box::new(|request| {
            request
                .starts_with("PUT /_tfe/upload")
                .then_some(Fault::Held)
        }),
    );
    let held = f.workdir(&config);
    let api = format!("{}/api/v2/", proxy.url);
    std::fs::write(
        held.path().join("test.tfrc"),
        format!(
            "host \"{}\" {{\n  services = {{\n    \"tfe.v2\" = \"{api}\"\n    \"tfe.v2.1\" = \"{api}\"\n  }}\n}}\n",
            f.host
        ),
    )
    .unwrap();
    f.ok(held.path(), &["init", "-input=false"]);
    let mut apply = crate::terraform::terraform(
        held.path(),
        &[
            "apply",
            "-auto-approve",
            "-input=false",
            "-var",
            "value=two",
        ],
    )
    .env(format!("TF_TOKEN_{}", f.host.replace('.', "_")), &f.ci)
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap();
    proxy.wait_for_faults(1, std::time::Duration::from_secs(120));
    let Fixture {
        server,
        ci,
        _data: data,
        ..
    } = f;
    drop(server);
    apply.kill().unwrap();
    apply.wait().unwrap();
    drop(proxy);

    let again = Server::with_config_file(data.path(), &data.path().join("wasmstate.toml"));
    let auth = format!("Bearer {ci}");
    let stored = send_with(
        "GET",
        &again.state_url("acme", "net"),
        None,
        &[("Authorization", &auth)],
    );
    assert_eq!(stored.body, old);
    let serial = serde_json::from_slice::<serde_json::Value>(&old).unwrap()["serial"].clone();
    let id = crate::common::send_with(
        "GET",
        &format!("{}/api/v2/organizations/acme/workspaces/net", again.url),
        None,
        &[("Authorization", &auth)],
    )
    .json()["data"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let current = send_with(
        "GET",
        &format!("{}/api/v2/workspaces/{id}/current-state-version", again.url),
        None,
        &[("Authorization", &auth)],
    );
    assert_eq!(current.json()["data"]["attributes"]["serial"], serial);
}
