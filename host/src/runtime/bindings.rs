//! Host-side bindings of the WIT world, the version check that runs before a
//! guest is instantiated, and conversions to the runtime-neutral types of
//! [`crate::backend`].

use crate::backend::{Diagnostic, LockInfo, StorageError};

wasmtime::component::bindgen!({
    path: "../wit",
    world: "backend",
    // Async imports: the git capability does network I/O on a blocking
    // thread and must not stall the executor; log/get-config are trivial.
    imports: { default: async },
    exports: { default: async },
});

use self::wasmstate::backend::types as t;

/// The WIT package version this host implements.
pub const WIT_VERSION: &str = "0.1.0";
const PACKAGE: &str = "wasmstate:backend";

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

impl From<t::LockInfo> for LockInfo {
    fn from(l: t::LockInfo) -> Self {
        LockInfo {
            id: bounded(l.id),
            operation: bounded(l.operation),
            info: bounded(l.info),
            who: bounded(l.who),
            version: bounded(l.version),
            created: bounded(l.created),
            path: bounded(l.path),
        }
    }
}

impl From<LockInfo> for t::LockInfo {
    fn from(l: LockInfo) -> Self {
        t::LockInfo {
            id: l.id,
            operation: l.operation,
            info: l.info,
            who: l.who,
            version: l.version,
            created: l.created,
            path: l.path,
        }
    }
}

/// Longest text a guest may put in an error (or a lock holder's field):
/// whatever a guest returns ends up in an HTTP answer and the log, so a
/// hostile one must not be able to make either huge.
pub const MAX_GUEST_TEXT: usize = 4096;

fn bounded(text: String) -> String {
    if text.len() <= MAX_GUEST_TEXT {
        text
    } else {
        super::sandbox::truncate(&text, MAX_GUEST_TEXT)
    }
}

impl From<t::Diagnostic> for Diagnostic {
    fn from(d: t::Diagnostic) -> Self {
        Diagnostic {
            key: d.key.map(bounded),
            message: bounded(d.message),
        }
    }
}

impl From<t::Error> for StorageError {
    fn from(e: t::Error) -> Self {
        match e {
            t::Error::NotFound => StorageError::NotFound,
            t::Error::Locked(holder) => StorageError::Locked(holder.into()),
            t::Error::LockMismatch(holder) => StorageError::LockMismatch(holder.map(Into::into)),
            t::Error::InvalidInput(m) => StorageError::InvalidInput(bounded(m)),
            t::Error::InvalidConfig(d) => {
                StorageError::InvalidConfig(d.into_iter().take(64).map(Into::into).collect())
            }
            t::Error::Unavailable(m) => StorageError::Unavailable(bounded(m)),
            t::Error::Internal(m) => StorageError::Internal(bounded(m)),
        }
    }
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
