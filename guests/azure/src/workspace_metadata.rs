//! Workspace metadata (the host's small JSON document of tags, terraform
//! version, creation time): one block blob per workspace,
//! `key + ".wasmstate-metadata/" + <workspace> + ".json"`, its ETag the
//! version a conditional write compares.
//!
//! Terraform's azurerm backend lists a workspace for every blob named
//! `key + "env:" + <name>`: these names start `key + "."`, outside that
//! prefix, so neither Terraform nor this guest ever lists one as a
//! workspace. Also what a ranged Get Blob tells of the whole blob, which
//! `head` reads.

use crate::blobs::{Condition, Container, Refusal, Repeat};
use wasmstate_guest::http::Response;
use wasmstate_guest::{Error, Expect, Metadata};

/// Largest document kept (the contract's limit).
const MAX_BYTES: u64 = 64 << 10;

/// The metadata blob of workspace `ws` for state key `key`.
pub fn blob(key: &str, ws: &str) -> String {
    format!("{key}.wasmstate-metadata/{ws}.json")
}

/// What a ranged Get Blob said of the whole blob.
pub struct First {
    /// Its ETag, quotes included.
    pub etag: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its Content-MD5 (base64), when it has one.
    pub md5: Option<String>,
}

impl First {
    /// Lowercase hex of its Content-MD5, when it has one.
    pub fn md5_hex(&self) -> Option<String> {
        self.md5.as_deref().and_then(base64_hex)
    }
}

/// What the answer to a ranged Get Blob of `path` says of the whole blob.
pub fn first_bytes(answer: &Response, path: &str) -> Result<First, Error> {
    let size = match answer.status {
        // `Content-Range: bytes 0-65535/10485760`
        206 => answer
            .header("content-range")
            .and_then(|r| r.rsplit('/').next())
            .and_then(|n| n.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                Error::Internal(format!("reading {path}: a part came without its size"))
            })?,
        // A store that ignored the range sent all of it.
        _ => answer.body.len() as u64,
    };
    let etag = answer
        .header("etag")
        .ok_or_else(|| Error::Internal(format!("reading {path}: the answer had no ETag")))?
        .to_string();
    // A ranged answer carries the blob's MD5 apart from the part's; a
    // whole one as its Content-MD5.
    let md5 = answer
        .header("x-ms-blob-content-md5")
        .or_else(|| (answer.status == 200).then(|| answer.header("content-md5"))?)
        .map(str::to_string);
    Ok(First { etag, size, md5 })
}

/// Lowercase hex of base64 `text`, when it is base64.
fn base64_hex(text: &str) -> Option<String> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .ok()
        .filter(|b| !b.is_empty())?;
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The document in `blob` and its ETag, from one Get Blob.
pub fn read(c: &Container, blob: &str) -> Result<Option<Metadata>, Error> {
    let path = c.path(blob);
    let Some(answer) = c.range(blob, None, None, 0, MAX_BYTES)? else {
        // Gone, or zero-length (no range to read): which one, and its ETag.
        return match c.properties(blob)? {
            None => Ok(None),
            Some(p) if p.size == 0 => Ok(Some(Metadata {
                content: String::new(),
                version: p.etag,
            })),
            Some(_) => Err(Error::Unavailable(format!(
                "{path} changed while it was read; retry"
            ))),
        };
    };
    let first = first_bytes(&answer, &path)?;
    if first.size > MAX_BYTES {
        return Err(Error::Internal(format!(
            "{path} holds {} bytes, more than workspace metadata's 64 KiB; delete it",
            first.size
        )));
    }
    let content = String::from_utf8(answer.body).map_err(|_| {
        Error::Internal(format!(
            "{path} is not UTF-8 text, so no metadata of wasmstate's; delete it"
        ))
    })?;
    Ok(Some(Metadata {
        content,
        version: first.etag,
    }))
}

/// Set (`Some`) or remove (`None`) the document in `blob`, only if it is
/// as `expect` says: one request with `If-Match` or `If-None-Match: *`,
/// sent once (a repeat of one applied would be refused as changed).
pub fn write(
    c: &Container,
    blob: &str,
    content: Option<&str>,
    expect: &Expect,
) -> Result<bool, Error> {
    let condition = match expect {
        Expect::Any => Condition::Any,
        Expect::Absent => Condition::Absent,
        Expect::Version(etag) => Condition::Etag(etag.clone()),
    };
    let Some(content) = content else {
        return remove(c, blob, &condition);
    };
    if content.len() as u64 > MAX_BYTES {
        return Err(Error::InvalidInput(format!(
            "workspace metadata of {} bytes is more than 64 KiB",
            content.len()
        )));
    }
    let bytes = content.as_bytes().to_vec();
    match c.put(blob, bytes, &[], &condition, None, Some(Repeat::Never))? {
        Ok(()) => Ok(true),
        Err(Refusal::Changed) => Ok(false),
        // An ETag expected of a blob that is gone.
        Err(Refusal::Missing) if matches!(condition, Condition::Etag(_)) => Ok(false),
        Err(Refusal::Missing) => Err(Error::Internal(format!(
            "container {} does not exist",
            c.name
        ))),
        Err(Refusal::Lease) => Err(leased(c, blob)),
    }
}

/// Remove `blob` if `condition` holds; removing one that is not there
/// succeeds, whatever was expected of it.
fn remove(c: &Container, blob: &str, condition: &Condition) -> Result<bool, Error> {
    if *condition == Condition::Absent {
        return Ok(c.properties(blob)?.is_none());
    }
    match c.delete(blob, condition)? {
        Ok(()) | Err(Refusal::Missing) => Ok(true),
        // Changed since, or already gone (Azurite answers a condition on
        // a missing blob with 412).
        Err(Refusal::Changed) => Ok(c.properties(blob)?.is_none()),
        Err(Refusal::Lease) => Err(leased(c, blob)),
    }
}

fn leased(c: &Container, blob: &str) -> Error {
    Error::Internal(format!(
        "{} is leased, which wasmstate never does to metadata: break its lease",
        c.path(blob)
    ))
}
