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
            println!("{}", json_line(record)?);
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

/// Whether `c` changes how a terminal shows what follows: a control
/// character, or a bidirectional override that reorders the line.
fn steers(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with control characters escaped: holders, claims and guests'
/// errors come from others, and must not drive the admin's terminal.
fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| match steers(c) {
            true => c.escape_default().collect::<Vec<_>>(),
            false => vec![c],
        })
        .collect()
}

/// A record as one JSON line, with the control characters serde_json
/// leaves as they are (DEL and C1, which some terminals obey) escaped too.
fn json_line(record: &Record) -> serde_json::Result<String> {
    let text = serde_json::to_string(record)?;
    Ok(text
        .chars()
        .map(|c| match steers(c) {
            true => format!("\\u{:04x}", c as u32),
            false => c.to_string(),
        })
        .collect())
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
    fn json_lines_escape_every_control_character_and_stay_json() {
        let mut record: crate::audit::Record = serde_json::from_str(
            r#"{"time":"t","replica":"r","caller":"c","backend":"b","workspace":"w",
                "operation":"write","status":200,"result":"ok"}"#,
        )
        .unwrap();
        record.result = "ok\u{9b}2J\u{7f}".into();
        let line = super::json_line(&record).unwrap();
        assert!(!line.chars().any(char::is_control), "{line}");
        let back: crate::audit::Record = serde_json::from_str(&line).unwrap();
        assert_eq!(back.result, record.result);
    }

    #[test]
    fn control_characters_never_reach_the_terminal() {
        let shown = super::printable("ci@runner\u{1b}[2K\rroot\n\u{202e}txt.exe");
        assert!(!shown.chars().any(super::steers), "{shown}");
        assert!(shown.contains("\\u{1b}[2K"), "{shown}");
    }
}
