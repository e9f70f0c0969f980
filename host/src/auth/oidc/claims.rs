//! Roles: which grants a token's claims earn.

use super::super::Grant;
use serde_json::Value;

/// One `[[oidc.roles]]`: every bound claim must match for its grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcRole {
    /// Claim name and pattern (`*` matches any run of characters).
    pub bound_claims: Vec<(String, String)>,
    /// What a matching token may do.
    pub grants: Vec<Grant>,
}

impl OidcRole {
    /// Whether every bound claim matches `claims`. A claim that is a list
    /// matches when one of its items does; a number or boolean is matched
    /// as written in JSON; a missing claim never matches.
    pub fn matches(&self, claims: &serde_json::Map<String, Value>) -> bool {
        self.bound_claims
            .iter()
            .all(|(name, pattern)| match claims.get(name) {
                Some(Value::Array(items)) => items.iter().any(|v| value_matches(pattern, v)),
                Some(value) => value_matches(pattern, value),
                None => false,
            })
    }
}

/// Claims the audit trail keeps when the config names none: who ran the
/// job and from where, as GitHub Actions and GitLab CI name it.
pub const DEFAULT_AUDIT_CLAIMS: [&str; 8] = [
    "repository",
    "ref",
    "actor",
    "workflow",
    "run_id",
    "project_path",
    "pipeline_id",
    "user_login",
];

/// The claims in `names` that `claims` carries, as text (a list's items
/// joined by commas), each cut to 200 characters: what an audit record
/// keeps of the caller.
pub fn kept<'a>(
    claims: &serde_json::Map<String, Value>,
    names: impl IntoIterator<Item = &'a str>,
) -> std::collections::BTreeMap<String, String> {
    let text = |value: &Value| match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    names
        .into_iter()
        .filter_map(|name| {
            let value = match claims.get(name)? {
                Value::Array(items) => items.iter().map(text).collect::<Vec<_>>().join(","),
                Value::Object(_) | Value::Null => return None,
                value => text(value),
            };
            Some((name.to_string(), value.chars().take(200).collect()))
        })
        .take(32)
        .collect()
}

fn value_matches(pattern: &str, value: &Value) -> bool {
    match value {
        Value::String(text) => glob(pattern, text),
        Value::Number(_) | Value::Bool(_) => glob(pattern, &value.to_string()),
        _ => false,
    }
}

/// `*` matches any run of characters (none included); everything else
/// itself. Linear: no backtracking blow-up on hostile claims.
pub fn glob(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("acme/infra", "acme/infra"));
        assert!(!glob("acme/infra", "acme/infra2"));
        assert!(glob("acme/*", "acme/infra"));
        assert!(!glob("acme/*", "evil/acme/infra"));
        assert!(glob("*", ""));
        assert!(glob("refs/heads/*", "refs/heads/main"));
        assert!(glob("a*b*c", "aXXbYYc"));
        assert!(!glob("a*b*c", "aXXcYYb"));
        assert!(!glob("ab*ba", "aba"), "the two ends may not overlap");
    }

    #[test]
    fn every_bound_claim_must_match_and_lists_match_any_item() {
        let role = OidcRole {
            bound_claims: vec![
                ("repository".into(), "acme/*".into()),
                ("ref".into(), "refs/heads/main".into()),
            ],
            grants: Vec::new(),
        };
        let claims = |json: Value| json.as_object().unwrap().clone();
        assert!(role.matches(&claims(
            serde_json::json!({"repository": "acme/infra", "ref": "refs/heads/main"})
        )));
        assert!(!role.matches(&claims(
            serde_json::json!({"repository": "acme/infra", "ref": "refs/heads/dev"})
        )));
        assert!(!role.matches(&claims(serde_json::json!({"repository": "acme/infra"}))));
        assert!(role.matches(&claims(
            serde_json::json!({"repository": ["x/y", "acme/a"], "ref": "refs/heads/main"})
        )));
    }
}
