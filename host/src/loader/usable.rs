//! Stage 5 of loading: a guest without a manifest declares no needs, so
//! it gets the operator's grants as written, and a backend whose guest has
//! nowhere to keep states would load, pass `check-config`, and then answer
//! 500 to every request. The checks here refuse it at load, with the line
//! to add, where that can be told: statically from its imports and grants,
//! and, when it was granted nothing at all (so it can reach nothing outside
//! itself), from its own answer to a workspace list.
//!
//! A guest with a manifest is not checked here: what it asks for and was
//! not granted already stops it in [`super::narrow`].

use crate::backend::{Storage, StorageError};
use crate::config::{BackendConfig, GuestSource};
use crate::marketplace::manifest::ComponentInfo;
use crate::runtime::GuestBackend;
use std::path::Path;

/// A way a guest can keep states outside itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Files in the directory granted at `/data`.
    Directory,
    /// HTTP requests (an object store, etcd, a cloud API).
    Http,
    /// The host's git capability.
    Git,
}

impl Route {
    /// The import a guest using this route cannot do without.
    fn import(self) -> &'static str {
        match self {
            Route::Directory => "wasi:filesystem/preopens@",
            Route::Http => "wasi:http/outgoing-handler@",
            Route::Git => "wasmstate:backend/git@",
        }
    }

    /// The config line that grants it.
    fn grant(self, backend: &str) -> String {
        match self {
            Route::Directory => format!("dir = \"/var/lib/wasmstate/{backend}\""),
            Route::Http => "allow_http = [\"https://HOST\"]".to_string(),
            Route::Git => "allow_git = [\"URL\"]".to_string(),
        }
    }

    fn granted(self, backend: &BackendConfig, dir: Option<&Path>) -> bool {
        match self {
            Route::Directory => dir.is_some(),
            Route::Http => {
                !backend.allow_http.is_empty()
                    || backend.aws.is_some()
                    || backend.azure.is_some()
                    || backend.gcp.is_some()
            }
            Route::Git => !backend.allow_git.is_empty(),
        }
    }
}

const ROUTES: [Route; 3] = [Route::Directory, Route::Http, Route::Git];

/// Refuse a manifest-less guest file that cannot keep a state as
/// configured: one-line errors saying what to add.
pub async fn check(
    backend: &BackendConfig,
    info: &ComponentInfo,
    guest: &GuestBackend,
    dir: Option<&Path>,
) -> anyhow::Result<()> {
    let GuestSource::File(path) = &backend.guest else {
        return Ok(());
    };
    if info.manifest.is_some() {
        return Ok(());
    }
    let name = &backend.name;
    let imported: Vec<Route> = ROUTES
        .into_iter()
        .filter(|r| info.imports.iter().any(|i| i.starts_with(r.import())))
        .collect();
    let granted: Vec<Route> = ROUTES
        .into_iter()
        .filter(|r| r.granted(backend, dir))
        .collect();
    if !granted.is_empty() {
        return match unusable_grants(name, &imported, &granted) {
            Some(said) => anyhow::bail!("backend {name:?}: its guest {} {said}", path.display()),
            None => Ok(()),
        };
    }
    // Granted nothing, it can reach nothing outside itself, so asking it is
    // harmless. Only a guest that keeps files is asked: one that imports
    // no filesystem may be deliberately storage-less (a test double).
    if !imported.contains(&Route::Directory) {
        return Ok(());
    }
    match guest.list_workspaces().await {
        Err(e) if says_it_cannot_work(&e) => anyhow::bail!(
            "backend {name:?}: its guest {} (no manifest) is granted no directory and cannot \
             list its workspaces ({}): add {} to [backends.{name}]",
            path.display(),
            one_line(&e.to_string()),
            what_to_add(name, &imported)
        ),
        _ => Ok(()),
    }
}

/// Statically certain: a guest given grants it has no import to use (a
/// filesystem guest given only `allow_http`, say) can keep no state.
fn unusable_grants(name: &str, imported: &[Route], granted: &[Route]) -> Option<String> {
    if imported.is_empty() || granted.iter().any(|r| imported.contains(r)) {
        return None;
    }
    Some(format!(
        "(no manifest) cannot use what it is granted ({}), only {}: add {} to [backends.{name}]",
        describe(granted),
        describe(imported),
        what_to_add(name, imported)
    ))
}

/// The grant to add, first the directory when the guest keeps files (what
/// most guests do), then the others it could use.
fn what_to_add(name: &str, imported: &[Route]) -> String {
    let mut grants = imported.iter().map(|r| r.grant(name));
    let first = grants.next().unwrap_or_default();
    let others: Vec<String> = grants.collect();
    if others.is_empty() {
        first
    } else {
        format!(
            "{first} (or, where it keeps states elsewhere, {})",
            others.join(" or ")
        )
    }
}

/// An answer that is the guest's own verdict on its configuration. A crash,
/// a deadline or a memory cap is the guest's bug or the host's limit, met
/// again by requests; and an answer larger than the host takes means the
/// guest did list.
fn says_it_cannot_work(e: &StorageError) -> bool {
    match e {
        StorageError::InvalidConfig(_) | StorageError::Unavailable(_) => true,
        StorageError::Internal(message) => !message.contains("the host accepts from one call"),
        _ => false,
    }
}

fn describe(routes: &[Route]) -> String {
    routes
        .iter()
        .map(|r| match r {
            Route::Directory => "a directory",
            Route::Http => "HTTP",
            Route::Git => "git",
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The guest's message on one line (it may carry a traceback), without
/// the control characters (terminal escapes) a hostile guest could send to
/// the operator's terminal through `check-config`.
fn one_line(text: &str) -> String {
    text.split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|word| !word.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::{Route, one_line, unusable_grants, what_to_add};

    #[test]
    fn grants_a_guest_cannot_use_are_refused_with_the_one_it_can() {
        let said = unusable_grants("files", &[Route::Directory], &[Route::Http]).unwrap();
        assert!(
            said.contains("add dir = \"/var/lib/wasmstate/files\" to [backends.files]"),
            "{said}"
        );
        assert!(!said.contains('\n'), "{said}");
        // One grant it can use is enough; and a guest importing none of the
        // routes (storage-less) is left alone.
        let all = [Route::Directory, Route::Http, Route::Git];
        assert_eq!(unusable_grants("py", &all, &[Route::Http]), None);
        assert_eq!(unusable_grants("none", &[], &[Route::Git]), None);
    }

    #[test]
    fn the_directory_comes_first_in_what_to_add() {
        let all = [Route::Directory, Route::Http, Route::Git];
        assert_eq!(
            what_to_add("py", &all),
            "dir = \"/var/lib/wasmstate/py\" (or, where it keeps states elsewhere, \
             allow_http = [\"https://HOST\"] or allow_git = [\"URL\"])"
        );
    }

    #[test]
    fn the_guests_message_reaches_the_terminal_without_escapes() {
        assert_eq!(
            one_line("no /data\x1b]0;owned\x07\x1b[2J\n  Traceback:\r\n\tline 1"),
            "no /data ]0;owned [2J Traceback: line 1"
        );
    }
}
