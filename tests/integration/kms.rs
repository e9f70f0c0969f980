//! Encryption at rest with a KMS key, rotation, and `wasmstate state
//! reseal`.
//!
//! moto plays AWS KMS and IAM: after setup it checks every request's
//! SigV4 signature and the caller's IAM policy (`kms:GenerateDataKey`,
//! `kms:Decrypt`), and its Decrypt refuses an encryption context other
//! than the one a data key was generated for. So a state that round-trips
//! proves the host called KMS with valid credentials and the right context.

use crate::common::*;
use std::path::{Path, PathBuf};

const KMS_KEY_ID: &str = "2026-12";

/// moto with a KMS key and two IAM users: `sealer` may generate and
/// unwrap data keys; `reader` may only unwrap.
struct Kms {
    moto: Moto,
    arn: String,
    sealer: (String, String),
    reader: (String, String),
    /// May also use the bucket [`BUCKET`].
    storer: (String, String),
}

const BUCKET: &str = "kms-states";

fn user(moto: &Moto, name: &str, actions: &[&str]) -> (String, String) {
    moto.query("iam", "CreateUser", &[("UserName", name)]);
    let policy = serde_json::json!({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]
    })
    .to_string();
    moto.query(
        "iam",
        "PutUserPolicy",
        &[
            ("UserName", name),
            ("PolicyName", "kms"),
            ("PolicyDocument", &policy),
        ],
    );
    let key = moto.query("iam", "CreateAccessKey", &[("UserName", name)]);
    (
        crate::aws_credentials::between(&key, "AccessKeyId"),
        crate::aws_credentials::between(&key, "SecretAccessKey"),
    )
}

impl Kms {
    fn start() -> Kms {
        let moto = Moto::start();
        let created = moto.kms(
            "CreateKey",
            serde_json::json!({"Description": "wasmstate states", "KeyUsage": "ENCRYPT_DECRYPT"}),
        );
        let arn = created["KeyMetadata"]["Arn"].as_str().unwrap().to_string();
        let sealer = user(&moto, "sealer", &["kms:GenerateDataKey", "kms:Decrypt"]);
        let reader = user(&moto, "reader", &["kms:Decrypt"]);
        let storer = user(
            &moto,
            "storer",
            &["s3:*", "kms:GenerateDataKey", "kms:Decrypt"],
        );
        moto.create_bucket(BUCKET);
        moto.check_signatures();
        Kms {
            moto,
            arn,
            sealer,
            reader,
            storer,
        }
    }

    /// The key entry for `encryption.keys`, reaching moto.
    fn key(&self) -> String {
        format!(
            "{{ id = \"{KMS_KEY_ID}\", aws_kms = \"{}\", endpoint = \"{}\" }}",
            self.arn, self.moto.url
        )
    }

    /// `encryption.aws` with `who`'s keys.
    fn credentials(who: &(String, String)) -> String {
        format!(
            "aws = {{ access_key = \"{}\", secret_key = \"{}\" }}",
            who.0, who.1
        )
    }
}

fn config(store: &Path, backend: &str, encryption: &str) -> String {
    format!(
        "[backends.{backend}]\nguest = \"local\"\ndir = {store:?}\nhistory = 5\nencryption = {{ {encryption} }}\n"
    )
}

fn state(serial: u64, note: &str) -> Vec<u8> {
    format!(
        r#"{{"version":4,"serial":{serial},"lineage":"kms-lineage","outputs":{{"note":{{"value":"secret-{note}","type":"string"}}}}}}"#
    )
    .into_bytes()
}

/// The entry of a fresh file key `k1` kept in `dir`.
fn file_key(dir: &Path) -> String {
    format!("{{ id = \"k1\", file = {:?} }}", key_file(dir))
}

/// Serials 1 to 3 of each of `workspaces`, written through `server`.
fn three_serials(server: &Server, backend: &str, workspaces: &[&str]) {
    for workspace in workspaces {
        let url = server.state_url(backend, workspace);
        for serial in 1..=3 {
            let body = state(serial, &format!("{workspace}-{serial}"));
            assert_eq!(send("POST", &url, Some(&body)).status, 200);
        }
    }
}

fn calls(server: &Server, backend: &str, call: &str) -> f64 {
    server.metric(&format!(
        "wasmstate_key_service_calls_total{{backend=\"{backend}\",call=\"{call}\"}}"
    ))
}

fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return files;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push((path.clone(), std::fs::read(&path).unwrap()));
        }
    }
    files
}

fn holds(bytes: &[u8], text: &str) -> bool {
    bytes.windows(text.len()).any(|w| w == text.as_bytes())
}

#[test]
fn a_kms_sealed_backend_round_trips_terraform_through_moto_with_iam_enforced() {
    let kms = Kms::start();
    let data = tempdir();
    let store = data.path().join("store");
    let encryption = format!("keys = [{}], {}", kms.key(), Kms::credentials(&kms.sealer));
    let server = Server::with_config(data.path(), &config(&store, "default", &encryption));
    let work = tempdir();
    crate::terraform::apply_and_check(
        work.path(),
        &server.state_url("default", "default"),
        &server,
    );

    // What the guest stored: an envelope with a KMS-wrapped data key.
    let stored = std::fs::read(store.join("default/terraform.tfstate")).unwrap();
    let envelope: serde_json::Value = serde_json::from_slice(&stored).unwrap();
    let sealed = &envelope["wasmstate_encrypted"];
    assert_eq!(sealed["format"], 3, "{envelope}");
    assert_eq!(sealed["key_id"], KMS_KEY_ID);
    assert!(sealed["wrapped_key"].as_str().is_some_and(|w| w.len() > 40));
    assert!(
        !holds(&stored, "terraform_data"),
        "plaintext reached storage"
    );

    // One KMS call per write; a read of this replica's own write needs none.
    let url = server.state_url("default", "counted");
    let generated = calls(&server, "default", "generate");
    let unwrapped = calls(&server, "default", "unwrap");
    for serial in 1..=3 {
        assert_eq!(send("POST", &url, Some(&state(serial, "a"))).status, 200);
    }
    assert_eq!(calls(&server, "default", "generate"), generated + 3.0);
    for _ in 0..3 {
        assert_eq!(send("GET", &url, None).body, state(3, "a"));
    }
    assert_eq!(calls(&server, "default", "unwrap"), unwrapped);

    // A second replica has no cached key: one Decrypt, then none.
    let other_dir = tempdir();
    let other = Server::with_config(other_dir.path(), &config(&store, "default", &encryption));
    let other_url = other.state_url("default", "counted");
    for _ in 0..2 {
        assert_eq!(send("GET", &other_url, None).body, state(3, "a"));
    }
    assert_eq!(calls(&other, "default", "unwrap"), 1.0);
    assert_eq!(calls(&other, "default", "cached"), 1.0);

    // An envelope moved to another workspace: KMS refuses its context.
    std::fs::create_dir_all(store.join("moved")).unwrap();
    std::fs::copy(
        store.join("counted/terraform.tfstate"),
        store.join("moved/terraform.tfstate"),
    )
    .unwrap();
    let moved = send("GET", &other.state_url("default", "moved"), None);
    assert_eq!(moved.status, 500, "{}", moved.text());
    assert!(
        moved.text().contains("InvalidCiphertext"),
        "{}",
        moved.text()
    );
}

/// The host's KMS calls use the backend's own credentials (an S3 backend's
/// keys), or the standard chain (the environment) when it has none.
#[test]
fn kms_calls_use_the_backends_own_credentials_or_the_standard_chain() {
    let kms = Kms::start();
    let data = tempdir();
    let (access, secret) = &kms.storer;
    let s3_config = format!(
        "[backends.s3]\nguest = \"s3-lockfile\"\nencryption = {{ keys = [{}] }}\n\
         [backends.s3.config]\nbucket = {BUCKET:?}\nkey = \"app/terraform.tfstate\"\n\
         region = \"us-east-1\"\nuse_path_style = true\nendpoints = {{ s3 = {:?} }}\n\
         access_key = {access:?}\nsecret_key = {secret:?}\n",
        kms.key(),
        kms.moto.url
    );
    let server = Server::with_config(data.path(), &s3_config);
    let url = server.state_url("s3", "default");
    let posted = send("POST", &url, Some(&state(1, "s3")));
    assert_eq!(posted.status, 200, "{}", posted.text());
    assert_eq!(send("GET", &url, None).body, state(1, "s3"));
    assert_eq!(calls(&server, "s3", "generate"), 1.0);
    drop(server);

    // A local backend, no credentials in the config: the environment's.
    let store = data.path().join("store");
    let config_path = data.path().join("env.toml");
    let keys = format!("keys = [{}]", kms.key());
    std::fs::write(&config_path, config(&store, "default", &keys)).unwrap();
    let (access, secret) = &kms.sealer;
    let env = [
        ("AWS_ACCESS_KEY_ID", access.as_str()),
        ("AWS_SECRET_ACCESS_KEY", secret.as_str()),
    ];
    let server = Server::with_config_env(data.path(), &config_path, &env);
    let url = server.state_url("default", "default");
    let posted = send("POST", &url, Some(&state(1, "env")));
    assert_eq!(posted.status, 200, "{}", posted.text());
    assert_eq!(send("GET", &url, None).body, state(1, "env"));
    drop(server);
    // Without them, the same config cannot reach the key: a 503 naming it.
    let server = Server::with_config_file(data.path(), &config_path);
    let refused = send(
        "POST",
        &server.state_url("default", "default"),
        Some(&state(2, "env")),
    );
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(refused.text().contains(KMS_KEY_ID), "{}", refused.text());
}

#[test]
fn kms_refusals_and_outages_are_503s_naming_the_key_and_nothing_is_written() {
    let kms = Kms::start();
    let data = tempdir();
    let store = data.path().join("store");
    let full = format!("keys = [{}], {}", kms.key(), Kms::credentials(&kms.sealer));
    let server = Server::with_config(data.path(), &config(&store, "default", &full));
    let url = server.state_url("default", "default");
    assert_eq!(send("POST", &url, Some(&state(1, "kept"))).status, 200);
    drop(server);
    let file = store.join("default/terraform.tfstate");
    let before = std::fs::read(&file).unwrap();

    // IAM allows this user Decrypt but not GenerateDataKey.
    let reader = format!("keys = [{}], {}", kms.key(), Kms::credentials(&kms.reader));
    let server = Server::with_config(data.path(), &config(&store, "default", &reader));
    let url = server.state_url("default", "default");
    let denied = send("POST", &url, Some(&state(2, "lost")));
    assert_eq!(denied.status, 503, "{}", denied.text());
    for needed in [KMS_KEY_ID, &kms.arn, "AccessDenied", "GenerateDataKey"] {
        assert!(
            denied.text().contains(needed),
            "{needed}: {}",
            denied.text()
        );
    }
    assert_eq!(std::fs::read(&file).unwrap(), before, "nothing written");
    assert_eq!(send("GET", &url, None).body, state(1, "kept"));
    drop(server);

    // KMS unreachable: reads and writes are 503s; nothing plain is written.
    let closed = format!("http://127.0.0.1:{}", free_port());
    let unreachable = full.replace(&kms.moto.url, &closed);
    let server = Server::with_config(data.path(), &config(&store, "default", &unreachable));
    let url = server.state_url("default", "default");
    for (method, body) in [("GET", None), ("POST", Some(state(2, "lost")))] {
        let answer = send(method, &url, body.as_deref());
        assert_eq!(answer.status, 503, "{method}: {}", answer.text());
        assert!(
            answer.text().contains(KMS_KEY_ID) && answer.text().contains("cannot reach KMS"),
            "{method}: {}",
            answer.text()
        );
    }
    assert_eq!(std::fs::read(&file).unwrap(), before, "nothing written");
}

/// Every workspace's state and kept versions, read through `server`.
fn everything(server: &Server, backend: &str) -> Vec<(String, Vec<u8>)> {
    let mut read = Vec::new();
    let list = send("GET", &format!("{}/workspaces/{backend}", server.url), None);
    assert_eq!(list.status, 200, "{}", list.text());
    for workspace in list.json().as_array().unwrap() {
        let workspace = workspace.as_str().unwrap();
        let url = server.state_url(backend, workspace);
        let current = send("GET", &url, None);
        assert_eq!(current.status, 200, "{workspace}: {}", current.text());
        read.push((workspace.to_string(), current.body));
        let (versions, _) = versions(&url);
        for version in versions.as_array().unwrap() {
            let id = version["id"].as_str().unwrap();
            let answer = send("GET", &format!("{url}/versions/{id}"), None);
            assert_eq!(answer.status, 200, "{workspace} {id}: {}", answer.text());
            read.push((format!("{workspace}@{id}"), answer.body));
        }
    }
    read.sort();
    read
}

#[test]
fn rotating_from_a_file_key_to_kms_and_resealing_leaves_nothing_for_the_old_key() {
    let kms = Kms::start();
    let data = tempdir();
    let store = data.path().join("store");
    let k1 = file_key(data.path());
    let server = Server::with_config(
        data.path(),
        &config(&store, "default", &format!("keys = [{k1}]")),
    );
    three_serials(&server, "default", &["default", "net", "app", "busy"]);
    let before = everything(&server, "default");
    assert_eq!(before.len(), 4 * 4, "4 states and 3 versions of each");
    drop(server);

    // The KMS key goes in front: new writes use it, old states still open.
    let rotated = format!(
        "keys = [{}, {k1}], {}",
        kms.key(),
        Kms::credentials(&kms.sealer)
    );
    let server = Server::with_config(data.path(), &config(&store, "default", &rotated));
    assert_eq!(everything(&server, "default"), before);
    let held = lock_info("someone-else", "ops@elsewhere");
    let busy = server.state_url("default", "busy");
    assert_eq!(send("LOCK", &busy, Some(&held)).status, 200);

    let (ok, out) = wasmstate(&["state", "reseal", "--dry-run", "--server", &server.url]);
    assert!(ok, "{out}");
    assert!(
        out.contains("dry run") && out.contains("would be re-sealed"),
        "{out}"
    );
    let sealed_with_k1 = |store: &Path, history: &Path| {
        [files_under(store), files_under(history)]
            .concat()
            .into_iter()
            .filter(|(_, bytes)| holds(bytes, "\"key_id\":\"k1\""))
            .count()
    };
    let history = data.path().join("history");
    assert_eq!(
        sealed_with_k1(&store, &history),
        16,
        "a dry run changes nothing"
    );

    // The held workspace is skipped and named; the run says it is unfinished.
    let (ok, out) = wasmstate(&["state", "reseal", "--server", &server.url]);
    assert!(!ok, "{out}");
    assert!(out.contains("busy: locked by ops@elsewhere"), "{out}");
    assert!(
        out.contains("[4/4]") && out.contains("run `wasmstate state reseal` again"),
        "{out}"
    );
    assert_eq!(
        sealed_with_k1(&store, &history),
        4,
        "only busy's state and versions"
    );
    assert_eq!(send("UNLOCK", &busy, Some(&held)).status, 200);
    let (ok, out) = wasmstate(&["state", "reseal", "--server", &server.url]);
    assert!(ok, "{out}");
    assert!(
        out.contains("3 already current") && out.contains("1 re-sealed"),
        "{out}"
    );
    assert_eq!(sealed_with_k1(&store, &history), 0);
    // The lock was released: Terraform can lock again.
    assert_eq!(send("LOCK", &busy, Some(&held)).status, 200);
    assert_eq!(send("UNLOCK", &busy, Some(&held)).status, 200);
    drop(server);

    // The old key removed: every state and version still reads the same.
    let only_kms = format!("keys = [{}], {}", kms.key(), Kms::credentials(&kms.sealer));
    let server = Server::with_config(data.path(), &config(&store, "default", &only_kms));
    assert_eq!(everything(&server, "default"), before);
}

#[test]
fn a_renamed_backend_keeps_every_state_and_version_after_reseal_from_backend() {
    let data = tempdir();
    let store = data.path().join("store");
    let keys = format!("keys = [{}]", file_key(data.path()));
    let server = Server::with_config(data.path(), &config(&store, "old", &keys));
    three_serials(&server, "old", &["default", "net"]);
    let before = everything(&server, "old");
    drop(server);

    // Renamed: the envelopes are bound to the old name and do not open.
    let server = Server::with_config(data.path(), &config(&store, "new", &keys));
    let refused = send("GET", &server.state_url("new", "net"), None);
    assert_eq!(refused.status, 500, "{}", refused.text());
    assert!(
        refused.text().contains("another backend"),
        "{}",
        refused.text()
    );

    let reseal = ["state", "reseal", "-b", "new", "--from-backend", "old"];
    let (ok, out) = wasmstate(&[&reseal[..], &["--dry-run", "--server", &server.url]].concat());
    assert!(ok && out.contains("would be re-sealed"), "{out}");
    let (ok, out) = wasmstate(&[&reseal[..], &["--server", &server.url]].concat());
    assert!(ok, "{out}");
    assert!(out.contains("re-bound from \"old\""), "{out}");
    assert_eq!(everything(&server, "new"), before);
    // The old name's history folder was emptied into the new one.
    assert!(files_under(&data.path().join("history/old")).is_empty());
    // A second run finds nothing to do.
    let (ok, out) = wasmstate(&[&reseal[..], &["--server", &server.url]].concat());
    assert!(
        ok && out.contains("2 already current") && !out.contains("re-sealed (was"),
        "{out}"
    );
}

#[test]
fn a_rename_reseal_refuses_a_rolled_back_state_and_a_served_name() {
    let data = tempdir();
    let store = data.path().join("store");
    let keys = format!("keys = [{}]", file_key(data.path()));
    let server = Server::with_config(data.path(), &config(&store, "old", &keys));
    three_serials(&server, "old", &["net"]);
    drop(server);
    // Storage hands back serial 2 in place of 3 (a rollback the seal
    // alone cannot tell): the kept version, copied over the state.
    let kept = files_under(&data.path().join("history/old/net"));
    let (_, second) = kept
        .iter()
        .find(|(path, _)| path.to_string_lossy().ends_with("-2.tfstate"))
        .expect("serial 2 is kept");
    std::fs::write(store.join("net/terraform.tfstate"), second).unwrap();

    let renamed = format!(
        "{}[backends.other]\nguest = \"local\"\n",
        config(&store, "new", &keys)
    );
    let server = Server::with_config(data.path(), &renamed);
    // Reads of the new name before the re-seal (a plan, the console, a dry
    // run) fail, and must not switch the rollback check off.
    assert_eq!(
        send("GET", &server.state_url("new", "net"), None).status,
        500
    );
    let (ok, out) = wasmstate(&[
        "state",
        "reseal",
        "-b",
        "new",
        "--from-backend",
        "old",
        "--dry-run",
        "--server",
        &server.url,
    ]);
    assert!(ok && out.contains("would be re-sealed"), "{out}");
    // A name served here is not a former name.
    let (ok, out) = wasmstate(&[
        "state",
        "reseal",
        "-b",
        "new",
        "--from-backend",
        "other",
        "--server",
        &server.url,
    ]);
    assert!(!ok && out.contains("is served here"), "{out}");
    // The old name's kept versions say serial 3 was seen: refused.
    let (ok, out) = wasmstate(&[
        "state",
        "reseal",
        "-b",
        "new",
        "--from-backend",
        "old",
        "--server",
        &server.url,
    ]);
    assert!(!ok, "{out}");
    assert!(out.contains("refused as a rollback"), "{out}");
    assert_eq!(
        send("GET", &server.state_url("new", "net"), None).status,
        500
    );
    // Nothing was re-sealed: the stored state is still the rolled-back one.
    assert_eq!(
        &std::fs::read(store.join("net/terraform.tfstate")).unwrap(),
        second
    );
}
