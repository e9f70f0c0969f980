//! `backend "remote"` with a prefix, and `terraform_remote_state` reading
//! a workspace's outputs through it.

use super::{Fixture, fixture};

fn remote(f: &Fixture, workspaces: &str) -> String {
    format!(
        "hostname = \"{}\"\n    organization = \"acme\"\n    workspaces {workspaces}",
        f.host
    )
}

#[test]
fn backend_remote_with_a_prefix_and_terraform_remote_state() {
    let f = fixture();
    let net = f.workdir(&format!(
        "terraform {{\n  backend \"remote\" {{\n    {}\n  }}\n}}\nresource \"terraform_data\" \"example\" {{\n  input = \"hello\"\n}}\noutput \"o\" {{\n  value = terraform_data.example.output\n}}\n",
        remote(&f, "{ prefix = \"net-\" }")
    ));
    // With nothing under the prefix yet, init says so and exits 1, but
    // keeps the backend (upstream terraform behaviour).
    let init = f.tf(net.path(), &f.ci, &["init", "-input=false"], "");
    assert!(
        super::text(&init).contains("No existing workspaces"),
        "{}",
        super::text(&init)
    );
    f.ok(net.path(), &["workspace", "new", "a"]);
    f.ok(net.path(), &["apply", "-auto-approve", "-input=false"]);
    // The prefix is the server's name; terraform shows it stripped.
    let list = f.ok(net.path(), &["workspace", "list"]);
    assert!(list.contains("* a") && !list.contains("net-a"), "{list}");
    let stored = f.http("GET", "/states/acme/net-a", None);
    assert_eq!(stored.json()["outputs"]["o"]["value"], "hello");

    let reader = f.workdir(&format!(
        "data \"terraform_remote_state\" \"net\" {{\n  backend = \"remote\"\n  config = {{\n    {}\n  }}\n}}\noutput \"seen\" {{\n  value = data.terraform_remote_state.net.outputs.o\n}}\n",
        remote(&f, "= { name = \"net-a\" }")
    ));
    f.ok(reader.path(), &["init", "-input=false"]);
    f.ok(reader.path(), &["apply", "-auto-approve", "-input=false"]);
    let seen = f.ok(reader.path(), &["output", "-raw", "seen"]);
    assert_eq!(seen.trim(), "hello");
}
