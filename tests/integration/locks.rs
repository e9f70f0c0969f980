//! Locks you can see aging: `wasmstate lock list` against a running
//! server, oldest first, filtered by age, lock IDs only for admins.

use crate::common::*;

fn lock_created(id: &str, who: &str, created: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "ID": id, "Operation": "OperationTypeApply", "Info": "", "Who": who,
        "Version": "1.11.4", "Created": created, "Path": ""
    }))
    .unwrap()
}

#[test]
fn lock_list_shows_holders_and_ages_oldest_first() {
    let dir = tempdir();
    let (admin, admin_sha) = generate_token();
    let (reader, reader_sha) = generate_token();
    let server = Server::with_config(
        &dir.path().join("data"),
        &format!(
            "[backends.default]\nguest = \"local\"\n\
             [[tokens]]\nname = \"admin\"\nsha256 = \"{admin_sha}\"\ngrants = [\"*:*:admin\"]\n\
             [[tokens]]\nname = \"reader\"\nsha256 = \"{reader_sha}\"\ngrants = [\"*:*:read\"]\n"
        ),
    );
    let auth = format!("Bearer {admin}");
    let lock = |workspace: &str, body: Vec<u8>| {
        let url = server.state_url("default", workspace);
        let answer = send_with("LOCK", &url, Some(&body), &[("Authorization", &auth)]);
        assert_eq!(answer.status, 200, "{}", answer.text());
    };
    let now = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    lock("fresh", lock_created("fresh-id", "bob@ci", &now));
    lock(
        "stale",
        lock_created("stale-id", "alice@laptop", "2026-01-02T15:04:05.123456789Z"),
    );
    let post = send_with(
        "POST",
        &server.state_url("default", "free"),
        Some(&state(1)),
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
    );
    assert_eq!(post.status, 200, "{}", post.text());

    let list = |token: &str, extra: &[&str]| {
        let mut args = vec![
            "lock",
            "list",
            "--server",
            server.url.as_str(),
            "--token",
            token,
        ];
        args.extend_from_slice(extra);
        let (ok, out) = wasmstate(&args);
        assert!(ok, "{out}");
        out
    };
    let all = list(&admin, &[]);
    let rows: Vec<&str> = all.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{all}");
    assert!(
        rows[0].starts_with("stale") && rows[0].contains("alice@laptop"),
        "{all}"
    );
    assert!(
        rows[1].starts_with("fresh") && rows[1].contains("bob@ci"),
        "{all}"
    );
    assert!(all.contains("id stale-id"), "an admin sees lock IDs: {all}");
    assert!(
        !all.contains("free"),
        "an unlocked workspace is not listed: {all}"
    );

    let old = list(&admin, &["--older-than", "1h"]);
    assert!(old.contains("stale") && !old.contains("fresh"), "{old}");

    let seen = list(&reader, &[]);
    assert!(
        seen.contains("alice@laptop") && !seen.contains("stale-id"),
        "{seen}"
    );
}
