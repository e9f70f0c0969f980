//! A hostile guest (`tests/fixtures/hostile`) attacks its sandbox, one
//! attack per backend, whenever a request names the workspace `attack`.
//! Each attack must be contained: the request fails with a clear 5xx (the
//! guest's own report says what stopped it), nothing outside the sandbox is
//! read or touched (a secret file beside the granted directories, canary
//! HTTP listeners, a git repository that was not granted), the same backend
//! answers its next request normally, and a healthy `local` backend on the
//! same server keeps round-tripping states. Plain traps, endless loops and
//! memory exhaustion are covered in `sandbox.rs`.

use crate::common::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The fixture guest that attacks its sandbox on demand.
pub const HOSTILE_WASM: &str = env!("WASMSTATE_FIXTURE_HOSTILE");

/// Every attack the fixture knows; each is also the name of its backend.
const ATTACKS: [&str; 13] = [
    "recursion",
    "trap-mid-write",
    "http-ungranted",
    "http-metadata",
    "http-forged-host",
    "http-relative",
    "fs-dotdot",
    "fs-absolute",
    "fs-symlink",
    "giant-state",
    "giant-error",
    "log-flood",
    "git-ungranted",
];

/// The content of the secret file beside the granted directories. Distinct
/// from its name, which the guest's error messages may quote.
const SECRET: &str = "hostile-suite: the launch codes are 0000";
/// Every line the log-flood attack writes starts with this.
const FLOOD_MARKER: &str = "hostile-flood-line";
/// The host's cap on guest log lines per request (`MAX_LOG_LINES`).
const MAX_GUEST_LOG_LINES: usize = 64;
/// The memory limit of most hostile backends.
const MEMORY_MIB: u64 = 32;
/// The line the log-forge attack tries to slip into the host's log.
const FORGED: &str = "INFO wasmstate::server: FORGED-BY-A-GUEST";

/// A server with a healthy `local` backend and one backend per attack, and
/// everything the attacks aim at. Fields drop in order: the server first,
/// the temporary directory last.
struct Hostile {
    server: Server,
    /// The one origin the HTTP backends are granted (`allow_http`).
    granted: Canary,
    /// An origin nobody was granted: the ungranted and forged-Host target.
    ungranted: Canary,
    /// A bare repository the git backend names but was not granted.
    ungranted_repo: PathBuf,
    /// The repository git-escalate is granted (only its `state` branch,
    /// lock refs and `*.tfstate` files).
    escalate_repo: PathBuf,
    /// The trap-mid-write backend's own directory.
    trap_dir: PathBuf,
    /// The secret file, beside (outside) every granted directory.
    secret: PathBuf,
    /// The server's data directory.
    data: PathBuf,
    /// Last serial the healthy backend's `ws` workspace holds.
    serial: AtomicU64,
    root: tempfile::TempDir,
}

/// One `[backends.NAME]` table on the hostile guest, attacking `attack`.
fn backend(attack: &str, settings: &str, config: &str) -> String {
    format!(
        "\n[backends.{attack}]\nguest = {HOSTILE_WASM:?}\n{settings}\n\
         [backends.{attack}.config]\nattack = {attack:?}\n{config}\n"
    )
}

impl Hostile {
    fn start() -> Hostile {
        let root = tempdir();
        let base = root.path();
        let granted = Canary::start();
        let ungranted = Canary::start();
        let secret = base.join("secret.txt");
        std::fs::write(&secret, SECRET).unwrap();
        let data_dir = |attack: &str| base.join(format!("data-{attack}"));
        // `link`, inside fs-symlink's granted directory, points at the
        // folder holding the secret.
        std::fs::create_dir_all(data_dir("fs-symlink")).unwrap();
        std::os::unix::fs::symlink(base, data_dir("fs-symlink").join("link")).unwrap();
        // A FIFO (and a link to it) in fs-special's directory, as another
        // program could leave one there: a guest cannot make one.
        let special = data_dir("fs-special");
        std::fs::create_dir_all(&special).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(special.join("fifo"))
            .status();
        assert!(made.unwrap().success(), "mkfifo in {}", special.display());
        std::os::unix::fs::symlink("fifo", special.join("link")).unwrap();
        let repos = base.join("repos");
        std::fs::create_dir_all(&repos).unwrap();
        let granted_repo = bare_repo(&repos, "granted");
        let ungranted_repo = bare_repo(&repos, "ungranted");
        let escalate_repo = bare_repo(&repos, "escalate");

        let limits =
            |timeout_ms: u64| format!("memory_mib = {MEMORY_MIB}\ntimeout_ms = {timeout_ms}");
        let http = |timeout_ms: u64| {
            format!(
                "{}\nallow_http = [{:?}]",
                limits(timeout_ms),
                granted.origin()
            )
        };
        let fs = |attack: &str| format!("{}\ndir = {:?}", limits(2000), data_dir(attack));
        let trap_dir = data_dir("trap-mid-write");
        let steal = format!("{}/steal", ungranted.origin());
        let forged = format!("{}/forged", ungranted.origin());
        let granted_authority = granted.addr.to_string();
        let secret_path = secret.display().to_string();
        let granted_repo = granted_repo.display().to_string();
        let ungranted_path = ungranted_repo.display().to_string();
        let escalate_path = escalate_repo.display().to_string();
        // A name granted by origin that resolves (through /etc/hosts, the
        // host's own resolver) to a loopback address nobody granted.
        let by_name = format!("http://localhost:{}", ungranted.addr.port());
        let mut config = String::from("[backends.healthy]\nguest = \"local\"\n");
        for table in [
            backend("recursion", &limits(2000), ""),
            backend(
                "trap-mid-write",
                &format!("{}\ndir = {trap_dir:?}", limits(2000)),
                "",
            ),
            backend(
                "http-ungranted",
                &http(5000),
                &format!("target = {steal:?}"),
            ),
            backend("http-metadata", &http(5000), ""),
            backend(
                "http-forged-host",
                &http(5000),
                &format!("target = {forged:?}\nhost = {granted_authority:?}"),
            ),
            // If a relative request were resolved against the wasmstate
            // server itself, it would fetch the healthy backend's state.
            backend(
                "http-relative",
                &http(5000),
                "target = \"/states/healthy/precious\"",
            ),
            backend("fs-dotdot", &fs("fs-dotdot"), ""),
            backend(
                "fs-absolute",
                &fs("fs-absolute"),
                &format!("target = {secret_path:?}"),
            ),
            backend("fs-symlink", &fs("fs-symlink"), ""),
            // With a disk quota: its opens are made under the quota's lock.
            backend(
                "fs-special",
                &format!("{}\ndisk_quota_mib = 8", fs("fs-special")),
                "",
            ),
            backend("giant-state", &limits(5000), ""),
            // Enough memory to build the 64 MiB message, so the host (not
            // the memory limit) has to bound what reaches the client.
            backend("giant-error", "memory_mib = 160\ntimeout_ms = 10000", ""),
            // A million host calls take a few seconds; the deadline stays
            // under the harness's 60 s client timeout.
            backend("log-flood", &limits(30_000), ""),
            backend(
                "git-ungranted",
                &format!("{}\nallow_git = [{granted_repo:?}]", limits(5000)),
                &format!("target = {ungranted_path:?}"),
            ),
            backend(
                "http-granted-name",
                &format!("{}\nallow_http = [{by_name:?}]", limits(5000)),
                &format!("target = \"{by_name}/steal\""),
            ),
            backend(
                "git-escalate",
                &format!(
                    "{}\nallow_git = [{escalate_path:?}]\n\
                     git_refs = [\"refs/heads/state\", \"refs/heads/locks/**\"]\n\
                     git_paths = [\"*.tfstate\"]",
                    limits(10_000)
                ),
                &format!("target = {escalate_path:?}"),
            ),
            backend("log-forge", &limits(2000), &format!("target = {FORGED:?}")),
        ] {
            config.push_str(&table);
        }
        let data = base.join("server");
        let server = Server::with_config(&data, &config);
        let hostile = Hostile {
            server,
            granted,
            ungranted,
            ungranted_repo,
            escalate_repo,
            trap_dir,
            secret,
            data,
            serial: AtomicU64::new(0),
            root,
        };
        // A state written before any attack, checked after them.
        let precious = hostile.server.state_url("healthy", "precious");
        let answer = send("POST", &precious, Some(&state(1)));
        assert_eq!(answer.status, 200, "precious state: {}", answer.text());
        hostile
    }

    /// Run `attack` once: a write for trap-mid-write, a read otherwise.
    fn attack(&self, attack: &str) -> Answer {
        let url = self.server.state_url(attack, "attack");
        if attack == "trap-mid-write" {
            send("POST", &url, Some(&state(1)))
        } else {
            send("GET", &url, None)
        }
    }

    /// The attack failed with a 5xx that leaks nothing, the same backend
    /// answers its next request, and the healthy backend round-trips.
    fn assert_contained(&self, attack: &str, answer: &Answer) {
        let text = answer.text();
        assert!(
            (500..600).contains(&answer.status),
            "{attack}: expected a 5xx, got {}: {}",
            answer.status,
            short(&text)
        );
        assert_leaks_nothing(attack, answer);
        self.next_request_works(attack);
        self.healthy_round_trip();
    }

    /// The backend serves workspace `ok` normally after an attack.
    fn next_request_works(&self, attack: &str) {
        let url = self.server.state_url(attack, "ok");
        let read = send("GET", &url, None);
        assert_eq!(
            read.status,
            404,
            "{attack}: GET after the attack: {}",
            short(&read.text())
        );
        assert!(
            read.text().contains("no state yet"),
            "{attack}: {}",
            read.text()
        );
        let write = send("POST", &url, Some(&state(1)));
        assert_eq!(
            write.status,
            200,
            "{attack}: POST after the attack: {}",
            short(&write.text())
        );
    }

    /// Write the next serial to the healthy backend and read it back.
    fn healthy_round_trip(&self) {
        let serial = self.serial.fetch_add(1, Ordering::SeqCst) + 1;
        let url = self.server.state_url("healthy", "ws");
        let write = send("POST", &url, Some(&state(serial)));
        assert_eq!(write.status, 200, "healthy write: {}", write.text());
        assert_eq!(
            send("GET", &url, None).body,
            state(serial),
            "healthy read of serial {serial}"
        );
    }

    /// The state written before the attacks is still there, byte for byte.
    fn assert_precious_intact(&self) {
        let answer = send("GET", &self.server.state_url("healthy", "precious"), None);
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.body, state(1), "the healthy backend's state changed");
    }

    /// Neither canary listener was ever contacted.
    fn assert_canaries_untouched(&self) {
        assert_eq!(
            self.ungranted.connections(),
            0,
            "the ungranted origin was contacted"
        );
        assert_eq!(
            self.granted.connections(),
            0,
            "the granted origin was contacted, though no attack targets it"
        );
    }

    fn log_bytes(&self) -> u64 {
        std::fs::metadata(&self.server.log).map_or(0, |m| m.len())
    }
}

/// No answer may carry the secret, a canary's answer, /etc/passwd or a
/// report of an escape.
fn assert_leaks_nothing(attack: &str, answer: &Answer) {
    let text = answer.text();
    for (leak, what) in [
        (SECRET, "the secret file's content"),
        (CANARY, "a canary listener's answer"),
        ("root:x:0:0", "/etc/passwd"),
        ("escaped:", "an escape the guest reported"),
    ] {
        assert!(
            !text.contains(leak),
            "{attack}: the answer carries {what}: {}",
            short(&text)
        );
    }
}

/// At most 2000 characters of `text`, for assertion messages.
fn short(text: &str) -> String {
    const MAX: usize = 2000;
    if text.len() <= MAX {
        return text.to_string();
    }
    let mut end = MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &text[..end], text.len())
}

/// Names of the entries directly in `dir`.
fn listing(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn crashing_guests_are_contained_and_leave_other_state_untouched() {
    let fx = Hostile::start();
    for round in 1..=2 {
        // Unbounded recursion overflows the wasm stack: a trap, not a
        // crashed server.
        let answer = fx.attack("recursion");
        assert_eq!(
            answer.status,
            500,
            "round {round}: {}",
            short(&answer.text())
        );
        assert!(
            answer
                .text()
                .contains("backend \"recursion\": guest crashed"),
            "round {round}: {}",
            short(&answer.text())
        );
        fx.assert_contained("recursion", &answer);

        // A panic halfway through a write: the half-written file stays in
        // the guest's own directory, the healthy backend's state is intact.
        let answer = fx.attack("trap-mid-write");
        assert_eq!(
            answer.status,
            500,
            "round {round}: {}",
            short(&answer.text())
        );
        assert!(
            answer.text().contains("fixture: trap mid-write"),
            "round {round}: {}",
            short(&answer.text())
        );
        fx.assert_contained("trap-mid-write", &answer);
        let attempted = state(1);
        let half = std::fs::read(fx.trap_dir.join("attack.tfstate"))
            .expect("the attack should have half-written its own state file");
        assert_eq!(half, attempted[..attempted.len() / 2], "round {round}");
        fx.assert_precious_intact();

        // A state far past the memory limit cannot be built: the guest
        // reports how far it got, or is stopped at the limit.
        let answer = fx.attack("giant-state");
        let text = answer.text();
        assert_eq!(answer.status, 500, "round {round}: {}", short(&text));
        match text.split("stopped growing at ").nth(1) {
            Some(rest) => {
                let grown: u64 = rest
                    .split(' ')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("no size in: {}", short(&text)));
                assert!(
                    grown < MEMORY_MIB << 20,
                    "round {round}: the state grew to {grown} bytes, past the {MEMORY_MIB} MiB limit"
                );
            }
            None => assert!(
                text.contains(&format!("exceeded its memory limit of {MEMORY_MIB} MiB")),
                "round {round}: {}",
                short(&text)
            ),
        }
        assert!(
            answer.body.len() < 64 << 10,
            "round {round}: a {} byte answer",
            answer.body.len()
        );
        fx.assert_contained("giant-state", &answer);
    }
    assert!(fx.server.log_text().contains("guest crashed"));
    fx.assert_precious_intact();
}

/// A FIFO another program left in a guest's directory: no open of it,
/// whatever its flags, and no change of its times through a link, waits
/// for the FIFO's other end. (A guest's file calls run on a host worker,
/// where no deadline reaches: a call that waited would hold the worker
/// for good, and the attack would end in a 504 instead of this report.)
#[test]
fn no_call_on_a_fifo_waits_whatever_its_flags() {
    let fx = Hostile::start();
    for round in 1..=2 {
        let answer = fx.attack("fs-special");
        let text = answer.text();
        for what in [
            "read fifo",
            "write fifo",
            "truncate fifo",
            "create fifo",
            "read link",
            "set times via link",
        ] {
            assert!(
                text.contains(&format!("{what}: unsupported")),
                "round {round}: {what}: {}",
                short(&text)
            );
        }
        fx.assert_contained("fs-special", &answer);
    }
}

mod reach;
