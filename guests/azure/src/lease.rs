//! Locks as Terraform's azurerm backend takes them (its `client.go`): the
//! state blob is created empty where missing, an infinite lease is
//! acquired on it with the lock's lease ID proposed, then metadata
//! `terraformlockid` records who holds it. The lease is the arbiter: of
//! two lockers only one acquires it, whatever either read before.

use crate::blobs::{Condition, Container, Props, Refusal, pause};
use crate::lockinfo::{META_KEY, Stored, lease_id, unknown_holder};
use wasmstate_guest::{Error, LockInfo};

/// Pauses while a lease's holder has not written its lock info yet (a
/// locker between its two steps), before it is reported as unknown.
const INFO_PAUSES_MS: [u64; 4] = [10, 50, 150, 400];

/// Times a lock is tried again when the blob changed under it (deleted
/// between the read and the lease, say).
const RETRIES: usize = 10;

/// Who holds the lease on a blob, as its metadata says.
pub enum Holder {
    /// Not leased.
    None,
    /// Leased, with this lock info.
    Known(Stored),
    /// Leased, without readable lock info (why).
    Unknown(String),
}

impl Holder {
    /// The holder of the blob whose properties are `props`.
    pub fn of(props: &Props) -> Holder {
        if !props.leased {
            return Holder::None;
        }
        match props.meta(META_KEY) {
            None | Some("") => Holder::Unknown("is missing".into()),
            Some(value) => match Stored::decode(value) {
                Ok(stored) => Holder::Known(stored),
                Err(why) => Holder::Unknown(format!("is {why}")),
            },
        }
    }

    /// The holder as clients see it (`path` for an unknown one).
    pub fn reported(&self, path: &str) -> Option<LockInfo> {
        match self {
            Holder::None => None,
            Holder::Known(stored) => Some(stored.reported()),
            Holder::Unknown(why) => Some(unknown_holder(path.to_string(), why)),
        }
    }
}

/// `metadata` with the lock info set to `stored`, or removed.
fn with_lock(metadata: &[(String, String)], stored: Option<&Stored>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = metadata
        .iter()
        .filter(|(n, _)| n != META_KEY)
        .cloned()
        .collect();
    if let Some(stored) = stored {
        out.push((META_KEY.to_string(), stored.encode()));
    }
    out
}

/// Take the lock on `blob` for `info`.
pub fn lock(c: &Container, blob: &str, info: &LockInfo) -> Result<(), Error> {
    let path = c.path(blob);
    let stored = Stored::new(info, path.clone());
    let lease = stored.lease().to_string();
    for _ in 0..RETRIES {
        let Some(props) = c.properties(blob)? else {
            // As Terraform: an empty JSON blob to lease; never over a state
            // created meanwhile.
            match c.put(blob, Vec::new(), &[], &Condition::Absent, None, None)? {
                Ok(()) | Err(Refusal::Changed | Refusal::Lease) => continue,
                Err(Refusal::Missing) => {
                    return Err(Error::Internal(format!(
                        "container {} does not exist",
                        c.name
                    )));
                }
            }
        };
        match Holder::of(&props) {
            // Only the very ID it was taken with takes it again: the
            // lease's other names (the GUID of a non-GUID ID, another
            // case) belong to other lockers.
            Holder::Known(held) if held.original() != info.id => {
                return Err(Error::locked(held.reported()));
            }
            // Unleased, leased without lock info, or leased by this lock
            // (a retried request): the acquire decides, as it succeeds only
            // with the lease's own ID.
            _ => {}
        }
        let answer = c.lease(
            blob,
            "acquire",
            &[
                ("x-ms-lease-duration", "-1"),
                ("x-ms-proposed-lease-id", &lease),
            ],
        )?;
        match answer.status {
            201 | 200 => return record(c, blob, &stored),
            404 => continue,
            409 => return Err(held_by_other(c, blob, &info.id)?),
            _ => return Err(crate::blobs::failed(&format!("leasing {path}"), &answer)),
        }
    }
    Err(Error::Unavailable(format!(
        "{path} kept changing while it was being locked"
    )))
}

/// Write the lock info under the lease just acquired, keeping the other
/// metadata, unless the lock's other name got the same lease and recorded
/// itself first (then the lock is theirs). If writing fails otherwise the
/// lease is released again, so no lock is left without a holder to name.
fn record(c: &Container, blob: &str, stored: &Stored) -> Result<(), Error> {
    let lease = stored.lease();
    let outcome = (|| {
        // Written only over the info just read: of two lockers granted one
        // lease, the second finds the first's info.
        for _ in 0..RETRIES {
            let props = c.properties(blob)?.ok_or_else(|| {
                Error::Unavailable(format!(
                    "{} vanished while it was being locked",
                    c.path(blob)
                ))
            })?;
            if let Holder::Known(held) = Holder::of(&props)
                && held.lease().eq_ignore_ascii_case(lease)
                && held.original() != stored.original()
            {
                return Ok(Err(Error::locked(held.reported())));
            }
            let metadata = with_lock(&props.metadata, Some(stored));
            let condition = Condition::Etag(props.etag.clone());
            match c.set_metadata(blob, &metadata, &condition, Some(lease))? {
                Ok(()) => return Ok(Ok(())),
                Err(Refusal::Changed) => continue,
                Err(refusal) => {
                    return Err(Error::Unavailable(format!(
                        "recording the lock on {} was refused ({refusal:?}); retry",
                        c.path(blob)
                    )));
                }
            }
        }
        Err(Error::Unavailable(format!(
            "{} kept changing while its lock was recorded; retry",
            c.path(blob)
        )))
    })();
    match outcome {
        Ok(taken) => taken,
        Err(e) => {
            let _ = c.lease(blob, "release", &[("x-ms-lease-id", lease)]);
            Err(e)
        }
    }
}

/// The error for a lease someone else acquired first: their lock info,
/// once they have written it.
fn held_by_other(c: &Container, blob: &str, id: &str) -> Result<Error, Error> {
    let path = c.path(blob);
    let mut pauses = INFO_PAUSES_MS.iter();
    loop {
        let holder = match c.properties(blob)? {
            Some(props) => Holder::of(&props),
            None => Holder::None,
        };
        match (&holder, pauses.next()) {
            (Holder::Known(held), _) if held.original() == id => {
                // The info names this lock, yet the lease refused its ID:
                // the info outlived its lease (broken by another tool) and
                // someone else leases the blob now.
                return Ok(Error::locked(unknown_holder(
                    path,
                    "names this lock, but another lease holds the blob",
                )));
            }
            (Holder::Known(held), _) => return Ok(Error::locked(held.reported())),
            (Holder::None, _) => {
                return Ok(Error::Unavailable(format!(
                    "the lease on {path} was released while this lock was refused; retry"
                )));
            }
            (Holder::Unknown(_), Some(ms)) => pause(*ms),
            (Holder::Unknown(_), None) => {
                return Ok(Error::locked(holder.reported(&path).expect("leased")));
            }
        }
    }
}

/// Release the lock on `blob` held under `id`.
pub fn unlock(c: &Container, blob: &str, id: &str) -> Result<(), Error> {
    let path = c.path(blob);
    let Some(props) = c.properties(blob)? else {
        return Ok(());
    };
    match Holder::of(&props) {
        Holder::None => Ok(()),
        Holder::Known(held) if held.is(id) => {
            if release(c, blob, &props, held.lease())? {
                return Ok(());
            }
            // The lease is no longer this one (broken and taken since).
            match c.properties(blob)?.map(|p| Holder::of(&p)) {
                Some(Holder::Known(now)) if now.is(id) => Err(Error::Unavailable(format!(
                    "the lease on {path} does not match its lock info; force-unlock it"
                ))),
                Some(now) => Err(Error::lock_mismatch(now.reported(&path))),
                None => Ok(()),
            }
        }
        Holder::Known(held) => Err(Error::lock_mismatch(Some(held.reported()))),
        // No lock info: the lease is ours only if it is our lease ID,
        // which only the release itself can tell.
        Holder::Unknown(_) => {
            let answer = c.lease(blob, "release", &[("x-ms-lease-id", &lease_id(id))])?;
            match answer.status {
                200 => Ok(()),
                _ => Err(Error::lock_mismatch(None)),
            }
        }
    }
}

/// Remove the lock info under `lease`, then release it, as Terraform's
/// Unlock does; `false` when `lease` is not the blob's lease.
fn release(c: &Container, blob: &str, props: &Props, lease: &str) -> Result<bool, Error> {
    let metadata = with_lock(&props.metadata, None);
    match c.set_metadata(blob, &metadata, &Condition::Any, Some(lease))? {
        Ok(()) => {}
        Err(Refusal::Lease) => return Ok(false),
        Err(Refusal::Missing) => return Ok(true),
        Err(Refusal::Changed) => {
            return Err(Error::Unavailable(format!(
                "{} changed while it was being unlocked; retry",
                c.path(blob)
            )));
        }
    }
    let answer = c.lease(blob, "release", &[("x-ms-lease-id", lease)])?;
    match answer.status {
        200 | 404 => Ok(true),
        409 => Ok(false),
        _ => Err(crate::blobs::failed(
            &format!("releasing the lease on {}", c.path(blob)),
            &answer,
        )),
    }
}

/// The holder of the lock on `blob`.
pub fn current(c: &Container, blob: &str) -> Result<Option<LockInfo>, Error> {
    Ok(match c.properties(blob)? {
        Some(props) => Holder::of(&props).reported(&c.path(blob)),
        None => None,
    })
}

/// `props` of `blob` and their holder, read again after pauses while the
/// blob is leased without lock info; `None` when the blob is gone.
fn settled(c: &Container, blob: &str, mut props: Props) -> Result<Option<(Props, Holder)>, Error> {
    let mut pauses = INFO_PAUSES_MS.iter();
    loop {
        let holder = Holder::of(&props);
        match (&holder, pauses.next()) {
            (Holder::Unknown(_), Some(ms)) => {
                pause(*ms);
                match c.properties(blob)? {
                    Some(again) => props = again,
                    None => return Ok(None),
                }
            }
            _ => return Ok(Some((props, holder))),
        }
    }
}

/// Release the lock on `blob` whoever holds it; the holder released.
///
/// A holder whose lock info names its lease is released as Terraform's
/// unlock does (so a lock taken by someone else after the read is left
/// alone); a lease without lock info, or whose info names another lease,
/// is broken.
pub fn force(c: &Container, blob: &str) -> Result<Option<LockInfo>, Error> {
    let path = c.path(blob);
    let Some(props) = c.properties(blob)? else {
        return Ok(None);
    };
    // A lease without lock info may be a locker between its two steps:
    // give it time to record itself before breaking the lease, so a
    // recorded lock is released as its holder's, and reported.
    let Some((props, holder)) = settled(c, blob, props)? else {
        return Ok(None);
    };
    match &holder {
        Holder::None => return Ok(None),
        Holder::Known(held) => {
            if release(c, blob, &props, held.lease())? {
                return Ok(Some(held.reported()));
            }
            // Taken by someone else since the read: theirs, left alone.
            let now = c.properties(blob)?.map(|p| Holder::of(&p));
            if !matches!(&now, Some(Holder::Known(again)) if again.lease() == held.lease()) {
                return Err(Error::Unavailable(format!(
                    "the lock on {path} changed hands while it was being force-unlocked; read it again"
                )));
            }
        }
        Holder::Unknown(_) => {}
    }
    let answer = c.lease(blob, "break", &[("x-ms-lease-break-period", "0")])?;
    if !matches!(answer.status, 202 | 200 | 404 | 409) {
        return Err(crate::blobs::failed(
            &format!("breaking the lease on {path}"),
            &answer,
        ));
    }
    // The broken lease's lock info goes too, unless the blob changed
    // (someone locked it) since.
    if let Some(props) = c.properties(blob)?
        && !props.leased
        && props.meta(META_KEY).is_some()
    {
        let metadata = with_lock(&props.metadata, None);
        let _ = c.set_metadata(blob, &metadata, &Condition::Etag(props.etag.clone()), None)?;
    }
    Ok(holder.reported(&path))
}
