//! A state's history from the blob's snapshots, kept when `snapshot =
//! true` (Terraform's setting: a snapshot before every write). Each
//! snapshot holds a state that was live until the next write; the live
//! blob is the newest version. Serials come from each version's first
//! bytes (a state Terraform wrote) or its last (a sealed one).
//!
//! Version ids: a snapshot's timestamp; for the live blob `live-<ETag>`,
//! which keeps naming the same bytes after the next write snapshots them
//! (a snapshot keeps its base blob's ETag).

use crate::blobs::Container;
use crate::listing::{self, Listed};
use wasmstate_guest::{Error, Version, version_in_prefix, version_in_tail};

/// Most versions listed, the newest.
const MAX_VERSIONS: usize = 100;

/// Bytes read from a version's start, and from its end, for its serial.
const SERIAL_BYTES: u64 = 64 << 10;

/// The prefix of the live blob's version id.
const LIVE: &str = "live-";

/// The versions of `blob`, newest first.
pub fn list(container: &Container, blob: &str) -> Result<Vec<Version>, Error> {
    let mut found: Vec<Listed> = listing::all(container, blob, true)?
        .into_iter()
        .filter(|b| b.name == blob)
        .collect();
    // The live blob first, then snapshots newest first (their timestamps
    // are fixed-width ISO 8601, so text order is time order).
    found.sort_by(|a, b| match (&a.snapshot, &b.snapshot) {
        (None, None) => std::cmp::Ordering::Equal,
        (None, Some(_)) => std::cmp::Ordering::Less,
        (Some(_), None) => std::cmp::Ordering::Greater,
        (Some(x), Some(y)) => y.cmp(x),
    });
    found.truncate(MAX_VERSIONS);
    let mut versions = Vec::new();
    for version in &found {
        let bytes = version.properties.content_length;
        let serial = match bytes {
            0 => None,
            _ => serial_of(container, version)?,
        };
        versions.push(Version {
            id: match &version.snapshot {
                Some(snapshot) => snapshot.clone(),
                None => format!("{LIVE}{}", version.properties.etag.trim_matches('"')),
            },
            serial,
            created_unix_ms: version.modified_unix_ms(),
            bytes,
        });
    }
    // A snapshot carries its base's Last-Modified, which the store gives
    // to the second: equal times keep the listing's order, and no later
    // entry may claim a later time than an earlier one.
    for i in 1..versions.len() {
        versions[i].created_unix_ms = versions[i]
            .created_unix_ms
            .min(versions[i - 1].created_unix_ms);
    }
    Ok(versions)
}

/// Where version `id` of `blob` is now: the snapshot it names, or the
/// live blob while it still has the ETag named, else the snapshot the
/// next write made of it. `None` when there is no such version.
pub fn locate(container: &Container, blob: &str, id: &str) -> Result<Option<Located>, Error> {
    let Some(etag) = id.strip_prefix(LIVE) else {
        // A snapshot timestamp: digits, `-`, `:`, `.`, `T`, `Z`.
        let plausible = !id.is_empty()
            && id.len() <= 40
            && id
                .bytes()
                .all(|b| b.is_ascii_digit() || matches!(b, b'-' | b':' | b'.' | b'T' | b'Z'));
        return Ok(plausible.then(|| Located {
            snapshot: Some(id.to_string()),
            etag: None,
        }));
    };
    let quoted = format!("\"{etag}\"");
    if let Some(live) = container.properties(blob)?
        && live.etag == quoted
    {
        return Ok(Some(Located {
            snapshot: None,
            etag: Some(quoted),
        }));
    }
    let newest = listing::all(container, blob, true)?
        .into_iter()
        .filter(|b| b.name == blob && b.properties.etag.trim_matches('"') == etag)
        .filter_map(|b| b.snapshot)
        .max();
    Ok(newest.map(|snapshot| Located {
        snapshot: Some(snapshot),
        etag: None,
    }))
}

/// A version's place: a snapshot, or the live blob pinned to an ETag.
pub struct Located {
    /// The snapshot's timestamp.
    pub snapshot: Option<String>,
    /// The live blob's ETag.
    pub etag: Option<String>,
}

fn serial_of(container: &Container, version: &Listed) -> Result<Option<u64>, Error> {
    let size = version.properties.content_length;
    let snapshot = version.snapshot.as_deref();
    let etag = format!("\"{}\"", version.properties.etag.trim_matches('"'));
    // The live blob is pinned to the ETag listed; a snapshot never changes.
    let pin = snapshot.is_none().then_some(etag.as_str());
    let read = |start: u64, end: u64| -> Result<Vec<u8>, Error> {
        Ok(container
            .range(&version.name, snapshot, pin, start, end - 1)?
            .map(|answer| answer.body)
            .unwrap_or_default())
    };
    let head = read(0, SERIAL_BYTES.min(size))?;
    if let Some((_, serial)) = version_in_prefix(&head) {
        return Ok(Some(serial));
    }
    if size <= SERIAL_BYTES {
        return Ok(None);
    }
    let tail = read(size - SERIAL_BYTES, size)?;
    Ok(version_in_tail(&tail).map(|(_, serial)| serial))
}
