//! Review of the TFE door's workspace metadata (issue 44): what a
//! caller's grants let it learn of tags, and tags as terraform writes
//! them (any case), with the real terraform.

use super::{LOCAL, fixture_with, names, text};
use crate::common::*;

/// `tags = ["App"]` in the cloud block: the workspace terraform creates
/// is kept with the tag `app`, and the same block (sent as written, not
/// lower-cased) must find it again, on init and in `workspace list`.
#[test]
fn fixed_a_cloud_block_with_upper_case_tags_finds_its_own_workspaces() {
    let f = fixture_with(LOCAL, "");
    let work = f.workdir(&f.cloud("tags = [\"App\"]"));
    let out = f.tf(work.path(), &f.ci, &["init", "-input=true"], "dev\n");
    assert!(out.status.success(), "{}", text(&out));
    f.ok(work.path(), &["apply", "-auto-approve", "-input=false"]);

    let list = f.api(
        "GET",
        "organizations/acme/workspaces?search%5Btags%5D=App",
        &f.ci,
        None,
    );
    assert_eq!(list.status, 200, "{}", list.text());
    assert_eq!(names(&list.json()), ["dev"]);

    // A second checkout of the same configuration selects it.
    let again = f.workdir(&f.cloud("tags = [\"App\"]"));
    let out = f.tf(again.path(), &f.ci, &["init", "-input=false"], "");
    assert!(out.status.success(), "{}", text(&out));
    let listed = f.ok(again.path(), &["workspace", "list"]);
    assert!(listed.contains("dev"), "{listed}");
}

/// A caller with only the `outputs` role on a workspace sees it (what
/// `terraform_remote_state` needs) but not its tags, neither in its
/// document nor by selecting on them; `read` sees them.
#[test]
fn fixed_the_outputs_role_learns_no_tags() {
    let (reader, reader_sha) = generate_token();
    let (viewer, viewer_sha) = generate_token();
    let f = fixture_with(
        LOCAL,
        &format!(
            "[[tokens]]\nname = \"reader\"\nsha256 = \"{reader_sha}\"\ngrants = [\"acme:shared:outputs\"]\n\
             [[tokens]]\nname = \"viewer\"\nsha256 = \"{viewer_sha}\"\ngrants = [\"acme:*:read\"]\n"
        ),
    );
    let created = f.api(
        "POST",
        "organizations/acme/workspaces",
        &f.ci,
        Some(
            r#"{"data":{"type":"workspaces","attributes":{"name":"shared"},"relationships":{"tags":{"data":[{"type":"tags","attributes":{"name":"secret-project"}}]}}}}"#,
        ),
    );
    assert_eq!(created.status, 201, "{}", created.text());

    let tags_seen = |token: &str| {
        let doc = f.api("GET", "organizations/acme/workspaces/shared", token, None);
        assert_eq!(doc.status, 200, "{}", doc.text());
        doc.json()["data"]["attributes"]["tag-names"].clone()
    };
    let selected = |token: &str, tag: &str| {
        let list = f.api(
            "GET",
            &format!("organizations/acme/workspaces?search%5Btags%5D={tag}"),
            token,
            None,
        );
        assert_eq!(list.status, 200, "{}", list.text());
        names(&list.json())
    };
    assert_eq!(tags_seen(&viewer), serde_json::json!(["secret-project"]));
    assert_eq!(selected(&viewer, "secret-project"), ["shared"]);

    assert_eq!(tags_seen(&reader), serde_json::json!([]));
    assert!(selected(&reader, "secret-project").is_empty());
    assert!(selected(&reader, "other").is_empty());
    // Still listed by name (terraform_remote_state finds it so).
    let list = f.api("GET", "organizations/acme/workspaces", &reader, None);
    assert_eq!(names(&list.json()), ["shared"]);
    // And it cannot change them (write needed).
    let id = f.workspace_id("shared");
    let added = f.api(
        "POST",
        &format!("workspaces/{id}/relationships/tags"),
        &reader,
        Some(r#"{"data":[{"type":"tags","attributes":{"name":"x"}}]}"#),
    );
    assert_eq!(added.status, 403, "{}", added.text());
    let added = f.api(
        "POST",
        &format!("workspaces/{id}/relationships/tags"),
        &viewer,
        Some(r#"{"data":[{"type":"tags","attributes":{"name":"x"}}]}"#),
    );
    assert_eq!(added.status, 403, "{}", added.text());
    assert_eq!(tags_seen(&viewer), serde_json::json!(["secret-project"]));
}
