//! The `gcs` guest against fake-gcs-server (the real Go emulator of Cloud
//! Storage's JSON API), and side by side with Terraform's native
//! `backend "gcs"` on the same bucket: each side honours the other's locks
//! and reads the other's state, in the same layout.

use crate::common::*;
use crate::terraform::apply_and_check;
use std::path::Path;

pub(crate) const BUCKET: &str = "wasmstate-gcs";
pub(crate) const PREFIX: &str = "team/app";

pub(crate) fn start(versioned: bool) -> FakeGcs {
    let gcs = FakeGcs::start();
    gcs.create_bucket(BUCKET, versioned);
    gcs
}

pub(crate) fn settings(gcs: &FakeGcs) -> Vec<(String, String)> {
    [
        ("bucket", BUCKET.to_string()),
        ("prefix", PREFIX.to_string()),
        ("storage_custom_endpoint", gcs.endpoint()),
        // As Terraform's gcs backend is given one; fake-gcs-server reads
        // none (tests/integration/gcp_credentials.rs checks the tokens).
        ("access_token", "fake".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

pub(crate) fn server(data: &Path, gcs: &FakeGcs) -> Server {
    Server::with_config(data, &backend_table("gcs", "gcs", "", &settings(gcs)))
}

#[test]
fn gcs_passes_the_kit_with_object_versions() {
    let gcs = start(true);
    let mut args = vec!["guest".to_string(), "test".into(), "gcs".into()];
    for (k, v) in settings(&gcs) {
        args.push("--config".into());
        args.push(format!("{k}={v}"));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, out) = wasmstate(&args);
    assert!(ok, "{out}");
    assert_eq!(summary(&out), "33 passed, 0 failed", "{out}");
}

#[test]
fn terraform_through_gcs() {
    let gcs = start(false);
    let (data, work) = (tempdir(), tempdir());
    let server = server(data.path(), &gcs);
    apply_and_check(work.path(), &server.state_url("gcs", "default"), &server);
    let stored = gcs
        .object(BUCKET, &format!("{PREFIX}/default.tfstate"))
        .expect("state at <prefix>/default.tfstate, as Terraform's gcs backend keeps it");
    let served = send("GET", &server.state_url("gcs", "default"), None).body;
    assert_eq!(stored, served);
}

/// Terraform's own `backend "gcs"` on the same bucket, under `prefix`.
pub(crate) fn native_block(gcs: &FakeGcs, prefix: &str) -> String {
    format!(
        r#"terraform {{
  backend "gcs" {{
    bucket                  = "{BUCKET}"
    prefix                  = "{prefix}"
    storage_custom_endpoint = "{}"
    access_token            = "fake"
  }}
}}
"#,
        gcs.endpoint()
    )
}

#[test]
fn gcs_interoperates_with_native_terraform() {
    let gcs = start(false);
    let data = tempdir();
    let server = server(data.path(), &gcs);
    let lock_released = || {
        gcs.object(BUCKET, &format!("{PREFIX}/default.tflock"))
            .is_none()
    };
    let staging_stored = || {
        gcs.object(BUCKET, &format!("{PREFIX}/staging.tfstate"))
            .is_some()
    };
    crate::side_by_side::check(
        &server,
        "gcs",
        crate::side_by_side::Native {
            backend_block: native_block(&gcs, PREFIX),
            lock_released: &lock_released,
            staging_stored: &staging_stored,
            holder_shown: true,
        },
    );
}

/// A team on Terraform's `backend "gcs"` moves onto wasmstate with
/// `terraform init -migrate-state`, works there, and moves back, losing
/// nothing either way.
#[test]
fn a_team_moves_from_native_gcs_to_wasmstate_and_back() {
    let gcs = start(false);
    let data = tempdir();
    let server = server(data.path(), &gcs);
    let stored_back =
        || serde_json::from_slice(&gcs.object(BUCKET, "back/default.tfstate").unwrap()).unwrap();
    crate::side_by_side::moves_there_and_back(
        &server.state_url("gcs", "moved"),
        &native_block(&gcs, "native"),
        &native_block(&gcs, "back"),
        &stored_back,
    );
    assert!(
        gcs.object(BUCKET, &format!("{PREFIX}/moved.tfstate"))
            .is_some(),
        "the guest keeps the moved state under its own prefix"
    );
}
