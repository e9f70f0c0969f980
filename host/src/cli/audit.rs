//! `wasmstate audit`: search a running server's audit trail.

use super::RemoteArgs;
use crate::audit::Record;

/// Which records `wasmstate audit` prints.
#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    /// Only this workspace.
    #[arg(long, short)]
    workspace: Option<String>,
    /// Only this operation: write, delete, lock, lock-takeover, unlock,
    /// force-unlock, restore, workspace-create, workspace-delete.
    #[arg(long)]
    operation: Option<String>,
    /// Only callers whose name contains this (`alice`, `oidc:github`).
    #[arg(long)]
    caller: Option<String>,
    /// Only from this time on: `2026-11-24`, or `2026-11-24T09:00:00Z`.
    #[arg(long)]
    since: Option<String>,
    /// Only up to this time; a day means the whole day.
    #[arg(long)]
    until: Option<String>,
    /// Only refused changes (4xx, 5xx).
    #[arg(long)]
    refused: bool,
    /// At most this many records, newest first (up to 1000).
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Print the records as JSON lines, every field.
    #[arg(long)]
    json: bool,
}

impl AuditArgs {
    fn query(&self) -> Vec<(&'static str, String)> {
        let mut query = vec![("limit", self.limit.to_string())];
        let fields = [
            ("workspace", &self.workspace),
            ("operation", &self.operation),
            ("caller", &self.caller),
            ("since", &self.since),
            ("until", &self.until),
        ];
        query.extend(
            fields
                .into_iter()
                .filter_map(|(k, v)| Some((k, v.clone()?))),
        );
        if self.refused {
            query.push(("refused", "true".into()));
        }
        query
    }
}

/// Print the records `args` asks for, from the server `remote` names.
pub async fn run(args: AuditArgs, remote: RemoteArgs) -> anyhow::Result<()> {
    let answer = remote
        .client()?
        .audit(&remote.backend, &args.query())
        .await?;
    if args.json {
        for record in &answer.records {
            println!("{}", serde_json::to_string(record)?);
        }
        return Ok(());
    }
    println!(
        "{:<24} {:<16} {:<16} {:<28} {:>13}  result",
        "time", "workspace", "operation", "caller", "serial"
    );
    for record in &answer.records {
        println!("{}", line(record));
    }
    eprintln!(
        "{} record(s) from the trails in replica {:?}'s data directory (each replica writes its own)",
        answer.records.len(),
        answer.replica
    );
    Ok(())
}

/// `text` with control characters escaped: holders, claims and guests'
/// errors come from others, and must not drive the admin's terminal.
fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| match c.is_control() {
            true => c.escape_default().collect::<Vec<_>>(),
            false => vec![c],
        })
        .collect()
}

/// One record as a table row.
fn line(record: &Record) -> String {
    let serial = match record.serials() {
        none if none.is_empty() => "-".to_string(),
        serials => serials,
    };
    let mut result = format!("{} {}", record.status, record.result);
    if let Some(holder) = &record.holder {
        result.push_str(&format!(" (holder {holder})"));
    }
    let claims: Vec<String> = record
        .claims
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if !claims.is_empty() {
        result.push_str(&format!(" [{}]", claims.join(" ")));
    }
    printable(&format!(
        "{:<24} {:<16} {:<16} {:<28} {:>13}  {result}",
        record.time,
        record.workspace,
        record.operation.name(),
        record.caller,
        serial
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn control_characters_never_reach_the_terminal() {
        let shown = super::printable("ci@runner\u{1b}[2K\rroot\n");
        assert!(!shown.chars().any(char::is_control), "{shown}");
        assert!(shown.contains("\\u{1b}[2K"), "{shown}");
    }
}
