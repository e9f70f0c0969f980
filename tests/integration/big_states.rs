//! Big states: held once by the server, and judged by the stale-write
//! guard from their first bytes, whatever their size.

use crate::common::*;
use crate::conformance::V0_1_0_LOCAL_WASM;

const MIB: usize = 1 << 20;

/// A state of about `size` bytes with `serial`; with `late`, serial and
/// lineage come after the bulk (legal JSON, though Terraform writes them
/// first), so the guard must read past its first 64 KiB.
fn big_state(size: usize, serial: u64, late: bool) -> Vec<u8> {
    let bulk = "x".repeat(size);
    let text = if late {
        format!(
            r#"{{"version":4,"outputs":{{"blob":{{"value":"{bulk}","type":"string"}}}},"resources":[],"serial":{serial},"lineage":"late"}}"#
        )
    } else {
        format!(
            r#"{{"version":4,"serial":{serial},"lineage":"early","outputs":{{"blob":{{"value":"{bulk}","type":"string"}}}},"resources":[]}}"#
        )
    };
    text.into_bytes()
}

#[test]
fn a_big_state_costs_the_server_its_size_once() {
    let dir = tempdir();
    let server = Server::start(&dir.path().join("data"));
    let url = server.state_url("default", "big");
    // Warm up: the guest compiled and a pool slot used.
    assert_eq!(
        send("POST", &url, Some(&big_state(1000, 1, false))).status,
        200
    );
    let pid = server.pid();
    let before = rss_kib(pid);
    reset_peak_rss(pid);
    let state = big_state(64 * MIB, 2, false);
    let posted = send("POST", &url, Some(&state));
    assert_eq!(posted.status, 200, "{}", posted.text());
    let got = send("GET", &url, None);
    assert_eq!(got.status, 200);
    assert!(got.body == state, "the state came back different");
    let growth = (peak_rss_kib(pid).saturating_sub(before) * 1024) as usize;
    assert!(
        growth <= state.len() * 3 / 2,
        "a {} MiB POST and GET grew the server's peak memory by {} MiB, over 1.5 times the state",
        state.len() / MIB,
        growth / MIB
    );
}

#[test]
fn the_stale_write_guard_reads_past_the_beginning_when_it_must() {
    let dir = tempdir();
    let server = Server::start(&dir.path().join("data"));
    for late in [false, true] {
        let url = server.state_url("default", if late { "late" } else { "early" });
        let newer = big_state(2 * MIB, 5, late);
        assert_eq!(send("POST", &url, Some(&newer)).status, 200);
        // Older serial: refused, whether serial sits first or after 2 MiB.
        let older = send("POST", &url, Some(&big_state(2 * MIB, 4, late)));
        assert_eq!(older.status, 409, "late = {late}: {}", older.text());
        assert!(
            older.text().contains("older than the stored state's 5"),
            "{}",
            older.text()
        );
        // The same bytes again (a retried POST): accepted, nothing changes.
        assert_eq!(
            send("POST", &url, Some(&newer)).status,
            200,
            "late = {late}"
        );
        // Same serial, other bytes: another writer got there first.
        let mut other = newer.clone();
        let at = other.len() / 2;
        other[at] = b'y';
        let conflict = send("POST", &url, Some(&other));
        assert_eq!(conflict.status, 409, "late = {late}: {}", conflict.text());
        assert!(
            conflict.text().contains("different content"),
            "{}",
            conflict.text()
        );
        assert!(
            send("GET", &url, None).body == newer,
            "late = {late}: the stored state changed"
        );
    }
}

/// A guest with 32 MiB of memory stores and serves a 48 MiB state: only
/// possible because the state streams through it in chunks (under 0.1.0 it
/// had to fit in the guest's memory whole, twice for a write).
#[test]
fn guests_store_states_bigger_than_their_memory() {
    let dir = tempdir();
    let repo = bare_repo(dir.path(), "states");
    let server = Server::with_config(
        &dir.path().join("data"),
        &format!(
            "[backends.local]\nguest = \"local\"\nmemory_mib = 32\n\
             [backends.old]\nguest = {:?}\nmemory_mib = 32\ndir = {:?}\n\
             [backends.git]\nguest = \"git\"\nmemory_mib = 32\ntimeout_ms = 60000\n\
             [backends.git.config]\nrepository = {:?}\n",
            V0_1_0_LOCAL_WASM,
            dir.path().join("old").display().to_string(),
            repo.display().to_string()
        ),
    );
    let state = big_state(48 * MIB, 1, false);
    // The same guest built for 0.1.0 gets the state whole: it cannot.
    let old = send("POST", &server.state_url("old", "big"), Some(&state));
    assert!(
        old.status >= 500,
        "a 0.1.0 guest took a state bigger than its memory: {}",
        old.text()
    );
    for backend in ["local", "git"] {
        let url = server.state_url(backend, "big");
        let posted = send("POST", &url, Some(&state));
        assert_eq!(posted.status, 200, "{backend}: {}", posted.text());
        let got = send("GET", &url, None);
        assert_eq!(got.status, 200, "{backend}: {}", got.text());
        assert!(
            got.body == state,
            "{backend}: the state came back different"
        );
    }
    // The git guest committed it whole, where plain git sees it.
    let size = git(&repo, &["cat-file", "-s", "main:big.tfstate"]);
    assert_eq!(size.trim(), state.len().to_string());
}
