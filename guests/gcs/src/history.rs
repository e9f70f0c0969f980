//! A state's history from the bucket's object versioning: every generation
//! of the state object, newest first. A generation's serial comes from the
//! `wasmstate-serial` metadata wasmstate writes, or from its first bytes
//! (a state Terraform wrote), or its last (a sealed one written before the
//! metadata).
//!
//! GCS keeps no delete markers: an overwrite ends the old generation the
//! moment the new one is created, a delete ends it with nothing after. So
//! where a generation ended before the next began, or the newest has
//! ended, the workspace had no state: that moment is listed with 0 bytes,
//! and the host's rollback check starts afresh after it. Times alone
//! cannot tell a delete followed by a new state within a second from an
//! overwrite, so this guest deletes a state by writing an empty generation
//! first (`delete_state` in lib.rs): listed with 0 bytes like a workspace
//! created empty, it marks the delete whatever the times say.

use crate::objects::{Bucket, Object, SERIAL_KEY};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use wasmstate_guest::{Error, Version, log, version_in_prefix, version_in_tail};

/// Most versions listed, the newest.
const MAX_VERSIONS: usize = 100;

/// Bytes read from a generation's start, and from its end, for its serial
/// when it carries no metadata.
const SERIAL_BYTES: u64 = 64 << 10;

fn instant(text: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(text, &Rfc3339).ok()
}

fn millis(text: &str) -> u64 {
    instant(text).map_or(0, |t| {
        u64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(0)
    })
}

/// The versions of `object`, newest first; `None` without versioning.
pub fn list(bucket: &Bucket, object: &str) -> Result<Option<Vec<Version>>, Error> {
    if !bucket.versioning_enabled()? {
        log::warn(&format!(
            "gs://{} has object versioning off, so it keeps no previous states: this replica keeps \
             versions in its own data directory. Turn it on (gcloud storage buckets update gs://{} \
             --versioning) so every replica sees every version",
            bucket.name, bucket.name
        ));
        return Ok(None);
    }
    let mut generations: Vec<Object> = bucket
        .list(object, true)?
        .into_iter()
        .filter(|o| o.name == object)
        .collect();
    generations.sort_by_key(|o| std::cmp::Reverse(o.generation.parse::<i64>().unwrap_or(0)));
    let mut versions = Vec::new();
    let mut newer: Option<&Object> = None;
    for generation in &generations {
        let ended = generation.time_deleted.as_deref().and_then(instant);
        let next_began = newer.and_then(|n| instant(&n.time_created));
        // Ended before anything replaced it: a delete. The two times are
        // stamped apart (fake-gcs-server stamps an end to the second), so
        // only a gap past a second counts: a delete missed makes the host's
        // rollback check consult more versions, one made up would let it
        // consult too few.
        let gap = match (ended, next_began) {
            (Some(ended), Some(began)) => began - ended > time::Duration::seconds(1),
            (Some(_), None) => true,
            _ => false,
        };
        if gap {
            versions.push(Version {
                id: format!("deleted-{}", generation.generation),
                serial: None,
                created_unix_ms: generation.time_deleted.as_deref().map_or(0, millis),
                bytes: 0,
            });
        }
        let size = generation.bytes()?;
        let serial = match size {
            0 => None,
            _ => serial_of(bucket, object, generation)?,
        };
        versions.push(Version {
            id: generation.generation.clone(),
            serial,
            created_unix_ms: millis(&generation.time_created),
            bytes: size,
        });
        if versions.len() >= MAX_VERSIONS {
            break;
        }
        newer = Some(generation);
    }
    versions.truncate(MAX_VERSIONS);
    Ok(Some(versions))
}

fn serial_of(bucket: &Bucket, object: &str, generation: &Object) -> Result<Option<u64>, Error> {
    if let Some(serial) = generation
        .metadata
        .get(SERIAL_KEY)
        .and_then(|s| s.parse().ok())
    {
        return Ok(Some(serial));
    }
    let size = generation.bytes()?;
    let head = bucket.read_range(object, &generation.generation, 0, SERIAL_BYTES.min(size))?;
    if let Some((_, serial)) = version_in_prefix(&head) {
        return Ok(Some(serial));
    }
    if size <= SERIAL_BYTES {
        return Ok(None);
    }
    let tail = bucket.read_range(object, &generation.generation, size - SERIAL_BYTES, size)?;
    Ok(version_in_tail(&tail).map(|(_, serial)| serial))
}
