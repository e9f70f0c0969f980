//! Instances made ahead for a backend's next call: each request still gets
//! an instance no other request ran in (a POST's head and write share
//! one), and the server keeps only so many.

use crate::common::*;
use crate::metrics::{scrape, value};
use std::time::Duration;

/// Instances ready now, across the server.
const READY: &str = "wasmstate_guest_ready_instances";

fn on_ready(server: &Server, backend: &str) -> f64 {
    scrape(server)
        .get(&format!(
            r#"wasmstate_guest_calls_on_ready_instance_total{{backend="{backend}"}}"#
        ))
        .copied()
        .unwrap_or(0.0)
}

fn wait_for_one_ready(server: &Server) {
    wait_until("an instance made ahead", Duration::from_secs(30), || {
        value(&scrape(server), READY) == 1.0
    });
}

/// Two calls: the backend is in use from the second (the server's own
/// probe at start may have been the first).
fn use_it(url: &str) {
    for _ in 0..2 {
        let answer = send("GET", url, None);
        assert!(matches!(answer.status, 200 | 404), "{}", answer.text());
    }
}

/// A server whose backend `remember` counts the calls each instance
/// served, in use; and its workspace's URL.
fn remembering(dir: &std::path::Path) -> (Server, String) {
    let server = Server::with_config(
        dir,
        &format!(
            "[backends.remember]\nguest = \"{MISBEHAVE_WASM}\"\nconfig = {{ mode = \"remember\" }}\n"
        ),
    );
    let url = server.state_url("remember", "default");
    use_it(&url);
    (server, url)
}

#[test]
fn a_call_on_an_instance_made_ahead_still_has_it_to_itself() {
    let dir = tempdir();
    let (server, url) = remembering(dir.path());
    let before = on_ready(&server, "remember");
    for call in 0..4 {
        wait_for_one_ready(&server);
        let answer = send("GET", &url, None);
        assert_eq!(answer.status, 200, "{}", answer.text());
        // The guest counts the reads its instance served: an instance
        // that served an earlier call would say 2.
        assert_eq!(answer.json()["reads_seen"], 1, "call {call}");
        assert_eq!(answer.json()["calls_seen"], 1, "call {call}");
    }
    // At least: the server's own probe of the backend at start, if it
    // came late, found one ready too.
    assert!(on_ready(&server, "remember") - before >= 4.0);
}

/// A POST's head and conditional write run in one instance (the guest's
/// write succeeds only as its instance's second call), and the requests
/// after it never find that instance: a GET's served that read alone, and
/// the next POST's head is its instance's first call again.
#[test]
fn a_posts_calls_share_one_instance_that_no_other_request_gets() {
    let dir = tempdir();
    let (_server, url) = remembering(dir.path());
    let state = br#"{"version":4,"serial":2,"lineage":"remember","resources":[]}"#;
    for round in 0..3 {
        let posted = send("POST", &url, Some(state));
        assert_eq!(posted.status, 200, "round {round}: {}", posted.text());
        let read = send("GET", &url, None);
        assert_eq!(read.status, 200, "{}", read.text());
        assert_eq!(read.json()["calls_seen"], 1, "round {round}");
    }
}

#[test]
fn the_server_keeps_at_most_its_share_of_instances_ready() {
    let dir = tempdir();
    // An eighth of 8: one instance ready across both backends.
    let server = Server::with_config(
        dir.path(),
        "max_instances = 8\n[backends.a]\nguest = \"local\"\n[backends.b]\nguest = \"local\"\n",
    );
    let (a, b) = (server.state_url("a", "w"), server.state_url("b", "w"));
    assert_eq!(value(&scrape(&server), &format!("{READY}_limit")), 1.0);
    use_it(&a);
    wait_for_one_ready(&server);
    // b is in use too, but the one slot is a's: none is made for b.
    use_it(&b);
    assert_eq!(value(&scrape(&server), READY), 1.0);
    assert_eq!(on_ready(&server, "b"), 0.0);
    let before = on_ready(&server, "a");
    assert_eq!(send("GET", &a, None).status, 404);
    assert_eq!(on_ready(&server, "a") - before, 1.0);
    assert_eq!(on_ready(&server, "b"), 0.0);
}
