//! Locks as people see them: who holds one and for how long, and the
//! locks the host takes itself.

use wasmstate_types::LockInfo;

/// A lock someone holds, as `GET /ui/api/backends/{backend}/locks` lists
/// it (and `wasmstate lock list` reads it).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct HeldLock {
    /// The locked workspace.
    pub workspace: String,
    /// `user@host` of the holder.
    pub who: String,
    /// What it is doing (`OperationTypeApply`…).
    pub operation: String,
    /// Since when, as the holder's client said (RFC 3339).
    pub created: String,
    /// Seconds since `created`, when it parses (a client's clock).
    pub age_seconds: Option<u64>,
    /// The lock ID: admins only (whoever knows it can unlock).
    pub id: Option<String>,
}

/// `seconds` in its two largest units (`3h 12m`, `4days 1h`, `42s`).
pub fn age_text(seconds: u64) -> String {
    let text = humantime::format_duration(std::time::Duration::from_secs(seconds)).to_string();
    text.split(' ').take(2).collect::<Vec<_>>().join(" ")
}

/// How long ago `lock` was taken at `now`, by the `Created` time its
/// holder's client wrote (that client's clock); `None` when it does not
/// parse.
pub fn lock_age(lock: &LockInfo, now: time::OffsetDateTime) -> Option<time::Duration> {
    let created = time::OffsetDateTime::parse(
        &lock.created,
        &time::format_description::well_known::Rfc3339,
    );
    created.ok().map(|at| now - at)
}

impl HeldLock {
    /// `lock`, held on `workspace`, as `now` sees it; its ID only for an
    /// admin.
    pub fn of(workspace: String, lock: LockInfo, admin: bool, now: time::OffsetDateTime) -> Self {
        HeldLock {
            workspace,
            age_seconds: lock_age(&lock, now).map(|age| age.whole_seconds().max(0) as u64),
            who: lock.who,
            operation: lock.operation,
            created: lock.created,
            id: admin.then_some(lock.id),
        }
    }
}

/// A lock the host or its tools take themselves (a restore, an unlocked
/// write), in Terraform's shape so `terraform force-unlock` and the console
/// understand who holds it. Its id is random, as Terraform's are: nobody
/// else can present it.
pub fn own_lock(operation: &str, info: String, who: String) -> LockInfo {
    use aes_gcm::aead::OsRng;
    use aes_gcm::aead::rand_core::RngCore;
    let mut id = [0u8; 16];
    OsRng.fill_bytes(&mut id);
    let hex = hex::encode(id);
    LockInfo {
        id: format!(
            "{}-{}-{}-{}-{}",
            &hex[..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..]
        ),
        operation: operation.into(),
        info,
        who,
        version: env!("CARGO_PKG_VERSION").into(),
        created: time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        path: String::new(),
    }
}
