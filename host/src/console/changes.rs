//! What changed inside a changed resource instance: the attributes that
//! differ, old and new, and the instance's JSON, with every attribute
//! Terraform marks sensitive (`sensitive_attributes`) masked in all of it.

use super::state_view::cut_text;
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// Most changed instances shown in detail in one comparison.
pub const MAX_DETAILED: usize = 50;
/// Most bytes of one attribute's value shown.
pub const VALUE_SHOWN_BYTES: usize = 1024;
/// Most bytes of an instance's JSON shown.
pub const JSON_SHOWN_BYTES: usize = 32 << 10;
/// What stands for a sensitive value.
pub const MASK: &str = "(sensitive)";

/// One attribute that differs.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct AttributeChange {
    /// Its name (top-level attribute).
    pub name: String,
    /// Its old value as JSON (cut), `None` when it was absent.
    pub old: Option<String>,
    /// Its new value as JSON (cut), `None` when it is gone.
    pub new: Option<String>,
    /// Sensitive in either version: both values are [`MASK`].
    pub sensitive: bool,
}

/// One changed instance, in detail.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct InstanceChange {
    /// Its address.
    pub address: String,
    /// The attributes that differ, by name.
    pub attributes: Vec<AttributeChange>,
    /// The older instance's attributes as JSON, sensitive ones masked (cut).
    pub old_json: String,
    /// The newer instance's attributes as JSON, sensitive ones masked (cut).
    pub new_json: String,
}

/// Which top-level attributes `sensitive_attributes` covers.
enum Sensitive {
    /// These, by name.
    Names(BTreeSet<String>),
    /// All of them: a path this reader does not understand masks all.
    All,
}

impl Sensitive {
    fn covers(&self, name: &str) -> bool {
        match self {
            Sensitive::Names(names) => names.contains(name),
            Sensitive::All => true,
        }
    }
}

/// Read Terraform's `sensitive_attributes`: a list of paths, each a list
/// of steps (`{"type":"get_attr","value":"password"}`); the first step
/// names the top-level attribute, which is masked whole.
fn sensitive(paths: Option<&Value>) -> Sensitive {
    let mut names = BTreeSet::new();
    let paths = match paths {
        None | Some(Value::Null) => return Sensitive::Names(names),
        Some(Value::Array(paths)) => paths,
        Some(_) => return Sensitive::All,
    };
    for path in paths {
        let step = match path {
            Value::Array(steps) => steps.first(),
            step @ Value::Object(_) => Some(step),
            _ => None,
        };
        match step {
            Some(Value::Object(step))
                if step.get("type").and_then(Value::as_str) == Some("get_attr") =>
            {
                match step.get("value").and_then(Value::as_str) {
                    Some(name) => names.insert(name.to_string()),
                    None => return Sensitive::All,
                };
            }
            _ => return Sensitive::All,
        }
    }
    Sensitive::Names(names)
}

/// `attributes` as a map (anything else under one name).
fn as_map(attributes: &Value) -> Map<String, Value> {
    match attributes {
        Value::Object(map) => map.clone(),
        Value::Null => Map::new(),
        other => Map::from_iter([("(attributes)".to_string(), other.clone())]),
    }
}

/// Shortest secret looked for in other attributes: shorter ones would
/// mask half of every instance.
const MIN_SECRET: usize = 4;
/// Most bytes of marked values looked for in one instance's other
/// attributes: past it (a marked map of thousands of values), every
/// attribute of the instance is masked rather than searched.
const MAX_SECRET_BYTES: usize = 1 << 20;

/// The text of a leaf as a secret or a place one may hide: strings as
/// they are (not JSON-escaped: a secret holding `"`, `\` or a newline, a
/// PEM key, must be found in its copies too), numbers as written.
fn leaf_text(value: &Value) -> Option<std::borrow::Cow<'_, str>> {
    match value {
        Value::String(s) => Some(std::borrow::Cow::Borrowed(s)),
        Value::Number(n) => Some(std::borrow::Cow::Owned(n.to_string())),
        _ => None,
    }
}

/// The strings and numbers inside the marked attributes of `map`.
fn secrets_of(map: &Map<String, Value>, marks: &Sensitive, into: &mut BTreeSet<String>) {
    fn leaves(value: &Value, into: &mut BTreeSet<String>) {
        match value {
            Value::Array(items) => items.iter().for_each(|v| leaves(v, into)),
            Value::Object(map) => map.values().for_each(|v| leaves(v, into)),
            leaf => {
                if let Some(text) = leaf_text(leaf).filter(|t| t.len() >= MIN_SECRET) {
                    into.insert(text.into_owned());
                }
            }
        }
    }
    for (name, value) in map {
        if marks.covers(name) {
            leaves(value, into);
        }
    }
}

/// Finds marked values inside other values: one pass over each value
/// whatever the number of secrets (Aho-Corasick), or "everything holds
/// one" when there are too many to look for.
enum Finder {
    Nothing,
    Some(aho_corasick::AhoCorasick),
    Everything,
}

impl Finder {
    fn new(secrets: &BTreeSet<String>) -> Finder {
        if secrets.is_empty() {
            return Finder::Nothing;
        }
        if secrets.iter().map(String::len).sum::<usize>() > MAX_SECRET_BYTES {
            return Finder::Everything;
        }
        match aho_corasick::AhoCorasick::new(secrets) {
            Ok(finder) => Finder::Some(finder),
            // Too large to build: masking all is the safe answer.
            Err(_) => Finder::Everything,
        }
    }

    /// Whether `value` holds a secret in a string, a number or a key.
    fn in_value(&self, value: &Value) -> bool {
        let finder = match self {
            Finder::Nothing => return false,
            Finder::Everything => return true,
            Finder::Some(finder) => finder,
        };
        fn look(finder: &aho_corasick::AhoCorasick, value: &Value) -> bool {
            match value {
                Value::Array(items) => items.iter().any(|v| look(finder, v)),
                Value::Object(map) => map
                    .iter()
                    .any(|(k, v)| finder.is_match(k.as_str()) || look(finder, v)),
                leaf => leaf_text(leaf).is_some_and(|t| finder.is_match(t.as_ref())),
            }
        }
        look(finder, value)
    }
}

fn shown(value: &Value, max: usize, pretty: bool) -> String {
    let text = match pretty {
        true => serde_json::to_string_pretty(value),
        false => serde_json::to_string(value),
    }
    .unwrap_or_default();
    match cut_text(&text, max) {
        (whole, false) => whole.to_string(),
        (part, true) => format!("{part}… (cut at {} KiB)", max >> 10),
    }
}

/// The details of the instance at `address`, from its old and new
/// attributes and `sensitive_attributes`. An attribute is masked in both
/// versions when either marks it, or when it holds a marked value:
/// Terraform marks only where a secret went in (`terraform_data`'s
/// `output` copies its marked `input`, unmarked). Each value is searched
/// once for all the marked ones; past 1 MiB of them, every
/// attribute is masked.
pub fn instance_change(
    address: &str,
    old: (&Value, Option<&Value>),
    new: (&Value, Option<&Value>),
) -> InstanceChange {
    let marks = [sensitive(old.1), sensitive(new.1)];
    let (old_map, new_map) = (as_map(old.0), as_map(new.0));
    let mut secrets = BTreeSet::new();
    secrets_of(&old_map, &marks[0], &mut secrets);
    secrets_of(&new_map, &marks[1], &mut secrets);
    let finder = Finder::new(&secrets);
    let names: BTreeSet<&String> = old_map.keys().chain(new_map.keys()).collect();
    // Decided once per attribute: each value is searched once.
    let hidden: BTreeSet<&String> = names
        .iter()
        .copied()
        .filter(|name| {
            marks.iter().any(|m| m.covers(name))
                || old_map.get(*name).is_some_and(|v| finder.in_value(v))
                || new_map.get(*name).is_some_and(|v| finder.in_value(v))
        })
        .collect();
    let secret = |name: &String| hidden.contains(name);
    let attributes = names
        .into_iter()
        // Compared unmasked: a secret that changed is a change, shown masked.
        .filter(|name| old_map.get(*name) != new_map.get(*name))
        .map(|name| {
            let hidden = secret(name);
            let value = |map: &Map<String, Value>| {
                map.get(name).map(|v| match hidden {
                    true => MASK.to_string(),
                    false => shown(v, VALUE_SHOWN_BYTES, false),
                })
            };
            AttributeChange {
                name: name.clone(),
                old: value(&old_map),
                new: value(&new_map),
                sensitive: hidden,
            }
        })
        .collect();
    let masked = |map: &Map<String, Value>| -> Value {
        Value::Object(
            map.iter()
                .map(|(k, v)| match secret(k) {
                    true => (k.clone(), Value::String(MASK.into())),
                    false => (k.clone(), v.clone()),
                })
                .collect(),
        )
    };
    InstanceChange {
        address: address.to_string(),
        attributes,
        old_json: shown(&masked(&old_map), JSON_SHOWN_BYTES, true),
        new_json: shown(&masked(&new_map), JSON_SHOWN_BYTES, true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_what_differs_and_masks_what_is_sensitive() {
        let old = json!({"id": "1", "input": "one", "password": "old-secret", "same": [1]});
        let new = json!({"id": "1", "input": "two", "password": "new-secret", "same": [1], "added": true});
        let marks = json!([[{"type": "get_attr", "value": "password"}]]);
        let change = instance_change(
            "terraform_data.b",
            (&old, Some(&marks)),
            (&new, Some(&marks)),
        );
        let names: Vec<&str> = change.attributes.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["added", "input", "password"]);
        let input = &change.attributes[1];
        assert_eq!(
            (input.old.as_deref(), input.new.as_deref()),
            (Some("\"one\""), Some("\"two\""))
        );
        assert_eq!(change.attributes[0].old, None);
        let password = &change.attributes[2];
        assert!(password.sensitive);
        assert_eq!(password.new.as_deref(), Some(MASK));
        let everything = serde_json::to_string(&change).unwrap();
        assert!(!everything.contains("secret"), "{everything}");
        assert!(change.new_json.contains("\"two\""), "{}", change.new_json);
    }

    #[test]
    fn marked_in_one_version_is_masked_in_both() {
        let old = json!({"token": "before-it-was-marked"});
        let new = json!({"token": "after"});
        let marks = json!([[{"type": "get_attr", "value": "token"}, {"type": "index", "value": {"value": 0, "type": "number"}}]]);
        let change = instance_change("x.y", (&old, None), (&new, Some(&marks)));
        let everything = serde_json::to_string(&change).unwrap();
        assert!(
            !everything.contains("before-it") && !everything.contains("after"),
            "{everything}"
        );
    }

    #[test]
    fn copies_of_a_marked_value_are_masked_too() {
        // As Terraform writes terraform_data with a sensitive input.
        let old = json!({"input": {"value": "first-secret", "type": "string"}, "output": {"value": "first-secret", "type": "string"}, "id": "i"});
        let new = json!({"input": {"value": "second-secret", "type": "string"}, "output": {"value": "second-secret", "type": "string"}, "id": "i"});
        let marks = json!([[{"type": "get_attr", "value": "input"}]]);
        let change = instance_change(
            "terraform_data.s",
            (&old, Some(&marks)),
            (&new, Some(&marks)),
        );
        assert_eq!(change.attributes.len(), 2);
        assert!(change.attributes.iter().all(|a| a.sensitive));
        let everything = serde_json::to_string(&change).unwrap();
        assert!(!everything.contains("secret"), "{everything}");
        assert!(
            change.old_json.contains("\"id\": \"i\""),
            "{}",
            change.old_json
        );
    }

    #[test]
    fn marks_it_cannot_read_mask_everything() {
        let old = json!({"a": "x1"});
        let new = json!({"a": "x2"});
        let change = instance_change("x.y", (&old, Some(&json!(["a.b"]))), (&new, None));
        assert!(change.attributes[0].sensitive);
        assert!(!serde_json::to_string(&change).unwrap().contains("x1"));
    }

    /// A marked `password` whose value a provider copies into a computed
    /// attribute (a connection string). Secrets holding characters JSON
    /// escapes (a quote, a backslash, the newlines of a PEM key) were
    /// looked for in the copy's escaped JSON text, so never found, and
    /// marked numbers were not looked for at all: the copy was shown.
    #[test]
    fn copies_of_secrets_json_escapes_or_numbers_are_masked() {
        for secret in [
            json!("pa\"ss\\word-1"),
            json!("-----BEGIN KEY-----\nMIIEpAIBAAKCAQEA\n-----END KEY-----\n"),
            json!(48213977),
        ] {
            let text = match &secret {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let instance = |id: &str| {
                json!({"id": id, "password": secret,
                       "connection": format!("postgres://app:{text}@db:5432/app")})
            };
            let marks = json!([[{"type": "get_attr", "value": "password"}]]);
            let change = instance_change(
                "db.main",
                (&instance("a"), Some(&marks)),
                (&instance("b"), Some(&marks)),
            );
            let output = serde_json::to_string(&change).unwrap();
            let escaped = serde_json::to_string(&secret).unwrap();
            let escaped = escaped.trim_matches('"');
            for shown in [&change.old_json, &change.new_json, &output] {
                assert!(
                    !shown.contains(escaped) && !shown.contains(text.as_str()),
                    "{secret} leaked: {shown}"
                );
            }
            assert!(
                change.new_json.contains("\"connection\": \"(sensitive)\""),
                "{}",
                change.new_json
            );
        }
    }

    /// A marked map of 50,000 values and a changed 1 MiB attribute: each
    /// value of the instance was searched once per secret (and again per
    /// use), minutes of a core holding the server's one comparison slot.
    #[test]
    fn many_secrets_cost_one_pass_and_too_many_mask_everything() {
        let secrets: Map<String, Value> = (0..50_000)
            .map(|i| (format!("k{i}"), json!(format!("s{i:07}"))))
            .collect();
        let marks = json!([[{"type": "get_attr", "value": "data"}]]);
        let big = |c: &str| json!({"data": secrets, "blob": c.repeat(1 << 20), "id": "x"});
        let started = std::time::Instant::now();
        let change = instance_change("k.s", (&big("a"), Some(&marks)), (&big("b"), Some(&marks)));
        let took = started.elapsed();
        assert!(took < std::time::Duration::from_secs(3), "took {took:?}");
        let blob = &change.attributes[0];
        assert_eq!(blob.name, "blob");
        assert!(!blob.sensitive, "no secret in it");
        // Past MAX_SECRET_BYTES of marked values, nothing is shown.
        let many: Map<String, Value> = (0..100_000)
            .map(|i| (format!("k{i}"), json!(format!("secret-{i:08}"))))
            .collect();
        let old = json!({"data": many, "plain": "one"});
        let new = json!({"data": many, "plain": "two"});
        let change = instance_change("k.s", (&old, Some(&marks)), (&new, Some(&marks)));
        assert!(change.attributes.iter().all(|a| a.sensitive));
        assert!(!change.new_json.contains("two") && !change.new_json.contains("secret-"));
    }
}
