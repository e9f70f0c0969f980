//! What changed between two Terraform states, by resource instance address
//! (`module.net.aws_subnet.a["x"]`, as `terraform state list` prints it)
//! and by output name. Reads Terraform's state JSON (format 4) with serde;
//! anything else (an OpenTofu encrypted state, say) is not a diffable state.

use super::changes::{InstanceChange, MAX_DETAILED, instance_change};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// The differences between two states.
#[derive(Debug, Default, Serialize, PartialEq, Eq)]
pub struct StateDiff {
    /// Resource instances only in the newer state.
    pub added: Vec<String>,
    /// Resource instances only in the older state.
    pub removed: Vec<String>,
    /// Resource instances in both whose attributes differ.
    pub changed: Vec<String>,
    /// Outputs added, removed or changed, by name.
    pub outputs_changed: Vec<String>,
    /// The first [`MAX_DETAILED`] changed instances: their attributes that
    /// differ, old and new, sensitive ones masked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<InstanceChange>,
}

#[derive(Deserialize)]
struct State {
    #[serde(default)]
    resources: Vec<Resource>,
    #[serde(default)]
    outputs: BTreeMap<String, Value>,
}

#[derive(Deserialize)]
struct Resource {
    module: Option<String>,
    #[serde(default)]
    mode: String,
    #[serde(rename = "type")]
    kind: String,
    name: String,
    #[serde(default)]
    instances: Vec<Instance>,
}

#[derive(Deserialize)]
struct Instance {
    index_key: Option<Value>,
    #[serde(default)]
    attributes: Value,
    /// Terraform's marks of sensitive attributes, to mask them.
    sensitive_attributes: Option<Value>,
}

/// Every resource instance of a state by address, with its attributes.
fn instances(state: &State) -> BTreeMap<String, &Instance> {
    let mut all = BTreeMap::new();
    for resource in &state.resources {
        let mut base = String::new();
        if let Some(module) = &resource.module {
            base.push_str(module);
            base.push('.');
        }
        if resource.mode == "data" {
            base.push_str("data.");
        }
        base.push_str(&format!("{}.{}", resource.kind, resource.name));
        for instance in &resource.instances {
            let address = match &instance.index_key {
                None => base.clone(),
                // Terraform prints string keys quoted, numbers bare.
                Some(Value::String(key)) => format!("{base}[{}]", Value::String(key.clone())),
                Some(key) => format!("{base}[{key}]"),
            };
            all.insert(address, instance);
        }
    }
    all
}

/// Parse a state for diffing; `Err` says in one line why it is not one.
/// Read twice from the bytes (a header that skips everything, then the
/// state itself), never as a whole `Value` tree and then again typed.
fn parse(bytes: &[u8]) -> Result<State, String> {
    #[derive(Deserialize)]
    struct Head {
        version: Option<u64>,
        encryption_version: Option<serde::de::IgnoredAny>,
    }
    let head: Head = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    if head.encryption_version.is_some() {
        return Err("encrypted by OpenTofu: only its clients can read it".into());
    }
    if head.version != Some(4) {
        return Err("not a Terraform state of format 4".into());
    }
    serde_json::from_slice(bytes).map_err(|e| format!("not a Terraform state: {e}"))
}

/// What changed from `older` to `newer`.
pub fn diff(older: &[u8], newer: &[u8]) -> Result<StateDiff, String> {
    let (older, newer) = (parse(older)?, parse(newer)?);
    let (before, after) = (instances(&older), instances(&newer));
    let mut result = StateDiff::default();
    for (address, new) in &after {
        match before.get(address) {
            None => result.added.push(address.clone()),
            Some(old) if old.attributes != new.attributes => {
                if result.details.len() < MAX_DETAILED {
                    result.details.push(instance_change(
                        address,
                        (&old.attributes, old.sensitive_attributes.as_ref()),
                        (&new.attributes, new.sensitive_attributes.as_ref()),
                    ));
                }
                result.changed.push(address.clone());
            }
            Some(_) => {}
        }
    }
    result.removed = before
        .keys()
        .filter(|a| !after.contains_key(*a))
        .cloned()
        .collect();
    // A set: names come from both states, each once, sorted.
    let names: std::collections::BTreeSet<&String> =
        older.outputs.keys().chain(newer.outputs.keys()).collect();
    result.outputs_changed = names
        .into_iter()
        .filter(|name| older.outputs.get(*name) != newer.outputs.get(*name))
        .cloned()
        .collect();
    Ok(result)
}

/// The few things a workspace list shows of a state.
#[derive(Debug, Default, Serialize, Clone, PartialEq, Eq)]
pub struct Summary {
    /// `serial`.
    pub serial: Option<u64>,
    /// `lineage`.
    pub lineage: Option<String>,
}

/// Summarise a state from its beginning (it may be cut anywhere after
/// `serial` and `lineage`, which Terraform and OpenTofu write first).
pub fn summary(prefix: &[u8]) -> Summary {
    match crate::statefile::version_in_prefix(prefix) {
        Some((lineage, serial)) => Summary {
            serial: Some(serial),
            lineage: Some(lineage),
        },
        None => Summary::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::diff;

    fn state(resources: &str, outputs: &str) -> Vec<u8> {
        format!(r#"{{"version":4,"serial":1,"lineage":"l","resources":[{resources}],"outputs":{{{outputs}}}}}"#)
            .into_bytes()
    }

    const A: &str = r#"{"mode":"managed","type":"terraform_data","name":"a","instances":[{"attributes":{"input":"1"}}]}"#;
    const B: &str = r#"{"mode":"managed","type":"terraform_data","name":"b","instances":[{"index_key":0,"attributes":{"input":"x"}},{"index_key":1,"attributes":{"input":"y"}}]}"#;
    const B2: &str = r#"{"mode":"managed","type":"terraform_data","name":"b","instances":[{"index_key":0,"attributes":{"input":"x"}},{"index_key":1,"attributes":{"input":"CHANGED"}}]}"#;
    const C: &str = r#"{"module":"module.net","mode":"data","type":"http","name":"c","instances":[{"index_key":"k","attributes":{}}]}"#;

    #[test]
    fn names_added_removed_and_changed_instances_by_address() {
        let older = state(&format!("{A},{B}"), r#""o":{"value":1,"type":"number"}"#);
        let newer = state(
            &format!("{B2},{C}"),
            r#""o":{"value":2,"type":"number"},"p":{"value":"x","type":"string"}"#,
        );
        let d = diff(&older, &newer).unwrap();
        assert_eq!(d.added, vec![r#"module.net.data.http.c["k"]"#]);
        assert_eq!(d.removed, vec!["terraform_data.a"]);
        assert_eq!(d.changed, vec!["terraform_data.b[1]"]);
        assert_eq!(
            d.details[0].attributes[0].new.as_deref(),
            Some("\"CHANGED\"")
        );
        assert_eq!(d.outputs_changed, vec!["o", "p"]);
    }

    #[test]
    fn identical_states_differ_in_nothing() {
        let s = state(A, "");
        assert_eq!(diff(&s, &s).unwrap(), super::StateDiff::default());
    }

    #[test]
    fn encrypted_states_are_not_diffed() {
        let tofu = br#"{"serial":1,"lineage":"l","encrypted_data":"x","encryption_version":"v0"}"#;
        let err = diff(tofu, tofu).unwrap_err();
        assert!(err.contains("encrypted by OpenTofu"), "{err}");
    }
}
