//! Where the rollback check of a workspace starts when this replica has
//! not seen it yet (after a start, or on a replica that never served it):
//! from the history the storage keeps, so that every replica on the same
//! storage reaches the same verdict.
//!
//! The seed is the newest version's lineage with the newest `(started,
//! serial)` any version of that lineage reached since the state last began
//! (a version of 0 bytes: a delete, or a workspace created empty). So an older
//! envelope put back as the newest object (a rollback the seal cannot
//! tell) is refused by every replica, not only by the one that wrote the
//! newer state; and a state deleted and started again is judged afresh,
//! as on the replica that deleted it.

use crate::backend::Version;
use std::future::Future;

/// `lineage`, `started` and `serial` a stored state (sealed or not) keeps
/// in clear, read without opening it (`started`: 0 where there is none).
pub fn clear_life(stored: &[u8]) -> Option<(Option<String>, u64, u64)> {
    let (lineage, serial) = clear_version(stored)?;
    let started = match super::envelope::is_sealed(stored) {
        true => super::envelope::label(stored).map_or(0, |l| l.started),
        false => 0,
    };
    Some((lineage, started, serial))
}

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

/// Most versions the seed looks at, newest first: a guest may list more
/// (its storage's whole history), and each may cost a read.
pub const MAX_SEED_VERSIONS: usize = 100;

/// Where a workspace's rollback check starts, from a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seed {
    /// At this lineage, `started` and serial.
    At(Option<String>, u64, u64),
    /// Afresh: the history holds no state of the current life (none at
    /// all, or a delete or an empty creation is the newest).
    Fresh,
    /// Not known (a version could not be read): the check starts with
    /// what the read brings, and the next read asks again.
    Unknown,
}

/// The seed from `versions` (newest first, as the storage lists them),
/// reading versions with `read` only where an older one lists a serial
/// above the newest's (or none): the versions between are read too, for a
/// version written with `allow_force_push` (an older state on purpose)
/// ends the walk. In the common history, where the newest is the highest,
/// that is one read.
pub async fn newest_of_life<F, R>(versions: &[Version], read: R) -> Seed
where
    R: Fn(String) -> F,
    F: Future<Output = Option<Vec<u8>>>,
{
    let life: Vec<&Version> = versions
        .iter()
        .take(MAX_SEED_VERSIONS)
        .take_while(|v| v.bytes > 0)
        .collect();
    let Some(newest) = life.first() else {
        return Seed::Fresh;
    };
    let Some(stored) = read(newest.id.clone()).await else {
        return Seed::Unknown;
    };
    let Some((lineage, mut started, mut serial)) = clear_life(&stored) else {
        return Seed::Unknown;
    };
    if super::envelope::restarts(&stored) {
        return Seed::At(lineage, started, serial);
    }
    // Versions that might raise the seed: a serial above it, or unknown.
    let may_raise = |v: &&Version, serial: u64| v.serial.is_none_or(|s| s > serial);
    for (at, version) in life.iter().enumerate().skip(1) {
        if !life[at..].iter().any(|v| may_raise(v, serial)) {
            break;
        }
        let Some(bytes) = read(version.id.clone()).await else {
            continue;
        };
        if let Some((their_lineage, their_started, their_serial)) = clear_life(&bytes)
            && their_lineage == lineage
            && (their_started, their_serial) > (started, serial)
        {
            (started, serial) = (their_started, their_serial);
        }
        if super::envelope::restarts(&bytes) {
            break;
        }
    }
    Seed::At(lineage, started, serial)
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

    async fn seed(versions: &[Version], stored: &[(&str, Vec<u8>)]) -> Seed {
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
        assert_eq!(
            seed(&versions, &stored).await,
            Seed::At(Some("L".into()), 0, 7)
        );
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
        assert_eq!(
            seed(&versions, &stored).await,
            Seed::At(Some("L".into()), 0, 2)
        );
    }

    #[tokio::test]
    async fn unknown_serials_are_read_and_nothing_readable_is_no_seed() {
        let versions = [version("b", Some(3), 10), version("a", None, 10)];
        let stored = [("b", state("L", 3)), ("a", state("L", 8))];
        assert_eq!(
            seed(&versions, &stored).await,
            Seed::At(Some("L".into()), 0, 8)
        );
        assert_eq!(
            seed(&[version("gone", Some(1), 10)], &[]).await,
            Seed::Unknown
        );
        assert_eq!(seed(&[version("d", None, 0)], &[]).await, Seed::Fresh);
        assert_eq!(seed(&[], &[]).await, Seed::Fresh);
    }

    /// A state force-pushed (older on purpose) ends the walk: what came
    /// before it does not count, whether it is the newest or in between.
    #[tokio::test]
    async fn a_force_pushed_version_starts_the_check_over() {
        use crate::store::envelope;
        let key = envelope::parse_material("k", &envelope::generate_material()).unwrap();
        let place = envelope::Place {
            backend: "b",
            workspace: "w",
        };
        let sealed = |serial: u64, forced: bool| {
            let plain = state("L", serial);
            let header = envelope::StateHeader::of(&plain);
            let sealing = envelope::Sealing {
                key_id: "k",
                key: &key,
                wrapped: None,
            };
            envelope::seal(sealing, place, &plain, &header, forced).unwrap()
        };
        let versions = [
            version("after", Some(31), 10),
            version("forced", Some(30), 10),
            version("before", Some(40), 10),
        ];
        let stored = [
            ("after", sealed(31, false)),
            ("forced", sealed(30, true)),
            ("before", sealed(40, false)),
        ];
        assert_eq!(
            seed(&versions, &stored).await,
            Seed::At(Some("L".into()), 0, 31)
        );
        let stored = [("forced", sealed(30, true)), ("before", sealed(40, false))];
        assert_eq!(
            seed(&versions[1..], &stored).await,
            Seed::At(Some("L".into()), 0, 30)
        );
        // Without the mark, the same history is a rollback from 40.
        let stored = [
            ("after", sealed(31, false)),
            ("forced", sealed(30, false)),
            ("before", sealed(40, false)),
        ];
        assert_eq!(
            seed(&versions, &stored).await,
            Seed::At(Some("L".into()), 0, 40)
        );
    }
}
