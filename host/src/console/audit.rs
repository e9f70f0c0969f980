//! The console's audit page, `/ui/audit/{backend}`: the data directory's trails of
//! a backend, filtered by a form (admins of the backend, or of the
//! workspace the filter names).

use super::{Answer, Shared, Visitor, page};
use crate::audit::{Filter, Operation, Record};
use crate::backend::Storage;
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::response::IntoResponse;
use maud::{Markup, html};

pub(super) async fn audit_page<S: Storage>(
    State(console): Shared<S>,
    Path(backend): Path<String>,
    Query(filter): Query<Filter>,
    visitor: Visitor,
) -> Answer {
    let answer = console
        .app
        .audit_of(&visitor.caller(), &backend, filter.clone())
        .await?;
    let body = render(&backend, &filter, &answer.replica, &answer.records);
    Ok(page(&format!("Audit trail of {backend}"), &visitor, body))
}

pub(super) async fn audit_json<S: Storage>(
    State(console): Shared<S>,
    Path(backend): Path<String>,
    Query(filter): Query<Filter>,
    visitor: Visitor,
) -> Answer {
    let answer = console
        .app
        .audit_of(&visitor.caller(), &backend, filter)
        .await?;
    Ok(Json(answer).into_response())
}

fn render(backend: &str, filter: &Filter, replica: &str, records: &[Record]) -> Markup {
    let value = |v: &Option<String>| v.clone().unwrap_or_default();
    let chosen = filter.operation.as_deref().unwrap_or("");
    html! {
        form #audit-filter method="get" action={ "/ui/audit/" (backend) } {
            label { "Workspace " input name="workspace" value=(value(&filter.workspace)); }
            label { "Operation "
                select name="operation" {
                    option value="" selected[chosen.is_empty()] { "any" }
                    @for op in Operation::ALL {
                        option value=(op.name()) selected[chosen == op.name()] { (op.name()) }
                    }
                }
            }
            label { "Caller " input name="caller" value=(value(&filter.caller)); }
            label { "Since " input name="since" placeholder="2026-11-24" value=(value(&filter.since)); }
            label { "Until " input name="until" placeholder="2026-11-24" value=(value(&filter.until)); }
            label { input type="checkbox" name="refused" value="true" checked[filter.refused == Some(true)]; " refused only" }
            button type="submit" { "Filter" }
        }
        p.note { "Newest first, from the trails in replica " code { (replica) } "'s data directory: each replica writes its own." }
        table #audit {
            thead { tr { th { "time" } th { "workspace" } th { "operation" } th { "caller" } th { "serial" } th { "result" } } }
            tbody {
                @for r in records {
                    tr data-operation=(r.operation.name()) data-status=(r.status) {
                        td.time { (r.time) }
                        td { a href={ "/ui/backends/" (backend) "/" (r.workspace) } { (r.workspace) } }
                        td.operation { (r.operation.name()) }
                        td.caller {
                            (r.caller)
                            @for (name, claim) in &r.claims { br; small { (name) "=" (claim) } }
                        }
                        td.serial { (r.serials()) }
                        td.result {
                            span class=(if r.status >= 400 { "refused" } else { "ok" }) { (r.status) " " (r.result) }
                            @if let Some(holder) = &r.holder { br; small { "holder " (holder) } }
                            @if let Some(lock) = &r.lock { br; small { "lock " code { (lock) } } }
                        }
                    }
                }
            }
        }
        @if records.is_empty() { p #no-records { "No record matches." } }
    }
}
