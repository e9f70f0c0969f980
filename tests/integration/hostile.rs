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

#[test]
fn outbound_http_reaches_only_origins_granted_by_uri() {
    let fx = Hostile::start();
    for round in 1..=2 {
        for (attack, expected) in [
            // The SDK's client reports the host's refusal.
            ("http-ungranted", "the host refused the request"),
            ("http-metadata", "the host refused the request"),
            // Raw wasi:http: the guest lists what each attempt met.
            ("http-forged-host", "blocked:"),
            ("http-relative", "blocked:"),
        ] {
            let answer = fx.attack(attack);
            let text = answer.text();
            assert!(
                text.contains(expected),
                "round {round}: {attack}: expected {expected:?} in {}",
                short(&text)
            );
            fx.assert_contained(attack, &answer);
        }
    }
    let log = fx.server.log_text();
    let ungranted = fx.ungranted.origin();
    // The refusals were the policy's, judged on the URI: the forged Host
    // header (naming the granted origin) did not open the ungranted one.
    for refused in [
        format!("refused outbound request to {ungranted}/steal"),
        format!("refused outbound request to {ungranted}/forged"),
        "refused outbound request to http://169.254.169.254/latest/meta-data/".to_string(),
    ] {
        assert!(log.contains(&refused), "no {refused:?} in the log:\n{log}");
    }
    assert!(log.contains("link-local/metadata"), "{log}");
    fx.assert_canaries_untouched();
    fx.assert_precious_intact();
}

#[test]
fn files_outside_the_granted_directory_are_out_of_reach() {
    let fx = Hostile::start();
    let before = listing(fx.root.path());
    for round in 1..=2 {
        for attack in ["fs-dotdot", "fs-absolute", "fs-symlink"] {
            let answer = fx.attack(attack);
            let text = answer.text();
            // The guest got no bytes from any path it tried.
            assert!(
                text.contains("blocked:"),
                "round {round}: {attack}: {}",
                short(&text)
            );
            fx.assert_contained(attack, &answer);
        }
    }
    assert_eq!(std::fs::read_to_string(&fx.secret).unwrap(), SECRET);
    assert_eq!(
        listing(fx.root.path()),
        before,
        "files appeared or vanished beside the granted directories"
    );
    // The guest's own `..` symlink does not survive it either way.
    assert!(
        std::fs::symlink_metadata(fx.root.path().join("data-fs-symlink/escape")).is_err(),
        "the guest left a symlink to `..` behind"
    );
}

#[test]
fn a_git_repository_that_was_not_granted_stays_untouched() {
    let fx = Hostile::start();
    for round in 1..=2 {
        let answer = fx.attack("git-ungranted");
        let text = answer.text();
        assert!(
            text.contains("blocked:") && text.contains("not granted"),
            "round {round}: {}",
            short(&text)
        );
        fx.assert_contained("git-ungranted", &answer);
    }
    assert_eq!(
        git(&fx.ungranted_repo, &["for-each-ref"]).trim(),
        "",
        "the repository that was not granted has refs"
    );
    // The host made no clone of it (nor of anything: no backend here
    // used git legitimately).
    let clones = fx.data.join("git");
    if clones.exists() {
        // (`.owner` is the host's claim on the directory, not a clone.)
        let cloned: Vec<_> = listing(&clones)
            .into_iter()
            .filter(|name| name.ends_with(".git"))
            .collect();
        assert!(cloned.is_empty(), "the host cloned {cloned:?}");
    }
    assert!(
        fx.server
            .log_text()
            .contains("git call refused: repository not granted"),
        "{}",
        fx.server.log_text()
    );
}

#[test]
fn a_granted_name_resolving_to_an_ungranted_address_is_not_reached() {
    let fx = Hostile::start();
    for round in 1..=2 {
        let answer = fx.attack("http-granted-name");
        let text = answer.text();
        assert!(
            text.contains("the host refused the request"),
            "round {round}: {}",
            short(&text)
        );
        fx.assert_contained("http-granted-name", &answer);
    }
    // Refused on the address the name resolved to, before connecting.
    let log = fx.server.log_text();
    let port = fx.ungranted.addr.port();
    assert!(
        log.contains(&format!("refused outbound request to localhost:{port}"))
            && log.contains("an internal address nobody granted"),
        "{log}"
    );
    fx.assert_canaries_untouched();
}

#[test]
fn the_git_capability_moves_only_granted_refs_forward_and_touches_only_granted_paths() {
    let fx = Hostile::start();
    let answer = fx.attack("git-escalate");
    let text = answer.text();
    for refused in [
        "push main: ",
        "push a tag: ",
        "commit a workflow file: ",
        "non-fast-forward push: ",
        "push with a stale expected value: ",
    ] {
        assert!(
            text.contains(refused),
            "{refused:?} missing: {}",
            short(&text)
        );
    }
    assert!(text.contains("is not granted to this backend"), "{text}");
    assert!(text.contains("a ref only moves forward"), "{text}");
    fx.assert_contained("git-escalate", &answer);
    // The remote holds exactly the legitimate work: one branch, two
    // commits, only the state file.
    let repo = &fx.escalate_repo;
    assert_eq!(
        git(repo, &["for-each-ref", "--format=%(refname)"]).trim(),
        "refs/heads/state"
    );
    assert_eq!(
        git(repo, &["log", "--format=%s", "refs/heads/state"]).trim(),
        "next\nstate"
    );
    assert_eq!(
        git(repo, &["ls-tree", "-r", "--name-only", "refs/heads/state"]).trim(),
        "prod.tfstate"
    );
}

#[test]
fn a_guest_cannot_forge_lines_of_the_hosts_log() {
    let fx = Hostile::start();
    let answer = fx.attack("log-forge");
    assert_eq!(answer.status, 500, "{}", short(&answer.text()));
    assert_eq!(
        answer.text().trim_end().lines().count(),
        1,
        "the error answer is not one line: {:?}",
        answer.text()
    );
    fx.assert_contained("log-forge", &answer);
    // The guest's log line and its error both reached the log, escaped.
    let escaped = format!("innocent\\n{FORGED}");
    wait_until("the escaped lines", Duration::from_secs(10), || {
        fx.server.log_text().matches(&escaped).count() >= 2
    });
    let log = fx.server.log_text();
    let forged: Vec<&str> = log
        .lines()
        .filter(|l| l.trim_start().starts_with(FORGED))
        .collect();
    assert!(forged.is_empty(), "forged log lines: {forged:?}");
}

#[test]
fn a_log_flood_is_capped_per_request() {
    let fx = Hostile::start();
    let before = fx.log_bytes();
    let answer = fx.attack("log-flood");
    // The guest ends with "no state" (404); stopped at its deadline (504)
    // it is contained all the same.
    assert!(
        matches!(answer.status, 404 | 504),
        "{}: {}",
        answer.status,
        short(&answer.text())
    );
    assert_leaks_nothing("log-flood", &answer);
    wait_until(
        "the guest log-limit notice",
        Duration::from_secs(10),
        || fx.server.log_text().contains("log limit"),
    );
    let log = fx.server.log_text();
    let lines = log.lines().filter(|l| l.contains(FLOOD_MARKER)).count();
    assert!(
        (1..=MAX_GUEST_LOG_LINES).contains(&lines),
        "{lines} of the guest's 1,000,000 lines reached the log (cap: {MAX_GUEST_LOG_LINES})"
    );
    // 1,000,000 lines of 1 KiB would be 1 GiB; 64 of them are 64 KiB.
    let grown = fx.log_bytes() - before;
    assert!(grown < 4 << 20, "the log grew by {grown} bytes");
    fx.next_request_works("log-flood");
    fx.healthy_round_trip();
}

#[test]
fn a_giant_error_message_reaches_the_client_bounded() {
    let fx = Hostile::start();
    let log_before = fx.log_bytes();
    let answer = fx.attack("giant-error");
    assert_eq!(answer.status, 500, "{}", short(&answer.text()));
    // The guest's message is 64 MiB; the host must cut it before it
    // reaches the client (and the log).
    assert!(
        answer.body.len() < 1 << 20,
        "the error answer is {} bytes: the host passed the guest's 64 MiB message through",
        answer.body.len()
    );
    let logged = fx.log_bytes() - log_before;
    assert!(
        logged < 4 << 20,
        "the log grew by {logged} bytes: the host logged the guest's 64 MiB message"
    );
    fx.assert_contained("giant-error", &answer);
}

#[test]
fn server_memory_stays_bounded_across_repeated_attacks() {
    let fx = Hostile::start();
    fx.healthy_round_trip();
    let before = rss_kib(fx.server.pid());
    for _ in 0..2 {
        for attack in ATTACKS {
            let answer = fx.attack(attack);
            assert_leaks_nothing(attack, &answer);
        }
    }
    fx.healthy_round_trip();
    let after = rss_kib(fx.server.pid());
    // Generous on purpose: the giant error is copied a few times on its way
    // out, freed memory stays in the allocator's per-thread arenas, and each
    // instance slot of the pool keeps up to 1 MiB resident. What it catches
    // is a leak per request: 26 attacks holding on to their 32-160 MiB
    // instances, a giant error or the log flood's 1 GiB of lines, would be
    // far past it.
    let grown_mib = after.saturating_sub(before) / 1024;
    assert!(
        grown_mib < 256,
        "the server's RSS grew by {grown_mib} MiB ({before} KiB -> {after} KiB) over two rounds of attacks"
    );
    fx.assert_canaries_untouched();
    fx.assert_precious_intact();
    assert_eq!(git(&fx.ungranted_repo, &["for-each-ref"]).trim(), "");
    assert_eq!(std::fs::read_to_string(&fx.secret).unwrap(), SECRET);
}
