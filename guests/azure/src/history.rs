//! A state's history from the blob's snapshots, kept when `snapshot =
//! true` (Terraform's setting: a snapshot before every write). Each
//! snapshot holds a state that was live until the next write; the live
//! blob is the newest version. Serials come from each version's first
//! bytes (a state Terraform wrote) or its last (a sealed one).
//!
//! Version ids: a snapshot's timestamp; for the live blob `live-` and a
//! token of its content that keeps naming the same bytes after the next
//! write snapshots them (a snapshot keeps its base blob's properties):
//! `md5-<hex>` of its Content-MD5, which the store keeps for every Put
//! Blob and a metadata change (a lock taken or released) leaves alone,
//! and this guest sets on its block lists; a blob another tool uploaded
//! in blocks may have none, and its ETag stands in, which a lock changes
//! (such a version listed, then locked, reads as gone).

use crate::blobs::Container;
use crate::listing::{self, Listed};
use wasmstate_guest::{Error, Version, version_in_prefix, version_in_tail};

/// Most versions listed, the newest.
const MAX_VERSIONS: usize = 100;

/// Bytes read from a version's start, and from its end, for its serial.
const SERIAL_BYTES: u64 = 64 << 10;

/// The prefix of the live blob's version id.
const LIVE: &str = "live-";

/// Times the versions are listed again when the live blob changed while
/// its serial was read.
const LIST_TRIES: usize = 3;

/// The token naming a blob's content (see the module's doc); also the
/// version `head` gives and a conditional write compares, which a lock
/// (metadata) therefore leaves as it is.
pub fn token(md5: Option<&str>, etag: &str) -> String {
    use base64::Engine;
    let digest = md5.filter(|m| !m.is_empty()).and_then(|m| {
        base64::engine::general_purpose::STANDARD
            .decode(m.trim())
            .ok()
    });
    match digest {
        Some(digest) => {
            let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            format!("md5-{hex}")
        }
        None => etag.trim_matches('"').to_string(),
    }
}

/// The token of a listed blob or snapshot.
fn listed_token(version: &Listed) -> String {
    let md5 = Some(version.properties.content_md5.as_str());
    token(md5, &version.properties.etag)
}

/// A version changed or vanished while its serial was read.
struct Moved;

/// The versions of `blob`, newest first.
pub fn list(container: &Container, blob: &str) -> Result<Vec<Version>, Error> {
    for _ in 0..LIST_TRIES {
        if let Ok(versions) = list_once(container, blob)? {
            return Ok(versions);
        }
    }
    Err(Error::Unavailable(format!(
        "{} kept changing while its versions were listed; retry",
        container.path(blob)
    )))
}

/// The versions of `blob`, newest first, unless one moved while read.
fn list_once(container: &Container, blob: &str) -> Result<Result<Vec<Version>, Moved>, Error> {
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
            _ => match serial_of(container, version)? {
                Ok(serial) => serial,
                Err(moved) => return Ok(Err(moved)),
            },
        };
        versions.push(Version {
            id: match &version.snapshot {
                Some(snapshot) => snapshot.clone(),
                None => format!("{LIVE}{}", listed_token(version)),
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
    Ok(Ok(versions))
}

/// Where version `id` of `blob` is now: the snapshot it names, or the
/// live blob (pinned to its ETag now) while its content is the one named,
/// else the newest snapshot of that content. `None` when there is no such
/// version.
pub fn locate(container: &Container, blob: &str, id: &str) -> Result<Option<Located>, Error> {
    let Some(named) = id.strip_prefix(LIVE) else {
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
    if let Some(live) = container.properties(blob)?
        && token(live.md5.as_deref(), &live.etag) == named
    {
        return Ok(Some(Located {
            snapshot: None,
            etag: Some(live.etag),
        }));
    }
    let newest = listing::all(container, blob, true)?
        .into_iter()
        .filter(|b| b.name == blob && listed_token(b) == named)
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

/// The serial of a listed version; [`Moved`] when it changed (the live
/// blob's ETag, even by a lock alone) or vanished since it was listed.
fn serial_of(container: &Container, version: &Listed) -> Result<Result<Option<u64>, Moved>, Error> {
    let size = version.properties.content_length;
    let snapshot = version.snapshot.as_deref();
    let etag = format!("\"{}\"", version.properties.etag.trim_matches('"'));
    // The live blob is pinned to the ETag listed; a snapshot never changes.
    let pin = snapshot.is_none().then_some(etag.as_str());
    let read = |start: u64, end: u64| -> Result<Result<Vec<u8>, Moved>, Error> {
        Ok(container
            .range(&version.name, snapshot, pin, start, end - 1)?
            .map(|answer| answer.body)
            .ok_or(Moved))
    };
    let head = match read(0, SERIAL_BYTES.min(size))? {
        Ok(head) => head,
        Err(moved) => return Ok(Err(moved)),
    };
    if let Some((_, serial)) = version_in_prefix(&head) {
        return Ok(Ok(Some(serial)));
    }
    if size <= SERIAL_BYTES {
        return Ok(Ok(None));
    }
    let tail = match read(size - SERIAL_BYTES, size)? {
        Ok(tail) => tail,
        Err(moved) => return Ok(Err(moved)),
    };
    Ok(Ok(version_in_tail(&tail).map(|(_, serial)| serial)))
}
