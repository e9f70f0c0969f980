//! What every guest that keeps a Terraform backend's own layout shows
//! beside that native backend on the same storage: each side reads the
//! state the other wrote, each side's lock stops the other, and workspaces
//! made on one side are listed on the other. The AWS and GCS tests call
//! it with their storage and native backend block.

use crate::common::*;
use crate::terraform::{CONFIG, apply_and_check, capture_terraform, ok, run, stored_output};
use std::io::Write;
use std::time::Duration;

/// The storage under test, as the checks need to see it.
pub(crate) struct Native<'a> {
    /// Terraform's own backend block on the same storage.
    pub backend_block: String,
    /// Whether the storage holds no lock object or item for `default`.
    pub lock_released: &'a dyn Fn() -> bool,
    /// Whether the storage holds a state for workspace `staging`.
    pub staging_stored: &'a dyn Fn() -> bool,
    /// Whether a lock's holder is stored for the other side to read (not
    /// with Terraform's pg backend, whose advisory locks carry nothing).
    pub holder_shown: bool,
}

/// Run every check against `server`'s `backend` and Terraform's native
/// backend described by `native`.
pub(crate) fn check(server: &Server, backend: &str, native: Native<'_>) {
    let url = server.state_url(backend, "default");
    let (via_wasmstate, native_dir) = (tempdir(), tempdir());

    // State written through wasmstate is what native Terraform reads.
    apply_and_check(via_wasmstate.path(), &url, server);
    let dir = native_dir.path();
    std::fs::write(
        dir.join("main.tf"),
        format!("{}{CONFIG}", native.backend_block),
    )
    .unwrap();
    ok(dir, &["init", "-input=false"]);
    assert!(ok(dir, &["state", "list"]).contains("terraform_data.example"));
    let plan = run(
        dir,
        &[
            "plan",
            "-detailed-exitcode",
            "-input=false",
            "-var",
            "value=two",
        ],
    );
    assert_eq!(
        plan.status.code(),
        Some(0),
        "native Terraform sees wasmstate's state as current"
    );

    // A lock taken through wasmstate stops native Terraform...
    let ours = lock_info("wasm-lock", "wasm@host");
    assert_eq!(send("LOCK", &url, Some(&ours)).status, 200);
    let blocked = run(dir, &["plan", "-input=false", "-lock-timeout=0s"]);
    assert!(
        !blocked.status.success(),
        "native Terraform ignored wasmstate's lock"
    );
    let said = String::from_utf8_lossy(&blocked.stderr);
    if native.holder_shown {
        assert!(said.contains("wasm@host"), "{said}");
    }
    assert_eq!(send("UNLOCK", &url, Some(&ours)).status, 200);

    // ...and a lock held by native Terraform stops wasmstate: a LOCK, and a
    // write sent without one (the host's own lock for it is refused).
    let (mut holder, output) = capture_terraform(dir, &["apply", "-var", "value=native"]);
    wait_until(
        "native apply's approval prompt",
        Duration::from_secs(60),
        || output.lock().unwrap().contains("Enter a value:"),
    );
    let refused = send("LOCK", &url, Some(&ours));
    assert_eq!(refused.status, 423, "{}", refused.text());
    if native.holder_shown {
        assert_eq!(refused.json()["Operation"], "OperationTypeApply");
    }
    assert_ne!(refused.json()["ID"], "wasm-lock");
    let mut next = send("GET", &url, None).json();
    next["serial"] = serde_json::json!(next["serial"].as_u64().unwrap() + 1);
    let written = send("POST", &url, Some(&serde_json::to_vec(&next).unwrap()));
    assert_eq!(
        written.status,
        423,
        "an unlocked write waits for native's lock: {}",
        written.text()
    );
    holder.stdin.take().unwrap().write_all(b"no\n").unwrap();
    holder.wait().unwrap();
    assert!(
        (native.lock_released)(),
        "native Terraform released its lock"
    );

    // State written by native Terraform is what wasmstate serves.
    ok(
        dir,
        &[
            "apply",
            "-auto-approve",
            "-input=false",
            "-var",
            "value=native",
        ],
    );
    assert_eq!(stored_output(&url), "native");

    // Workspaces: the same layout on both sides.
    ok(dir, &["workspace", "new", "staging"]);
    assert!(
        (native.staging_stored)(),
        "native Terraform's new workspace is where wasmstate keeps one"
    );
    assert_eq!(
        send("POST", &server.state_url(backend, "prod"), Some(&state(1))).status,
        200
    );
    let listed = send("GET", &format!("{}/workspaces/{backend}", server.url), None).json();
    assert_eq!(listed, serde_json::json!(["default", "prod", "staging"]));
    let native_list = ok(dir, &["workspace", "list"]);
    assert!(
        native_list.contains("prod") && native_list.contains("staging"),
        "{native_list}"
    );
}

/// A team on a native backend moves onto wasmstate (`url`) with
/// `terraform init -migrate-state`, works there, and moves back onto the
/// native backend at another place (`there` and `back` are its backend
/// blocks), losing nothing either way: the plan is clean at each stop.
/// `stored_back` reads the state the last move wrote, from the storage.
pub(crate) fn moves_there_and_back(
    url: &str,
    there: &str,
    back: &str,
    stored_back: &dyn Fn() -> serde_json::Value,
) {
    use crate::terraform::{HTTP_BACKEND, init};
    let work = tempdir();
    let dir = work.path();
    let apply = |value: &str| {
        let var = format!("value={value}");
        ok(
            dir,
            &["apply", "-auto-approve", "-input=false", "-var", &var],
        );
    };
    let plan_is_clean = |value: &str| {
        let var = format!("value={value}");
        let plan = run(
            dir,
            &["plan", "-detailed-exitcode", "-input=false", "-var", &var],
        );
        assert_eq!(
            plan.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&plan.stdout)
        );
    };
    std::fs::write(dir.join("main.tf"), CONFIG).unwrap();
    std::fs::write(dir.join("backend.tf"), there).unwrap();
    ok(dir, &["init", "-input=false"]);
    apply("native");

    std::fs::write(dir.join("backend.tf"), HTTP_BACKEND).unwrap();
    init(dir, url, &["-migrate-state", "-force-copy"]);
    assert_eq!(stored_output(url), "native");
    plan_is_clean("native");
    apply("wasmstate");

    std::fs::write(dir.join("backend.tf"), back).unwrap();
    ok(
        dir,
        &["init", "-input=false", "-migrate-state", "-force-copy"],
    );
    assert_eq!(stored_back()["outputs"]["value"]["value"], "wasmstate");
    plan_is_clean("wasmstate");
}
