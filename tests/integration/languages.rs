//! Guests in any language, from nothing: `wasmstate guest new NAME --lang
//! rust|python|js` writes a template; the real toolchains build it
//! (cargo for wasm32-wasip2, componentize-py 0.25.1 from PyPI,
//! componentize-js 0.23.0 from npm, each installed and version-checked by
//! the harness); the conformance kit passes unchanged (every case, with a
//! state larger than the 64 MiB the manifests ask for, and contract
//! 0.3.0's head, conditional writes and metadata kept in the guest's own
//! directory); the embedded manifest is read back; a real `terraform
//! apply` is served through it; unlocked racers on two replicas get one
//! 200 and one 409; a 256 MiB state goes both ways at `memory_mib = 64`;
//! and a crash says why.

mod build;
mod procs;
mod races;
mod stale;

use crate::common::*;
use build::{build_template, built, edit_file, must, template};
use procs::{compiler_children, idle_rss_mib};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Contract 0.3.0's kit cases a template must pass for real: not skipped
/// (built for 0.3.0), metadata kept in its own storage (no note).
const CONTRACT_0_3_0_CASES: [&str; 4] = [
    "head agrees with read",
    "parallel conditional writers from one version: exactly one wins",
    "workspace metadata round-trips and is replaced only as expected",
    "deleting a workspace removes its metadata",
];

/// The kit on `wasm` must run and pass every case, contract 0.3.0's
/// included; its report.
fn passes_the_kit(wasm: &Path) -> String {
    let (ok, out) = wasmstate(&["guest", "test", wasm.to_str().unwrap()]);
    assert!(ok, "{out}");
    let passed = out.lines().filter(|l| l.starts_with("PASS  ")).count();
    assert!(passed >= 33, "{out}");
    assert_eq!(summary(&out), format!("{passed} passed, 0 failed"), "{out}");
    assert!(!out.contains("\nSKIP  "), "no case skipped: {out}");
    for case in CONTRACT_0_3_0_CASES {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("PASS  {case}")))
            .unwrap_or_else(|| panic!("{case}: not passed in\n{out}"));
        assert!(
            !line.contains("keeps no metadata"),
            "metadata is kept in the guest's storage: {line}"
        );
    }
    out
}

/// `guest inspect` reads the manifest the template embedded.
fn carries_its_manifest(wasm: &Path, name: &str) {
    let (ok, out) = wasmstate(&["guest", "inspect", wasm.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(out.contains(name), "{out}");
    assert!(out.contains("directory     true"), "{out}");
}

/// A real `terraform apply` through a backend on `wasm`.
fn serves_terraform(wasm: &Path) {
    let root = tempdir();
    let store = root.path().join("store");
    let server = Server::with_config(
        &root.path().join("data"),
        &format!("[backends.lang]\nguest = {wasm:?}\ndir = {store:?}\n"),
    );
    let work = tempdir();
    crate::terraform::apply_and_check(work.path(), &server.state_url("lang", "tf"), &server);
    assert!(
        store.join("tf/terraform.tfstate").is_file(),
        "the state is in the guest's layout"
    );
}

/// The built template `lang` (named `name`) passes the kit at the 64 MiB
/// its manifest asks for, carries that manifest, and serves Terraform.
fn the_template_passes_and_serves(lang: &'static str, name: &str) {
    let wasm = built(lang);
    let out = passes_the_kit(wasm);
    assert!(out.contains("memory cap: 64 MiB per call"), "{out}");
    carries_its_manifest(wasm, name);
    serves_terraform(wasm);
}

#[test]
fn a_python_guest_from_the_template_passes_the_kit_and_serves_terraform() {
    the_template_passes_and_serves("python", "py-guest");
}

#[test]
fn a_javascript_guest_from_the_template_passes_the_kit_and_serves_terraform() {
    the_template_passes_and_serves("js", "js-guest");
}

#[test]
fn python_unlocked_racers_on_two_replicas_get_one_200_and_one_409() {
    races::unlocked_racers_get_one_200_and_one_409(built("python"));
}

#[test]
fn javascript_unlocked_racers_on_two_replicas_get_one_200_and_one_409() {
    races::unlocked_racers_get_one_200_and_one_409(built("js"));
}

#[test]
fn python_a_lock_granted_during_a_workspace_delete_is_kept() {
    races::a_lock_granted_during_a_workspace_delete_is_kept(built("python"));
}

#[test]
fn javascript_a_lock_granted_during_a_workspace_delete_is_kept() {
    races::a_lock_granted_during_a_workspace_delete_is_kept(built("js"));
}

#[test]
fn python_a_write_into_a_dangling_link_is_a_500() {
    races::a_write_into_a_dangling_link_is_a_500(built("python"));
}

#[test]
fn javascript_a_write_into_a_dangling_link_is_a_500() {
    races::a_write_into_a_dangling_link_is_a_500(built("js"));
}

#[test]
fn python_a_metadata_write_racing_a_workspace_delete_is_never_a_500() {
    races::a_metadata_write_racing_a_workspace_delete_is_never_a_500(built("python"));
}

#[test]
fn javascript_a_metadata_write_racing_a_workspace_delete_is_never_a_500() {
    races::a_metadata_write_racing_a_workspace_delete_is_never_a_500(built("js"));
}

/// The `lang` template, built to wait before it writes a metadata version
/// whose document has the tag [`races::HELD_TAG`], while `<dir>/.hold` is
/// there (after making `<dir>/.held`, which says it got there): a race's
/// order, made to happen.
fn held_before_metadata_writes(lang: &str) -> PathBuf {
    let held = races::HELD_TAG;
    match lang {
        "python" => build_template(lang, "py-held", |dir| {
            let at = "            document = f\"{os.urandom(8).hex()}\\n{content or ''}\"  # no document: removed\n";
            let pause = format!(
                "            if '\"{held}\"' in (content or \"\"):\n\
                 \x20               open(os.path.join(ROOT, \".held\"), \"w\").close()\n\
                 \x20               while os.path.isdir(os.path.join(ROOT, \".hold\")):\n\
                 \x20                   monotonic_clock.subscribe_duration(1_000_000).block()\n"
            );
            edit_file(&dir.join("app.py"), at, &format!("{at}{pause}"));
        }),
        _ => build_template(lang, "js-held", |dir| {
            let at = "      const document = `${randomName()}\\n${content ?? ''}`; // no document: removed\n";
            let pause = format!(
                "      if (content?.includes('\"{held}\"')) {{\n\
                 \x20       dir.openAt(NOFOLLOW, '.held', {{ create: true }}, {{ write: true }});\n\
                 \x20       while (isDir(dir, '.hold')) subscribeDuration(1_000_000n).block();\n\
                 \x20     }}\n"
            );
            edit_file(&dir.join("guest.js"), at, &format!("{at}{pause}"));
        }),
    }
}

#[test]
fn python_a_metadata_write_of_a_deleted_workspace_never_lands_on_its_successor() {
    let wasm = held_before_metadata_writes("python");
    races::a_metadata_write_of_a_deleted_workspace_never_lands_on_its_successor(&wasm);
}

#[test]
fn javascript_a_metadata_write_of_a_deleted_workspace_never_lands_on_its_successor() {
    let wasm = held_before_metadata_writes("js");
    races::a_metadata_write_of_a_deleted_workspace_never_lands_on_its_successor(&wasm);
}

#[test]
fn python_a_stopped_writes_lock_is_taken_over_only_when_stale() {
    stale::a_stopped_writes_lock_is_taken_over_only_when_stale(built("python"));
}

#[test]
fn javascript_a_stopped_writes_lock_is_taken_over_only_when_stale() {
    stale::a_stopped_writes_lock_is_taken_over_only_when_stale(built("js"));
}

/// A state four times the memory the template asks for, written and read
/// back byte-exact through a server: the template streams for real.
fn serves_a_state_four_times_its_memory(wasm: &Path) {
    let root = tempdir();
    let store = root.path().join("store");
    let server = Server::with_config(
        &root.path().join("data"),
        &format!(
            "[backends.big]\nguest = {wasm:?}\ndir = {store:?}\nmemory_mib = 64\ntimeout_ms = 120000\n"
        ),
    );
    let pad = "x".repeat(256 << 20);
    let state = format!(
        r#"{{"version":4,"serial":1,"lineage":"big","outputs":{{}},"resources":[],"pad":"{pad}"}}"#
    );
    drop(pad);
    let url = server.state_url("big", "big");
    let put = send("POST", &url, Some(state.as_bytes()));
    assert_eq!(put.status, 200, "{}", put.text());
    assert_eq!(
        std::fs::metadata(store.join("big/terraform.tfstate"))
            .unwrap()
            .len(),
        state.len() as u64
    );
    let got = send("GET", &url, None);
    assert_eq!(
        got.status,
        200,
        "{}",
        String::from_utf8_lossy(&got.body[..got.body.len().min(300)])
    );
    assert!(
        got.body == state.as_bytes(),
        "the 256 MiB state came back different ({} bytes)",
        got.body.len()
    );
}

#[test]
fn a_python_guest_serves_a_256_mib_state_at_64_mib_of_memory() {
    serves_a_state_four_times_its_memory(built("python"));
}

#[test]
fn a_javascript_guest_serves_a_256_mib_state_at_64_mib_of_memory() {
    serves_a_state_four_times_its_memory(built("js"));
}

/// A guest whose `read` throws, unguarded, for the kit's workspaces (and
/// `ck-crash`): the client gets the exception in one line, the log and the
/// kit the traceback or stack.
fn a_crash_says_why(wasm: &Path, reason: &str, story: &str) {
    let root = tempdir();
    let server = Server::with_config(
        &root.path().join("data"),
        &format!(
            "[backends.crashing]\nguest = {wasm:?}\ndir = {:?}\nmemory_mib = 64\n",
            root.path().join("store")
        ),
    );
    let answer = send("GET", &server.state_url("crashing", "ck-crash"), None);
    assert_eq!(answer.status, 500, "{}", answer.text());
    let text = answer.text();
    assert!(text.contains(reason), "{text}");
    assert_eq!(
        text.trim().lines().count(),
        1,
        "one line for the client: {text}"
    );
    assert!(!text.contains(story), "the stack stays in the log: {text}");
    wait_until(
        "the log line with the stack",
        Duration::from_secs(10),
        || {
            let log = server.log_text();
            log.contains(reason) && log.contains(story)
        },
    );
    let (ok, out) = wasmstate(&["guest", "test", wasm.to_str().unwrap()]);
    assert!(!ok, "{out}");
    assert!(out.contains(&format!("guest crashed: {reason}")), "{out}");
    assert!(out.contains(&format!("| {story}")), "{out}");
}

#[test]
fn a_python_exception_reaches_the_client_the_log_and_the_kit() {
    let wasm = build_template("python", "py-crash", |dir| {
        edit_file(
            &dir.join("app.py"),
            "    @guarded\n    def read(self, workspace, into):\n",
            "    def read(self, workspace, into):\n        if workspace.startswith(\"ck-\"):\n            raise ValueError(\"oops in read\")\n",
        )
    });
    a_crash_says_why(
        &wasm,
        "ValueError: oops in read",
        "Traceback (most recent call last):",
    );
}

#[test]
fn a_javascript_exception_reaches_the_client_the_log_and_the_kit() {
    let wasm = build_template("js", "js-crash", |dir| {
        edit_file(
            &dir.join("guest.js"),
            "  read: guarded((workspace, into) => copyToSink(root(), `${workspace}/${STATE}`, into)),",
            "  read: (workspace, into) => { if (workspace.startsWith('ck-')) throw new Error('oops in read'); return copyToSink(root(), `${workspace}/${STATE}`, into); },",
        )
    });
    a_crash_says_why(&wasm, "uncaught Error: oops in read", "Stack:");
}

#[test]
fn a_rust_guest_from_the_template_passes_the_kit_and_serves_terraform() {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let root = tempdir();
    let dir = root.path().join("rust-guest");
    let sdk = workspace.join("sdk");
    template(
        "rust",
        "rust-guest",
        &dir,
        &["--sdk", sdk.to_str().unwrap()],
    );
    // The workspace's lockfile and the guests' target folder: the SDK and
    // its dependencies are already built there, at the same versions.
    std::fs::copy(workspace.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let target = workspace.join("target/wasm-guests");
    must(
        "cargo build --target wasm32-wasip2",
        Command::new(env!("CARGO"))
            .args([
                "build",
                "--release",
                "--target",
                "wasm32-wasip2",
                "--target-dir",
            ])
            .arg(&target)
            .args(["--config", "profile.release.debug=false"])
            .args(["--config", "profile.release.strip=\"debuginfo\""])
            .current_dir(&dir)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_TARGET_DIR"),
    );
    let wasm = target.join("wasm32-wasip2/release/rust_guest.wasm");
    passes_the_kit(&wasm);
    carries_its_manifest(&wasm, "rust-guest");
    serves_terraform(&wasm);
}

#[test]
fn a_template_never_overwrites_and_rust_asks_for_the_sdk() {
    let root = tempdir();
    let dir = root.path().join("taken");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("keep.txt"), "mine").unwrap();
    let (ok, out) = wasmstate(&[
        "guest",
        "new",
        "x",
        "--lang",
        "js",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert!(!ok && out.contains("not empty"), "{out}");
    assert_eq!(
        std::fs::read_to_string(dir.join("keep.txt")).unwrap(),
        "mine"
    );
    let fresh = root.path().join("fresh");
    let (ok, out) = wasmstate(&[
        "guest",
        "new",
        "x",
        "--lang",
        "rust",
        "--dir",
        fresh.to_str().unwrap(),
    ]);
    assert!(!ok && out.contains("--sdk PATH"), "{out}");
    let (ok, out) = wasmstate(&["guest", "new", "Bad_Name", "--lang", "python"]);
    assert!(!ok, "{out}");
}

#[test]
fn a_template_copies_the_wit_as_shipped_and_names_itself() {
    // The name is replaced where the template means it, and nowhere else:
    // WASI's comments say `NAME` (`EAI_NONAME`, `ENAMETOOLONG`).
    let root = tempdir();
    let dir = root.path().join("js-named");
    let (ok, out) = wasmstate(&[
        "guest",
        "new",
        "js-named",
        "--lang",
        "js",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    assert!(out.contains("(JavaScript)"), "{out}");
    assert!(out.contains("keep wasmstate on the PATH"), "{out}");
    let shipped = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../wit");
    for file in [
        "backend.wit",
        "guest.wit",
        "deps/sockets.wit",
        "deps/filesystem.wit",
    ] {
        assert_eq!(
            std::fs::read_to_string(dir.join("wit").join(file)).unwrap(),
            std::fs::read_to_string(shipped.join(file)).unwrap(),
            "wit/{file} differs from the shipped one"
        );
    }
    let package = std::fs::read_to_string(dir.join("package.json")).unwrap();
    assert!(package.contains("\"name\": \"js-named\""), "{package}");
    let manifest = std::fs::read_to_string(dir.join("guest.toml")).unwrap();
    assert!(manifest.contains("name = \"js-named\""), "{manifest}");
}

#[test]
fn a_guest_without_manifest_or_directory_is_refused_by_check_config_and_serve() {
    // Built as an author with an own layout does: no embedded manifest, so
    // the host cannot know it keeps files.
    let wasm = build_template("python", "py-bare", |dir| {
        edit_file(
            &dir.join("build.sh"),
            "wasmstate guest embed-manifest guest.wasm guest.toml\n",
            "",
        )
    });
    let (ok, out) = wasmstate(&["guest", "inspect", wasm.to_str().unwrap()]);
    assert!(ok && out.contains("manifest      none"), "{out}");
    let root = tempdir();
    let config = root.path().join("bare.toml");
    std::fs::write(&config, format!("[backends.bare]\nguest = {wasm:?}\n")).unwrap();
    let (ok, out) = wasmstate(&["check-config", config.to_str().unwrap()]);
    assert!(!ok, "it would answer 500 to every request:\n{out}");
    assert!(!out.contains("configuration OK"), "{out}");
    let error = out
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line:\n{out}"));
    assert!(
        error.contains("granted no directory")
            && error.contains("add dir = \"/var/lib/wasmstate/bare\"")
            && error.ends_with("to [backends.bare]"),
        "one line saying what to add: {error}"
    );
    // `serve` refuses to start the same way (instead of serving 500s).
    let mut serve = std::process::Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(root.path().join("data"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let log = capture(serve.stderr.take().unwrap());
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let exited = loop {
        if let Some(status) = serve.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = serve.kill();
            let _ = serve.wait();
            panic!(
                "serve started a backend that cannot work:\n{}",
                log.lock().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!exited.success());
    wait_until("the refusal in its log", Duration::from_secs(10), || {
        log.lock().unwrap().contains("add dir = ")
    });
    // With the directory granted, it passes.
    std::fs::write(
        &config,
        format!(
            "[backends.bare]\nguest = {wasm:?}\ndir = {:?}\n",
            root.path().join("store")
        ),
    )
    .unwrap();
    let (ok, out) = wasmstate(&["check-config", config.to_str().unwrap()]);
    assert!(ok && out.contains("configuration OK"), "{out}");
}

/// A server that compiles its guest at start (an empty cache, as on a new
/// pod) holds, once idle, at most 20 MiB more than one that found the
/// guest compiled: the compiler's memory leaves with the child process
/// that compiled. Before, with this JavaScript guest: about 390 MiB
/// cold against 75 MiB warm.
#[test]
fn a_cold_start_holds_no_more_memory_than_a_warm_one() {
    let wasm = built("js");
    let root = tempdir();
    let data = root.path().join("data");
    // A cache of its own, empty at first: the tests' shared one may
    // hold this guest already.
    let cache = root.path().join("cache");
    let config = format!(
        "[backends.lang]\nguest = {wasm:?}\ndir = {:?}\n",
        root.path().join("store")
    );
    // Listening means its guest is loaded; no call is made, so no
    // instance is kept ready.
    let start = || {
        let server = Server::with_cache(&data, &config, &cache);
        let rss = idle_rss_mib(server.pid());
        (rss, server.log_text())
    };
    let (cold, cold_log) = start();
    assert!(
        cold_log.contains("compiled guest in a child process"),
        "{cold_log}"
    );
    let (warm, warm_log) = start();
    assert!(
        !warm_log.contains("compiled guest"),
        "the second start found the guest compiled:\n{warm_log}"
    );
    eprintln!("idle after a cold start: {cold} MiB; after a warm start: {warm} MiB");
    assert!(
        cold <= warm + 20,
        "idle after a cold start: {cold} MiB; after a warm start: {warm} MiB"
    );
}

/// A guest the compiler refuses stops the start with the compiler child's
/// own reason, in one error line.
#[test]
fn a_guest_the_compiler_refuses_fails_with_the_childs_reason() {
    // A component holding one core module whose function returns an i64
    // where its type says i32: well-formed sections, invalid code.
    let module: &[u8] = &[
        0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // core module header
        0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7f, // type 0: () -> i32
        0x03, 0x02, 0x01, 0x00, // func 0: type 0
        0x0a, 0x06, 0x01, 0x04, 0x00, 0x42, 0x00, 0x0b, // body: i64.const 0
    ];
    let mut wasm = b"\0asm\x0d\x00\x01\x00".to_vec();
    wasm.push(0x01);
    wasm.push(module.len() as u8);
    wasm.extend_from_slice(module);
    let root = tempdir();
    let guest = root.path().join("invalid.wasm");
    std::fs::write(&guest, &wasm).unwrap();
    let config = root.path().join("invalid.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\n[backends.bad]\nguest = {guest:?}\ndir = {:?}\n",
            root.path().join("data"),
            root.path().join("store")
        ),
    )
    .unwrap();
    let (ok, out) = wasmstate(&["check-config", config.to_str().unwrap()]);
    assert!(!ok, "{out}");
    let error = out
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line:\n{out}"));
    assert!(
        error.contains("bad")
            && error.contains("the compiler process failed")
            && error.contains("not a valid WebAssembly component"),
        "{error}"
    );
}

/// A server killed while its compiler child works takes the child with it:
/// no orphan keeps compiling (holding the compiler's memory, and racing the
/// restarted server's own child) for a server that is gone.
#[test]
fn a_compiler_child_dies_with_its_server() {
    let wasm = built("js");
    let root = tempdir();
    let (config, cache) = (root.path().join("js.toml"), root.path().join("cache"));
    let store = root.path().join("store");
    std::fs::write(
        &config,
        format!("[backends.js]\nguest = {wasm:?}\ndir = {store:?}\n"),
    )
    .unwrap();
    let mut serve = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(root.path().join("data"))
        .arg("--cache-dir")
        .arg(&cache)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut children = Vec::new();
    wait_until("its compiler child", Duration::from_secs(60), || {
        // Half a second of CPU: past reading its input (a child killed
        // mid-read fails on its own), compiling.
        children = compiler_children(serve.id(), 50);
        !children.is_empty()
    });
    serve.kill().unwrap();
    serve.wait().unwrap();
    let gone = |pid: &u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.rsplit_once(") ")
            .is_none_or(|(_, rest)| rest.starts_with('Z'))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !children.iter().all(gone) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let orphans: Vec<_> = children.iter().filter(|pid| !gone(pid)).collect();
    for pid in &orphans {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    assert!(
        orphans.is_empty(),
        "compiler children outlived their server: {orphans:?}"
    );
    let entries: Vec<_> =
        std::fs::read_dir(&cache).map_or(Vec::new(), |d| d.flatten().map(|e| e.path()).collect());
    assert!(
        !entries
            .iter()
            .any(|p| p.extension().is_some_and(|x| x == "cwasm")),
        "the child went on compiling after its server died: {entries:?}"
    );
}
