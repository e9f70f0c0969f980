//! Where the rollback check of a workspace starts when this replica has
//! not seen it yet (after a start, or on a replica that never served it):
//! from the history the storage keeps, so that every replica on the same
//! storage reaches the same verdict.
//!
//! The seed is the newest version's lineage with the highest serial any
//! version of that lineage reached since the state last began (a version
//! of 0 bytes: a delete, or a workspace created empty). So an older
//! envelope put back as the newest object (a rollback the seal cannot
//! tell) is refused by every replica, not only by the one that wrote the
//! newer state; and a state deleted and started again is judged afresh,
//! as on the replica that deleted it.

use crate::backend::Version;
use std::cmp::Reverse;
use std::future::Future;

/// `lineage` and `serial` a stored state (sealed or not) keeps in clear,
/// read without opening it.
pub fn clear_version(stored: &[u8]) -> Option<(Option<String>, u64)> {
    let prefix = &stored[..stored.len().min(crate::statefile::PREFIX_BYTES)];
    if let Some((lineage, serial)) = crate::statefile::version_in_prefix(prefix)
        .or_else(|| crate::statefile::version_of_envelope(stored))
    {
        return Some((Some(lineage), serial));
    }
    let header = super::envelope::StateHeader::of(stored);
    Some((header.lineage, header.serial?))
}

/// The seed from `versions` (newest first, as the storage lists them),
/// reading a version's bytes with `read` only where its listed serial could
/// raise the seed. `None` when the newest version cannot be read or holds
/// no serial.
pub async fn newest_of_life<F, R>(versions: &[Version], read: R) -> Option<(Option<String>, u64)>
where
    R: Fn(String) -> F,
    F: Future<Output = Option<Vec<u8>>>,
{
    let life: Vec<&Version> = versions.iter().take_while(|v| v.bytes > 0).collect();
    let newest = life.first()?;
    let (lineage, mut serial) = clear_version(&read(newest.id.clone()).await?)?;
    // Listed serials higher than the newest's first; unknown ones last.
    let mut candidates: Vec<&Version> = life[1..]
        .iter()
        .copied()
        .filter(|v| v.serial.is_none_or(|s| s > serial))
        .collect();
    candidates.sort_by_key(|v| Reverse(v.serial.map_or(0, |s| s + 1)));
    for candidate in candidates {
        if candidate.serial.is_some_and(|s| s <= serial) {
            continue;
        }
        let Some(bytes) = read(candidate.id.clone()).await else {
            continue;
        };
        if let Some((their_lineage, their_serial)) = clear_version(&bytes)
            && their_lineage == lineage
            && their_serial > serial
        {
            serial = their_serial;
        }
    }
    Some((lineage, serial))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn version(id: &str, serial: Option<u64>, bytes: u64) -> Version {
        Version {
            id: id.into(),
            serial,
            created_unix_ms: 0,
            bytes,
            written_by: None,
        }
    }

    fn state(lineage: &str, serial: u64) -> Vec<u8> {
        format!(r#"{{"version":4,"serial":{serial},"lineage":"{lineage}"}}"#).into_bytes()
    }

    async fn seed(
        versions: &[Version],
        stored: &[(&str, Vec<u8>)],
    ) -> Option<(Option<String>, u64)> {
        let stored: HashMap<String, Vec<u8>> = stored
            .iter()
            .map(|(id, bytes)| (id.to_string(), bytes.clone()))
            .collect();
        newest_of_life(versions, |id| {
            let got = stored.get(&id).cloned();
            async move { got }
        })
        .await
    }

    #[tokio::test]
    async fn an_older_state_put_back_as_newest_is_seeded_above() {
        // v3 is serial 5 put back over serial 7 of the same lineage.
        let versions = [
            version("v3", Some(5), 10),
            version("v2", Some(7), 10),
            version("v1", Some(5), 10),
        ];
        let stored = [
            ("v3", state("L", 5)),
            ("v2", state("L", 7)),
            ("v1", state("L", 5)),
        ];
        assert_eq!(seed(&versions, &stored).await, Some((Some("L".into()), 7)));
    }

    #[tokio::test]
    async fn another_lineage_or_an_earlier_life_does_not_count() {
        let versions = [
            version("new", Some(2), 10),
            version("other", Some(9), 10),
            version("deleted", None, 0),
            version("before", Some(40), 10),
        ];
        let stored = [
            ("new", state("L", 2)),
            ("other", state("M", 9)),
            ("before", state("L", 40)),
        ];
        assert_eq!(seed(&versions, &stored).await, Some((Some("L".into()), 2)));
    }

    #[tokio::test]
    async fn unknown_serials_are_read_and_nothing_readable_is_no_seed() {
        let versions = [version("b", Some(3), 10), version("a", None, 10)];
        let stored = [("b", state("L", 3)), ("a", state("L", 8))];
        assert_eq!(seed(&versions, &stored).await, Some((Some("L".into()), 8)));
        assert_eq!(seed(&[version("gone", Some(1), 10)], &[]).await, None);
        assert_eq!(seed(&[version("d", None, 0)], &[]).await, None);
    }
}
