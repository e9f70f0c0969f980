//! What one POST costs in guest calls (`wasmstate_guest_call_seconds_count`),
//! the write path of issue 46: on a contract 0.3.0 guest a write is the
//! storage's head and a conditional write, whether or not the client holds
//! a lock, and a retried one the head alone; on a guest built for 0.2.1
//! the host still locks for an unlocked write, reads to judge it, writes
//! and unlocks. Sealed and plain, on the `local` guest and its 0.2.1 build.

use crate::common::*;

/// The `local` guest as the 0.2.1 SDK built it.
const V0_2_1_LOCAL_WASM: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/v0.2.1/local.wasm"
);

/// Guest calls made by each kind of POST.
#[derive(Debug, PartialEq)]
struct Calls {
    unlocked: f64,
    retried: f64,
    locked: f64,
}

/// The calls one POST of each kind costs on `guest` (`sealed` or not).
fn calls_per_post(guest: &str, sealed: bool) -> Calls {
    let root = tempdir();
    let store = root.path().join("store");
    let encryption = match sealed {
        true => {
            let key = key_file(root.path());
            format!("encryption = {{ keys = [{{ id = \"k1\", file = {key:?} }}] }}\n")
        }
        false => String::new(),
    };
    let config = format!("[backends.main]\nguest = {guest:?}\ndir = {store:?}\n{encryption}");
    let server = Server::with_config(&root.path().join("data"), &config);
    let calls = r#"wasmstate_guest_call_seconds_count{backend="main"}"#;
    let url = server.state_url("main", "ws");
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);
    let spent = |post: &dyn Fn()| {
        let before = server.metric(calls);
        post();
        server.metric(calls) - before
    };
    let unlocked = spent(&|| assert_eq!(send("POST", &url, Some(&state(2))).status, 200));
    let retried = spent(&|| assert_eq!(send("POST", &url, Some(&state(2))).status, 200));
    let id = "c0ffee00-0000-4000-8000-00000000beef";
    assert_eq!(send("LOCK", &url, Some(&lock_info(id, "ci@a"))).status, 200);
    let under = format!("{url}?ID={id}");
    let locked = spent(&|| assert_eq!(send("POST", &under, Some(&state(3))).status, 200));
    assert_eq!(
        send("UNLOCK", &url, Some(&lock_info(id, "ci@a"))).status,
        200
    );
    assert_eq!(send("GET", &url, None).body, state(3));
    Calls {
        unlocked,
        retried,
        locked,
    }
}

#[test]
fn a_post_is_a_head_and_a_conditional_write_on_a_0_3_0_guest() {
    for sealed in [false, true] {
        let now = calls_per_post("local", sealed);
        let before = calls_per_post(V0_2_1_LOCAL_WASM, sealed);
        println!("sealed {sealed}: 0.3.0 {now:?}, 0.2.1 {before:?}");
        assert_eq!(
            now,
            Calls {
                unlocked: 2.0,
                retried: 1.0,
                locked: 2.0,
            },
            "sealed {sealed}"
        );
        // Through the host's lock: guard, lock, guard again, write, unlock.
        assert_eq!(before.unlocked, 5.0, "sealed {sealed}: {before:?}");
        assert!(before.retried >= 2.0, "sealed {sealed}: {before:?}");
    }
}
