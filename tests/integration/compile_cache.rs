//! A server whose compile cache cannot be written (a read-only volume, a
//! full disk) still takes its guests' machine code from the compiler
//! child, which sends it back on its stdout: the server never compiles
//! in its own process (which would keep the compiler's memory for good).

use crate::common::*;

#[test]
fn an_unwritable_cache_still_takes_the_childs_output() {
    let root = tempdir();
    let data = root.path().join("data");
    // A regular file where the cache directory should be: nothing can
    // be written under it, whoever runs the test (root included).
    let cache = root.path().join("cache");
    std::fs::write(&cache, b"not a directory").unwrap();
    let config = format!(
        "[backends.x]\nguest = \"local\"\ndir = {:?}\n",
        root.path().join("store")
    );
    let server = Server::with_cache(&data, &config, &cache);
    let log = server.log_text();
    assert!(
        log.contains("using the compiler process's output"),
        "the server should use what the child compiled:\n{log}"
    );
    assert!(
        !log.contains("compiling in this process"),
        "the server compiled in its own process:\n{log}"
    );
    // And it serves with that code.
    let url = server.state_url("x", "default");
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);
    assert_eq!(send("GET", &url, None).body, state(1));
}
