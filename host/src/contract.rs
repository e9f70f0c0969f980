//! The contract between host and guests: which WIT package and version a
//! component must export to be served here. Plain names, no wasmtime: the
//! marketplace checks it at install time, the runtime before linking.

/// The WIT package version this host implements.
pub const WIT_VERSION: &str = "0.1.0";
/// The WIT package guests export.
pub const PACKAGE: &str = "wasmstate:backend";

/// Refuse, before instantiation, a component that was not built for this
/// host's contract, naming both versions.
pub fn check_version(names: &[String]) -> anyhow::Result<()> {
    let wanted = format!("{PACKAGE}/storage@{WIT_VERSION}");
    if names.contains(&wanted) {
        // `history` joined the contract before the first release; a guest
        // built earlier lacks it.
        for interface in ["workspaces", "history", "config"] {
            let export = format!("{PACKAGE}/{interface}@{WIT_VERSION}");
            if !names.contains(&export) {
                anyhow::bail!(
                    "guest does not export {export}; rebuild it against the current wasmstate-guest SDK"
                );
            }
        }
        return Ok(());
    }
    let prefix = format!("{PACKAGE}/storage@");
    if let Some(found) = names.iter().find_map(|n| n.strip_prefix(&prefix)) {
        anyhow::bail!(
            "guest is built for {PACKAGE}@{found}, but this host supports {PACKAGE}@{WIT_VERSION}; \
             rebuild it against a matching wasmstate-guest SDK"
        );
    }
    anyhow::bail!(
        "not a wasmstate guest: it does not export {wanted} (it exports: {})",
        if names.is_empty() {
            "nothing".to_string()
        } else {
            names.join(", ")
        }
    )
}

#[cfg(test)]
mod tests {
    use super::check_version;

    #[test]
    fn accepts_the_supported_version() {
        let names: Vec<String> = ["storage", "workspaces", "history", "config"]
            .iter()
            .map(|i| format!("wasmstate:backend/{i}@0.1.0"))
            .collect();
        assert!(check_version(&names).is_ok());
        let msg = check_version(&names[..2]).unwrap_err().to_string();
        assert!(
            msg.contains("history@0.1.0") && msg.contains("rebuild"),
            "{msg}"
        );
    }

    #[test]
    fn names_both_versions_when_they_differ() {
        let names = vec!["wasmstate:backend/storage@0.9.0".to_string()];
        let msg = check_version(&names).unwrap_err().to_string();
        assert!(msg.contains("wasmstate:backend@0.9.0"), "{msg}");
        assert!(msg.contains("wasmstate:backend@0.1.0"), "{msg}");
    }

    #[test]
    fn says_when_a_component_is_no_guest_at_all() {
        let names = vec!["wasi:cli/run@0.2.0".to_string()];
        let msg = check_version(&names).unwrap_err().to_string();
        assert!(msg.starts_with("not a wasmstate guest"), "{msg}");
    }
}
