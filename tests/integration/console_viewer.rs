//! The console's state viewer, comparison details and search: after two
//! real `terraform apply`s (modules, `count`, `for_each`, a sensitive
//! variable and output), in headless Chromium as a reader of some
//! workspaces only (tests/tools/console_viewer_check.py); and a 100 MiB
//! state viewed in bounded memory.

use crate::common::*;
use crate::console::basic;
use std::path::PathBuf;

const ADMIN: (&str, &str) = ("olivia", "admin password for the viewer");
const READER: (&str, &str) = ("rita", "reader password for the viewer");
const SECRETS: [&str; 2] = ["first-secret-xyz", "second-secret-xyz"];
/// A workspace the reader may not read.
const HIDDEN: &str = "zeta-private";
/// A workspace holding an OpenTofu-encrypted state.
const ENCRYPTED: &str = "tofu-enc";

fn config() -> String {
    format!(
        "[backends.default]\nguest = \"local\"\n\
         [[users]]\nname = \"{}\"\npassword_hash = \"{}\"\ngrants = [\"*:*:admin\"]\n\
         [[users]]\nname = \"{}\"\npassword_hash = \"{}\"\ngrants = [\"default:app:read\", \"default:{ENCRYPTED}:read\"]\n",
        ADMIN.0,
        crate::auth::hash(ADMIN.1),
        READER.0,
        crate::auth::hash(READER.1)
    )
}

/// Terraform code: 103 resources in the root module (one with a sensitive
/// input), 2 in `module.net` (`count = 3`, `for_each` of 2), a sensitive
/// output and a plain one.
fn terraform_code(url: &str) -> String {
    let mut code = format!(
        "terraform {{\n  backend \"http\" {{\n    address = \"{url}\"\n    lock_address = \"{url}\"\n    unlock_address = \"{url}\"\n    username = \"{}\"\n    password = \"{}\"\n  }}\n}}\n\
         variable \"b\" {{\n  default = \"one\"\n}}\n\
         variable \"secret\" {{\n  default = \"{}\"\n  sensitive = true\n}}\n\
         resource \"terraform_data\" \"a\" {{\n  input = \"fixed\"\n}}\n\
         resource \"terraform_data\" \"b\" {{\n  input = var.b\n}}\n\
         resource \"terraform_data\" \"s\" {{\n  input = var.secret\n}}\n\
         module \"net\" {{\n  source = \"./net\"\n}}\n\
         output \"pw\" {{\n  value = var.secret\n  sensitive = true\n}}\n\
         output \"greeting\" {{\n  value = \"hello\"\n}}\n",
        ADMIN.0, ADMIN.1, SECRETS[0]
    );
    for i in 0..100 {
        code.push_str(&format!(
            "resource \"terraform_data\" \"bulk_{i:03}\" {{}}\n"
        ));
    }
    code
}

const NET_MODULE: &str = "resource \"terraform_data\" \"c\" {\n  count = 3\n  input = count.index\n}\n\
    resource \"terraform_data\" \"f\" {\n  for_each = toset([\"x\", \"y\"])\n  input = each.key\n}\n";

#[test]
fn the_state_viewer_comparison_and_search_in_a_real_browser() {
    tools::require(&tools::CHROMIUM);
    tools::require(&tools::CHROMEDRIVER);
    let dir = tempdir();
    let server = Server::with_config(&dir.path().join("data"), &config());
    let url = server.state_url("default", "app");
    let work = dir.path().join("tf");
    std::fs::create_dir_all(work.join("net")).unwrap();
    std::fs::write(work.join("main.tf"), terraform_code(&url)).unwrap();
    std::fs::write(work.join("net/main.tf"), NET_MODULE).unwrap();
    let admin = basic(ADMIN);
    let auth = [("Authorization", admin.as_str())];
    let serial = || {
        send_with("GET", &url, None, &auth).json()["serial"]
            .as_u64()
            .expect("the state has a serial")
    };
    crate::terraform::ok(&work, &["init", "-input=false"]);
    crate::terraform::ok(&work, &["apply", "-auto-approve", "-input=false"]);
    let first = serial();
    let second_secret = format!("secret={}", SECRETS[1]);
    crate::terraform::ok(
        &work,
        &[
            "apply",
            "-auto-approve",
            "-input=false",
            "-var",
            "b=two",
            "-var",
            &second_secret,
        ],
    );
    let second = serial();
    assert!(second > first);
    let current = send_with("GET", &url, None, &auth).text();
    assert!(
        current.contains(SECRETS[1]),
        "the state holds the secret in the clear"
    );
    let versions = send_with("GET", &format!("{url}/versions"), None, &auth).json();
    let from = versions
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["serial"].as_u64() == Some(first))
        .and_then(|v| v["id"].as_str())
        .expect("the first apply's state is kept as a version")
        .to_string();

    // A workspace the reader may not read, holding the same resource; one
    // OpenTofu encrypted (its envelope, as OpenTofu ≥ 1.7 writes it).
    let hidden = br#"{"version":4,"serial":1,"lineage":"h","outputs":{},"resources":[{"mode":"managed","type":"terraform_data","name":"a","provider":"provider[\"terraform.io/builtin/terraform\"]","instances":[{"attributes":{"id":"x"}}]}]}"#;
    let posted = send_with(
        "POST",
        &server.state_url("default", HIDDEN),
        Some(hidden),
        &auth,
    );
    assert_eq!(posted.status, 200, "{}", posted.text());
    let envelope = br#"{"serial":1,"lineage":"tofu","meta":{"key_provider.pbkdf2.key":"eyJzYWx0IjoiQUFBQSJ9"},"encrypted_data":"q83vEjRWeJA=","encryption_version":"v0"}"#;
    let posted = send_with(
        "POST",
        &server.state_url("default", ENCRYPTED),
        Some(envelope),
        &auth,
    );
    assert_eq!(posted.status, 200, "{}", posted.text());

    // Scripts see the same, masked: the pages' HTML and the JSON.
    let ui = |path: &str| send_with("GET", &format!("{}{path}", server.url), None, &auth);
    for path in [
        "/ui/backends/default/app/state".to_string(),
        "/ui/backends/default/app/state?page=2".to_string(),
        format!("/ui/backends/default/app/state?version={from}"),
        format!("/ui/backends/default/app?from={from}&to=current"),
        "/ui/api/backends/default/app/state".to_string(),
        format!("/ui/api/backends/default/app/diff?from={from}&to=current"),
    ] {
        let got = ui(&path);
        assert_eq!(got.status, 200, "{path}: {}", got.text());
        for secret in SECRETS {
            assert!(
                !got.text().contains(secret),
                "{path} shows the secret {secret}"
            );
        }
    }
    let viewed = ui("/ui/api/backends/default/app/state").json();
    assert_eq!(viewed["resources_total"], 105, "{viewed}");
    assert_eq!(viewed["written_by"], ADMIN.0, "{viewed}");
    let diff = ui(&format!(
        "/ui/api/backends/default/app/diff?from={from}&to=current"
    ))
    .json();
    let b = diff["details"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["address"] == "terraform_data.b")
        .expect("terraform_data.b is detailed");
    let input = b["attributes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "input")
        .unwrap();
    assert!(
        input["old"].as_str().unwrap().contains("one")
            && input["new"].as_str().unwrap().contains("two"),
        "{b}"
    );
    let reader = basic(READER);
    let as_reader = |path: &str| {
        send_with(
            "GET",
            &format!("{}{path}", server.url),
            None,
            &[("Authorization", reader.as_str())],
        )
    };
    let found = as_reader("/ui/api/search/default?q=terraform_data.a");
    assert_eq!(found.status, 200, "{}", found.text());
    assert!(!found.text().contains(HIDDEN), "{}", found.text());
    assert_eq!(found.json()["hits"][0]["workspace"], "app");
    let all = ui("/ui/api/search/default?q=terraform_data.a").json();
    let workspaces: Vec<&str> = all["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["workspace"].as_str().unwrap())
        .collect();
    assert_eq!(workspaces, ["app", HIDDEN], "an admin's search finds both");
    assert_eq!(
        as_reader(&format!("/ui/api/backends/default/{HIDDEN}/state")).status,
        403
    );
    assert_eq!(as_reader("/ui/api/search/default?q=").status, 400);
    let tofu = as_reader(&format!("/ui/api/backends/default/{ENCRYPTED}/state"));
    assert_eq!(tofu.status, 200, "{}", tofu.text());
    assert_eq!(tofu.json()["encrypted"], true);

    let shots =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-artifacts/console-viewer");
    let _ = std::fs::remove_dir_all(&shots);
    let check = dir.path().join("viewer.json");
    std::fs::write(
        &check,
        serde_json::json!({
            "base": server.url,
            "backend": "default",
            "workspace": "app",
            "reader": [READER.0, READER.1],
            "serial": second,
            "first_serial": first,
            "from_version": from,
            "writer": ADMIN.0,
            "secrets": SECRETS,
            "encrypted": ENCRYPTED,
            "hidden": HIDDEN,
            "screenshots": shots,
        })
        .to_string(),
    )
    .unwrap();
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/tools/console_viewer_check.py");
    let out = std::process::Command::new(tools::python_env().python())
        .arg(&script)
        .arg(&check)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(
        out.status.success() && text.contains("ALL PASSED"),
        "{text}"
    );
    for page in ["state", "state-page-2", "comparison", "search", "encrypted"] {
        let png = std::fs::read(shots.join(format!("{page}.png"))).unwrap_or_default();
        assert!(png.starts_with(b"\x89PNG"), "no screenshot of {page}");
    }
}

const MIB: usize = 1 << 20;

/// A format-4 state of about `size` bytes: resources of 4 instances each,
/// in a few modules, as `terraform show` would find them.
fn big_state(size: usize) -> (Vec<u8>, usize) {
    let mut text = String::from(
        r#"{"version":4,"terraform_version":"1.11.4","serial":3,"lineage":"big","outputs":{"o":{"value":"v","type":"string"}},"resources":["#,
    );
    let mut count = 0;
    while text.len() < size {
        if count > 0 {
            text.push(',');
        }
        let instances: Vec<String> = (0..4)
            .map(|i| format!(r#"{{"index_key":{i},"schema_version":0,"attributes":{{"id":"{count}-{i}","input":{{"value":"{}","type":"string"}},"triggers_replace":null}},"sensitive_attributes":[]}}"#, "p".repeat(120)))
            .collect();
        text.push_str(&format!(
            r#"{{"module":"module.m{}","mode":"managed","type":"terraform_data","name":"r{count}","provider":"provider[\"terraform.io/builtin/terraform\"]","instances":[{}]}}"#,
            count % 7,
            instances.join(",")
        ));
        count += 1;
    }
    text.push_str("]}");
    (text.into_bytes(), count)
}

/// Viewing a 100 MiB state grows the server's peak memory by about the
/// state's bytes (read once from storage), not by a parsed tree of it.
#[test]
fn a_100_mib_state_is_viewed_in_bounded_memory() {
    let dir = tempdir();
    let server = Server::with_config(
        &dir.path().join("data"),
        "max_body_mib = 160\n[backends.default]\nguest = \"local\"\n",
    );
    let url = server.state_url("default", "big");
    let (state, resources) = big_state(100 * MIB);
    let posted = send("POST", &url, Some(&state));
    assert_eq!(posted.status, 200, "{}", posted.text());
    let view = format!("{}/ui/api/backends/default/big/state?page=7", server.url);
    // Warm up: the guest's read path used once with a small page.
    assert_eq!(
        send(
            "GET",
            &format!("{}/ui/api/backends/default", server.url),
            None
        )
        .status,
        200
    );
    let pid = server.pid();
    let before = rss_kib(pid);
    reset_peak_rss(pid);
    let started = std::time::Instant::now();
    let got = send("GET", &view, None);
    let took = started.elapsed();
    assert_eq!(got.status, 200, "{}", got.text());
    let growth = (peak_rss_kib(pid).saturating_sub(before) * 1024) as usize;
    let viewed = got.json();
    assert_eq!(viewed["resources_total"], resources as u64);
    assert_eq!(viewed["instances_total"], 4 * resources as u64);
    assert_eq!(viewed["resources"].as_array().unwrap().len(), 100);
    assert_eq!(
        viewed["resources"][0]["address"],
        format!("module.m{}.terraform_data.r600", 600 % 7)
    );
    println!(
        "viewing page 7 of a {} MiB state ({resources} resources) took {took:?} and grew the peak RSS by {} MiB",
        state.len() / MIB,
        growth / MIB
    );
    // The state's bytes once, and room for the guest's read buffers; a
    // serde_json::Value of this state alone would be several times it.
    assert!(
        growth <= state.len() * 3 / 2,
        "viewing a {} MiB state grew the server's peak memory by {} MiB, over 1.5 times the state",
        state.len() / MIB,
        growth / MIB
    );
}
