//! What the host authorizes on a backend's storage account: the state
//! blobs of its container (`key`, `key` + `env:NAME`) and the listing of
//! them, with the operations a state store needs, and each workspace's
//! metadata blob (`key` + `.wasmstate-metadata/NAME.json`: read, put,
//! deleted). Copying from elsewhere
//! in the account, ACLs, tags, container changes and permanent deletes are
//! refused, so a guest cannot use the host's key to reach other blobs.

use super::AzureGrant;
use http::{HeaderMap, Method, Uri};

/// Query parameters a request may carry (names, lower-case).
const ALLOWED_QUERY: &[&str] = &[
    "restype",
    "comp",
    "prefix",
    "marker",
    "maxresults",
    "include",
    "delimiter",
    "timeout",
    "snapshot",
    "versionid",
    "blockid",
    "blocklisttype",
];

/// `comp` values on a state blob: leases, metadata (the lock info),
/// blocks of a big state, snapshots (Terraform's `snapshot` history).
const BLOB_COMPS: &[&str] = &["lease", "metadata", "block", "blocklist", "snapshot"];

/// The `x-ms-*` headers a state store sends (`x-ms-meta-*` besides). Any
/// other is refused: copies from elsewhere (`x-ms-copy-source`), legal
/// holds and immutability policies that would pin a state forever, tags,
/// tiers, customer-provided keys.
const ALLOWED_MS_HEADERS: &[&str] = &[
    "x-ms-version",
    "x-ms-date",
    "x-ms-client-request-id",
    "x-ms-blob-type",
    "x-ms-blob-content-type",
    "x-ms-blob-content-md5",
    "x-ms-lease-id",
    "x-ms-lease-action",
    "x-ms-lease-duration",
    "x-ms-lease-break-period",
    "x-ms-proposed-lease-id",
    "x-ms-range",
    "x-ms-delete-snapshots",
];

/// `Ok` when `method uri` stays on the grant's state blobs.
pub fn check(
    grant: &AzureGrant,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<(), String> {
    let refuse = |why: &str| Err(format!("{method} {}: {why}", uri.path()));
    if let Some(name) = headers.keys().map(|h| h.as_str()).find(|h| {
        h.starts_with("x-ms-") && !h.starts_with("x-ms-meta-") && !ALLOWED_MS_HEADERS.contains(h)
    }) {
        return refuse(&format!("the host does not sign requests with {name}"));
    }
    // Only the deletion of a whole workspace takes its snapshots along;
    // snapshots alone are never erased.
    if let Some(value) = headers.get("x-ms-delete-snapshots")
        && value != "include"
    {
        return refuse("x-ms-delete-snapshots other than `include`");
    }
    // Azure reads `\` as `/`: a name checked here would not be the one
    // reached.
    if uri.path().contains('\\') || uri.path().to_ascii_lowercase().contains("%5c") {
        return refuse("a backslash in the path");
    }
    let query: Vec<(String, String)> = form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .map(|(k, v)| (k.to_ascii_lowercase(), v.into_owned()))
        .collect();
    if let Some((name, _)) = query
        .iter()
        .find(|(k, _)| !ALLOWED_QUERY.contains(&k.as_str()))
    {
        return refuse(&format!("the host does not sign requests with ?{name}"));
    }
    let mut names: Vec<&str> = query.iter().map(|(k, _)| k.as_str()).collect();
    names.sort();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return refuse("a query parameter is given twice");
    }
    let param = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let Some(rest) = uri.path().strip_prefix(grant.base_path.as_str()) else {
        return refuse("not under the blob endpoint");
    };
    let Some(rest) = rest
        .strip_prefix('/')
        .and_then(|r| r.strip_prefix(grant.container.as_str()))
    else {
        return refuse(&format!("outside container {}", grant.container));
    };
    if rest.is_empty() || rest == "/" {
        // The container itself: only listing the state blobs.
        let env = format!("{}env:", grant.key);
        let listing = *method == Method::GET
            && param("restype") == Some("container")
            && param("comp") == Some("list")
            && param("prefix").is_some_and(|p| p == grant.key || p.starts_with(&env))
            && param("include").is_none_or(|i| i == "snapshots");
        return if listing {
            Ok(())
        } else {
            refuse(&format!(
                "on the container, the host signs only listings of blobs starting with {:?}",
                grant.key
            ))
        };
    }
    let Some(encoded) = rest.strip_prefix('/') else {
        return refuse(&format!("outside container {}", grant.container));
    };
    let blob = percent_encoding::percent_decode_str(encoded)
        .decode_utf8()
        .map_err(|_| format!("{method} {}: the blob name is not UTF-8", uri.path()))?;
    // Dot segments are resolved by some HTTP stacks before Azure sees the
    // name: never sign one, so the name checked is the name reached.
    if blob.split('/').any(|s| s == "." || s == "..") || encoded.split('/').any(|s| s.is_empty()) {
        return refuse("the blob name has an empty, `.` or `..` segment");
    }
    let state_blob = blob == grant.key
        || blob
            .strip_prefix(grant.key.as_str())
            .and_then(|rest| rest.strip_prefix("env:"))
            .is_some_and(|ws| {
                crate::names::check_name("workspace", ws).is_ok() && !ws.ends_with('.')
            });
    // A workspace's metadata: a whole small blob, read, put or deleted.
    let metadata_blob = blob
        .strip_prefix(grant.key.as_str())
        .and_then(|rest| rest.strip_prefix(".wasmstate-metadata/"))
        .and_then(|rest| rest.strip_suffix(".json"))
        .is_some_and(|ws| crate::names::check_name("workspace", ws).is_ok());
    if metadata_blob {
        return if query.is_empty()
            && matches!(
                *method,
                Method::GET | Method::HEAD | Method::PUT | Method::DELETE
            ) {
            Ok(())
        } else {
            refuse("a workspace's metadata blob is only read, put and deleted")
        };
    }
    if !state_blob {
        return refuse(&format!(
            "the host signs only the state blobs {:?} and {:?}+\"env:NAME\"",
            grant.key, grant.key
        ));
    }
    if param("restype").is_some() || param("include").is_some() || param("prefix").is_some() {
        return refuse("a listing parameter on a blob");
    }
    if headers.contains_key("x-ms-delete-snapshots")
        && (blob == grant.key || *method != Method::DELETE)
    {
        return refuse("only a named workspace's deletion takes its snapshots along");
    }
    let comp = param("comp");
    if let Some(comp) = comp
        && !BLOB_COMPS.contains(&comp)
    {
        return refuse(&format!("the host does not sign ?comp={comp}"));
    }
    let reading = matches!(*method, Method::GET | Method::HEAD);
    // A snapshot or version is history: read, never changed or erased.
    if (param("snapshot").is_some() || param("versionid").is_some()) && !reading {
        return refuse("snapshots and versions are only read");
    }
    match *method {
        Method::GET | Method::HEAD | Method::PUT | Method::DELETE => Ok(()),
        _ => refuse("method not signed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capabilities::azure::AzureCredential;

    fn grant() -> AzureGrant {
        AzureGrant {
            origins: Vec::new(),
            account: "devstoreaccount1".into(),
            base_path: "/devstoreaccount1".into(),
            container: "tfstate".into(),
            key: "prod.tfstate".into(),
            credential: AzureCredential::Sas("sv=x".into()),
        }
    }

    fn check_of(method: Method, path: &str, headers: &[(&str, &str)]) -> Result<(), String> {
        let uri: Uri = format!("http://127.0.0.1:10000{path}").parse().unwrap();
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        check(&grant(), &method, &uri, &map)
    }

    #[test]
    fn the_state_blobs_and_their_listing_are_signed() {
        for (method, path) in [
            (Method::GET, "/devstoreaccount1/tfstate/prod.tfstate"),
            (
                Method::PUT,
                "/devstoreaccount1/tfstate/prod.tfstate?comp=lease",
            ),
            (
                Method::PUT,
                "/devstoreaccount1/tfstate/prod.tfstateenv%3Adev?comp=metadata",
            ),
            (
                Method::PUT,
                "/devstoreaccount1/tfstate/prod.tfstateenv:dev?comp=block&blockid=AAAA",
            ),
            (
                Method::DELETE,
                "/devstoreaccount1/tfstate/prod.tfstateenv:dev",
            ),
            (
                Method::GET,
                "/devstoreaccount1/tfstate/prod.tfstate?snapshot=2026-01-01T00:00:00.0000000Z",
            ),
            (
                Method::GET,
                "/devstoreaccount1/tfstate?restype=container&comp=list&prefix=prod.tfstateenv%3A",
            ),
            (
                Method::PUT,
                "/devstoreaccount1/tfstate/prod.tfstate.wasmstate-metadata%2Fdev.json",
            ),
            (
                Method::DELETE,
                "/devstoreaccount1/tfstate/prod.tfstate.wasmstate-metadata%2Fdev.json",
            ),
        ] {
            assert_eq!(
                check_of(method.clone(), path, &[]),
                Ok(()),
                "{method} {path}"
            );
        }
    }

    #[test]
    fn other_blobs_containers_and_operations_are_refused() {
        for (method, path, headers) in [
            (
                Method::GET,
                "/devstoreaccount1/tfstate/other.tfstate",
                &[][..],
            ),
            (Method::GET, "/devstoreaccount1/secrets/prod.tfstate", &[]),
            (
                Method::GET,
                "/devstoreaccount1/tfstate/prod.tfstateenv:dev/../../other",
                &[],
            ),
            (
                Method::PUT,
                "/devstoreaccount1/tfstate/prod.tfstate.wasmstate-metadata%2Fdev.json?comp=lease",
                &[],
            ),
            (
                Method::GET,
                "/devstoreaccount1/tfstate/prod.tfstate.wasmstate-metadata%2Fa%2Fb.json",
                &[],
            ),
            (
                Method::GET,
                "/devstoreaccount1/tfstate/prod.tfstate/%2E%2E/x",
                &[],
            ),
            (
                Method::GET,
                "/devstoreaccount1/tfstate?restype=container&comp=list",
                &[],
            ),
            (
                Method::GET,
                "/devstoreaccount1/tfstate?restype=container&comp=list&prefix=other",
                &[],
            ),
            (
                Method::DELETE,
                "/devstoreaccount1/tfstate?restype=container",
                &[],
            ),
            (
                Method::PUT,
                "/devstoreaccount1/tfstate?restype=container&comp=acl",
                &[],
            ),
            (
                Method::PUT,
                "/devstoreaccount1/tfstate/prod.tfstate?comp=tags",
                &[],
            ),
            (
                Method::PUT,
                "/devstoreaccount1/tfstate/prod.tfstate?comp=copy",
                &[],
            ),
            (
                Method::DELETE,
                "/devstoreaccount1/tfstate/prod.tfstate?snapshot=2026",
                &[],
            ),
            (
                Method::DELETE,
                "/devstoreaccount1/tfstate/prod.tfstate?deletetype=permanent",
                &[],
            ),
            (
                Method::GET,
                "/devstoreaccount1/tfstate/prod.tfstate?comp=lease&comp=list",
                &[],
            ),
            (
                Method::PUT,
                "/devstoreaccount1/tfstate/prod.tfstate",
                &[(
                    "x-ms-copy-source",
                    "http://127.0.0.1:10000/devstoreaccount1/secrets/key",
                )][..],
            ),
        ] {
            assert!(
                check_of(method.clone(), path, headers).is_err(),
                "{method} {path}"
            );
        }
    }
}
