//! Google credentials held by the host: a service account's key exchanged
//! for a token at its `token_uri`, the metadata server's token, refresh
//! before expiry, and a refused token reported as a 503 that changes
//! nothing. Requests reach fake-gcs-server only through a gate that lets
//! through those carrying a token the token endpoint minted
//! ([`GoogleFront`]), so a request the host forgot to authorize fails.

use crate::common::*;
use std::path::Path;
use std::time::Duration;

const BUCKET: &str = "wasmstate-gcp-auth";

fn server(
    data: &Path,
    front: &GoogleFront,
    credentials: Option<&Path>,
    env: &[(&str, &str)],
) -> Server {
    let mut config = format!(
        "[backends.gcs]\nguest = \"gcs\"\n[backends.gcs.config]\nbucket = {BUCKET:?}\nprefix = \"app\"\nstorage_custom_endpoint = \"{}/storage/v1/\"\n",
        front.url
    );
    if let Some(path) = credentials {
        config.push_str(&format!("credentials = {:?}\n", path.to_str().unwrap()));
    }
    let file = data.join("wasmstate.toml");
    std::fs::create_dir_all(data).unwrap();
    std::fs::write(&file, config).unwrap();
    Server::with_config_env(data, &file, env)
}

/// Lock, write, read back and unlock `ws`: every kind of request the
/// guest makes (lookups, the lock object's upload and delete, the
/// state's upload, ranged reads, the listing).
fn round_trip(server: &Server, ws: &str, serial: u64) {
    let url = server.state_url("gcs", ws);
    let lock = lock_info("0b3c7a52-3f39-4a55-9d9b-1d8c0b6c1a11", "ci@runner");
    assert_eq!(send("LOCK", &url, Some(&lock)).status, 200);
    let body = state(serial);
    let written = send(
        "POST",
        &format!("{url}?ID=0b3c7a52-3f39-4a55-9d9b-1d8c0b6c1a11"),
        Some(&body),
    );
    assert_eq!(written.status, 200, "{}", written.text());
    assert_eq!(send("GET", &url, None).body, body);
    assert_eq!(send("UNLOCK", &url, Some(&lock)).status, 200);
}

#[test]
fn a_service_account_key_is_exchanged_by_the_host_and_its_token_reused() {
    let gcs = FakeGcs::start();
    gcs.create_bucket(BUCKET, false);
    let keys = tempdir();
    let front = GoogleFront::start(&gcs.url, 3600);
    let (file, public) = service_account_key(keys.path(), &front.token_uri());
    front.trust_key(public);
    let data = tempdir();
    let server = server(data.path(), &front, Some(&file), &[]);
    for (i, ws) in ["default", "staging", "prod"].iter().enumerate() {
        round_trip(&server, ws, i as u64 + 1);
    }
    assert_eq!(
        front.unauthorized(),
        Vec::<String>::new(),
        "every request to storage carries the host's token"
    );
    assert!(front.forwarded().len() > 20, "{:?}", front.forwarded());
    assert_eq!(front.minted(), 1, "one token, reused until it nears expiry");
    let listed = send("GET", &format!("{}/workspaces/gcs", server.url), None);
    assert_eq!(listed.status, 200, "{}", listed.text());
    for ws in ["default", "staging", "prod"] {
        assert!(listed.text().contains(ws), "{}", listed.text());
    }
    assert!(
        gcs.object(BUCKET, "app/staging.tfstate").is_some(),
        "the state is in the bucket, at Terraform's gcs layout"
    );
    // The key never reaches the guest: its config holds no credentials.
    assert!(!server.log_text().contains("BEGIN PRIVATE KEY"));
}

#[test]
fn the_metadata_server_gives_the_token_and_it_is_minted_again_before_expiry() {
    let gcs = FakeGcs::start();
    gcs.create_bucket(BUCKET, false);
    // Tokens that live 4 s are minted again halfway through.
    let front = GoogleFront::start(&gcs.url, 4);
    let data = tempdir();
    let host = front.metadata_host();
    let server = server(data.path(), &front, None, &[("GCE_METADATA_HOST", &host)]);
    round_trip(&server, "default", 1);
    assert_eq!(front.minted(), 1);
    let url = server.state_url("gcs", "default");
    wait_until(
        "a second token before the first expires",
        Duration::from_secs(30),
        || {
            assert_eq!(send("GET", &url, None).status, 200);
            front.minted() >= 2
        },
    );
    assert_eq!(front.unauthorized(), Vec::<String>::new());
}

#[test]
fn a_refused_token_is_a_503_naming_the_cause_and_writes_nothing() {
    let gcs = FakeGcs::start();
    gcs.create_bucket(BUCKET, false);
    let front = GoogleFront::start(&gcs.url, 3600);
    front.refuse_tokens(true);
    let data = tempdir();
    let host = front.metadata_host();
    let server = server(data.path(), &front, None, &[("GCE_METADATA_HOST", &host)]);
    let url = server.state_url("gcs", "default");
    let answer = send("POST", &url, Some(&state(1)));
    assert_eq!(answer.status, 503, "{}", answer.text());
    assert!(
        server
            .log_text()
            .contains("cannot get a Google access token"),
        "{}",
        server.log_text()
    );
    assert!(gcs.object(BUCKET, "app/default.tfstate").is_none());
    assert!(front.forwarded().is_empty(), "{:?}", front.forwarded());
    // Once the endpoint grants again, the same server serves.
    front.refuse_tokens(false);
    round_trip(&server, "default", 2);
}
