//! What an index entry, a signing key and a reload may name: another
//! guest's name, keys scoped to other guests, narrowed grants.

use super::*;

#[test]
fn an_index_entry_naming_another_guest_and_keys_scoped_to_other_guests_are_refused() {
    let dir = tempdir();
    let etcd = copy_guest(ETCD_GUEST_WASM, dir.path(), "etcd.wasm");
    let digest = sha256_of(&etcd);
    // The index calls it "s3-archive"; the component says it is "etcd".
    let index = dir.path().join("index.json");
    std::fs::write(
        &index,
        serde_json::json!({"guests": [{"name": "s3-archive", "version": "0.1.0",
            "description": "not what it says", "sha256": digest, "url": etcd.to_str().unwrap()}]})
        .to_string(),
    )
    .unwrap();
    let config = write_config(dir.path(), "allow_unsigned = true", "");
    let out = install(&config, "s3-archive", &["--index", index.to_str().unwrap()]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(
            "the index lists it as \"s3-archive\", but the component is the guest \"etcd\""
        ),
        "{}",
        text(&out)
    );
    assert!(listed(&config).contains("no guests installed"));

    // A publisher key trusted only for its own guests does not vouch for etcd.
    let (secret, public) = keygen(dir.path(), "acme");
    sign(&etcd, &secret);
    let scoped = format!("trusted_keys = [{{ key = {public:?}, guests = [\"acme-*\"] }}]");
    let config = write_config(dir.path(), &scoped, "");
    let out = install(&config, etcd.to_str().unwrap(), &[]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("is trusted for the guest \"etcd\""),
        "{}",
        text(&out)
    );
    // Scoped to etcd: installed.
    let scoped = format!("trusted_keys = [{{ key = {public:?}, guests = [\"etcd\"] }}]");
    let config = write_config(dir.path(), &scoped, "");
    let out = install(&config, etcd.to_str().unwrap(), &[]);
    assert!(out.status.success(), "{}", text(&out));

    // Plain HTTP from a remote host is refused before anything is fetched.
    let out = install(&config, "http://guests.example.com/etcd.wasm", &[]);
    assert!(!out.status.success());
    assert!(text(&out).contains("https"), "{}", text(&out));
}

/// `wasmstate_backend_up{backend="NAME"}`.
fn backend_up(server: &Server, name: &str) -> f64 {
    server.metric(&format!("wasmstate_backend_up{{backend=\"{name}\"}}"))
}

/// Wait until `wasmstate_backend_up{backend="NAME"}` is `up` after a
/// reload: the server sets it only after logging "reload done", which is
/// all [`reload`] waits for.
fn assert_backend_up_after_reload(server: &Server, name: &str, up: f64) {
    wait_until(
        &format!("wasmstate_backend_up{{backend=\"{name}\"}} to be {up} after the reload"),
        Duration::from_secs(30),
        || backend_up(server, name) == up,
    );
}

#[test]
fn a_reload_that_narrows_grants_removes_a_key_or_a_backend_stops_what_it_no_longer_allows() {
    let etcd = Etcd::start();
    let dir = tempdir();
    let guest = copy_guest(ETCD_GUEST_WASM, dir.path(), "etcd.wasm");
    let digest = sha256_of(&guest);
    let (secret, public) = keygen(dir.path(), "publisher");
    let (_, stranger) = keygen(dir.path(), "stranger");
    sign(&guest, &secret);
    let config = write_config(dir.path(), &format!("trusted_keys = [{public:?}]"), "");
    let out = install(&config, guest.to_str().unwrap(), &[]);
    assert!(out.status.success(), "{}", text(&out));
    let write = |key: &str, grant: bool, gone: bool| {
        let grant = if grant {
            format!("allow_http = [{:?}]\n", etcd.url)
        } else {
            String::new()
        };
        let gone = if gone {
            ""
        } else {
            "[backends.gone]\nguest = \"local\"\n"
        };
        std::fs::write(
            &config,
            format!(
                "data_dir = \"data\"\n[marketplace]\ntrusted_keys = [{key:?}]\n\
                 [backends.default]\nguest = \"local\"\n{gone}\
                 [backends.kv]\nguest = \"etcd@sha256:{digest}\"\n{grant}\
                 config = {{ endpoint = {:?} }}\n",
                etcd.url
            ),
        )
        .unwrap();
    };
    write(&public, true, false);
    let server = Server::with_config_file(&dir.path().join("data"), &config);
    let kv = server.state_url("kv", "ws");
    let gone = server.state_url("gone", "ws");
    let serving = |url: &str| {
        let answer = send("GET", url, None);
        assert_eq!(answer.status, 404, "{url}: {}", answer.text());
    };
    let stopped = |url: &str, why: &str| {
        let answer = send("GET", url, None);
        assert_eq!(answer.status, 503, "{url}: {}", answer.text());
        assert!(
            answer.text().contains("this backend is stopped") && answer.text().contains(why),
            "{url}: expected {why:?} in {}",
            answer.text()
        );
    };
    serving(&kv);
    serving(&gone);
    assert_eq!(backend_up(&server, "kv"), 1.0);

    // 1. The grant its manifest needs is withdrawn: stopped, not served
    //    with the old grant.
    write(&public, false, false);
    reload(&server, 1);
    stopped(&kv, "has not granted");
    assert_backend_up_after_reload(&server, "kv", 0.0);
    serving(&gone);
    // Granted again: serving again.
    write(&public, true, false);
    reload(&server, 2);
    serving(&kv);
    assert_backend_up_after_reload(&server, "kv", 1.0);

    // 2. The publisher's key is no longer trusted: stopped.
    write(&stranger, true, false);
    reload(&server, 3);
    stopped(&kv, "trusted");
    assert_backend_up_after_reload(&server, "kv", 0.0);

    // 3. A backend removed from the config: stopped.
    write(&public, true, true);
    reload(&server, 4);
    stopped(&gone, "removed from the config");
    assert_backend_up_after_reload(&server, "gone", 0.0);
    serving(&kv);
    let log = server.log_text();
    assert!(log.contains("backend stopped"), "{log}");
    assert!(
        log.contains("backend removed from the config: stopped"),
        "{log}"
    );
    assert!(
        server.metric("wasmstate_reloads_total{result=\"ok\"}") >= 4.0,
        "{}",
        send("GET", &format!("{}/metrics", server.url), None).text()
    );
}
