//! The HTML of the state viewer, of a comparison's changed instances and
//! of the search (maud: every value escaped by construction), and the two
//! pages' handlers; `viewer` and `search` find the data (and answer its
//! JSON), this module only shows it. Sensitive values never reach these
//! functions: the data is masked before.

use super::changes::{InstanceChange, MAX_DETAILED};
use super::data::storage_of;
use super::search::{Asked, Searched, search};
use super::state_view::{MAX_GROUPS, MAX_OUTPUTS};
use super::viewer::{Viewed, Wanted, view};
use super::{Answer, Shared, Visitor, page};
use crate::backend::Storage;
use crate::client::format_unix_ms;
use axum::extract::{Path, Query, State};
use maud::{Markup, html};

fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// A value for a query string (version ids may hold `&` or `#`).
fn query_value(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// What one state holds.
pub fn state(v: &Viewed) -> Markup {
    let s = &v.state;
    let workspace = format!("/ui/backends/{}/{}", v.backend, v.workspace);
    let here = format!("{workspace}/state?version={}", query_value(&v.version));
    html! {
        p.links {
            a href=(workspace) { "Versions of " (v.workspace) }
            " · "
            a href={ "/ui/search/" (v.backend) } { "Search " (v.backend) }
        }
        dl #state-facts {
            dt { "version" } dd #state-version { (v.version) }
            dt { "size" } dd #state-size { (size(v.bytes)) }
            dt { "serial" } dd #state-serial { (s.head.serial.map(|n| n.to_string()).unwrap_or_else(|| "-".into())) }
            dt { "lineage" } dd #state-lineage { code { (s.head.lineage.as_deref().unwrap_or("-")) } }
            dt { "written by" } dd #state-writer {
                @match &v.written_by {
                    Some(who) => (who),
                    None => span.unknown title="not in this replica's audit trail" { "—" },
                }
                @if let Some(at) = v.written_unix_ms { " · " (format_unix_ms(at)) }
            }
            @if let Some(tf) = &s.head.terraform_version { dt { "written with" } dd { (tf) } }
        }
        @if s.head.encrypted {
            p #encrypted {
                "Encrypted by OpenTofu (client-side state encryption): its resources and outputs \
                 are ciphertext this server cannot read. Use `tofu show` with the key to see them."
            }
        } @else {
            h2 { (s.resources_total) " resources, " (s.instances_total) " instances" }
            table #groups {
                thead { tr { th { "module" } th { "type" } th { "resources" } th { "instances" } } }
                tbody {
                    @for g in &s.groups {
                        tr data-module=(g.module) data-type=(g.kind) {
                            td { (if g.module.is_empty() { "(root)" } else { &g.module }) }
                            td { code { (g.kind) } }
                            td.resources { (g.resources) }
                            td.instances { (g.instances) }
                        }
                    }
                }
            }
            @if s.groups_cut { p.note { "Only the first " (MAX_GROUPS) " module and type groups are counted." } }
            table #resources {
                thead { tr { th { "address" } th { "provider" } th { "instances" } } }
                tbody {
                    @for r in &s.resources {
                        tr data-address=(r.address) {
                            td { code { (r.address) } }
                            td { small { (r.provider) } }
                            td.instances { (r.instances) }
                        }
                    }
                }
            }
            @if s.pages > 1 {
                nav.pager #resource-pages {
                    @if s.page > 1 { a rel="prev" href={ (here) "&page=" (s.page - 1) } { "← previous" } }
                    span { "page " (s.page) " of " (s.pages) }
                    @if s.page < s.pages { a rel="next" href={ (here) "&page=" (s.page + 1) } { "next →" } }
                }
            }
            h2 { "Outputs" }
            @if s.outputs.is_empty() { p { "No outputs." } }
            @else {
                table #outputs {
                    thead { tr { th { "name" } th { "type" } th { "value" } } }
                    tbody {
                        @for o in &s.outputs {
                            tr data-output=(o.name) {
                                td { code { (o.name) } }
                                td { code { (o.kind.as_deref().unwrap_or("")) } }
                                td.value {
                                    @match &o.value {
                                        Some(value) => {
                                            pre { (value) }
                                            @if o.cut { small { "(cut)" } }
                                        }
                                        None if o.sensitive => span.sensitive { "(sensitive)" },
                                        None => span.unknown { "—" },
                                    }
                                }
                            }
                        }
                    }
                }
                @if s.outputs_total > s.outputs.len() {
                    p.note { "The first " (MAX_OUTPUTS) " of " (s.outputs_total) " outputs." }
                }
            }
        }
    }
}

/// The changed instances of a comparison, in detail.
pub fn instance_changes(details: &[InstanceChange], changed: usize) -> Markup {
    html! {
        @if !details.is_empty() {
            section #instance-changes {
                h3 { "What changed" }
                @if changed > details.len() {
                    p.note { "The first " (MAX_DETAILED) " of " (changed) " changed instances." }
                }
                @for c in details {
                    div.instance-change data-address=(c.address) {
                        h4 { code { (c.address) } }
                        table.attributes {
                            thead { tr { th { "attribute" } th { "old" } th { "new" } } }
                            tbody {
                                @for a in &c.attributes {
                                    tr data-attribute=(a.name) class=[a.sensitive.then_some("sensitive")] {
                                        td { code { (a.name) } }
                                        td.old { (value_cell(a.old.as_deref())) }
                                        td.new { (value_cell(a.new.as_deref())) }
                                    }
                                }
                            }
                        }
                        details.raw {
                            summary { "Raw JSON" }
                            div.raw-pair {
                                div { h5 { "old" } pre.old-json { (c.old_json) } }
                                div { h5 { "new" } pre.new-json { (c.new_json) } }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn value_cell(value: Option<&str>) -> Markup {
    html! {
        @match value {
            Some(v) => code { (v) },
            None => span.unknown { "(absent)" },
        }
    }
}

/// The search form and what it found.
pub fn search_body(backend: &str, query: Option<&str>, found: Option<&Searched>) -> Markup {
    html! {
        form #search method="get" action={ "/ui/search/" (backend) } {
            label { "Resource address or type "
                input name="q" value=(query.unwrap_or("")) placeholder="aws_s3_bucket.logs" required;
            }
            button type="submit" { "Search" }
        }
        @if let Some(f) = found {
            p #search-scope {
                "Searched " (f.searched) " of " (f.readable) " workspaces you may read ("
                (size(f.bytes_read)) " of state)."
            }
            @if let Some(cut) = &f.cut { p #search-cut.note { "Not every state was searched: " (cut) "." } }
            @if f.hits.is_empty() { p #no-hits { "No state holds " code { (f.query) } "." } }
            @else {
                table #hits {
                    thead { tr { th { "workspace" } th { "resources" } } }
                    tbody {
                        @for h in &f.hits {
                            tr data-workspace=(h.workspace) {
                                td { a href={ "/ui/backends/" (backend) "/" (h.workspace) "/state" } { (h.workspace) } }
                                td {
                                    ul { @for a in &h.addresses { li { code { (a) } } } }
                                    @if h.matched > h.addresses.len() { small { (h.matched) " in all" } }
                                }
                            }
                        }
                    }
                }
            }
            @if !f.encrypted.is_empty() {
                p #search-encrypted.note {
                    "Encrypted by OpenTofu, not searchable here: "
                    @for (i, w) in f.encrypted.iter().enumerate() { @if i > 0 { ", " } (w) }
                }
            }
            @for (w, why) in &f.failed { p.error data-workspace=(w) { (w) ": " (why) } }
        }
    }
}

/// `GET /ui/backends/{backend}/{workspace}/state`.
pub(super) async fn state_page<S: Storage>(
    State(console): Shared<S>,
    Path((backend, workspace)): Path<(String, String)>,
    Query(wanted): Query<Wanted>,
    visitor: Visitor,
) -> Answer {
    let (app, caller) = (&console.app, visitor.caller());
    let page_no = wanted.page.unwrap_or(1);
    let viewed = view(
        app,
        &caller,
        &backend,
        &workspace,
        wanted.version(),
        page_no,
    )
    .await?;
    let title = format!("State of {backend}/{workspace}");
    Ok(page(&title, &visitor, state(&viewed)))
}

/// `GET /ui/search/{backend}`.
pub(super) async fn search_page<S: Storage>(
    State(console): Shared<S>,
    Path(backend): Path<String>,
    Query(asked): Query<Asked>,
    visitor: Visitor,
) -> Answer {
    let caller = visitor.caller();
    // The form alone until something is asked, but only for readers.
    let found = match asked.q.as_deref().filter(|q| !q.trim().is_empty()) {
        Some(q) => Some(search(&console.app, &caller, &backend, q).await?),
        None => {
            storage_of(&console.app, &caller, &backend, None)?;
            None
        }
    };
    let body = search_body(&backend, asked.q.as_deref(), found.as_ref());
    Ok(page(&format!("Search {backend}"), &visitor, body))
}
