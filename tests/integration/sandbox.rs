//! Guests that trap, loop forever or exhaust memory are contained: each
//! request fails with a clear 5xx within its limits, the same backend keeps
//! answering the next request, and a healthy backend on the same server is
//! unaffected.

use crate::common::*;
use std::time::{Duration, Instant};

const SPIN_TIMEOUT_MS: u64 = 1500;

fn server(dir: &std::path::Path) -> Server {
    Server::with_config(
        dir,
        &format!(
            r#"
            [backends.healthy]
            guest = "local"

            [backends.trap]
            guest = "{wasm}"
            config = {{ mode = "trap" }}

            [backends.spin]
            guest = "{wasm}"
            timeout_ms = {SPIN_TIMEOUT_MS}
            config = {{ mode = "loop" }}

            [backends.swallow]
            guest = "{wasm}"
            config = {{ mode = "swallow" }}

            [backends.hog]
            guest = "{wasm}"
            memory_mib = 32
            config = {{ mode = "oom" }}
            "#,
            wasm = MISBEHAVE_WASM
        ),
    )
}

fn healthy_round_trip(server: &Server, serial: u64) {
    let url = server.state_url("healthy", "ws");
    assert_eq!(send("POST", &url, Some(&state(serial))).status, 200);
    assert_eq!(send("GET", &url, None).body, state(serial));
}

#[test]
fn a_trapping_guest_gets_a_500_naming_its_panic() {
    let dir = tempdir();
    let server = server(dir.path());
    for attempt in 0..2 {
        let answer = send("GET", &server.state_url("trap", "ws"), None);
        assert_eq!(answer.status, 500, "attempt {attempt}: {}", answer.text());
        let text = answer.text();
        assert!(text.contains("backend \"trap\": guest crashed"), "{text}");
        assert!(text.contains("fixture: deliberate trap"), "{text}");
        healthy_round_trip(&server, attempt + 1);
    }
}

#[test]
fn a_guest_answering_success_after_a_failed_copy_is_not_believed() {
    // The state goes to the guest's stderr, which takes 16 KiB: the copy
    // fails half-way, the guest says "written", the host says 500.
    let dir = tempdir();
    let server = server(dir.path());
    let mut big = state(1);
    big.truncate(big.len() - 1);
    big.extend_from_slice(format!(r#","pad":"{}"}}"#, "x".repeat(64 << 10)).as_bytes());
    let answer = send("POST", &server.state_url("swallow", "ws"), Some(&big));
    assert_eq!(answer.status, 500, "{}", answer.text());
    assert!(
        answer
            .text()
            .contains("after the host's copy of the state failed"),
        "{}",
        answer.text()
    );
    healthy_round_trip(&server, 1);
}

#[test]
fn an_endless_loop_is_stopped_at_the_deadline() {
    let dir = tempdir();
    let server = server(dir.path());
    let url = server.state_url("spin", "ws");
    let spinning = std::thread::spawn(move || {
        let started = Instant::now();
        (send("GET", &url, None), started.elapsed())
    });
    // While one instance spins, the healthy backend answers.
    for serial in 1..=5 {
        healthy_round_trip(&server, serial);
    }
    assert!(
        !spinning.is_finished(),
        "the healthy requests should have finished while the guest was still spinning"
    );
    let (answer, elapsed) = spinning.join().unwrap();
    assert_eq!(answer.status, 504, "{}", answer.text());
    assert!(
        answer
            .text()
            .contains(&format!("time limit of {SPIN_TIMEOUT_MS} ms")),
        "{}",
        answer.text()
    );
    assert!(
        elapsed >= Duration::from_millis(SPIN_TIMEOUT_MS) && elapsed < Duration::from_secs(10),
        "stopped after {elapsed:?}"
    );
    // The backend serves the next request the same way (no poisoned state).
    assert_eq!(
        send(
            "LOCK",
            &server.state_url("spin", "ws"),
            Some(&lock_info("x", "y"))
        )
        .status,
        504
    );
    healthy_round_trip(&server, 6);
}

#[test]
fn memory_exhaustion_is_stopped_at_the_limit() {
    let dir = tempdir();
    let server = server(dir.path());
    for attempt in 0..2 {
        let answer = send("POST", &server.state_url("hog", "ws"), Some(&state(1)));
        assert_eq!(answer.status, 500, "{}", answer.text());
        assert!(
            answer
                .text()
                .contains("exceeded its memory limit of 32 MiB"),
            "{}",
            answer.text()
        );
        healthy_round_trip(&server, attempt + 1);
    }
}

#[test]
fn a_guest_cannot_see_outside_its_granted_directory() {
    // The local guest writes under /data only; a workspace name cannot
    // escape it, and files beside the data directory stay untouched.
    let dir = tempdir();
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "untouched").unwrap();
    let server = server(dir.path());
    // (`..` itself is covered in protocol.rs: HTTP clients normalise it away.)
    for name in ["..%2Fsecret.txt", "..%5Csecret.txt"] {
        let answer = send("POST", &server.state_url("healthy", name), Some(&state(1)));
        assert_eq!(answer.status, 400, "{name}: {}", answer.text());
    }
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "untouched");
}

#[test]
fn a_flood_to_one_backend_leaves_instance_slots_for_the_others() {
    // 4 slots in all; the spinning backend may hold 3 of them (its default
    // share), so the healthy one always finds a free slot. (With the
    // spinning backend allowed all 4, this fails: checked by hand.)
    let dir = tempdir();
    let server = Server::with_config(
        dir.path(),
        &format!(
            "max_instances = 4\n[backends.healthy]\nguest = \"local\"\n[backends.spin]\nguest = \"{MISBEHAVE_WASM}\"\ntimeout_ms = 3000\nconfig = {{ mode = \"loop\" }}\n"
        ),
    );
    let finished = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let spinners: Vec<_> = (0..6)
        .map(|_| {
            let url = server.state_url("spin", "ws");
            let finished = finished.clone();
            std::thread::spawn(move || {
                let answer = send("GET", &url, None);
                finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                answer.status
            })
        })
        .collect();
    wait_until(
        "six spinning requests in flight",
        Duration::from_secs(30),
        || server.metric("wasmstate_requests_in_flight") >= 7.0,
    );
    healthy_round_trip(&server, 1);
    assert_eq!(
        finished.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the healthy backend had to wait for the flooding one to give a slot back"
    );
    for spinner in spinners {
        assert_eq!(spinner.join().unwrap(), 504);
    }
}

/// A FIFO left where a state should be (by an operator or another
/// program: a guest cannot make one) is refused at once, not waited on.
/// A guest's file calls run inline on a worker thread, where no deadline
/// reaches them, so opening it would hold that worker until a writer came;
/// more such requests than workers would stall the whole server.
#[test]
fn a_fifo_in_a_backends_directory_is_refused_not_waited_on() {
    let root = tempdir();
    let dir = root.path().join("granted");
    // `q` has a disk quota: its opens are made under the quota's lock
    // (with a look at the path where a size may change), and refuse the
    // same.
    let quoted = root.path().join("quoted");
    let server = Server::with_config(
        &root.path().join("data"),
        &format!(
            "[backends.b]\nguest = \"local\"\ndir = {dir:?}\ntimeout_ms = 120000\n\
             [backends.q]\nguest = \"local\"\ndir = {quoted:?}\ndisk_quota_mib = 8\ntimeout_ms = 120000\n"
        ),
    );
    for granted in [&dir, &quoted] {
        std::fs::create_dir_all(granted.join("ws")).unwrap();
        let fifo = granted.join("ws").join("terraform.tfstate");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success(), "mkfifo {}", fifo.display());
    }
    // More readers than the server has workers: each would block one.
    let readers: Vec<_> = (0..6)
        .map(|i| {
            let url = server.state_url(["b", "q"][i % 2], "ws");
            std::thread::spawn(move || send("GET", &url, None))
        })
        .collect();
    for reader in readers {
        let answer = reader.join().unwrap();
        assert_eq!(answer.status, 500, "{}", answer.text());
        assert!(answer.text().contains("reading state"), "{}", answer.text());
    }
    let other = server.state_url("b", "other");
    assert_eq!(send("POST", &other, Some(&state(1))).status, 200);
    assert_eq!(send("GET", &other, None).body, state(1));

    // A FIFO where a write's marker goes, older than a marker left by a
    // killed writer: the create-new open cannot open it (it exists), and
    // the writer breaks it as stale and writes instead of waiting on it.
    std::fs::create_dir_all(dir.join("marked")).unwrap();
    let marker = dir.join("marked").join(".terraform.tfstate.writing");
    let made = std::process::Command::new("mkfifo").arg(&marker).status();
    assert!(made.unwrap().success(), "mkfifo {}", marker.display());
    let hour_ago = rustix::fs::Timespec {
        tv_sec: (std::time::SystemTime::now() - std::time::Duration::from_secs(3600))
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64,
        tv_nsec: 0,
    };
    let times = rustix::fs::Timestamps {
        last_access: hour_ago,
        last_modification: hour_ago,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        &marker,
        &times,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
    let marked = server.state_url("b", "marked");
    assert_eq!(send("POST", &marked, Some(&state(1))).status, 200);
    assert_eq!(send("GET", &marked, None).body, state(1));
    assert!(!marker.exists(), "the stale FIFO marker was broken");
    assert!(
        !dir.join("marked")
            .join(".terraform.tfstate.writing.break")
            .exists(),
        "the breaker's own marker is gone"
    );
}
