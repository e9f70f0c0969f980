//! What the host adds a token to: the state and lock objects of one
//! bucket under one prefix (`<prefix><workspace>.tfstate|.tflock`), the
//! workspaces' metadata (`<prefix>wasmstate-metadata/<workspace>.json`), the
//! listing of that prefix and the bucket's versioning setting. Other
//! objects, ACLs, IAM, copies, composes, batches and erasing a generation
//! (history) are refused, so a guest cannot use the host's token to reach
//! the rest of the project.

use super::GcpGrant;
use http::{Method, Uri};
use serde::Deserialize;

/// How a request in scope is authorized.
#[derive(Debug, PartialEq, Eq)]
pub enum Access {
    /// With the bearer token.
    Bearer,
    /// With the bearer token; it starts a resumable upload, whose session
    /// (its `upload_id`) the host then lets through.
    Initiation,
    /// By its resumable upload's session (the URL is the credential).
    Session,
}

const LIST_QUERY: &[&str] = &[
    "prefix",
    "delimiter",
    "pageToken",
    "versions",
    "fields",
    "maxResults",
    "alt",
    "prettyPrint",
];
const READ_QUERY: &[&str] = &[
    "alt",
    "generation",
    "ifGenerationMatch",
    "ifGenerationNotMatch",
    "ifMetagenerationMatch",
    "fields",
    "prettyPrint",
];
const DELETE_QUERY: &[&str] = &["ifGenerationMatch", "ifMetagenerationMatch"];
const UPLOAD_QUERY: &[&str] = &[
    "uploadType",
    "name",
    "ifGenerationMatch",
    "ifGenerationNotMatch",
    "kmsKeyName",
    "fields",
    "prettyPrint",
];

/// An object resource as the gcs guest sends it with an upload; any other
/// field (an ACL, a different bucket) is refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Resource {
    name: String,
    #[serde(default, rename = "contentType")]
    _content_type: Option<String>,
    #[serde(default, rename = "metadata")]
    _metadata: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default, rename = "kmsKeyName")]
    kms_key_name: Option<String>,
}

/// Whether `method uri` is an upload whose object is named in its body.
pub fn needs_body(grant: &GcpGrant, method: &Method, uri: &Uri) -> bool {
    *method == Method::POST
        && uri.path().starts_with(&grant.upload_path)
        && !query(uri).is_some_and(|q| q.iter().any(|(k, _)| k == "upload_id"))
}

/// How `method uri` (with `headers` and, for uploads, `body`) is
/// authorized, or why it is refused.
pub fn check(
    grant: &GcpGrant,
    request: (&Method, &Uri, &http::HeaderMap),
    body: Option<&[u8]>,
    known_session: &dyn Fn(&str) -> bool,
) -> Result<Access, String> {
    let (method, uri, headers) = request;
    let refuse = |why: String| Err(format!("{method} {}: {why}", uri.path()));
    let path = uri.path();
    if path.split('/').any(|s| s == "." || s == "..") || path.contains('\\') {
        return refuse("a `.`, `..` or backslash segment".into());
    }
    // Headers that would change the method, the billed project or the
    // key a state is encrypted with.
    if let Some(name) = headers.keys().map(|h| h.as_str()).find(|h| {
        *h == "x-http-method-override"
            || *h == "x-goog-user-project"
            || h.starts_with("x-goog-encryption")
    }) {
        return refuse(format!("the host does not authorize requests with {name}"));
    }
    let Some(query) = query(uri) else {
        return refuse("the query is not UTF-8".into());
    };
    let param = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let only = |allowed: &[&str]| -> Result<(), String> {
        let mut names: Vec<&str> = query.iter().map(|(k, _)| k.as_str()).collect();
        if let Some(name) = names.iter().find(|n| !allowed.contains(n)) {
            return Err(format!(
                "{method} {path}: the host does not authorize ?{name} here"
            ));
        }
        names.sort();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return Err(format!("{method} {path}: a query parameter is given twice"));
        }
        Ok(())
    };
    // A resumable upload's session, one the host started: its URL
    // authorizes it.
    if let Some(id) = param("upload_id") {
        return if matches!(*method, Method::PUT | Method::DELETE) && known_session(id) {
            Ok(Access::Session)
        } else {
            refuse("not a resumable upload the host started".into())
        };
    }
    // Segments decoded: `/b/{bucket}/o/{object}` under the API's path.
    let segments = |root: &str| -> Option<Vec<String>> {
        let rest = path.strip_prefix(root)?.strip_prefix("/b/")?;
        rest.split('/').map(decode).collect()
    };
    let ours = |segments: &[String]| segments.first() == Some(&grant.bucket);
    if let Some(segments) = segments(&grant.api_path).filter(|s| ours(s)) {
        match (method, &segments[1..]) {
            // The versioning setting only: nothing else of the bucket.
            (&Method::GET, []) if query.len() == 1 && param("fields") == Some("versioning") => {
                Ok(Access::Bearer)
            }
            (&Method::GET, [o]) if o == "o" => {
                only(LIST_QUERY)?;
                match param("prefix") {
                    Some(p) if p.starts_with(&grant.prefix) => Ok(Access::Bearer),
                    None if grant.prefix.is_empty() => Ok(Access::Bearer),
                    _ => refuse(format!(
                        "listings must stay under the prefix {:?}",
                        grant.prefix
                    )),
                }
            }
            (_, [o, object]) if o == "o" => {
                in_scope(grant, object).map_err(|why| format!("{method} {path}: {why}"))?;
                match *method {
                    Method::GET => only(READ_QUERY).map(|()| Access::Bearer),
                    // Never a `generation`: that would erase history.
                    Method::DELETE => only(DELETE_QUERY).map(|()| Access::Bearer),
                    _ => refuse("objects are only read, uploaded and deleted".into()),
                }
            }
            _ => refuse("not an operation on the state objects".into()),
        }
    } else if let Some(segments) = segments(&grant.upload_path).filter(|s| ours(s))
        && *method == Method::POST
        && segments[1..] == ["o".to_string()]
    {
        only(UPLOAD_QUERY)?;
        if param("kmsKeyName").is_some_and(|k| Some(k) != grant.kms_key.as_deref()) {
            return refuse("kmsKeyName is not the backend's kms_encryption_key".into());
        }
        let named = match (param("uploadType"), body) {
            (Some("media"), _) => None,
            (Some("multipart"), Some(body)) => Some(multipart_name(grant, headers, body)?),
            (Some("resumable"), Some([])) => None,
            (Some("resumable"), Some(body)) => Some(resource_name(grant, body)?),
            _ => return refuse("uploads are media, multipart or resumable".into()),
        };
        let access = if param("uploadType") == Some("resumable") {
            Access::Initiation
        } else {
            Access::Bearer
        };
        let name = match (named, param("name")) {
            (Some(named), Some(q)) if named != q => {
                return refuse("the object named in the body and in ?name differ".into());
            }
            (Some(named), _) => named,
            (None, Some(q)) => q.to_string(),
            (None, None) => return refuse("an upload without an object name".into()),
        };
        in_scope(grant, &name).map_err(|why| format!("{method} {path}: {why}"))?;
        Ok(access)
    } else {
        refuse(format!(
            "the host authorizes only the state objects of gs://{}/{}",
            grant.bucket, grant.prefix
        ))
    }
}

/// `Ok` for `<prefix><workspace>.tfstate` and `.tflock`, and the
/// workspace's metadata `<prefix>wasmstate-metadata/<workspace>.json`.
fn in_scope(grant: &GcpGrant, object: &str) -> Result<(), String> {
    let workspace = object.strip_prefix(&grant.prefix).and_then(|rest| {
        rest.strip_suffix(".tfstate")
            .or(rest.strip_suffix(".tflock"))
            .or(rest
                .strip_prefix("wasmstate-metadata/")
                .and_then(|m| m.strip_suffix(".json")))
    });
    match workspace {
        Some(ws) if crate::names::check_name("workspace", ws).is_ok() => Ok(()),
        _ => Err(format!(
            "{object:?} is not a state or lock object under gs://{}/{}",
            grant.bucket, grant.prefix
        )),
    }
}

/// The object a multipart upload names: its first part, which must be
/// the JSON resource and nothing else. Strict, so that no other reading
/// of the body (by the store) can find another name in it.
fn multipart_name(
    grant: &GcpGrant,
    headers: &http::HeaderMap,
    body: &[u8],
) -> Result<String, String> {
    let mut kinds = headers.get_all(http::header::CONTENT_TYPE).iter();
    let kind = match (kinds.next(), kinds.next()) {
        (Some(kind), None) => kind.to_str().unwrap_or(""),
        _ => return Err("a multipart upload must have one Content-Type".into()),
    };
    // A plain token: no quotes, comments or characters another parser
    // could read differently.
    let boundary = kind
        .strip_prefix("multipart/related; boundary=")
        .filter(|b| {
            !b.is_empty()
                && b.len() <= 70
                && b.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
        })
        .ok_or("a multipart upload must say `multipart/related; boundary=TOKEN`")?;
    let delimiter = format!("--{boundary}");
    let head = format!("{delimiter}\r\ncontent-type: application/json; charset=UTF-8\r\n\r\n");
    let rest = body
        .strip_prefix(head.as_bytes())
        .ok_or("a multipart upload must begin with its JSON resource")?;
    let second = format!("\r\n{delimiter}\r\ncontent-type: application/octet-stream\r\n\r\n");
    let end = find(rest, second.as_bytes()).ok_or("a multipart upload without its media part")?;
    let json = &rest[..end];
    // Exactly two parts: the media runs to the closing delimiter at the
    // very end, and holds no delimiter of its own.
    let media = rest[end + second.len()..]
        .strip_suffix(format!("\r\n{delimiter}--\r\n").as_bytes())
        .ok_or("a multipart upload must end with its closing delimiter")?;
    if find(json, delimiter.as_bytes()).is_some() || find(media, delimiter.as_bytes()).is_some() {
        return Err("a part holds the boundary".into());
    }
    resource_name(grant, json)
}

fn resource_name(grant: &GcpGrant, json: &[u8]) -> Result<String, String> {
    let resource = serde_json::from_slice::<Resource>(json)
        .map_err(|e| format!("the upload's resource is not one the host authorizes: {e}"))?;
    if resource.kms_key_name.is_some() && resource.kms_key_name != grant.kms_key {
        return Err("the upload's kmsKeyName is not the backend's kms_encryption_key".into());
    }
    Ok(resource.name)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The query's pairs, decoded; `None` when one is not UTF-8 (decoding it
/// lossily would check another name than the store reads).
fn query(uri: &Uri) -> Option<Vec<(String, String)>> {
    let decode = |text: &str| {
        percent_encoding::percent_decode_str(&text.replace('+', " "))
            .decode_utf8()
            .ok()
            .map(|s| s.into_owned())
    };
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Some((decode(k)?, decode(v)?))
        })
        .collect()
}

fn decode(segment: &str) -> Option<String> {
    percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .ok()
        .map(|s| s.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capabilities::gcp::TokenSource;

    fn grant() -> GcpGrant {
        GcpGrant {
            origins: Vec::new(),
            bucket: "tf-state".into(),
            prefix: "team/app/".into(),
            api_path: "/storage/v1".into(),
            upload_path: "/upload/storage/v1".into(),
            kms_key: None,
            source: TokenSource::Static("t".into()),
        }
    }

    fn check_of(
        method: Method,
        path: &str,
        kind: Option<&str>,
        body: Option<&[u8]>,
    ) -> Result<Access, String> {
        let uri: Uri = format!("https://storage.googleapis.com{path}")
            .parse()
            .unwrap();
        let mut headers = http::HeaderMap::new();
        if let Some(kind) = kind {
            headers.insert(http::header::CONTENT_TYPE, kind.parse().unwrap());
        }
        check(&grant(), (&method, &uri, &headers), body, &|id| id == "abc")
    }

    fn multipart(name: &str) -> Vec<u8> {
        format!(
            "--b1\r\ncontent-type: application/json; charset=UTF-8\r\n\r\n{{\"name\":{name:?},\"contentType\":\"application/json\"}}\r\n--b1\r\ncontent-type: application/octet-stream\r\n\r\n{{}}\r\n--b1--\r\n"
        )
        .into_bytes()
    }

    const KIND: Option<&str> = Some("multipart/related; boundary=b1");

    #[test]
    fn the_state_objects_listing_and_uploads_get_the_token() {
        for (method, path) in [
            (Method::GET, "/storage/v1/b/tf-state?fields=versioning"),
            (
                Method::GET,
                "/storage/v1/b/tf-state/o?prefix=team%2Fapp%2F&delimiter=%2F",
            ),
            (
                Method::GET,
                "/storage/v1/b/tf-state/o?prefix=team%2Fapp%2Fdefault.tfstate&versions=true",
            ),
            (
                Method::GET,
                "/storage/v1/b/tf-state/o/team%2Fapp%2Fdefault.tfstate?alt=media&generation=7",
            ),
            (
                Method::DELETE,
                "/storage/v1/b/tf-state/o/team%2Fapp%2Fdev.tflock?ifGenerationMatch=7",
            ),
            (
                Method::GET,
                "/storage/v1/b/tf-state/o/team%2Fapp%2Fwasmstate-metadata%2Fdev.json?alt=media",
            ),
            (
                Method::DELETE,
                "/storage/v1/b/tf-state/o/team%2Fapp%2Fwasmstate-metadata%2Fdev.json",
            ),
        ] {
            assert_eq!(
                check_of(method.clone(), path, None, None),
                Ok(Access::Bearer),
                "{method} {path}"
            );
        }
        let upload = "/upload/storage/v1/b/tf-state/o?uploadType=multipart&ifGenerationMatch=0";
        let body = multipart("team/app/dev.tflock");
        assert_eq!(
            check_of(Method::POST, upload, KIND, Some(&body)),
            Ok(Access::Bearer)
        );
        let resumable = "/upload/storage/v1/b/tf-state/o?uploadType=resumable";
        let resource = br#"{"name":"team/app/dev.tfstate","metadata":{"wasmstate-serial":"3"}}"#;
        assert_eq!(
            check_of(Method::POST, resumable, None, Some(resource)),
            Ok(Access::Initiation)
        );
        let session = "/upload/storage/v1/b/tf-state/o?uploadType=resumable&upload_id=abc";
        assert_eq!(
            check_of(Method::PUT, session, None, None),
            Ok(Access::Session)
        );
    }

    #[test]
    fn parser_differentials_and_foreign_sessions_are_refused() {
        let foreign = "/upload/storage/v1/b/attacker/o?uploadType=resumable&upload_id=XYZ";
        assert!(check_of(Method::PUT, foreign, None, None).is_err());
        for path in [
            "/storage/v1/b/tf-state",
            "/storage/v1/b/tf-state?fields=acl",
            "/storage/v1/b/tf-state?fields=versioning&projection=full",
            "/storage/v1/b/tf-state/o/team%2Fapp%2Fdefault.tfstate?alt=media&x=%FF",
        ] {
            assert!(check_of(Method::GET, path, None, None).is_err(), "{path}");
        }
        let upload = "/upload/storage/v1/b/tf-state/o?uploadType=multipart";
        let smuggled = format!(
            "{}\r\n--b1\r\ncontent-type: application/json; charset=UTF-8\r\n\r\n{{\"name\":\"secrets.json\"}}\r\n--b1--\r\n",
            String::from_utf8(multipart("team/app/x.tfstate"))
                .unwrap()
                .trim_end_matches("\r\n--b1--\r\n")
        );
        assert!(check_of(Method::POST, upload, KIND, Some(smuggled.as_bytes())).is_err());
        let odd = "multipart/related; boundary=(c)b1";
        assert!(
            check_of(
                Method::POST,
                upload,
                Some(odd),
                Some(&multipart("team/app/x.tfstate"))
            )
            .is_err()
        );
        let kms = "/upload/storage/v1/b/tf-state/o?uploadType=multipart&kmsKeyName=attacker";
        assert!(
            check_of(
                Method::POST,
                kms,
                KIND,
                Some(&multipart("team/app/x.tfstate"))
            )
            .is_err()
        );
    }

    #[test]
    fn other_objects_buckets_and_operations_are_refused() {
        for (method, path) in [
            (
                Method::GET,
                "/storage/v1/b/other/o/team%2Fapp%2Fdefault.tfstate",
            ),
            (
                Method::GET,
                "/storage/v1/b/tf-state/o/secrets.json?alt=media",
            ),
            (
                Method::GET,
                "/storage/v1/b/tf-state/o/team%2Fapp%2Fnested%2Fx.tfstate",
            ),
            (
                Method::GET,
                "/storage/v1/b/tf-state/o/team%2Fapp%2Fwasmstate-metadata%2Fa%2Fb.json",
            ),
            (Method::GET, "/storage/v1/b/tf-state/o?prefix=other%2F"),
            (Method::GET, "/storage/v1/b/tf-state/o"),
            (
                Method::GET,
                "/storage/v1/b/tf-state/o/team%2Fapp%2Fdefault.tfstate/acl",
            ),
            (Method::GET, "/storage/v1/b/tf-state/iam"),
            (Method::GET, "/storage/v1/b/tf-state?projection=full"),
            (
                Method::DELETE,
                "/storage/v1/b/tf-state/o/team%2Fapp%2Fdefault.tfstate?generation=3",
            ),
            (
                Method::PATCH,
                "/storage/v1/b/tf-state/o/team%2Fapp%2Fdefault.tfstate",
            ),
            (
                Method::POST,
                "/storage/v1/b/tf-state/o/team%2Fapp%2Fx.tfstate/rewriteTo/b/other/o/x",
            ),
            (
                Method::POST,
                "/storage/v1/b/tf-state/o/team%2Fapp%2Fx.tfstate/compose",
            ),
            (Method::POST, "/batch/storage/v1"),
            (Method::GET, "/storage/v1/b/tf-state/o/../../b/other/o/x"),
            (Method::GET, "/storage/v1/b?project=p"),
        ] {
            assert!(
                check_of(method.clone(), path, None, None).is_err(),
                "{method} {path}"
            );
        }
        let upload = "/upload/storage/v1/b/tf-state/o?uploadType=multipart";
        for (kind, body) in [
            (KIND, multipart("secrets.json")),
            (KIND, multipart("team/app/x.tfstate").into_iter().skip(2).collect()),
            (Some("multipart/related; boundary=zz"), multipart("team/app/x.tfstate")),
            (
                KIND,
                b"--b1\r\ncontent-type: application/json; charset=UTF-8\r\n\r\n{\"name\":\"team/app/x.tfstate\",\"acl\":[]}\r\n--b1\r\n".to_vec(),
            ),
            (
                KIND,
                b"--b1\r\ncontent-type: application/json; charset=UTF-8\r\n\r\n{\"name\":\"team/app/x.tfstate\",\"name\":\"secrets\"}\r\n--b1\r\n".to_vec(),
            ),
        ] {
            assert!(check_of(Method::POST, upload, kind, Some(&body)).is_err(), "{}", String::from_utf8_lossy(&body));
        }
        let named = "/upload/storage/v1/b/tf-state/o?uploadType=multipart&name=secrets.json";
        assert!(
            check_of(
                Method::POST,
                named,
                KIND,
                Some(&multipart("team/app/x.tfstate"))
            )
            .is_err()
        );
        let media = "/upload/storage/v1/b/tf-state/o?uploadType=media&name=secrets.json";
        assert!(check_of(Method::POST, media, None, Some(b"x")).is_err());
        let copy = "/upload/storage/v1/b/other/o?uploadType=media&name=team%2Fapp%2Fx.tfstate";
        assert!(check_of(Method::POST, copy, None, Some(b"x")).is_err());
    }
}
