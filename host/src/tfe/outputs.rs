//! Outputs of the current state: listed with sensitive values left out
//! (`null`), and one at a time with its value, which is what terraform asks
//! for each sensitive output it shows. The `outputs` role sees the outputs
//! that are not sensitive and nothing of the sensitive ones (they are left
//! out of its list, and refused one at a time), as its state download
//! leaves them out.

use super::jsonapi::{self, OutputAttributes, Resource, Single, TfeError};
use super::{Client, Tfe, ids, sees_all};
use crate::backend::Storage;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::Arc;

type Output = Resource<OutputAttributes>;

/// What this module reads of a state.
#[derive(Deserialize)]
struct Outputs {
    serial: Option<u64>,
    #[serde(default)]
    outputs: BTreeMap<String, StateOutput>,
    /// OpenTofu's client-side encryption: outputs cannot be seen.
    encrypted_data: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct StateOutput {
    #[serde(default)]
    value: serde_json::Value,
    #[serde(rename = "type", default)]
    detailed_type: serde_json::Value,
    #[serde(default)]
    sensitive: bool,
}

/// The outputs of the current state of `org`/`name`, and its serial;
/// `None` when it has no state.
async fn outputs<S: Storage>(
    tfe: &Tfe<S>,
    org: &str,
    name: &str,
) -> Result<Option<(u64, BTreeMap<String, StateOutput>)>, TfeError> {
    let target = tfe.app.target(org, name)?;
    let Some(state) = target
        .storage
        .read(name)
        .await
        .map_err(|e| target.error(e))?
    else {
        return Ok(None);
    };
    // Parsing a big state is the backend's host work, off the workers.
    let parsed = target
        .storage
        .host_work()
        .run_over(state, |s| serde_json::from_slice::<Outputs>(s).ok())
        .await
        .map_err(|e| target.error(e.into()))?;
    match parsed {
        Some(Outputs {
            serial: Some(serial),
            outputs,
            encrypted_data: None,
        }) => Ok(Some((serial, outputs))),
        _ => Err(TfeError::not_found(format!(
            "the state of {org}/{name} is not a plain Terraform state (encrypted by its client?): its outputs cannot be read here; use `terraform state pull`"
        ))),
    }
}

/// go-tfe's legacy coarse type for a cty type.
fn coarse(detailed: &serde_json::Value) -> String {
    let kind = match detailed {
        serde_json::Value::String(s) => s.as_str(),
        serde_json::Value::Array(a) => a.first().and_then(|k| k.as_str()).unwrap_or(""),
        _ => "",
    };
    match kind {
        "bool" => "boolean",
        "list" | "tuple" | "set" => "array",
        "map" | "object" => "hash",
        "number" => "number",
        _ => "string",
    }
    .to_string()
}

fn document(
    org: &str,
    name: &str,
    serial: u64,
    output: String,
    o: StateOutput,
    reveal: bool,
) -> Output {
    Resource {
        id: ids::output(org, name, serial, &output),
        kind: "state-version-outputs",
        attributes: OutputAttributes {
            coarse_type: coarse(&o.detailed_type),
            value: if o.sensitive && !reveal {
                serde_json::Value::Null
            } else {
                o.value
            },
            name: output,
            sensitive: o.sensitive,
            detailed_type: o.detailed_type,
        },
        relationships: None,
    }
}

/// `GET workspaces/{id}/current-state-version-outputs`: empty without a
/// state (terraform fails on a 404 here).
pub(super) async fn list<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path(id): Path<String>,
    client: Client,
    headers: HeaderMap,
) -> Result<Response, TfeError> {
    let caller = tfe.caller(&headers, client).await?;
    let (org, name) = tfe.by_id(&caller, &id).await?;
    let all = sees_all(&caller, &org, &name);
    let found: Vec<Output> = match outputs(&tfe, &org, &name).await? {
        None => Vec::new(),
        Some((serial, outputs)) => outputs
            .into_iter()
            .filter(|(_, o)| all || !o.sensitive)
            .map(|(output, o)| document(&org, &name, serial, output, o, false))
            .collect(),
    };
    let count = found.len().max(1);
    Ok(jsonapi::json(&jsonapi::page(found, 1, count)))
}

/// `GET state-version-outputs/{id}`: one output with its value, while the
/// state is at the serial its id names.
pub(super) async fn read<S: Storage>(
    State(tfe): State<Arc<Tfe<S>>>,
    Path(id): Path<String>,
    client: Client,
    headers: HeaderMap,
) -> Result<Response, TfeError> {
    let caller = tfe.caller(&headers, client).await?;
    let ((org, name), serial, output) =
        ids::parse_output(&id).ok_or_else(|| TfeError::not_found("no such output"))?;
    tfe.existing(&caller, &org, &name).await?;
    let gone = || {
        TfeError::not_found(format!(
            "output {output:?} is not in the current state of {org}/{name} at serial {serial}; list the outputs again"
        ))
    };
    let Some((current, mut outputs)) = outputs(&tfe, &org, &name).await? else {
        return Err(gone());
    };
    let Some(o) = outputs.remove(&output).filter(|_| current == serial) else {
        return Err(gone());
    };
    if o.sensitive && !sees_all(&caller, &org, &name) {
        return Err(TfeError::new(
            axum::http::StatusCode::FORBIDDEN,
            format!(
                "output {output:?} of {org}/{name} is sensitive: the outputs role does not see sensitive values (it needs the read role)"
            ),
        ));
    }
    let doc = document(&org, &name, serial, output.clone(), o, true);
    Ok(jsonapi::json(&Single { data: doc }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sensitive_values_are_left_out_of_lists_only() {
        let state: Outputs = serde_json::from_str(
            r#"{"serial":3,"outputs":{"s":{"value":"x","type":"string","sensitive":true}},"resources":[]}"#,
        )
        .unwrap();
        let (name, o) = state.outputs.into_iter().next().unwrap();
        let listed = document("b", "w", 3, name, o, false);
        assert_eq!(listed.attributes.value, serde_json::Value::Null);
        assert_eq!(listed.attributes.detailed_type, "string");
        assert_eq!(coarse(&serde_json::json!(["list", "string"])), "array");
    }
}
