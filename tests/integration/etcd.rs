//! The example third-party guest (`examples/etcd-guest`) against a real etcd
//! (Debian's etcd-server, installed when missing) on loopback ports.

use crate::common::*;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A throwaway etcd, killed on drop.
struct Etcd {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Etcd {
    fn start() -> Etcd {
        ensure_installed("etcd", "etcd-server");
        let dir = tempdir();
        let (client, peer) = (free_port(), free_port());
        let url = format!("http://127.0.0.1:{client}");
        let child = Command::new("etcd")
            .arg("--data-dir")
            .arg(dir.path().join("etcd"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
            ])
            .args([
                "--initial-cluster",
                &format!("default=http://127.0.0.1:{peer}"),
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("etcd.log")).unwrap())
            .spawn()
            .expect("start etcd");
        let etcd = Etcd {
            child,
            url,
            _dir: dir,
        };
        let health = format!("{}/health", etcd.url);
        wait_until("etcd to become healthy", Duration::from_secs(60), || {
            reqwest::blocking::get(&health)
                .ok()
                .and_then(|r| r.text().ok())
                .is_some_and(|t| t.contains("true"))
        });
        etcd
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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
