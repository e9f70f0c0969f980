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
