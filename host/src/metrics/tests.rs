use super::*;

#[test]
fn labels_stay_bounded() {
    let m = Metrics::new(["prod".to_string()]);
    m.request("prod", "GET", 200, Duration::from_millis(2));
    m.request("random-junk", "BREW", 404, Duration::from_millis(1));
    let text = m.render();
    assert!(
        text.contains(r#"wasmstate_requests_total{backend="prod",method="GET",status="200"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"wasmstate_requests_total{backend="-",method="other",status="404"} 1"#),
        "{text}"
    );
    assert!(
        !text.contains("random-junk") && !text.contains("BREW"),
        "{text}"
    );
}

#[test]
fn held_locks_are_bounded_in_number_and_keep_only_a_digest_of_ids() {
    let m = Metrics::new(["prod".to_string()]);
    // A 1 MiB lock ID costs the map 32 bytes.
    m.lock_granted("prod", "big", &"x".repeat(1 << 20));
    for i in 0..MAX_TRACKED_LOCKS + 10 {
        m.lock_granted("prod", &format!("ws-{i}"), "id");
    }
    assert_eq!(m.held.lock().unwrap().len(), MAX_TRACKED_LOCKS);
    let text = m.render();
    assert!(
        text.contains(&format!(
            r#"wasmstate_locks_held{{backend="prod"}} {MAX_TRACKED_LOCKS}"#
        )),
        "{}",
        &text[..text.len().min(2000)]
    );
}

#[test]
fn the_oldest_held_lock_ages_and_goes_to_zero_when_released() {
    let m = Metrics::new(["prod".to_string(), "dev".to_string()]);
    m.lock_granted("prod", "new", "a");
    // An hour ago, on this machine's monotonic clock (which starts at
    // boot: a machine up for less has nothing to test here).
    let Some(an_hour_ago) = Instant::now().checked_sub(std::time::Duration::from_secs(3600)) else {
        return;
    };
    m.held
        .lock()
        .unwrap()
        .insert(("prod".into(), "old".into()), ([0; 32], an_hour_ago));
    let text = m.render();
    let age: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(r#"wasmstate_oldest_lock_seconds{backend="prod"} "#))
        .and_then(|v| v.trim().parse().ok())
        .expect("the gauge is exported");
    assert!((3600..3700).contains(&age), "{age}");
    assert!(text.contains(r#"wasmstate_oldest_lock_seconds{backend="dev"} 0"#));
    m.held.lock().unwrap().clear();
    assert!(
        m.render()
            .contains(r#"wasmstate_oldest_lock_seconds{backend="prod"} 0"#)
    );
}

#[test]
fn held_locks_count_once_and_release() {
    let m = Metrics::new(["prod".to_string()]);
    m.lock_granted("prod", "ws", "a");
    m.lock_granted("prod", "ws", "a"); // a retry
    assert!(
        m.render()
            .contains(r#"wasmstate_locks_held{backend="prod"} 1"#)
    );
    m.lock_released("prod", "ws");
    m.lock_released("prod", "ws");
    let text = m.render();
    assert!(
        text.contains(r#"wasmstate_locks_held{backend="prod"} 0"#),
        "{text}"
    );
    assert!(
        text.contains(r#"wasmstate_lock_held_seconds_count{backend="prod"} 1"#),
        "{text}"
    );
}
