//! OpenTofu with client-side state encryption (OpenTofu ≥ 1.7) through
//! `backend "http"`. No OpenTofu binary can be installed on these machines,
//! so the bodies are built here the way OpenTofu's own code writes them
//! (github.com/opentofu/opentofu, the same from v1.8.0 to v1.12.x):
//!
//! - the plaintext is the state as `internal/states/statefile/version4.go`
//!   writes it: compact JSON (`json.Marshal`, since v1.8.0) and a `\n`;
//! - the key comes from the `pbkdf2` key provider with its defaults
//!   (`internal/encryption/keyprovider/pbkdf2/descriptor.go`: 32-byte salt,
//!   600000 iterations, sha512, 32-byte key), its metadata JSON base64'd
//!   into `meta` under `key_provider.pbkdf2.<name>`
//!   (`internal/encryption/keyprovider.go`);
//! - `aes_gcm` (`internal/encryption/method/aesgcm/aesgcm.go`) seals with
//!   a fresh 12-byte nonce and no associated data, and the payload is
//!   `nonce ‖ ciphertext ‖ tag`;
//! - the envelope (`internal/encryption/state.go` + `base.go`) is
//!   `{"serial","lineage","meta","encrypted_data","encryption_version":"v0"}`
//!   in that order, compact, with `serial` and `lineage` copied in clear.
//!
//! Requests carry what OpenTofu's http client sends
//! (`internal/backend/remote-state/http/client.go`): the `headers` option
//! (here `Authorization: Bearer …`, wasmstate's token auth), then
//! `Content-Type: application/json` and `Content-MD5` on every body.

use crate::common::*;
use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use md5::{Digest, Md5};
use std::sync::OnceLock;

const PASSPHRASE: &str = "correct-horse-battery-staple";
const LINEAGE: &str = "9b0d7a4c-6a3e-4b1e-8d9e-2f1c0b5a7e11";

/// A key from OpenTofu's pbkdf2 key provider, and the `meta` entry it
/// writes beside every state it encrypts (OpenTofu derives it once per
/// run, so one per test process is faithful too).
struct TofuKey {
    key: [u8; 32],
    meta: String,
}

fn tofu_key() -> &'static TofuKey {
    static KEY: OnceLock<TofuKey> = OnceLock::new();
    KEY.get_or_init(|| {
        let salt: Vec<u8> = (0u8..32).collect();
        let mut key = [0u8; 32];
        pbkdf2::pbkdf2_hmac::<sha2::Sha512>(PASSPHRASE.as_bytes(), &salt, 600_000, &mut key);
        let metadata = format!(
            r#"{{"salt":"{}","iterations":600000,"hash_function":"sha512","key_length":32}}"#,
            BASE64.encode(&salt)
        );
        TofuKey {
            key,
            meta: BASE64.encode(metadata),
        }
    })
}

/// A plain state as OpenTofu ≥ 1.8 writes it.
fn tofu_state(serial: u64, value: &str) -> Vec<u8> {
    format!(
        "{{\"version\":4,\"terraform_version\":\"1.10.0\",\"serial\":{serial},\"lineage\":\"{LINEAGE}\",\"outputs\":{{\"secret\":{{\"value\":\"{value}\",\"type\":\"string\",\"sensitive\":true}}}},\"resources\":[],\"check_results\":null}}\n"
    )
    .into_bytes()
}

/// `state` encrypted as OpenTofu's `aes_gcm` method with the pbkdf2 key
/// provider writes it.
fn encrypt(state: &[u8]) -> Vec<u8> {
    let key = tofu_key();
    let header: serde_json::Value = serde_json::from_slice(state).unwrap();
    let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&key.key));
    let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
    let sealed = cipher.encrypt(&nonce, state).unwrap();
    let payload = [nonce.as_slice(), &sealed].concat();
    format!(
        r#"{{"serial":{},"lineage":{},"meta":{{"key_provider.pbkdf2.passphrase":"{}"}},"encrypted_data":"{}","encryption_version":"v0"}}"#,
        header["serial"],
        header["lineage"],
        key.meta,
        BASE64.encode(payload)
    )
    .into_bytes()
}

/// Open an envelope as OpenTofu does on read (`base.go` `decrypt`, then
/// `state.go`'s check that the clear serial and lineage are the sealed
/// ones).
fn decrypt(envelope: &[u8]) -> Vec<u8> {
    let outer: serde_json::Value = serde_json::from_slice(envelope).unwrap();
    assert_eq!(outer["encryption_version"], "v0");
    assert_eq!(
        outer["meta"]["key_provider.pbkdf2.passphrase"],
        tofu_key().meta.as_str()
    );
    let payload = BASE64
        .decode(outer["encrypted_data"].as_str().unwrap())
        .unwrap();
    let (nonce, sealed) = payload.split_at(12);
    let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&tofu_key().key));
    let state = cipher.decrypt(Nonce::from_slice(nonce), sealed).unwrap();
    let inner: serde_json::Value = serde_json::from_slice(&state).unwrap();
    assert_eq!(inner["serial"], outer["serial"], "serial field mismatch");
    assert_eq!(inner["lineage"], outer["lineage"], "lineage field mismatch");
    state
}

/// A server whose backends need a token, as an OpenTofu user with
/// `headers = { Authorization = "Bearer …" }` would run it.
struct Tofu {
    server: Server,
    token: String,
    dir: tempfile::TempDir,
}

impl Tofu {
    fn start(backend_extra: &str) -> Tofu {
        let dir = tempdir();
        let (token, sha256) = generate_token();
        let server = Server::with_config(
            dir.path(),
            &format!(
                "[backends.default]\nguest = \"local\"\n{backend_extra}\n[[tokens]]\nname = \"tofu\"\nsha256 = \"{sha256}\"\ngrants = [\"*:*:admin\"]\n"
            ),
        );
        Tofu { server, token, dir }
    }

    fn url(&self, workspace: &str) -> String {
        self.server.state_url("default", workspace)
    }

    /// A request as OpenTofu's http client sends it.
    fn send(&self, method: &str, url: &str, body: Option<&[u8]>) -> Answer {
        let bearer = format!("Bearer {}", self.token);
        let mut headers = vec![("Authorization", bearer.as_str())];
        let md5 = body.map(|b| BASE64.encode(Md5::digest(b)));
        if let Some(md5) = &md5 {
            headers.push(("Content-Type", "application/json"));
            headers.push(("Content-MD5", md5));
        }
        send_with(method, url, body, &headers)
    }

    fn post(&self, workspace: &str, body: &[u8]) -> Answer {
        self.send("POST", &self.url(workspace), Some(body))
    }

    fn get(&self, workspace: &str) -> Vec<u8> {
        let answer = self.send("GET", &self.url(workspace), None);
        assert_eq!(answer.status, 200, "{}", answer.text());
        answer.body
    }

    /// Kept versions, newest first: (id, serial).
    fn versions(&self, workspace: &str) -> Vec<(String, Option<u64>)> {
        let answer = self.send("GET", &format!("{}/versions", self.url(workspace)), None);
        assert_eq!(answer.status, 200, "{}", answer.text());
        answer
            .json()
            .as_array()
            .unwrap()
            .iter()
            .map(|v| (v["id"].as_str().unwrap().to_string(), v["serial"].as_u64()))
            .collect()
    }

    fn version(&self, workspace: &str, id: &str) -> Vec<u8> {
        let answer = self.send(
            "GET",
            &format!("{}/versions/{id}", self.url(workspace)),
            None,
        );
        assert_eq!(answer.status, 200, "{}", answer.text());
        answer.body
    }
}

#[test]
fn encrypted_states_round_trip_byte_exact_as_opentofu_sends_them() {
    let tofu = Tofu::start("");
    let url = tofu.url("enc");
    let encrypted = encrypt(&tofu_state(1, "hunter2"));

    // Without the `headers` option's token: refused, nothing stored.
    let anonymous = send_with("POST", &url, Some(&encrypted), &[]);
    assert_eq!(anonymous.status, 401, "{}", anonymous.text());

    // tofu apply: LOCK, POST ?ID=, UNLOCK with the LockInfo it locked with.
    let lock = lock_info("tofu-lock-1", "tofu@ci");
    assert_eq!(tofu.send("LOCK", &url, Some(&lock)).status, 200);
    let written = tofu.send("POST", &format!("{url}?ID=tofu-lock-1"), Some(&encrypted));
    assert_eq!(written.status, 200, "{}", written.text());
    assert_eq!(tofu.send("UNLOCK", &url, Some(&lock)).status, 200);

    let stored = tofu.get("enc");
    assert_eq!(stored, encrypted, "served back byte for byte");
    assert_eq!(decrypt(&stored), tofu_state(1, "hunter2"));
    let text = String::from_utf8(stored).unwrap();
    assert!(
        !text.contains("hunter2"),
        "the server only ever saw ciphertext"
    );

    // A damaged body is still refused by its Content-MD5.
    let answer = send_with(
        "POST",
        &url,
        Some(&encrypt(&tofu_state(2, "x"))),
        &[
            ("Authorization", &format!("Bearer {}", tofu.token)),
            (
                "Content-MD5",
                &BASE64.encode(Md5::digest(b"something else")),
            ),
        ],
    );
    assert_eq!(answer.status, 400, "{}", answer.text());
    assert_eq!(tofu.get("enc"), encrypted);
}

#[test]
fn the_guard_reads_an_encrypted_states_clear_serial_and_lineage() {
    let tofu = Tofu::start("");
    let five = encrypt(&tofu_state(5, "five"));
    assert_eq!(tofu.post("g", &five).status, 200);

    let older = tofu.post("g", &encrypt(&tofu_state(4, "four")));
    assert_eq!(older.status, 409, "{}", older.text());
    assert!(
        older.text().contains("serial 4 is older"),
        "{}",
        older.text()
    );

    let other_lineage = String::from_utf8(encrypt(&tofu_state(6, "six")))
        .unwrap()
        .replace(LINEAGE, "another-lineage");
    let answer = tofu.post("g", other_lineage.as_bytes());
    assert_eq!(answer.status, 409, "{}", answer.text());
    assert!(answer.text().contains("lineage"), "{}", answer.text());

    // A retried POST of the same bytes is a no-op; the same serial with
    // other ciphertext is another writer.
    assert_eq!(tofu.post("g", &five).status, 200);
    assert_eq!(tofu.versions("g").len(), 1, "the retry wrote nothing");
    let rival = tofu.post("g", &encrypt(&tofu_state(5, "five")));
    assert_eq!(rival.status, 409, "{}", rival.text());
    assert_eq!(tofu.get("g"), five);
}

/// Issue 47, data 1: an encrypted state shows no `resources` or `outputs`,
/// and was taken for an empty one that any lineage may replace. On a new
/// workspace writer A stores serial 1; writer B's serial 1 of another
/// lineage is refused (409) as for plain states, and A's state stays.
#[test]
fn another_lineage_cannot_replace_an_encrypted_state_at_serial_1() {
    let tofu = Tofu::start("");
    let first = encrypt(&tofu_state(1, "writer a"));
    assert_eq!(tofu.post("fresh", &first).status, 200);
    for serial in [1, 2] {
        let other = String::from_utf8(encrypt(&tofu_state(serial, "writer b")))
            .unwrap()
            .replace(LINEAGE, "lineage-of-writer-b");
        let answer = tofu.post("fresh", other.as_bytes());
        assert_eq!(answer.status, 409, "serial {serial}: {}", answer.text());
        assert!(answer.text().contains("lineage"), "{}", answer.text());
    }
    assert_eq!(tofu.get("fresh"), first, "writer A's state stays");
}

#[test]
fn migrating_from_plain_to_encrypted_and_back_keeps_every_version() {
    let tofu = Tofu::start("");
    // OpenTofu's fallback migrations write the next serial, same lineage:
    // plain → encrypted (method unencrypted as fallback), then back.
    let states = [
        tofu_state(1, "one"),
        tofu_state(2, "two"),
        encrypt(&tofu_state(3, "three")),
        encrypt(&tofu_state(4, "four")),
        tofu_state(5, "five"),
    ];
    for (i, state) in states.iter().enumerate() {
        let answer = tofu.post("m", state);
        assert_eq!(answer.status, 200, "write {}: {}", i + 1, answer.text());
        assert_eq!(&tofu.get("m"), state, "read back after write {}", i + 1);
    }
    let versions = tofu.versions("m");
    let serials: Vec<Option<u64>> = versions.iter().map(|(_, s)| *s).collect();
    assert_eq!(serials, [Some(5), Some(4), Some(3), Some(2), Some(1)]);
    for ((id, _), state) in versions.iter().zip(states.iter().rev()) {
        assert_eq!(&tofu.version("m", id), state, "version {id}");
    }
    assert_eq!(
        decrypt(&tofu.version("m", &versions[2].0)),
        tofu_state(3, "three")
    );
}

#[test]
fn an_envelope_without_serial_and_lineage_cannot_replace_a_state_that_has_them() {
    // OpenTofu v1.7.0-alpha1 wrote envelopes without serial and lineage.
    let alpha = |state: &[u8]| {
        let full: serde_json::Value = serde_json::from_slice(&encrypt(state)).unwrap();
        format!(
            r#"{{"meta":{},"encrypted_data":{},"encryption_version":"v0"}}"#,
            full["meta"], full["encrypted_data"]
        )
        .into_bytes()
    };
    let tofu = Tofu::start("");
    // Nothing stored yet, or nothing with a lineage: nothing to protect.
    assert_eq!(tofu.post("a", &alpha(&tofu_state(1, "a"))).status, 200);
    assert_eq!(tofu.post("a", &alpha(&tofu_state(2, "b"))).status, 200);

    assert_eq!(tofu.post("b", &tofu_state(1, "kept")).status, 200);
    for body in [alpha(&tofu_state(2, "b")), br#"{"version":4}"#.to_vec()] {
        let answer = tofu.post("b", &body);
        assert_eq!(answer.status, 409, "{}", answer.text());
        assert!(
            answer.text().contains("has no lineage and serial"),
            "{}",
            answer.text()
        );
    }
    assert_eq!(tofu.get("b"), tofu_state(1, "kept"));

    // An operator who allows forced pushes accepts it.
    let forced = Tofu::start("allow_force_push = true");
    assert_eq!(forced.post("b", &tofu_state(1, "kept")).status, 200);
    let envelope = alpha(&tofu_state(2, "b"));
    assert_eq!(forced.post("b", &envelope).status, 200);
    assert_eq!(forced.get("b"), envelope);
}

#[test]
fn host_side_encryption_wraps_an_opentofu_envelope_and_serves_it_unchanged() {
    let keyfile = tempdir();
    let key = key_file(keyfile.path());
    let tofu = Tofu::start(&format!(
        "encryption = {{ keys = [{{ id = \"k1\", file = \"{}\" }}] }}",
        key.display()
    ));
    let envelope = encrypt(&tofu_state(1, "hunter2"));
    let ciphertext =
        serde_json::from_slice::<serde_json::Value>(&envelope).unwrap()["encrypted_data"]
            .as_str()
            .unwrap()
            .to_string();
    assert_eq!(tofu.post("h", &envelope).status, 200);
    assert_eq!(tofu.get("h"), envelope);

    // What the guest stored is the host's envelope around OpenTofu's.
    let stored =
        std::fs::read(tofu.dir.path().join("backends/default/h/terraform.tfstate")).unwrap();
    let stored = String::from_utf8(stored).unwrap();
    assert!(stored.contains("wasmstate_encrypted"), "{stored}");
    assert!(
        !stored.contains(&ciphertext),
        "OpenTofu's payload is sealed again"
    );
    assert!(
        stored.contains(&format!("\"lineage\":\"{LINEAGE}\"")),
        "{stored}"
    );

    let versions = tofu.versions("h");
    assert_eq!(versions.len(), 1);
    assert_eq!(tofu.version("h", &versions[0].0), envelope);
    // The guard still reads the clear serial through both envelopes.
    let older = tofu.post("h", &encrypt(&tofu_state(0, "zero")));
    assert_eq!(older.status, 409, "{}", older.text());
}

#[test]
fn restore_refuses_an_encrypted_version_and_changes_nothing() {
    let tofu = Tofu::start("");
    for state in [
        tofu_state(1, "one"),
        encrypt(&tofu_state(2, "two")),
        tofu_state(3, "three"),
    ] {
        assert_eq!(tofu.post("r", &state).status, 200);
    }
    let versions = tofu.versions("r");
    let restore = |id: &str| {
        wasmstate(&[
            "state",
            "restore",
            "r",
            id,
            "--server",
            &tofu.server.url,
            "--token",
            &tofu.token,
        ])
    };
    let (ok, out) = restore(&versions[1].0);
    assert!(!ok, "{out}");
    assert!(out.contains("is an OpenTofu-encrypted state"), "{out}");
    assert_eq!(tofu.get("r"), tofu_state(3, "three"));
    let lock = lock_info("after-restore", "t@h");
    assert_eq!(
        tofu.send("LOCK", &tofu.url("r"), Some(&lock)).status,
        200,
        "the refused restore took no lock"
    );
    assert_eq!(tofu.send("UNLOCK", &tofu.url("r"), Some(&lock)).status, 200);

    // A plain version restores as before, as the next serial.
    let (ok, out) = restore(&versions[2].0);
    assert!(ok, "{out}");
    let restored: serde_json::Value = serde_json::from_slice(&tofu.get("r")).unwrap();
    assert_eq!(restored["serial"], 4);
    assert_eq!(restored["outputs"]["secret"]["value"], "one");
}

#[test]
fn bodies_that_are_neither_kind_of_state_are_refused_with_400() {
    let tofu = Tofu::start("");
    for body in [
        br#"{"serial":1,"lineage":"l"}"#.as_slice(),
        br#"{"serial":1,"lineage":"l","meta":{},"encrypted_data":"","encryption_version":""}"#,
        b"[1,2,3]",
    ] {
        let answer = tofu.post("bad", body);
        assert_eq!(answer.status, 400, "{}", answer.text());
        assert!(
            answer.text().contains("nor an OpenTofu encrypted state"),
            "{}",
            answer.text()
        );
    }
    let missing = tofu.send("GET", &tofu.url("bad"), None);
    assert_eq!(missing.status, 404, "nothing was stored");
}
