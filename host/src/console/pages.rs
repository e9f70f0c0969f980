//! The console's HTML, built with maud (every value escaped by
//! construction). No script at all: admin actions are forms carrying the
//! session's CSRF token, so the Content-Security-Policy allows no script.

use super::data::{BackendView, Page, Versions, WorkspaceView};
use super::diff::StateDiff;
use crate::client::format_unix_ms;
use crate::marketplace::store::Installed;
use maud::{DOCTYPE, Markup, html};

/// Who is looking, for the header and the forms.
pub struct Viewer<'a> {
    /// User or token name; `None` when the server has no users.
    pub name: Option<&'a str>,
    /// The session's CSRF token, put in every form.
    pub csrf: &'a str,
}

fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// The frame every page shares.
pub fn layout(title: &str, viewer: &Viewer<'_>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) " · wasmstate" }
                link rel="stylesheet" href="/ui/assets/style.css";
            }
            body {
                header {
                    a.brand href="/ui/backends" { "wasmstate" }
                    nav {
                        a href="/ui/backends" { "Backends" }
                        a href="/ui/guests" { "Guests" }
                    }
                    @if let Some(name) = viewer.name {
                        form.signout method="post" action="/ui/logout" {
                            input type="hidden" name="csrf" value=(viewer.csrf);
                            span.who { (name) }
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    }
}

/// The sign-in form; after it, the browser goes to `next` (a console
/// path, checked by the caller).
pub fn login(message: Option<&str>, next: Option<&str>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "Sign in · wasmstate" }
                link rel="stylesheet" href="/ui/assets/style.css";
            }
            body {
                main.login {
                    h1 { "wasmstate" }
                    @if let Some(message) = message { p.error id="login-error" { (message) } }
                    form method="post" action="/ui/login" {
                        @if let Some(next) = next { input type="hidden" name="next" value=(next); }
                        label { "User " input id="user" name="user" autocomplete="username" required; }
                        label { "Password " input id="password" name="password" type="password" autocomplete="current-password" required; }
                        button id="sign-in" type="submit" { "Sign in" }
                    }
                }
            }
        }
    }
}

/// How long a lock has been held, to the minute (`3h 12m`, `4d 1h`).
fn held_for(seconds: u64) -> String {
    match seconds {
        0..60 => "under a minute".to_string(),
        _ => crate::backend::age_text(seconds - seconds % 60),
    }
}

fn pager(page: usize, pages: usize, base: &str) -> Markup {
    let join = if base.contains('?') { '&' } else { '?' };
    html! {
        @if pages > 1 {
            nav.pager {
                @if page > 1 { a rel="prev" href={ (base) (join) "page=" (page - 1) } { "← newer" } }
                span { "page " (page) " of " (pages) }
                @if page < pages { a rel="next" href={ (base) (join) "page=" (page + 1) } { "older →" } }
            }
        }
    }
}

/// Every backend the viewer may read.
pub fn backends(backends: &[BackendView]) -> Markup {
    html! {
        table #backends {
            thead { tr { th { "backend" } th { "guest" } th { "contract" } th { "sha256" } th { "signer" } th { "granted" } th { "limits and use" } } }
            tbody {
                @for b in backends {
                    tr data-backend=(b.name) {
                        td { a href={ "/ui/backends/" (b.name) } { (b.name) } }
                        @if let Some(d) = &b.description {
                            td { (d.guest) @if let Some(m) = &d.manifest { br; small { (m) } } }
                            td { (d.contract) }
                            td { code title=(d.sha256) { (d.sha256.get(..12).unwrap_or(&d.sha256)) "…" } }
                            td { (d.signer.as_deref().unwrap_or("unsigned")) }
                            td { ul { @for g in &d.granted { li { (g) } } } }
                            td { dl { @for (what, value) in &d.limits { dt { (what) } dd { (value) } } } }
                        } @else {
                            td colspan="6" { "not served by a guest" }
                        }
                    }
                }
            }
        }
    }
}

/// A backend's workspaces, with lock holders and force-unlock for admins.
pub fn workspaces(backend: &str, page: &Page<WorkspaceView>, viewer: &Viewer<'_>) -> Markup {
    html! {
        table #workspaces {
            thead { tr { th { "workspace" } th { "size" } th { "serial" } th { "lineage" } th { "last write" } th { "lock" } } }
            tbody {
                @for w in &page.items {
                    tr data-workspace=(w.name) {
                        td { a href={ "/ui/backends/" (backend) "/" (w.name) } { (w.name) } }
                        td.size {
                            @if let Some(error) = &w.error { span.error { (error) } }
                            @else { (w.size.map(size).unwrap_or_else(|| "-".into())) }
                        }
                        td.serial { (w.summary.serial.map(|s| s.to_string()).unwrap_or_default()) }
                        td.lineage { code { (w.summary.lineage.as_deref().unwrap_or("")) } }
                        td { (w.last_write_unix_ms.map(format_unix_ms).unwrap_or_else(|| "-".into())) }
                        td.lock {
                            @if let Some(lock) = &w.lock {
                                // Text and button side by side, the button
                                // on a line of its own when there is no room.
                                div.lock-cell {
                                    span.lock-text {
                                        span.holder { (lock.who) } " · " (lock.operation) " · since " (lock.created)
                                        @if let Some(age) = lock.age_seconds { " · held " span.age { (held_for(age)) } }
                                    }
                                    @if w.admin && !viewer.csrf.is_empty() {
                                        form.admin method="post" action={ "/ui/backends/" (backend) "/" (w.name) "/force-unlock" } {
                                            input type="hidden" name="csrf" value=(viewer.csrf);
                                            button.force-unlock type="submit" { "Force unlock" }
                                        }
                                    }
                                }
                            } @else { "unlocked" }
                        }
                    }
                }
            }
        }
        (pager(page.page, page.pages, &format!("/ui/backends/{backend}")))
    }
}

/// A workspace's versions, a form to compare two, the comparison, and
/// restore buttons for admins.
pub fn versions(
    backend: &str,
    workspace: &str,
    listed: &Versions,
    compared: Option<(&str, &str, &StateDiff)>,
    admin: bool,
    viewer: &Viewer<'_>,
) -> Markup {
    let here = format!("/ui/backends/{backend}/{workspace}");
    let page = &listed.page;
    html! {
        p #history-source { "Versions: " (listed.history.describe()) "." }
        p.links { a #view-state href={ (here) "/state" } { "What the current state holds" } }
        @if let Some((from, to, d)) = compared {
            section #diff {
                h2 { "From " code { (from) } " to " code { (to) } }
                @if d.added.is_empty() && d.removed.is_empty() && d.changed.is_empty() && d.outputs_changed.is_empty() {
                    p { "No resource or output changed." }
                }
                (changes("added", "Added", &d.added))
                (changes("removed", "Removed", &d.removed))
                (changes("changed", "Changed", &d.changed))
                (changes("outputs", "Outputs changed", &d.outputs_changed))
                (super::state_pages::instance_changes(&d.details, d.changed.len()))
            }
        }
        form #compare method="get" action=(here) {
            label { "From " input name="from" required placeholder="version id"; }
            label { "to " input name="to" value="current" required; }
            button type="submit" { "Compare" }
        }
        table #versions {
            thead { tr { th { "version" } th { "serial" } th { "written" } th { "by" } th { "size" } th { "" } } }
            tbody {
                @for v in &page.items {
                    tr data-version=(v.id) {
                        td { code { (v.id) } }
                        td.serial { (v.serial.map(|s| s.to_string()).unwrap_or_default()) }
                        td { (format_unix_ms(v.created_unix_ms)) }
                        td.by {
                            @match &v.written_by {
                                Some(who) => (who),
                                None => span.unknown title="not in this replica's audit trail" { "—" },
                            }
                        }
                        td { (size(v.bytes)) }
                        td {
                            a.compare href={ (here) "?from=" (query_value(&v.id)) "&to=current" } { "compare with current" }
                            " · "
                            a.view href={ (here) "/state?version=" (query_value(&v.id)) } { "view" }
                            @if admin {
                                form.admin method="post" action={ (here) "/restore" } {
                                    input type="hidden" name="csrf" value=(viewer.csrf);
                                    input type="hidden" name="version" value=(v.id);
                                    button.restore type="submit" { "Restore" }
                                }
                            }
                        }
                    }
                }
            }
        }
        (pager(page.page, page.pages, &here))
    }
}

/// A value for a query string: a version id comes from the guest's
/// history and may hold `&` or `#`.
fn query_value(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

fn changes(id: &str, title: &str, addresses: &[String]) -> Markup {
    html! {
        @if !addresses.is_empty() {
            h3 { (title) }
            ul id=(id) { @for a in addresses { li { code { (a) } } } }
        }
    }
}

/// The guests serving backends (manifest, asks beside grants, signature),
/// then every guest installed in the data directory.
pub fn guests(backends: &[BackendView], installed: &[Installed]) -> Markup {
    html! {
        h2 { "Serving backends" }
        table #guests {
            thead { tr { th { "guest" } th { "manifest" } th { "signature" } th { "asks for" } th { "granted (backend)" } } }
            tbody {
                @for b in backends {
                    @if let Some(d) = &b.description {
                        tr {
                            td { (d.guest) br; code { (d.sha256.get(..12).unwrap_or(&d.sha256)) "…" } }
                            td { (d.manifest.as_deref().unwrap_or("none")) br; small { "contract " (d.contract) } }
                            td { (d.signer.as_deref().map_or("unsigned".to_string(), |k| format!("signed by key {k}"))) }
                            td { ul { @for a in &d.asked { li { (a) } } } }
                            td { (b.name) ul { @for g in &d.granted { li { (g) } } } }
                        }
                    }
                }
            }
        }
        (installed_table(installed))
    }
}

fn installed_table(installed: &[Installed]) -> Markup {
    html! {
        h2 { "Installed" }
        @if installed.is_empty() {
            p { "No guest installed in this data directory (wasmstate guest install), or none you administer." }
        } @else {
            table #installed {
                thead { tr { th { "name" } th { "version" } th { "sha256" } th { "source" } th { "signature" } th { "size" } } }
                tbody {
                    @for g in installed {
                        tr {
                            td { (g.name) }
                            td { (g.version) }
                            td { code title=(g.sha256) { (g.sha256.get(..12).unwrap_or(&g.sha256)) "…" } }
                            td { (g.source) }
                            td { (g.signed_by.as_deref().map_or("unsigned".to_string(), |k| format!("signed by key {k}"))) }
                            td { (size(g.size)) }
                        }
                    }
                }
            }
        }
    }
}

/// A one-line message page (after an action, or for an error).
pub fn message(text: &str, back: &str) -> Markup {
    html! { p #message { (text) } p { a href=(back) { "Back" } } }
}
