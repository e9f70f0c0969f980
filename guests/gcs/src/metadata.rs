//! Workspace metadata (the host's small JSON document of tags, terraform
//! version, creation time): one object per workspace,
//! `<prefix>wasmstate-metadata/<workspace>.json`, its generation the
//! version a conditional write compares.
//!
//! Terraform's gcs backend lists a workspace for each object directly
//! under the prefix whose name ends in `.tfstate` (a `delimiter=/`
//! listing): these objects sit one folder down and end in `.json`, so
//! neither Terraform nor this guest ever lists one as a workspace.

use crate::objects::{Bucket, Condition};
use wasmstate_guest::{Error, Expect, Metadata};

/// The folder under the prefix that holds the metadata objects.
const FOLDER: &str = "wasmstate-metadata/";

/// Largest document kept (the contract's limit).
const MAX_BYTES: usize = 64 << 10;

/// The metadata object of workspace `ws` under `prefix`.
pub fn object(prefix: &str, ws: &str) -> String {
    format!("{prefix}{FOLDER}{ws}.json")
}

/// The document at `name` and the generation it is, from one GET.
pub fn read(bucket: &Bucket, name: &str) -> Result<Option<Metadata>, Error> {
    let Some(found) = bucket.first_bytes(name, MAX_BYTES as u64 + 1)? else {
        return Ok(None);
    };
    if found.size > MAX_BYTES as u64 {
        return Err(Error::Internal(format!(
            "{} holds {} bytes, more than workspace metadata's 64 KiB; delete it",
            bucket.url(name),
            found.size
        )));
    }
    // An answer without its generation (an empty object's 416): ask.
    let version = match found.generation {
        Some(generation) => generation,
        None => match bucket.get(name)? {
            Some(live) if live.bytes()? == 0 => live.generation,
            Some(_) => {
                return Err(Error::Unavailable(format!(
                    "{} changed while it was read; retry",
                    bucket.url(name)
                )));
            }
            None => return Ok(None),
        },
    };
    let content = String::from_utf8(found.bytes).map_err(|_| {
        Error::Internal(format!(
            "{} is not UTF-8 text, so no metadata of wasmstate's; delete it",
            bucket.url(name)
        ))
    })?;
    Ok(Some(Metadata { content, version }))
}

/// Set (`Some`) or remove (`None`) the document at `name`, only if it is
/// as `expect` says: one conditional request (`ifGenerationMatch`), so of
/// two writers expecting the same generation one succeeds.
pub fn write(
    bucket: &Bucket,
    name: &str,
    content: Option<&str>,
    expect: &Expect,
) -> Result<bool, Error> {
    let condition = match expect {
        Expect::Any => Condition::Any,
        Expect::Absent => Condition::Absent,
        // Generations are positive numbers: anything else was never one.
        Expect::Version(v) => match v.parse::<i64>() {
            Ok(g) if g > 0 => Condition::Generation(g),
            _ => return Ok(false),
        },
    };
    let Some(content) = content else {
        return remove(bucket, name, condition);
    };
    if content.len() > MAX_BYTES {
        return Err(Error::InvalidInput(format!(
            "workspace metadata of {} bytes is more than 64 KiB",
            content.len()
        )));
    }
    bucket.upload(name, content.as_bytes(), condition, None)
}

/// Remove the document at `name` if `condition` holds; removing one that
/// is not there succeeds, whatever was expected of it.
fn remove(bucket: &Bucket, name: &str, condition: Condition) -> Result<bool, Error> {
    let generation = match condition {
        Condition::Any => None,
        Condition::Absent => return Ok(bucket.get(name)?.is_none()),
        Condition::Generation(g) => Some(g.to_string()),
    };
    if bucket.delete(name, generation.as_deref())? {
        return Ok(true);
    }
    // Refused: changed since, or already gone (a store may answer a
    // condition on a missing object with 412 rather than 404).
    Ok(bucket.get(name)?.is_none())
}
