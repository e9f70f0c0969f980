//! Reviewer's probes of issue 47's PostgreSQL part (not part of the fix):
//! each test asserts the safe behaviour and fails while the finding holds.

use crate::common::*;

/// Under encryption, a storage writer (who has no key) must not get a
/// state of its own making served as the workspace's: the plain-empty
/// exception checks the state with serde (the last of duplicate keys
/// wins, so `"outputs":{}` last looks empty) while Terraform's Go decoder
/// merges duplicate `outputs` objects (the planted outputs survive), and
/// the rollback check's header (a derived struct) fails on a duplicate
/// `serial`, so the mark of the workspace's lineage is not consulted.
#[test]
fn a_planted_plain_state_with_duplicate_keys_is_not_served_under_encryption() {
    let pg = Postgres::start();
    let data = tempdir();
    let key = key_file(data.path());
    let server = Server::with_config(
        data.path(),
        &format!(
            "[backends.pg]\nguest = \"postgres\"\nencryption = {{ keys = [{{ id = \"k1\", file = {key:?} }}] }}\n\
             [backends.pg.config]\nconn_str = {:?}\nschema_name = \"sealed\"\n",
            pg.conn_str()
        ),
    );
    let url = server.state_url("pg", "prod");
    let mut sealed: serde_json::Value = serde_json::from_slice(&state(40)).unwrap();
    sealed["outputs"] =
        serde_json::json!({"admin_cidr": {"value": "10.0.0.0/8", "type": "string"}});
    let sealed = serde_json::to_vec(&sealed).unwrap();
    assert_eq!(send("POST", &url, Some(&sealed)).status, 200);
    assert_eq!(send("GET", &url, None).body, sealed);
    let plant = |json: &str| {
        pg.query(&format!(
            "update sealed.states set data = '{json}' where name = 'prod'"
        ))
    };

    // Control: the same lineage at serial 1, written plainly, is refused
    // as a rollback (the mark says serial 40).
    plant(r#"{"version":4,"serial":1,"lineage":"test-lineage","outputs":{},"resources":[]}"#);
    let control = send("GET", &url, None);
    assert_ne!(control.status, 200, "{}", control.text());

    // The same, with duplicate keys.
    let planted = r#"{"version":4,"serial":1,"serial":1,"lineage":"test-lineage","outputs":{"admin_cidr":{"value":"0.0.0.0/0","type":"string"}},"resources":[],"outputs":{}}"#;
    plant(planted);
    let read = send("GET", &url, None);
    // Refused as any plain state holding something is: never served, so
    // Terraform never reads the planted output.
    assert_eq!(read.status, 500, "{}", read.text());
    assert!(read.text().contains("not sealed"), "{}", read.text());
    assert!(!read.text().contains("0.0.0.0/0"), "{}", read.text());
}

/// The rollback marks refuse an older sealed state of the lineage seen
/// (storage handing back an old envelope). A plain empty state of another
/// lineage, which storage can write without any key, is read as a new
/// lineage and replaces the mark; the old envelope is then a "new
/// lineage" again and is served: the exception turns every sealed
/// workspace's rollback protection off for a storage writer, with no
/// duplicate keys needed.
#[test]
fn a_planted_empty_state_does_not_open_the_way_for_a_rollback() {
    let pg = Postgres::start();
    let data = tempdir();
    let key = key_file(data.path());
    let server = Server::with_config(
        data.path(),
        &format!(
            "[backends.pg]\nguest = \"postgres\"\nencryption = {{ keys = [{{ id = \"k1\", file = {key:?} }}] }}\n\
             [backends.pg.config]\nconn_str = {:?}\nschema_name = \"sealed\"\n",
            pg.conn_str()
        ),
    );
    let url = server.state_url("pg", "prod");
    let stored = || pg.query("select data from sealed.states where name = 'prod'");
    assert_eq!(send("POST", &url, Some(&state(5))).status, 200);
    let old = stored();
    assert_eq!(send("POST", &url, Some(&state(40))).status, 200);
    assert_eq!(send("GET", &url, None).body, state(40));
    let plant = |json: &str| {
        pg.query(&format!(
            "update sealed.states set data = $e${json}$e$ where name = 'prod'"
        ));
    };

    // Control: the old envelope alone is refused as a rollback.
    plant(&old);
    let control = send("GET", &url, None);
    assert_ne!(control.status, 200, "{}", control.text());

    plant(r#"{"version":4,"serial":1,"lineage":"planted","outputs":{},"resources":[]}"#);
    let empty = send("GET", &url, None);
    plant(&old);
    let rolled_back = send("GET", &url, None);
    assert!(
        rolled_back.status != 200,
        "after a planted empty state was read ({}), storage rolled the sealed state back from \
         serial 40 to serial 5 and it was served: {} {}",
        empty.status,
        rolled_back.status,
        rolled_back.text()
    );
}
