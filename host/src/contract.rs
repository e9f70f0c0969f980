//! The contract between host and guests: which WIT package versions a
//! component may export to be served here. Plain names, no wasmtime: the
//! marketplace checks it at install time, the runtime before linking.

/// The WIT package version this host implements natively (`wit/`).
pub const WIT_VERSION: &str = "0.3.0";
/// The WIT package guests export.
pub const PACKAGE: &str = "wasmstate:backend";

/// A contract version this host runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContractVersion {
    /// The current one: a write is one compare-and-swap of the storage
    /// (`storage.head`, `expect`), which also keeps workspace metadata.
    V0_3_0,
    /// States move in chunks, or between the host and a WASI stream
    /// (`copy-to`, `copy-from`); frozen in `wit/since_v0.2.1`, served
    /// through an adapter: no conditional write, no metadata.
    V0_2_1,
    /// States move in chunks; a subset of 0.2.1, served by the same
    /// adapter (the component model links semver-compatible names).
    V0_2_0,
    /// The first release, frozen in `wit/since_v0.1.0`: states move whole.
    V0_1_0,
}

impl ContractVersion {
    /// Every supported version, newest first.
    pub const ALL: [ContractVersion; 4] = [
        ContractVersion::V0_3_0,
        ContractVersion::V0_2_1,
        ContractVersion::V0_2_0,
        ContractVersion::V0_1_0,
    ];

    /// The WIT package version, e.g. `0.2.0`.
    pub fn as_str(self) -> &'static str {
        match self {
            ContractVersion::V0_3_0 => "0.3.0",
            ContractVersion::V0_2_1 => "0.2.1",
            ContractVersion::V0_2_0 => "0.2.0",
            ContractVersion::V0_1_0 => "0.1.0",
        }
    }

    /// How `guest inspect` describes it.
    pub fn describe(self) -> String {
        match self {
            ContractVersion::V0_3_0 => format!("{} (current)", self.as_str()),
            ContractVersion::V0_2_1 | ContractVersion::V0_2_0 => format!(
                "{} (supported; no conditional writes: the host takes the lock for each unlocked \
                 write and keeps workspace metadata on each replica)",
                self.as_str()
            ),
            v => format!(
                "{} (supported; states pass whole, so the guest holds each one in its memory)",
                v.as_str()
            ),
        }
    }
}

impl std::fmt::Display for ContractVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The contract version a component's `names` (its exports) implement;
/// refuses, before instantiation, one built for no version this host runs,
/// naming the versions.
pub fn check_version(names: &[String]) -> anyhow::Result<ContractVersion> {
    for version in ContractVersion::ALL {
        let storage = format!("{PACKAGE}/storage@{version}");
        if !names.contains(&storage) {
            continue;
        }
        // `history` joined the contract before the first release; a guest
        // built earlier lacks it.
        for interface in ["workspaces", "history", "config"] {
            let export = format!("{PACKAGE}/{interface}@{version}");
            if !names.contains(&export) {
                anyhow::bail!(
                    "guest does not export {export}; rebuild it against the current wasmstate-guest SDK"
                );
            }
        }
        return Ok(version);
    }
    let supported = ContractVersion::ALL.map(ContractVersion::as_str).join(", ");
    let prefix = format!("{PACKAGE}/storage@");
    if let Some(found) = names.iter().find_map(|n| n.strip_prefix(&prefix)) {
        anyhow::bail!(
            "guest is built for {PACKAGE}@{found}, but this host supports {PACKAGE}@{supported}; \
             rebuild it against a matching wasmstate-guest SDK"
        );
    }
    anyhow::bail!(
        "not a wasmstate guest: it does not export {PACKAGE}/storage@{WIT_VERSION} (it exports: {})",
        if names.is_empty() {
            "nothing".to_string()
        } else {
            names.join(", ")
        }
    )
}

#[cfg(test)]
mod tests {
    use super::{ContractVersion, WIT_VERSION, check_version};

    fn exports(version: &str) -> Vec<String> {
        ["storage", "workspaces", "history", "config"]
            .iter()
            .map(|i| format!("wasmstate:backend/{i}@{version}"))
            .collect()
    }

    #[test]
    fn accepts_every_supported_version() {
        for (version, expected) in [
            ("0.3.0", ContractVersion::V0_3_0),
            ("0.2.1", ContractVersion::V0_2_1),
            ("0.2.0", ContractVersion::V0_2_0),
            ("0.1.0", ContractVersion::V0_1_0),
        ] {
            assert_eq!(check_version(&exports(version)).unwrap(), expected);
            assert_eq!(expected.as_str(), version);
            assert_eq!(expected.to_string(), version);
        }
        for version in ["0.3.0", "0.2.0"] {
            let msg = check_version(&exports(version)[..2])
                .unwrap_err()
                .to_string();
            assert!(
                msg.contains(&format!("history@{version}")) && msg.contains("rebuild"),
                "{msg}"
            );
        }
    }

    #[test]
    fn the_current_version_is_the_wit_one_and_first() {
        assert_eq!(WIT_VERSION, "0.3.0");
        assert_eq!(ContractVersion::ALL[0].as_str(), WIT_VERSION);
        let all = ContractVersion::ALL.map(ContractVersion::as_str);
        assert_eq!(all, ["0.3.0", "0.2.1", "0.2.0", "0.1.0"], "newest first");
    }

    #[test]
    fn inspect_says_what_each_version_lacks() {
        assert_eq!(ContractVersion::V0_3_0.describe(), "0.3.0 (current)");
        for old in [ContractVersion::V0_2_1, ContractVersion::V0_2_0] {
            let said = old.describe();
            assert!(said.starts_with(&format!("{old} (supported; ")), "{said}");
            assert!(
                said.contains("no conditional writes") && said.contains("metadata"),
                "{said}"
            );
        }
        let said = ContractVersion::V0_1_0.describe();
        assert!(said.contains("states pass whole"), "{said}");
    }

    #[test]
    fn names_the_versions_when_they_differ() {
        let names = vec!["wasmstate:backend/storage@9.0.0".to_string()];
        let msg = check_version(&names).unwrap_err().to_string();
        assert!(msg.contains("wasmstate:backend@9.0.0"), "{msg}");
        assert!(
            msg.contains("wasmstate:backend@0.3.0, 0.2.1, 0.2.0, 0.1.0"),
            "{msg}"
        );
        // A 0.2.x minor this host never knew (0.2.2) is refused, naming
        // what is served.
        let names = exports("0.2.2");
        let msg = check_version(&names).unwrap_err().to_string();
        assert!(msg.contains("wasmstate:backend@0.2.2"), "{msg}");
    }

    #[test]
    fn says_when_a_component_is_no_guest_at_all() {
        let names = vec!["wasi:cli/run@0.2.0".to_string()];
        let msg = check_version(&names).unwrap_err().to_string();
        assert!(msg.starts_with("not a wasmstate guest"), "{msg}");
        assert!(msg.contains("storage@0.3.0"), "{msg}");
    }
}
