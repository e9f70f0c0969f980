//! Plain Rust types an author works with, free of generated bindings.

use serde::{Deserialize, Serialize};

/// Terraform's `LockInfo`, serialised with Terraform's exact field names so a
/// lock written by a guest is readable by Terraform's own backends.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LockInfo {
    /// Unique lock id (a UUID chosen by the client).
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
    /// Path of the state, as the client reported it.
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

/// One configuration problem, reported to the operator at startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The key at fault, when one key is.
    pub key: Option<String>,
    /// What is wrong and how to fix it, in one line.
    pub message: String,
}

impl Diagnostic {
    /// A problem with one key.
    pub fn key(key: impl Into<String>, message: impl Into<String>) -> Self {
        Diagnostic {
            key: Some(key.into()),
            message: message.into(),
        }
    }

    /// A problem with the configuration as a whole.
    pub fn general(message: impl Into<String>) -> Self {
        Diagnostic {
            key: None,
            message: message.into(),
        }
    }
}
