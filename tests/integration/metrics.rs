//! `GET /metrics`, scraped and parsed after real traffic.

use crate::common::*;
use std::collections::HashMap;

/// Parse the Prometheus text exposition into `series -> value`.
pub fn scrape(server: &Server) -> HashMap<String, f64> {
    let answer = send("GET", &format!("{}/metrics", server.url), None);
    assert_eq!(answer.status, 200);
    assert!(
        answer.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    answer
        .text()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (series, value) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad line {l:?}"));
            (
                series.to_string(),
                value
                    .parse()
                    .unwrap_or_else(|_| panic!("bad value in {l:?}")),
            )
        })
        .collect()
}

pub fn value(samples: &HashMap<String, f64>, series: &str) -> f64 {
    *samples.get(series).unwrap_or_else(|| {
        panic!(
            "no series {series}; have: {:#?}",
            samples.keys().collect::<Vec<_>>()
        )
    })
}

#[test]
fn metrics_count_requests_guest_work_faults_and_locks() {
    let dir = tempdir();
    let server = Server::with_config(
        dir.path(),
        &format!(
            "[backends.default]\nguest = \"local\"\n[backends.trap]\nguest = \"{MISBEHAVE_WASM}\"\nconfig = {{ mode = \"trap\" }}\n"
        ),
    );
    let url = server.state_url("default", "metered");
    assert_eq!(send("GET", &url, None).status, 404);
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);
    assert_eq!(
        send("LOCK", &url, Some(&lock_info("a", "a@host"))).status,
        200
    );
    assert_eq!(
        send("LOCK", &url, Some(&lock_info("b", "b@host"))).status,
        423
    );
    assert_eq!(
        send("GET", &server.state_url("trap", "x"), None).status,
        500
    );
    assert_eq!(
        send("GET", &server.state_url("no-such-backend", "x"), None).status,
        404
    );

    let m = scrape(&server);
    let requests = |backend: &str, method: &str, status: u16| {
        value(
            &m,
            &format!(
                r#"wasmstate_requests_total{{backend="{backend}",method="{method}",status="{status}"}}"#
            ),
        )
    };
    assert_eq!(requests("default", "GET", 404), 1.0);
    assert_eq!(requests("default", "POST", 200), 1.0);
    assert_eq!(requests("default", "LOCK", 200), 1.0);
    assert_eq!(requests("default", "LOCK", 423), 1.0);
    assert_eq!(requests("trap", "GET", 500), 1.0);
    assert_eq!(
        requests("-", "GET", 404),
        1.0,
        "unknown backends share one label"
    );
    assert_eq!(
        value(&m, r#"wasmstate_lock_conflicts_total{backend="default"}"#),
        1.0
    );
    assert_eq!(value(&m, r#"wasmstate_locks_held{backend="default"}"#), 1.0);
    assert_eq!(
        value(
            &m,
            r#"wasmstate_guest_faults_total{backend="trap",kind="trap"}"#
        ),
        1.0
    );
    // Startup validation plus one instance per guest call.
    assert!(
        value(
            &m,
            r#"wasmstate_guest_instantiate_seconds_count{backend="default"}"#
        ) >= 5.0
    );
    assert!(
        value(
            &m,
            r#"wasmstate_guest_call_seconds_count{backend="default"}"#
        ) >= 5.0
    );
    assert_eq!(
        value(
            &m,
            r#"wasmstate_request_seconds_count{backend="default",method="LOCK"}"#
        ),
        2.0
    );

    assert_eq!(
        send("UNLOCK", &url, Some(&lock_info("a", "a@host"))).status,
        200
    );
    let m = scrape(&server);
    assert_eq!(value(&m, r#"wasmstate_locks_held{backend="default"}"#), 0.0);
    assert_eq!(
        value(
            &m,
            r#"wasmstate_lock_held_seconds_count{backend="default"}"#
        ),
        1.0
    );
}
