//! The operator console, in headless Chromium driven by selenium
//! (tests/tools/console_check.py), after two real `terraform apply`s.

use crate::common::*;
use base64::Engine as _;
use std::path::PathBuf;
use std::time::Duration;

const ADMIN: (&str, &str) = ("olivia", "admin password for the console");
const READER: (&str, &str) = ("rita", "reader password for the console");

/// An `Authorization: Basic` value for `user` (name, password).
pub(crate) fn basic(user: (&str, &str)) -> String {
    let pair = format!("{}:{}", user.0, user.1);
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

/// Where the screenshots stay after the run, for people to look at.
fn artefacts() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-artifacts/console")
}

#[test]
fn the_console_shows_states_diffs_and_locks_in_a_real_browser() {
    tools::require(&tools::CHROMIUM);
    tools::require(&tools::CHROMEDRIVER);
    let dir = tempdir();
    let server = Server::with_config(
        &dir.path().join("data"),
        &format!(
            "[backends.default]\nguest = \"local\"\n\
             [[users]]\nname = \"{}\"\npassword_hash = \"{}\"\ngrants = [\"*:*:admin\"]\n\
             [[users]]\nname = \"{}\"\npassword_hash = \"{}\"\ngrants = [\"*:*:read\"]\n",
            ADMIN.0,
            crate::auth::hash(ADMIN.1),
            READER.0,
            crate::auth::hash(READER.1)
        ),
    );
    let url = server.state_url("default", "default");
    let work = dir.path().join("tf");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(
        work.join("main.tf"),
        format!(
            "terraform {{\n  backend \"http\" {{\n    address = \"{url}\"\n    lock_address = \"{url}\"\n    unlock_address = \"{url}\"\n    username = \"{}\"\n    password = \"{}\"\n  }}\n}}\n\
             variable \"b\" {{\n  default = \"one\"\n}}\n\
             resource \"terraform_data\" \"a\" {{\n  input = \"fixed\"\n}}\n\
             resource \"terraform_data\" \"b\" {{\n  input = var.b\n}}\n",
            ADMIN.0, ADMIN.1
        ),
    )
    .unwrap();
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
    crate::terraform::ok(
        &work,
        &["apply", "-auto-approve", "-input=false", "-var", "b=two"],
    );
    let second = serial();
    assert!(second > first, "the second apply wrote a newer serial");
    let versions = send_with("GET", &format!("{url}/versions"), None, &auth).json();
    let from = versions
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["serial"].as_u64() == Some(first))
        .and_then(|v| v["id"].as_str())
        .expect("the first apply's state is kept as a version")
        .to_string();
    // A lock held by a test client, as Terraform would hold it.
    let locked = send_with(
        "LOCK",
        &url,
        Some(&lock_info("console-lock", "alice@laptop")),
        &auth,
    );
    assert_eq!(locked.status, 200, "{}", locked.text());

    // Every console answer carries the strict policy.
    let login = send("GET", &format!("{}/ui/login", server.url), None);
    assert_eq!(login.status, 200);
    let csp = login.headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.starts_with("default-src 'none'") && !csp.contains("script-src"),
        "{csp}"
    );

    let shots = artefacts();
    let _ = std::fs::remove_dir_all(&shots);
    let config = dir.path().join("console.json");
    std::fs::write(
        &config,
        serde_json::json!({
            "base": server.url,
            "backend": "default",
            "workspace": "default",
            "admin": [ADMIN.0, ADMIN.1],
            "reader": [READER.0, READER.1],
            "serial": second,
            "from_version": from,
            "changed": "terraform_data.b",
            "holder": "alice@laptop",
            "screenshots": shots,
        })
        .to_string(),
    )
    .unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/tools/console_check.py");
    let out = std::process::Command::new(tools::python_env().python())
        .arg(&script)
        .arg(&config)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Shown with --nocapture: each step's time since the browser started.
    println!("{text}");
    assert!(
        out.status.success() && text.contains("ALL PASSED"),
        "{text}"
    );

    // The page's force-unlock really released it, and the restore unlocked
    // after itself: another client locks.
    let again = send_with("LOCK", &url, Some(&lock_info("after", "bob@ci")), &auth);
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(serial(), second + 1, "the restore wrote the next serial");
    for page in [
        "deep-link",
        "workspaces-1280",
        "backends",
        "workspaces-reader",
        "guests",
        "diff",
        "forged-post",
        "workspaces-admin",
        "force-unlocked",
        "restored",
        "audit",
    ] {
        let png = std::fs::read(shots.join(format!("{page}.png"))).unwrap_or_default();
        assert!(
            png.starts_with(b"\x89PNG"),
            "no screenshot of {page} in {}",
            shots.display()
        );
    }
}

#[test]
fn admin_forms_without_the_token_change_nothing() {
    let dir = tempdir();
    let server = Server::start(&dir.path().join("data"));
    let url = server.state_url("default", "default");
    assert_eq!(
        send("LOCK", &url, Some(&lock_info("held", "alice@laptop"))).status,
        200
    );
    // A session (no users: signing in is automatic) without its token.
    let ConsoleSession { client, cookie, .. } = ConsoleSession::open(&server);
    let forged = client
        .post(format!(
            "{}/ui/backends/default/default/force-unlock",
            server.url
        ))
        .header("cookie", &cookie)
        .form(&[("csrf", "guessed")])
        .send()
        .unwrap();
    assert_eq!(forged.status(), 403);
    assert!(forged.text().unwrap().contains("CSRF token"));
    let no_session = client
        .post(format!(
            "{}/ui/backends/default/default/force-unlock",
            server.url
        ))
        .form(&[("csrf", "guessed")])
        .send()
        .unwrap();
    assert_eq!(no_session.status(), 403);
    // Still locked: a second locker is refused.
    assert_eq!(
        send("LOCK", &url, Some(&lock_info("other", "bob@ci"))).status,
        423
    );
}

#[test]
fn installed_guests_are_listed_for_admins() {
    let dir = tempdir();
    let config = dir.path().join("wasmstate.toml");
    std::fs::write(
        &config,
        "data_dir = \"data\"\n[marketplace]\nallow_unsigned = true\n[backends.default]\nguest = \"local\"\n",
    )
    .unwrap();
    let (ok, out) = wasmstate(&[
        "guest",
        "install",
        ETCD_GUEST_WASM,
        "--config",
        config.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    let server = Server::with_config_file(&dir.path().join("data"), &config);
    // No users: everyone is an admin on loopback, and may see them.
    let listed = send("GET", &format!("{}/ui/api/guests", server.url), None).json();
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|g| g["name"].as_str())
        .collect();
    assert_eq!(names, ["etcd"], "{listed}");
    assert_eq!(listed[0]["signed_by"], serde_json::Value::Null);
}

/// A console session on a server without users (signing in is automatic).
pub(crate) struct ConsoleSession {
    /// A client that does not follow redirects.
    pub client: reqwest::blocking::Client,
    base: String,
    /// The session's cookie, `name=value`.
    pub cookie: String,
    csrf: String,
    workspace: String,
}

impl ConsoleSession {
    /// Sign in (automatic without users).
    pub fn open(server: &Server) -> ConsoleSession {
        ConsoleSession::signed_in(server, None, |client, login| client.get(login))
    }

    /// The session whose cookie the answer to `login` sets (answered
    /// `status`, when given), asked with a client that does not follow
    /// redirects.
    fn signed_in(
        server: &Server,
        status: Option<u16>,
        login: impl FnOnce(&reqwest::blocking::Client, String) -> reqwest::blocking::RequestBuilder,
    ) -> ConsoleSession {
        let client = reqwest::blocking::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let answer = login(&client, format!("{}/ui/login", server.url))
            .send()
            .unwrap();
        if let Some(status) = status {
            assert_eq!(
                answer.status(),
                status,
                "sign-in refused: {:?}",
                answer.text()
            );
        }
        let status = answer.status();
        let cookie = answer
            .headers()
            .get("set-cookie")
            .unwrap_or_else(|| panic!("no session cookie in the {status} answer to the login"))
            .to_str()
            .unwrap();
        ConsoleSession {
            cookie: cookie.split(';').next().unwrap().to_string(),
            client,
            base: server.url.clone(),
            csrf: String::new(),
            workspace: String::new(),
        }
    }

    /// Sign in as `user` with `password` through the login form.
    pub fn sign_in(server: &Server, user: &str, password: &str) -> ConsoleSession {
        ConsoleSession::signed_in(server, Some(303), |client, login| {
            client
                .post(login)
                .form(&[("user", user), ("password", password)])
        })
    }

    /// Ready to act on `workspace` of backend `default`, with the CSRF token
    /// its page carries.
    pub fn for_workspace(mut self, workspace: &str) -> ConsoleSession {
        let page = self
            .client
            .get(format!("{}/ui/backends/default/{workspace}", self.base))
            .header("cookie", &self.cookie)
            .send()
            .unwrap()
            .text()
            .unwrap();
        let marker = "name=\"csrf\" value=\"";
        let start = page.find(marker).expect("a form with the CSRF token") + marker.len();
        self.csrf = page[start..].split('"').next().unwrap().to_string();
        self.workspace = workspace.into();
        self
    }

    /// Force-unlock the workspace through the console's form: its status.
    pub fn force_unlock(&self) -> u16 {
        self.client
            .post(format!(
                "{}/ui/backends/default/{}/force-unlock",
                self.base, self.workspace
            ))
            .header("cookie", &self.cookie)
            .form(&[("csrf", self.csrf.as_str())])
            .send()
            .unwrap()
            .status()
            .as_u16()
    }

    /// Restore version `id` through the console's form: (status, page).
    pub fn restore(&self, id: &str) -> (u16, String) {
        let answer = self
            .client
            .post(format!(
                "{}/ui/backends/default/{}/restore",
                self.base, self.workspace
            ))
            .header("cookie", &self.cookie)
            .form(&[("csrf", self.csrf.as_str()), ("version", id)])
            .send()
            .unwrap();
        (answer.status().as_u16(), answer.text().unwrap())
    }
}
