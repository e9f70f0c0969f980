//! What the wasmstate host and its guest SDK share, kept in one place
//! because both are contracts: `LockInfo`'s JSON is what Terraform sends and
//! expects and what lock files and lock items hold, and the name rule is
//! what both enforce for workspaces.
#![deny(missing_docs)]

use serde::{Deserialize, Serialize};

/// Terraform's `LockInfo`, serialised with Terraform's exact field names
/// (`ID`, `Operation`, …) and order, so a lock written by wasmstate reads
/// as Terraform's own and the other way round.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LockInfo {
    /// Unique lock id chosen by the client (a UUID).
    #[serde(rename = "ID")]
    pub id: String,
    /// What the holder is doing, e.g. `OperationTypeApply`.
    #[serde(rename = "Operation", default)]
    pub operation: String,
    /// Free-form text from the holder.
    #[serde(rename = "Info", default)]
    pub info: String,
    /// `user@host` of the holder.
    #[serde(rename = "Who", default)]
    pub who: String,
    /// Terraform version of the holder.
    #[serde(rename = "Version", default)]
    pub version: String,
    /// RFC 3339 time the lock was taken.
    #[serde(rename = "Created", default)]
    pub created: String,
    /// Path of the state, as the client reported it (the S3 backend's is
    /// `<bucket>/<key>`).
    #[serde(rename = "Path", default)]
    pub path: String,
}

impl LockInfo {
    /// The lock as Terraform's JSON.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("LockInfo serialises")
    }

    /// Parse Terraform's JSON.
    pub fn from_json(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

pub mod git;
pub mod state;

/// The one rule for names that become path segments, file names and
/// storage keys (workspaces and backends).
pub mod names {
    /// Longest accepted name. Terraform's S3 backend keys and git branch names
    /// both stay comfortably within limits at this length.
    pub const MAX_NAME_LEN: usize = 90;

    /// Check a workspace or backend name: 1 to 90 characters of
    /// `A-Z a-z 0-9 . _ -`, not starting with `.` (which also excludes `.` and
    /// `..`). Returns a one-line reason when the name is refused.
    pub fn check_name(kind: &str, name: &str) -> Result<(), String> {
        if name.is_empty() {
            return Err(format!("{kind} name is empty"));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(format!(
                "{kind} name is {} characters long; the limit is {MAX_NAME_LEN}",
                name.len()
            ));
        }
        if name.starts_with('.') {
            return Err(format!("{kind} name {name:?} must not start with '.'"));
        }
        if let Some(bad) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(format!(
                "{kind} name {name:?} contains {bad:?}; use only letters, digits, '.', '_' and '-'"
            ));
        }
        Ok(())
    }

    #[cfg(test)]
    mod tests {
        use super::check_name;

        #[test]
        fn accepts_ordinary_names() {
            for name in ["default", "prod", "team-a_1.2", "X"] {
                assert!(check_name("workspace", name).is_ok(), "{name}");
            }
        }

        #[test]
        fn refuses_traversal_separators_and_control_characters() {
            for name in [
                "", ".", "..", ".hidden", "a/b", "a\\b", "a\nb", "a\0b", "ü", "a b",
            ] {
                assert!(check_name("workspace", name).is_err(), "{name:?}");
            }
            assert!(check_name("workspace", &"a".repeat(91)).is_err());
            assert!(check_name("workspace", &"a".repeat(90)).is_ok());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LockInfo;

    #[test]
    fn json_matches_terraform_field_names_and_order() {
        let info = LockInfo {
            id: "7c4d".into(),
            operation: "OperationTypeApply".into(),
            who: "me@host".into(),
            version: "1.11.4".into(),
            created: "2026-01-02T15:04:05Z".into(),
            ..LockInfo::default()
        };
        let json = String::from_utf8(info.to_json()).unwrap();
        assert_eq!(
            json,
            r#"{"ID":"7c4d","Operation":"OperationTypeApply","Info":"","Who":"me@host","Version":"1.11.4","Created":"2026-01-02T15:04:05Z","Path":""}"#
        );
        assert_eq!(LockInfo::from_json(json.as_bytes()).unwrap(), info);
        // OpenTofu's force-unlock body: only the ID matters.
        let tofu = LockInfo::from_json(br#"{"ID":"x","Created":"0001-01-01T00:00:00Z"}"#).unwrap();
        assert_eq!(tofu.id, "x");
    }
}
