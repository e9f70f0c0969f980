//! Upload capabilities: the URLs a state version's create answers with,
//! which terraform PUTs to without a bearer. Each is 32 random bytes,
//! good for one PUT within [`LIFETIME`], for one kind (raw or JSON) of one
//! pending version. They live in this replica's memory: the PUT must reach
//! the replica that answered the create (terraform sends both from one
//! process, within a second), and a restart forgets them, so a version
//! whose upload never came never becomes current.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an upload URL may be used.
pub const LIFETIME: Duration = Duration::from_secs(300);

/// At most this many versions wait for their uploads at once (each holds a
/// few hundred bytes; the rest are refused until some are used or expire).
const MAX_PENDING: usize = 4096;

/// At most this many of them for one workspace, so that one lock holder
/// cannot take the whole server's room (terraform has one at a time).
pub const MAX_PENDING_PER_WORKSPACE: usize = 16;

/// At most this many of them for one principal (a user or token name),
/// so that one caller cannot take the whole server's room through many
/// workspaces either.
pub const MAX_PENDING_PER_PRINCIPAL: usize = 64;

/// Why no version was created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The server has [`MAX_PENDING`] pending.
    Server,
    /// The workspace has [`MAX_PENDING_PER_WORKSPACE`]; the oldest
    /// expires after this long.
    Workspace(Duration),
    /// The caller has [`MAX_PENDING_PER_PRINCIPAL`]; the oldest expires
    /// after this long.
    Principal(Duration),
}

/// What an upload URL is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The raw state: written as the workspace's state.
    Raw,
    /// Terraform's JSON rendering: accepted and not kept.
    Json,
}

/// A state version created in upload mode.
#[derive(Debug, Clone)]
pub struct Pending {
    /// Its id (`svp-…`).
    pub id: String,
    /// The backend and workspace it is for.
    pub at: super::ids::At,
    /// Who created it (the write is theirs, in the audit trail too).
    pub caller: crate::protocol::Caller,
    /// The serial announced.
    pub serial: i64,
    /// MD5 of the raw state announced.
    pub md5: [u8; 16],
    /// The id of the caller's lock at create time: the upload writes
    /// under it, so it fails once that lock is gone.
    pub lock_id: String,
    /// `pending`, then `finalized` or `discarded`.
    pub status: &'static str,
    expires: Instant,
}

#[derive(Default)]
struct Inner {
    /// Upload secret → (version id, kind).
    secrets: HashMap<String, (String, Kind)>,
    /// Version id → version.
    versions: HashMap<String, Pending>,
}

/// The pending versions and their upload secrets.
#[derive(Default)]
pub struct Uploads(Mutex<Inner>);

fn random_hex() -> String {
    use aes_gcm::aead::OsRng;
    use aes_gcm::aead::rand_core::RngCore;
    let mut bytes = [0u8; 32];
    OsRng.fill_bytes(&mut bytes);
    hex::encode(bytes)
}

impl Uploads {
    /// A new pending version and its two upload secrets (raw, JSON);
    /// refused when too many are pending on the server, for its workspace
    /// or for its caller.
    pub fn create(
        &self,
        at: super::ids::At,
        caller: crate::protocol::Caller,
        serial: i64,
        md5: [u8; 16],
        lock_id: String,
    ) -> Result<(Pending, String, String), Full> {
        let mut inner = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        inner.versions.retain(|_, v| v.expires > now);
        let Inner { secrets, versions } = &mut *inner;
        // Finalized and discarded ones stay (for their reads, and for the
        // JSON upload terraform sends beside the raw one) but hold no raw
        // upload any more: when room runs short they make room, so that
        // creating versions and spoiling their uploads in a loop cannot
        // fill the server. Those with no upload outstanding go first,
        // then the oldest (a JSON upload comes within moments of its raw
        // one).
        if versions.len() >= MAX_PENDING {
            let outstanding: std::collections::HashSet<&String> =
                secrets.values().map(|(id, _)| id).collect();
            let mut settled: Vec<(bool, Instant, String)> = versions
                .iter()
                .filter(|(_, v)| v.status != "pending")
                .map(|(id, v)| (outstanding.contains(id), v.expires, id.clone()))
                .collect();
            settled.sort_unstable();
            let excess = versions.len() + 1 - MAX_PENDING;
            for (_, _, id) in settled.into_iter().take(excess) {
                versions.remove(&id);
            }
        }
        secrets.retain(|_, (id, _)| versions.contains_key(id));
        if versions.len() >= MAX_PENDING {
            return Err(Full::Server);
        }
        // Only pending ones count against a workspace or a principal.
        let who = super::principal(&caller);
        let waiting = |mine: &dyn Fn(&Pending) -> bool| {
            versions
                .values()
                .filter(|v| v.status == "pending" && mine(v))
                .fold((0, None), |(n, oldest): (usize, Option<Instant>), v| {
                    (n + 1, Some(oldest.map_or(v.expires, |o| o.min(v.expires))))
                })
        };
        let wait = |oldest: Option<Instant>| {
            oldest.map_or(LIFETIME, |o: Instant| o.saturating_duration_since(now))
        };
        let (count, oldest) = waiting(&|v| v.at == at);
        if count >= MAX_PENDING_PER_WORKSPACE {
            return Err(Full::Workspace(wait(oldest)));
        }
        let (count, oldest) = waiting(&|v| super::principal(&v.caller) == who);
        if count >= MAX_PENDING_PER_PRINCIPAL {
            return Err(Full::Principal(wait(oldest)));
        }
        let pending = Pending {
            id: format!("svp-{}", &random_hex()[..32]),
            at,
            caller,
            serial,
            md5,
            lock_id,
            status: "pending",
            expires: now + LIFETIME,
        };
        let (raw, json) = (random_hex(), random_hex());
        inner
            .secrets
            .insert(raw.clone(), (pending.id.clone(), Kind::Raw));
        inner
            .secrets
            .insert(json.clone(), (pending.id.clone(), Kind::Json));
        inner.versions.insert(pending.id.clone(), pending.clone());
        Ok((pending, raw, json))
    }

    /// Use `secret` (once): its version, unexpired, and what it uploads.
    /// A raw upload needs its version still pending; the JSON one, which
    /// terraform sends at the same time and is not kept, does not.
    pub fn redeem(&self, secret: &str) -> Option<(Pending, Kind)> {
        let mut inner = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (id, kind) = inner.secrets.remove(secret)?;
        let version = inner.versions.get(&id)?;
        let usable =
            version.expires > Instant::now() && (kind == Kind::Json || version.status == "pending");
        usable.then(|| (version.clone(), kind))
    }

    /// Set the status of version `id` (`finalized`, `discarded`).
    pub fn settle(&self, id: &str, status: &'static str) {
        let mut inner = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(version) = inner.versions.get_mut(id) {
            version.status = status;
        }
    }

    /// Version `id`, while this replica remembers it.
    pub fn get(&self, id: &str) -> Option<Pending> {
        let inner = self.0.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .versions
            .get(id)
            .filter(|v| v.expires > Instant::now())
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upload_url_works_once_and_only_for_its_kind() {
        let uploads = Uploads::default();
        let caller = crate::protocol::Caller::from_identity(None);
        let (pending, raw, json) = uploads
            .create(("b".into(), "w".into()), caller, 1, [0; 16], "L".into())
            .unwrap();
        assert_ne!(raw, json);
        assert_eq!(raw.len(), 64);
        let (used, kind) = uploads.redeem(&raw).unwrap();
        assert_eq!((used.id.as_str(), kind), (pending.id.as_str(), Kind::Raw));
        assert!(uploads.redeem(&raw).is_none(), "a second use");
        uploads.settle(&pending.id, "finalized");
        // The JSON upload, sent beside the raw one, still lands once.
        assert!(uploads.redeem(&json).is_some());
        assert!(uploads.redeem(&json).is_none());
        assert!(uploads.redeem("guess").is_none());
        assert_eq!(uploads.get(&pending.id).unwrap().status, "finalized");
    }

    #[test]
    fn one_workspace_cannot_take_every_pending_upload() {
        let uploads = Uploads::default();
        let caller = crate::protocol::Caller::from_identity(None);
        let create = |ws: &str| {
            uploads.create(
                ("b".into(), ws.into()),
                caller.clone(),
                1,
                [0; 16],
                "L".into(),
            )
        };
        for _ in 0..MAX_PENDING_PER_WORKSPACE {
            create("w").unwrap();
        }
        assert!(matches!(create("w"), Err(Full::Workspace(wait)) if wait <= LIFETIME));
        // Another workspace still has room; an upload frees one.
        let (_, raw, _) = create("v").unwrap();
        assert!(uploads.redeem(&raw).is_some());
        let (first, ..) = create("v").unwrap();
        uploads.settle(&first.id, "finalized");
        assert!(create("v").is_ok());
    }
}
