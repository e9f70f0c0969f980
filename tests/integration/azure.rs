//! The `azure` guest against Azurite (Microsoft's emulator of Azure
//! Storage): the conformance kit, Terraform through wasmstate, and the
//! layout Terraform's `azurerm` backend keeps, checked blob by blob
//! beside a client acting as that backend does (Microsoft's Python SDK,
//! [`Azurite::native`]): each side's lock stops the other, each reads the
//! state the other wrote, and snapshots are the history.

use crate::common::azurite::{ACCOUNT, ACCOUNT_KEY};
use crate::common::*;
use crate::terraform::{apply_and_check, ok, run};
use std::path::Path;

pub(crate) const CONTAINER: &str = "tfstate";
pub(crate) const KEY: &str = "prod.terraform.tfstate";

pub(crate) fn start() -> Azurite {
    let azurite = Azurite::start();
    azurite.native_ok(CONTAINER, &["create-container"]);
    azurite
}

pub(crate) fn settings(azurite: &Azurite, snapshot: bool) -> Vec<(String, String)> {
    [
        ("storage_account_name", ACCOUNT.to_string()),
        ("container_name", CONTAINER.to_string()),
        ("key", KEY.to_string()),
        ("blob_endpoint", azurite.endpoint()),
        ("access_key", ACCOUNT_KEY.to_string()),
        ("snapshot", snapshot.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

pub(crate) fn server(data: &Path, azurite: &Azurite, snapshot: bool) -> Server {
    server_with(data, azurite, snapshot, "")
}

/// [`server`], with `extra` lines in the backend's table.
fn server_with(data: &Path, azurite: &Azurite, snapshot: bool, extra: &str) -> Server {
    Server::with_config(
        data,
        &backend_table("az", "azure", extra, &settings(azurite, snapshot)),
    )
}

/// `wasmstate guest test azure` with these settings.
fn kit(settings: &[(String, String)]) -> (bool, String) {
    let mut args = vec!["guest".to_string(), "test".into(), "azure".into()];
    for (k, v) in settings {
        args.push("--config".into());
        args.push(format!("{k}={v}"));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    wasmstate(&args)
}

/// The blob of workspace `ws`, as Terraform's azurerm backend names it.
pub(crate) fn blob(ws: &str) -> String {
    match ws {
        "default" => KEY.to_string(),
        _ => format!("{KEY}env:{ws}"),
    }
}

/// A blob's bytes, read by the native client.
pub(crate) fn native_bytes(azurite: &Azurite, name: &str) -> Option<Vec<u8>> {
    let file = tempfile::NamedTempFile::new().unwrap();
    let (code, _) = azurite.native(CONTAINER, &["get", name, file.path().to_str().unwrap()]);
    (code == 0).then(|| std::fs::read(file.path()).unwrap())
}

/// Write `bytes` to a blob as Terraform's Put does (`lease` when held).
pub(crate) fn native_put(
    azurite: &Azurite,
    name: &str,
    bytes: &[u8],
    lease: Option<&str>,
    snapshot: bool,
) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), bytes).unwrap();
    azurite.native_ok(
        CONTAINER,
        &[
            "put",
            name,
            file.path().to_str().unwrap(),
            lease.unwrap_or("-"),
            &snapshot.to_string(),
        ],
    );
}

pub(crate) fn props(azurite: &Azurite, name: &str) -> serde_json::Value {
    azurite.native_ok(CONTAINER, &["props", name])
}

/// A LockInfo as Terraform's client makes one (a UUID as its ID).
pub(crate) fn terraform_lock(id: &str, who: &str) -> String {
    serde_json::json!({
        "ID": id, "Operation": "OperationTypeApply", "Info": "", "Who": who,
        "Version": "1.11.4", "Created": "2026-01-02T15:04:05.123456789Z", "Path": ""
    })
    .to_string()
}

/// A state of `serial` holding `pad` bytes of padding (big states go up
/// in blocks).
fn padded_state(serial: u64, pad: usize) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "version": 4, "terraform_version": "1.11.4", "serial": serial, "lineage": "azure-lineage",
        "outputs": {"pad": {"value": "x".repeat(pad), "type": "string"}}, "resources": []
    }))
    .unwrap()
}

#[test]
fn azure_passes_the_kit_with_snapshots_as_history() {
    let azurite = start();
    let (ok, out) = kit(&settings(&azurite, true));
    assert!(ok, "{out}");
    assert_eq!(summary(&out), "33 passed, 0 failed", "{out}");
}

#[test]
fn azure_passes_the_kit_without_snapshots() {
    let azurite = start();
    let (ok, out) = kit(&settings(&azurite, false));
    assert!(ok, "{out}");
    assert_eq!(summary(&out), "33 passed, 0 failed", "{out}");
}

/// A container SAS instead of the account key: the host appends it to
/// each request (the kit's every case, locks included). Without
/// snapshots: Azurite refuses a container SAS on a snapshot's read (even
/// one made by Microsoft's SDK).
#[test]
fn azure_passes_the_kit_with_a_sas_token() {
    let azurite = start();
    let sas = azurite.native_ok(CONTAINER, &["sas"]);
    let mut settings: Vec<(String, String)> = settings(&azurite, false)
        .into_iter()
        .filter(|(k, _)| k != "access_key")
        .collect();
    settings.push(("sas_token".into(), sas.as_str().unwrap().to_string()));
    let (ok, out) = kit(&settings);
    assert!(ok, "{out}");
    assert_eq!(summary(&out), "33 passed, 0 failed", "{out}");
}

#[test]
fn azure_refuses_unknown_settings_by_name() {
    let azurite = start();
    let mut settings = settings(&azurite, false);
    settings.push(("containr_name".into(), "typo".into()));
    let (ok, out) = kit(&settings);
    assert!(!ok, "{out}");
    assert!(out.contains("unknown key `containr_name`"), "{out}");
}

#[test]
fn terraform_through_azure() {
    let azurite = start();
    let (data, work) = (tempdir(), tempdir());
    let server = server(data.path(), &azurite, false);
    let url = server.state_url("az", "default");
    apply_and_check(work.path(), &url, &server);
    let served = send("GET", &url, None).body;
    assert_eq!(native_bytes(&azurite, KEY).as_deref(), Some(&served[..]));
    assert_eq!(props(&azurite, KEY)["content_type"], "application/json");
    let dir = work.path();

    // Workspaces: Terraform's `workspace new` through wasmstate's
    // workspace API is a blob `key + "env:" + name`.
    assert_eq!(
        send(
            "PUT",
            &format!("{}/workspaces/az/staging", server.url),
            None
        )
        .status,
        201
    );
    assert_eq!(props(&azurite, &blob("staging"))["size"], 0);

    // A lock taken the Terraform way stops terraform through wasmstate,
    // naming its holder; `terraform force-unlock` releases it, and the
    // blob is left as Terraform's own unlock leaves it.
    let id = "7d1f8a3e-0c4b-4e2a-9b6d-2f5e8c1a4b90";
    let taken = azurite.native_ok(
        CONTAINER,
        &["lock", KEY, &terraform_lock(id, "native@elsewhere")],
    );
    assert_eq!(taken["id"], id);
    let blocked = run(dir, &["plan", "-input=false", "-lock-timeout=0s"]);
    assert!(!blocked.status.success());
    let said = String::from_utf8_lossy(&blocked.stderr);
    // Terraform's http backend names the holder by its ID only.
    assert!(said.contains(&format!("ID={id}")), "{said}");
    ok(dir, &["force-unlock", "-force", id]);
    let after = props(&azurite, KEY);
    assert_eq!(after["lease_status"], "unlocked", "{after}");
    assert!(after["lock"].is_null(), "{after}");
    ok(
        dir,
        &[
            "apply",
            "-auto-approve",
            "-input=false",
            "-var",
            "value=three",
        ],
    );
}

#[test]
fn azure_keeps_terraforms_lock_layout() {
    let azurite = start();
    let data = tempdir();
    let server = server(data.path(), &azurite, false);
    let url = server.state_url("az", "default");
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);
    // Metadata others set survives locks and writes.
    azurite.native_ok(CONTAINER, &["set-metadata", KEY, r#"{"team":"infra"}"#]);

    // A Terraform lock ID (a UUID) is the lease ID and the info's ID.
    let guid = "3f0c2b1a-8e7d-4c6b-a5f4-0e9d8c7b6a51";
    assert_eq!(
        send("LOCK", &url, Some(&lock_info(guid, "wasm@host"))).status,
        200
    );
    let locked = props(&azurite, KEY);
    assert_eq!(locked["lease_status"], "locked", "{locked}");
    assert_eq!(locked["lock"]["ID"], guid);
    assert_eq!(locked["lock"]["Who"], "wasm@host");
    assert_eq!(locked["lock"]["Path"], format!("{CONTAINER}/{KEY}"));
    assert_eq!(locked["metadata"]["team"], "infra");

    // Writes under the lock carry the lease and keep the metadata.
    let locked_url = format!("{url}?ID={guid}");
    assert_eq!(send("POST", &locked_url, Some(&state(2))).status, 200);
    let written = props(&azurite, KEY);
    assert_eq!(written["lease_status"], "locked");
    assert_eq!(written["lock"]["ID"], guid);
    assert_eq!(written["metadata"]["team"], "infra");
    assert_eq!(written["content_type"], "application/json");

    // The lock blocks a Terraform-way locker, which sees our holder.
    let (code, refused) = azurite.native(
        CONTAINER,
        &[
            "lock",
            KEY,
            &terraform_lock("5e4d3c2b-1a09-4f8e-8d7c-6b5a49382716", "native@x"),
        ],
    );
    assert_eq!(code, 3, "{refused}");
    assert_eq!(refused["locked"]["Who"], "wasm@host");

    // Unlock removes the lock info and releases the lease.
    assert_eq!(
        send("UNLOCK", &url, Some(&lock_info(guid, "wasm@host"))).status,
        200
    );
    let unlocked = props(&azurite, KEY);
    assert_eq!(unlocked["lease_status"], "unlocked", "{unlocked}");
    assert!(unlocked["lock"].is_null(), "{unlocked}");
    assert_eq!(unlocked["metadata"]["team"], "infra");

    // A lock ID that is not a GUID gets a GUID lease; Terraform's own
    // unlock by that lease ID (what `terraform force-unlock` runs) works.
    assert_eq!(
        send("LOCK", &url, Some(&lock_info("wasm-lock", "wasm@host"))).status,
        200
    );
    let mapped = props(&azurite, KEY)["lock"].clone();
    let lease = mapped["ID"].as_str().unwrap().to_string();
    assert_eq!(lease.len(), 36, "{mapped}");
    assert_ne!(lease, "wasm-lock");
    assert_eq!(mapped["WasmstateID"], "wasm-lock");
    let refused = send("LOCK", &url, Some(&lock_info("intruder", "x@y")));
    assert_eq!(refused.status, 423);
    assert_eq!(
        refused.json()["ID"],
        "wasm-lock",
        "the holder is reported by its own ID"
    );
    // The lease's other name (its GUID) is another locker, refused with
    // the holder named, and the holder's info stays.
    let twin = send("LOCK", &url, Some(&lock_info(&lease, "twin@host")));
    assert_eq!(twin.status, 423, "{}", twin.text());
    assert_eq!(twin.json()["ID"], "wasm-lock");
    assert_eq!(props(&azurite, KEY)["lock"]["WasmstateID"], "wasm-lock");
    azurite.native_ok(CONTAINER, &["unlock", KEY, &lease]);
    assert_eq!(props(&azurite, KEY)["lease_status"], "unlocked");

    // A GUID's two cases are one lease: the one that holds it is named,
    // the other refused. A Created Terraform cannot read is stored as
    // the time the lock was taken.
    let upper = "A1B2C3D4-E5F6-4A7B-8C9D-0E1F2A3B4C5D";
    let mut odd =
        serde_json::from_slice::<serde_json::Value>(&lock_info(upper, "up@host")).unwrap();
    odd["Created"] = "yesterday".into();
    let odd = serde_json::to_vec(&odd).unwrap();
    assert_eq!(send("LOCK", &url, Some(&odd)).status, 200);
    let held = props(&azurite, KEY)["lock"].clone();
    assert_eq!(held["ID"], upper.to_ascii_lowercase(), "{held}");
    assert_eq!(held["WasmstateID"], upper, "{held}");
    let created = held["Created"].as_str().unwrap();
    assert!(
        created.starts_with("20") && created.ends_with('Z'),
        "{held}"
    );
    let lower = upper.to_ascii_lowercase();
    let other = send("LOCK", &url, Some(&lock_info(&lower, "low@host")));
    assert_eq!(other.status, 423, "{}", other.text());
    assert_eq!(other.json()["ID"], upper);
    assert_eq!(props(&azurite, KEY)["lock"]["Who"], "up@host");
    assert_eq!(send("UNLOCK", &url, Some(&odd)).status, 200);
    assert_eq!(props(&azurite, KEY)["lease_status"], "unlocked");

    // A lock taken the Terraform way stops wasmstate, naming its holder,
    // and so does a write sent without it.
    let native_id = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d";
    azurite.native_ok(
        CONTAINER,
        &["lock", KEY, &terraform_lock(native_id, "native@elsewhere")],
    );
    let refused = send("LOCK", &url, Some(&lock_info("wasm-2", "wasm@host")));
    assert_eq!(refused.status, 423, "{}", refused.text());
    assert_eq!(refused.json()["ID"], native_id);
    assert_eq!(refused.json()["Who"], "native@elsewhere");
    assert_eq!(send("POST", &url, Some(&state(3))).status, 423);
    azurite.native_ok(CONTAINER, &["unlock", KEY, native_id]);
    assert_eq!(
        send("LOCK", &url, Some(&lock_info("wasm-2", "wasm@host"))).status,
        200
    );
    assert_eq!(
        send("UNLOCK", &url, Some(&lock_info("wasm-2", "wasm@host"))).status,
        200
    );

    // A lease without lock info (another tool's) is a lock too, with an
    // unknown holder, and a force-unlock breaks it.
    let other = "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0";
    azurite.native_ok(CONTAINER, &["lease-only", KEY, other]);
    let refused = send("LOCK", &url, Some(&lock_info("wasm-3", "wasm@host")));
    assert_eq!(refused.status, 423, "{}", refused.text());
    assert!(refused.text().contains("Azure lease"), "{}", refused.text());
    assert_eq!(send("UNLOCK", &url, None).status, 200);
    assert_eq!(props(&azurite, KEY)["lease_status"], "unlocked");
    assert_eq!(
        send("LOCK", &url, Some(&lock_info("wasm-3", "wasm@host"))).status,
        200
    );

    // Lock info that outlived its lease (broken by another tool, the blob
    // leased again by someone else) grants nothing, even to the lock it
    // names.
    azurite.native_ok(CONTAINER, &["break", KEY]);
    azurite.native_ok(CONTAINER, &["lease-only", KEY, other]);
    let stale = send("LOCK", &url, Some(&lock_info("wasm-3", "wasm@host")));
    assert_eq!(stale.status, 423, "{}", stale.text());
    assert_eq!(send("UNLOCK", &url, None).status, 200);
    let cleared = props(&azurite, KEY);
    assert_eq!(cleared["lease_status"], "unlocked", "{cleared}");
    assert!(cleared["lock"].is_null(), "{cleared}");
}

#[test]
fn azure_states_read_both_ways_byte_for_byte() {
    let azurite = start();
    let data = tempdir();
    // A state bigger than the guest's memory goes through only if it
    // streams, in blocks and ranges.
    let server = server_with(data.path(), &azurite, false, "memory_mib = 32\n");
    for (ws, pad) in [("default", 10), ("big", 40 << 20)] {
        let url = server.state_url("az", ws);
        // Written by wasmstate (in 4 MiB blocks when big), read natively.
        let ours = padded_state(1, pad);
        assert_eq!(send("POST", &url, Some(&ours)).status, 200);
        assert!(
            native_bytes(&azurite, &blob(ws)) == Some(ours),
            "{ws}: wasmstate's write read natively"
        );
        assert_eq!(
            props(&azurite, &blob(ws))["content_type"],
            "application/json"
        );
        // Written natively, served by wasmstate.
        let theirs = padded_state(2, pad + 1);
        native_put(&azurite, &blob(ws), &theirs, None, false);
        assert!(
            send("GET", &url, None).body == theirs,
            "{ws}: the native write served"
        );
    }
    // A zero-length blob (Terraform's lock placeholder) is no state.
    native_put(&azurite, &blob("empty"), b"", None, false);
    assert_eq!(
        send("GET", &server.state_url("az", "empty"), None).status,
        404
    );

    // Workspaces: every `key + "env:"` blob, nothing below a further `/`.
    native_put(
        &azurite,
        &format!("{KEY}env:nested/deeper"),
        &state(1),
        None,
        false,
    );
    let listed = send("GET", &format!("{}/workspaces/az", server.url), None).json();
    assert_eq!(listed, serde_json::json!(["default", "big", "empty"]));
}

#[test]
fn azure_snapshots_are_the_history() {
    let azurite = start();
    let data = tempdir();
    let server = server(data.path(), &azurite, true);
    let url = server.state_url("az", "default");
    let snapshots = || {
        azurite
            .native_ok(CONTAINER, &["list", KEY, "true"])
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["name"] == KEY && !b["snapshot"].is_null())
            .count()
    };
    // The host locks around a write, as Terraform does: the lock makes
    // the empty blob Terraform leases, and the first write snapshots it.
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);
    let first = snapshots();
    assert!(first <= 1, "{first} snapshots after the first write");
    for serial in 2..=3 {
        assert_eq!(send("POST", &url, Some(&state(serial))).status, 200);
        assert_eq!(
            snapshots(),
            first + serial as usize - 1,
            "one snapshot per write"
        );
    }
    // A write the Terraform way (snapshot first) is history too.
    native_put(&azurite, KEY, &state(4), None, true);
    assert_eq!(snapshots(), first + 3);

    let answer = send("GET", &format!("{url}/versions"), None);
    assert_eq!(
        answer.headers["wasmstate-history"], "storage",
        "the blob's snapshots are the history"
    );
    let listed = answer.json();
    // 0 bytes: the empty blob before the first state.
    let states: Vec<&serde_json::Value> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["bytes"] != 0)
        .collect();
    let serials: Vec<u64> = states
        .iter()
        .map(|v| v["serial"].as_u64().unwrap())
        .collect();
    assert_eq!(serials, vec![4, 3, 2, 1], "{listed}");
    // A lock taken and released changes the blob's metadata (and ETag)
    // only: every version listed still reads.
    let reader = lock_info("reader", "me@host");
    assert_eq!(send("LOCK", &url, Some(&reader)).status, 200);
    assert_eq!(send("UNLOCK", &url, Some(&reader)).status, 200);
    for (version, serial) in states.iter().zip([4u64, 3, 2, 1]) {
        let id = version["id"].as_str().unwrap();
        let read = send("GET", &format!("{url}/versions/{}", urlencode(id)), None);
        assert_eq!(read.status, 200, "{id}: {}", read.text());
        assert!(
            read.body == state(serial),
            "version {id} reads back as serial {serial}"
        );
    }
}

/// Deleting a workspace deletes its blob with every snapshot; `default`
/// and a locked workspace are refused.
#[test]
fn azure_workspace_delete_takes_the_snapshots() {
    let azurite = start();
    let data = tempdir();
    let server = server(data.path(), &azurite, true);
    let url = server.state_url("az", "old");
    for serial in 1..=3 {
        assert_eq!(send("POST", &url, Some(&state(serial))).status, 200);
    }
    let blobs = || {
        azurite
            .native_ok(CONTAINER, &["list", &blob("old"), "true"])
            .as_array()
            .unwrap()
            .len()
    };
    assert!(blobs() >= 3, "the writes made snapshots");
    let workspace = format!("{}/workspaces/az/old", server.url);
    assert_eq!(
        send("LOCK", &url, Some(&lock_info("held", "me@host"))).status,
        200
    );
    let refused = send("DELETE", &workspace, None);
    assert_eq!(refused.status, 423, "{}", refused.text());
    assert_eq!(
        send("UNLOCK", &url, Some(&lock_info("held", "me@host"))).status,
        200
    );
    assert_eq!(send("DELETE", &workspace, None).status, 200);
    assert_eq!(blobs(), 0, "no blob or snapshot of the workspace is left");
    let default = send(
        "DELETE",
        &format!("{}/workspaces/az/default", server.url),
        None,
    );
    assert_ne!(default.status, 200);
}

fn urlencode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// A force-unlock that finds a lease without lock info waits for a
/// locker between its two steps to record itself, then releases that
/// lock as its holder's instead of breaking the lease under it.
#[test]
fn azure_force_unlock_waits_for_a_locker_recording_itself() {
    let azurite = start();
    let data = tempdir();
    let server = server(data.path(), &azurite, false);
    let url = server.state_url("az", "default");
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);
    let id = "2c4e6a8b-1d3f-4a5b-8c7d-9e0f1a2b3c4d";
    let locker = azurite.native_spawn(
        CONTAINER,
        &[
            "slow-lock",
            KEY,
            &terraform_lock(id, "slow@elsewhere"),
            "0.15",
        ],
    );
    let released = send("UNLOCK", &url, None);
    let (code, said) = locker.finish();
    assert_eq!(
        code, 0,
        "the locker's info was written under its lease: {said}"
    );
    assert_eq!(released.status, 200, "{}", released.text());
    let after = props(&azurite, KEY);
    assert_eq!(after["lease_status"], "unlocked", "{after}");
    assert!(after["lock"].is_null(), "{after}");
}
