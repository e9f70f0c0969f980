//! Client certificates as PKCS#12 (`.pfx`) files, as Terraform azurerm's
//! `client_certificate_path` + `client_certificate_password` (or
//! `ARM_`/`AZURE_CLIENT_CERTIFICATE_PATH` and `_PASSWORD`) name them: the
//! host opens the file, signs its assertions with the key inside, and the
//! fake token endpoint checks the signature and the leaf's `x5t`. A wrong
//! password is refused at start in one line, never shown.

use super::fake::{self, CLIENT, FakeEntra, TENANT};
use super::{SECRET, Storage, kit, kit_and_terraform};
use crate::common::*;
use std::process::Command;

const PASSWORD: &str = "pfx-password~5e4d3c2b1a";

#[test]
fn a_pfx_with_a_password_passes_the_kit_and_terraform() {
    let storage = Storage::start();
    let entra = FakeEntra::start(3600, SECRET);
    let dir = tempdir();
    let (_, public, x5t) = fake::client_certificate(dir.path());
    entra.accept_certificate(&public, &x5t);
    let pfx = fake::client_pfx(dir.path(), "client.pfx", PASSWORD);
    let settings = storage.settings(
        &entra,
        &[
            ("client_id", CLIENT),
            ("tenant_id", TENANT),
            ("client_certificate_path", pfx.to_str().unwrap()),
            ("client_certificate_password", PASSWORD),
        ],
    );
    kit_and_terraform(&entra, &settings, &storage.env(&[]), &[PASSWORD]);
    // Every exchange was a certificate assertion the fake verified.
    assert!(entra.token_hits() >= 2);
}

/// A PFX exported without a password (`-passout pass:`), named by the
/// environment as azurerm and Azure's SDKs read it.
#[test]
fn a_pfx_without_a_password_from_the_environment_passes_the_kit() {
    let storage = Storage::start();
    let entra = FakeEntra::start(3600, SECRET);
    let dir = tempdir();
    let (_, public, x5t) = fake::client_certificate(dir.path());
    entra.accept_certificate(&public, &x5t);
    let pfx = fake::client_pfx(dir.path(), "open.pfx", "");
    let mut settings = storage.settings(&entra, &[]);
    settings.retain(|(k, _)| k != "authority_host");
    let env = storage.env(&[
        ("AZURE_CLIENT_ID", CLIENT),
        ("AZURE_TENANT_ID", TENANT),
        ("AZURE_CLIENT_CERTIFICATE_PATH", pfx.to_str().unwrap()),
        ("AZURE_AUTHORITY_HOST", entra.url.as_str()),
    ]);
    let (ok, out) = kit(&settings, &env);
    assert!(ok, "{out}");
    assert_eq!(summary(&out), "33 passed, 0 failed", "{out}");
    assert!(entra.token_hits() >= 1);
    assert_eq!(entra.refusals(), Vec::<String>::new());
}

/// A wrong password: the kit and the server refuse to start, in one line
/// naming the file and what to do, without the password (given or right)
/// in what they print; Entra ID is never asked.
#[test]
fn a_wrong_pfx_password_is_refused_at_start_in_one_line() {
    let storage = Storage::start();
    let entra = FakeEntra::start(3600, SECRET);
    let dir = tempdir();
    fake::client_certificate(dir.path());
    let pfx = fake::client_pfx(dir.path(), "client.pfx", PASSWORD);
    let wrong = "not-the-pfx-password~0a9b8c";
    let settings = storage.settings(
        &entra,
        &[
            ("client_id", CLIENT),
            ("tenant_id", TENANT),
            ("client_certificate_path", pfx.to_str().unwrap()),
            ("client_certificate_password", wrong),
        ],
    );
    let expected = "set the password the file was exported with";
    let (ok, out) = kit(&settings, &storage.env(&[]));
    assert!(!ok, "{out}");
    let data = tempdir();
    let config = data.path().join("wasmstate.toml");
    std::fs::write(&config, backend_table("az", "azure", "", &settings)).unwrap();
    let serve = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data.path())
        .arg("--config")
        .arg(&config)
        .envs(storage.env(&[("WASMSTATE_LOG", "debug")]))
        .output()
        .unwrap();
    assert!(!serve.status.success(), "the server started");
    let log = String::from_utf8_lossy(&serve.stdout).into_owned()
        + &String::from_utf8_lossy(&serve.stderr);
    for said in [&out, &log] {
        let line = said
            .lines()
            .find(|l| l.contains(expected))
            .unwrap_or_else(|| panic!("{expected:?} not in {said}"));
        assert!(line.contains("client_certificate_password"), "{line}");
        assert!(line.contains(pfx.to_str().unwrap()), "{line}");
        assert!(!said.contains(wrong), "the given password shows");
        assert!(!said.contains(PASSWORD), "the file's password shows");
    }
    assert_eq!(entra.token_hits(), 0);
    assert_eq!(entra.refusals(), Vec::<String>::new());
}
