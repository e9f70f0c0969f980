//! The ids the cloud block sees, derived from names alone: every replica
//! mints the same id for the same workspace, state version or output,
//! with nothing to store or look up. An id names a workspace and grants
//! nothing: each use checks the caller's grants on it.
//!
//! | id                              | names                                  |
//! |---------------------------------|----------------------------------------|
//! | `ws-<b64(backend/workspace)>`   | a workspace                            |
//! | `sv-<b64(…)>.<serial>`          | the state of a workspace at a serial   |
//! | `wsout-<b64(…)>.<serial>.<b64(name)>` | one output of that state         |
//!
//! Base64url has no `/`, whitespace or `.` (go-tfe refuses ids with the
//! first two; the last separates the parts).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// A backend and one of its workspaces.
pub type At = (String, String);

fn encode(backend: &str, workspace: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("{backend}/{workspace}"))
}

fn decode(text: &str) -> Option<At> {
    let bytes = URL_SAFE_NO_PAD.decode(text).ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let (backend, workspace) = text.split_once('/')?;
    crate::names::check_name("backend", backend).ok()?;
    crate::names::check_name("workspace", workspace).ok()?;
    Some((backend.to_string(), workspace.to_string()))
}

/// The id of `backend`/`workspace`.
pub fn workspace(backend: &str, workspace: &str) -> String {
    format!("ws-{}", encode(backend, workspace))
}

/// The workspace a workspace id names.
pub fn parse_workspace(id: &str) -> Option<At> {
    decode(id.strip_prefix("ws-")?)
}

/// The id of the state of `backend`/`workspace` at `serial`.
pub fn version(backend: &str, workspace: &str, serial: u64) -> String {
    format!("sv-{}.{serial}", encode(backend, workspace))
}

/// The workspace and serial a state version id names.
pub fn parse_version(id: &str) -> Option<(At, u64)> {
    let (at, serial) = id.strip_prefix("sv-")?.split_once('.')?;
    Some((decode(at)?, serial.parse().ok()?))
}

/// The id of output `name` of the state of `backend`/`workspace` at `serial`.
pub fn output(backend: &str, workspace: &str, serial: u64, name: &str) -> String {
    format!(
        "wsout-{}.{serial}.{}",
        encode(backend, workspace),
        URL_SAFE_NO_PAD.encode(name)
    )
}

/// The workspace, serial and output name an output id names.
pub fn parse_output(id: &str) -> Option<(At, u64, String)> {
    let mut parts = id.strip_prefix("wsout-")?.split('.');
    let (at, serial, name) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let name = String::from_utf8(URL_SAFE_NO_PAD.decode(name).ok()?).ok()?;
    Some((decode(at)?, serial.parse().ok()?, name))
}

/// The backend and workspace (`-` for none) an API path names, through
/// its organization and workspace name or one of its ids: for the request
/// log. Names are only checked for form, not existence.
pub fn at_of_path(path: &str) -> Option<At> {
    let rest = path.strip_prefix(super::API_PATH)?;
    let mut parts = rest.split('/');
    let at = match (parts.next()?, parts.next()?) {
        ("organizations", org) => {
            crate::names::check_name("backend", org).ok()?;
            let workspace = match (parts.next(), parts.next()) {
                (Some("workspaces"), Some(name))
                    if crate::names::check_name("workspace", name).is_ok() =>
                {
                    name
                }
                _ => "-",
            };
            (org.to_string(), workspace.to_string())
        }
        ("workspaces", id) => parse_workspace(id)?,
        ("state-versions", id) => parse_version(id)?.0,
        ("state-version-outputs", id) => parse_output(id)?.0,
        _ => return None,
    };
    Some(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_carry_no_slash_or_space() {
        let id = workspace("prod", "net.a-b_c");
        assert!(!id.contains('/') && !id.contains(' '));
        assert_eq!(
            parse_workspace(&id),
            Some(("prod".into(), "net.a-b_c".into()))
        );
        let v = version("prod", "net.a-b_c", 42);
        assert_eq!(
            parse_version(&v),
            Some((("prod".into(), "net.a-b_c".into()), 42))
        );
        let o = output("prod", "w", 3, "db_password");
        assert_eq!(
            parse_output(&o),
            Some((("prod".into(), "w".into()), 3, "db_password".into()))
        );
    }

    #[test]
    fn paths_name_their_workspace_for_the_log() {
        let ws = workspace("prod", "net");
        let at = |p: &str| at_of_path(p);
        let net = Some(("prod".to_string(), "net".to_string()));
        assert_eq!(at(&format!("/api/v2/workspaces/{ws}/actions/lock")), net);
        assert_eq!(at("/api/v2/organizations/prod/workspaces/net"), net);
        let v = version("prod", "net", 3);
        assert_eq!(at(&format!("/api/v2/state-versions/{v}/download")), net);
        assert_eq!(
            at("/api/v2/organizations/prod/entitlement-set"),
            Some(("prod".into(), "-".into()))
        );
        assert_eq!(at("/api/v2/ping"), None);
        assert_eq!(at("/states/prod/net"), None);
    }

    #[test]
    fn forged_ids_name_nothing() {
        // `../x`, a missing slash, bad names, other prefixes.
        for text in ["../x", "nobackend", "a/../b", "a/b c", "/w"] {
            let forged = format!("ws-{}", URL_SAFE_NO_PAD.encode(text));
            assert_eq!(parse_workspace(&forged), None, "{text}");
        }
        assert_eq!(parse_workspace("sv-abc"), None);
        assert_eq!(parse_version("sv-cHJvZC93.x"), None);
    }
}
