//! Typed access to the backend's configuration table.

use crate::{Diagnostic, Error};
use std::collections::BTreeMap;
use std::str::FromStr;

/// The `[backends.NAME.config]` table from the operator's config file, as
/// string keys and values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    entries: BTreeMap<String, String>,
}

impl Config {
    /// Build from key/value pairs (the host's representation).
    pub fn from_pairs(pairs: impl IntoIterator<Item = (String, String)>) -> Self {
        Config {
            entries: pairs.into_iter().collect(),
        }
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries.get(key).map(String::as_str)
    }

    /// The value of `key`, or an [`Error::InvalidConfig`] saying it is missing.
    pub fn required(&self, key: &str) -> Result<&str, Error> {
        self.get(key).ok_or_else(|| {
            Error::InvalidConfig(vec![Diagnostic::key(
                key,
                format!("missing required key `{key}`"),
            )])
        })
    }

    /// The value of `key` parsed as `T`, or `default` when unset.
    pub fn parse_or<T: FromStr>(&self, key: &str, default: T) -> Result<T, Error>
    where
        T::Err: std::fmt::Display,
    {
        match self.get(key) {
            None => Ok(default),
            Some(raw) => raw.parse().map_err(|e: T::Err| {
                Error::InvalidConfig(vec![Diagnostic::key(
                    key,
                    format!("invalid value {raw:?} for `{key}`: {e}"),
                )])
            }),
        }
    }

    /// Fail with one diagnostic per key that is not in `known`, so typos are
    /// caught at startup instead of silently ignored.
    pub fn reject_unknown(&self, known: &[&str]) -> Result<(), Error> {
        let unknown: Vec<Diagnostic> = self
            .entries
            .keys()
            .filter(|k| !known.contains(&k.as_str()))
            .map(|k| {
                Diagnostic::key(
                    k.clone(),
                    format!("unknown key `{k}` (known keys: {})", known.join(", ")),
                )
            })
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidConfig(unknown))
        }
    }

    /// All keys and values.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}
