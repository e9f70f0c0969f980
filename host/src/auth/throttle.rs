//! Failed sign-ins, counted per client address and per user name: after a
//! few failures, further attempts are refused at once (429 with
//! `Retry-After`) for a backoff that doubles with each failure, without
//! spending a password verification on them. Successful sign-ins and
//! tokens are never slowed by someone else's failures: a success clears its
//! own address and user, and a blocked address is refused before any work.
//!
//! Unknown user names are counted like known ones, so the answers tell an
//! attacker nothing about which names exist. The configured users' names
//! have a table of their own (as large as the config), so no flood of
//! other names can push them out. The other tables are bounded: past
//! [`MAX_TRACKED`] entries, those with no failure for 15 minutes go
//! first, then the least penalised of those not in backoff (fewest
//! failures, the stalest of those first). An entry in backoff is never
//! forgotten before its backoff ends: a table full of them refuses keys it
//! does not track (429, until the first backoff ends) rather than let a
//! churn of names or addresses lift someone's backoff.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures allowed before the backoff starts.
pub const FREE_FAILURES: u32 = 5;
/// The first backoff; each further failure doubles it…
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// …up to this.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// A record with no failure for this long is forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(900);
/// Most addresses (and, separately, user names) tracked at once.
const MAX_TRACKED: usize = 10_000;

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
    blocked_until: Option<Instant>,
}

impl Failures {
    fn blocked(&self, now: Instant) -> bool {
        self.blocked_until.is_some_and(|until| until > now)
    }
}

/// One table of failures, by address or by user name.
#[derive(Debug)]
struct Table<K> {
    entries: Mutex<HashMap<K, Failures>>,
    /// Most entries kept.
    cap: usize,
    /// Set when the table was full of entries in backoff: until the first
    /// of them ends, keys it does not track are refused.
    full_until: Mutex<Option<Instant>>,
}

impl<K: std::hash::Hash + Eq + Clone> Table<K> {
    fn new() -> Self {
        Table::with_cap(MAX_TRACKED)
    }

    fn with_cap(cap: usize) -> Self {
        Table {
            entries: Mutex::new(HashMap::new()),
            cap,
            full_until: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, Failures>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn full_until(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.full_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long `key` must wait, if it is blocked now (a key not tracked
    /// while the table is full of backoffs is).
    fn wait(&self, key: &K, now: Instant) -> Option<Duration> {
        let entries = self.lock();
        let until = match entries.get(key) {
            Some(failures) => failures.blocked_until?,
            None if entries.len() >= self.cap => (*self.full_until())?,
            None => return None,
        };
        (until > now).then(|| until - now)
    }

    fn failed(&self, key: K, now: Instant) {
        let mut entries = self.lock();
        if entries.len() >= self.cap && !entries.contains_key(&key) {
            // Stale entries are past any backoff (FORGET_AFTER > MAX_BACKOFF).
            entries.retain(|_, f| now.duration_since(f.last) < FORGET_AFTER);
            if entries.len() >= self.cap {
                let least = entries
                    .iter()
                    .filter(|(_, f)| !f.blocked(now))
                    .min_by_key(|(_, f)| (f.count, f.last))
                    .map(|(k, _)| k.clone());
                match least {
                    Some(least) => {
                        entries.remove(&least);
                    }
                    None => {
                        // Full of backoffs: forget none, track no more.
                        *self.full_until() = entries.values().filter_map(|f| f.blocked_until).min();
                        return;
                    }
                }
            }
        }
        let entry = entries.entry(key).or_insert(Failures {
            count: 0,
            last: now,
            blocked_until: None,
        });
        if now.duration_since(entry.last) >= FORGET_AFTER {
            entry.count = 0;
        }
        entry.count += 1;
        entry.last = now;
        if entry.count > FREE_FAILURES {
            let doublings = (entry.count - FREE_FAILURES - 1).min(16);
            let backoff = (FIRST_BACKOFF * 2u32.pow(doublings)).min(MAX_BACKOFF);
            entry.blocked_until = Some(now + backoff);
        }
    }

    fn clear(&self, key: &K) {
        self.lock().remove(key);
    }
}

/// Failed sign-ins by client address and by user name.
#[derive(Debug)]
pub struct Throttle {
    addresses: Table<IpAddr>,
    /// Names that are no configured user's.
    users: Table<UserKey>,
    /// The configured users' names, and their own table.
    configured: std::collections::HashSet<UserKey>,
    configured_users: Table<UserKey>,
    /// Address groups a user signed in from before, and when: the
    /// user's backoff does not apply to them, or anyone failing a
    /// user's password from elsewhere would lock the user out.
    known: Mutex<HashMap<UserKey, Instant>>,
    /// Failures of a user from a group they signed in from: what limits
    /// guesses there, since the user's own backoff does not.
    pairs: Table<UserKey>,
}

/// How long an address group a user signed in from stays exempt from
/// the user's backoff.
const KNOWN_FOR: Duration = Duration::from_secs(30 * 24 * 3600);

fn known_key(address: IpAddr, user: &str) -> UserKey {
    use sha2::Digest;
    let mut hash = sha2::Sha256::new();
    hash.update(crate::policy::client_group(address).to_string());
    hash.update([0]);
    hash.update(user.as_bytes());
    hash.finalize().into()
}

/// A user name as the table keeps it: its SHA-256, so a name of any
/// length (a console form may carry megabytes) costs 32 bytes to track.
type UserKey = [u8; 32];

fn user_key(name: &str) -> UserKey {
    use sha2::Digest;
    sha2::Sha256::digest(name.as_bytes()).into()
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle::for_users(std::iter::empty::<&str>())
    }
}

impl Throttle {
    /// A throttle for a server of these users: their names are tracked
    /// apart from any other name, in a table as large as the config.
    pub fn for_users(names: impl IntoIterator<Item = impl AsRef<str>>) -> Self {
        let configured: std::collections::HashSet<UserKey> =
            names.into_iter().map(|n| user_key(n.as_ref())).collect();
        Throttle {
            addresses: Table::new(),
            users: Table::new(),
            configured_users: Table::with_cap(configured.len().max(1)),
            configured,
            known: Mutex::new(HashMap::new()),
            pairs: Table::new(),
        }
    }

    /// The table of `user`'s name.
    fn user_table(&self, user: &UserKey) -> &Table<UserKey> {
        match self.configured.contains(user) {
            true => &self.configured_users,
            false => &self.users,
        }
    }

    /// `Err(wait)` when `address` or `user` is in backoff.
    pub fn check(&self, address: IpAddr, user: Option<&str>) -> Result<(), Duration> {
        let now = Instant::now();
        let by_address = self
            .addresses
            .wait(&crate::policy::client_group(address), now);
        // From a group the user signed in from, the user's failures from
        // that group count (cleared only by the user's success), not the
        // user's failures from everywhere.
        let by_user = user.and_then(|u| match self.is_known(address, u, now) {
            true => self.pairs.wait(&known_key(address, u), now),
            false => {
                let key = user_key(u);
                self.user_table(&key).wait(&key, now)
            }
        });
        match by_address.max(by_user) {
            Some(wait) => Err(wait),
            None => Ok(()),
        }
    }

    /// A sign-in from `address` (as `user`) failed.
    pub fn failed(&self, address: IpAddr, user: Option<&str>) {
        let now = Instant::now();
        self.addresses
            .failed(crate::policy::client_group(address), now);
        if let Some(user) = user {
            let key = user_key(user);
            self.user_table(&key).failed(key, now);
            if self.is_known(address, user, now) {
                self.pairs.failed(known_key(address, user), now);
            }
        }
    }

    /// A sign-in from `address` as `user` succeeded: forget their failures.
    pub fn succeeded(&self, address: IpAddr, user: Option<&str>) {
        self.addresses.clear(&crate::policy::client_group(address));
        if let Some(user) = user {
            let now = Instant::now();
            // A success from a group exempt from the user's backoff does
            // not clear it: the user signing in at home would otherwise
            // reset what guessing from everywhere else has earned.
            if !self.is_known(address, user, now) {
                let key = user_key(user);
                self.user_table(&key).clear(&key);
            }
            self.pairs.clear(&known_key(address, user));
            let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
            if known.len() >= MAX_TRACKED {
                known.retain(|_, at| now.duration_since(*at) < KNOWN_FOR);
                if known.len() >= MAX_TRACKED
                    && let Some(oldest) = known.iter().min_by_key(|(_, at)| **at).map(|(k, _)| *k)
                {
                    known.remove(&oldest);
                }
            }
            known.insert(known_key(address, user), now);
        }
    }

    fn is_known(&self, address: IpAddr, user: &str, now: Instant) -> bool {
        self.known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&known_key(address, user))
            .is_some_and(|at| now.duration_since(*at) < KNOWN_FOR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_client_is_counted_by_its_64_and_a_long_name_by_its_hash() {
        let throttle = Throttle::default();
        let name = "x".repeat(2 << 20);
        for i in 0..=FREE_FAILURES {
            let address: IpAddr = format!("2001:db8:1:2::{i:x}").parse().unwrap();
            throttle.failed(address, Some(&name));
        }
        let other: IpAddr = "2001:db8:1:2:ffff::1".parse().unwrap();
        assert!(
            throttle.check(other, None).is_err(),
            "another address in the /64"
        );
        let neighbour: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert!(
            throttle.check(neighbour, None).is_ok(),
            "the next /64 is someone else"
        );
        assert!(
            throttle.check(neighbour, Some(&name)).is_err(),
            "the name itself"
        );
        let kept: usize = throttle.users.lock().keys().map(|k| k.len()).sum();
        assert_eq!(kept, 32, "a 2 MiB name is kept as its 32-byte hash");
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn backoff_starts_after_the_free_failures_and_doubles() {
        let t = Throttle::default();
        for _ in 0..FREE_FAILURES {
            assert!(t.check(A, Some("alice")).is_ok());
            t.failed(A, Some("alice"));
        }
        assert!(t.check(A, None).is_ok());
        t.failed(A, Some("alice"));
        let first = t.check(A, None).unwrap_err();
        assert!(
            first <= FIRST_BACKOFF && first > FIRST_BACKOFF / 2,
            "{first:?}"
        );
        t.failed(A, Some("alice"));
        let second = t.check(A, None).unwrap_err();
        assert!(second > FIRST_BACKOFF, "{second:?}");
        // The user name is blocked from another address too…
        assert!(t.check(B, Some("alice")).is_err());
        // …but that address, and other users, are not.
        assert!(t.check(B, Some("bob")).is_ok());
    }

    #[test]
    fn a_success_clears_its_address_and_user() {
        let t = Throttle::default();
        for _ in 0..=FREE_FAILURES {
            t.failed(A, Some("alice"));
        }
        assert!(t.check(A, Some("alice")).is_err());
        t.succeeded(A, Some("alice"));
        assert!(t.check(A, Some("alice")).is_ok());
    }

    #[test]
    fn the_tables_stay_bounded() {
        let t = Table::<u32>::new();
        let now = Instant::now();
        for key in 0..(MAX_TRACKED as u32 + 100) {
            t.failed(key, now);
        }
        assert!(t.lock().len() <= MAX_TRACKED);
    }

    /// Filling the table with fresh names (one failure each, from many
    /// addresses) never forgets a name in backoff: the least penalised go.
    #[test]
    fn churning_the_table_does_not_forget_a_backoff() {
        let t = Throttle::default();
        let victim = "alice";
        for _ in 0..=FREE_FAILURES + 2 {
            t.failed(A, Some(victim));
        }
        let wait = t.check(B, Some(victim)).unwrap_err();
        for i in 0..(MAX_TRACKED as u32 + 500) {
            let address = IpAddr::V4(std::net::Ipv4Addr::from(0x0a01_0000 + i));
            t.failed(address, Some(&format!("fresh-{i}")));
        }
        assert_eq!(t.users.lock().len(), MAX_TRACKED);
        let still = t.check(B, Some(victim)).unwrap_err();
        assert!(still <= wait && still > wait / 2, "{still:?} of {wait:?}");
    }

    /// Names with more failures than the victim's, each in backoff, fill
    /// the table: the victim's backoff is kept, and names the table cannot
    /// track are refused until the first backoff ends.
    #[test]
    fn a_table_full_of_backoffs_forgets_none_and_refuses_the_rest() {
        let t = Table::<u32>::with_cap(100);
        let now = Instant::now();
        for _ in 0..=FREE_FAILURES {
            t.failed(0, now);
        }
        let wait = t.wait(&0, now).expect("the victim is in backoff");
        for key in 1..100 {
            for _ in 0..=FREE_FAILURES + 3 {
                t.failed(key, now);
            }
        }
        t.failed(1000, now);
        assert_eq!(t.wait(&0, now), Some(wait), "the victim's backoff stays");
        assert!(!t.lock().contains_key(&1000));
        assert_eq!(
            t.wait(&1000, now),
            Some(wait),
            "refused until a backoff ends"
        );
        let later = now + wait + Duration::from_millis(1);
        assert_eq!(t.wait(&1000, later), None);
        t.failed(1000, later);
        assert!(t.lock().contains_key(&1000), "the lapsed one made room");
        assert!(!t.lock().contains_key(&0));
    }

    /// A configured user's name is tracked apart: a table of other names
    /// full of backoffs neither pushes out nor refuses it.
    #[test]
    fn configured_users_are_kept_apart_from_other_names() {
        let t = Throttle::for_users(["alice"]);
        // A backoff of 16 s: it outlasts the flood below.
        for _ in 0..=FREE_FAILURES + 4 {
            t.failed(A, Some("alice"));
        }
        assert!(t.check(B, Some("alice")).is_err());
        let attacker: IpAddr = "192.0.2.66".parse().unwrap();
        // One more name than the table holds, each with more failures
        // than hers: the last is not tracked.
        for i in 0..=MAX_TRACKED as u32 {
            for _ in 0..=FREE_FAILURES + 7 {
                t.failed(attacker, Some(&format!("name-{i}")));
            }
        }
        assert!(t.check(B, Some("alice")).is_err(), "her backoff stays");
        assert!(
            t.check(B, Some("someone-else")).is_err(),
            "the full table refuses"
        );
        let t = Throttle::for_users(["alice", "bob"]);
        for i in 0..MAX_TRACKED as u32 {
            for _ in 0..=FREE_FAILURES {
                t.failed(attacker, Some(&format!("name-{i}")));
            }
        }
        assert_eq!(
            t.check(B, Some("bob")),
            Ok(()),
            "a user with no failures is not refused"
        );
    }

    /// Failures of a user's password from elsewhere do not lock the user
    /// out of an address group they signed in from before (they did).
    #[test]
    fn a_users_known_address_is_not_locked_out_by_others_failures() {
        let t = Throttle::default();
        let home: IpAddr = "192.0.2.7".parse().unwrap();
        t.succeeded(home, Some("alice"));
        for i in 0..=FREE_FAILURES {
            let elsewhere: IpAddr = format!("198.51.100.{i}").parse().unwrap();
            t.failed(elsewhere, Some("alice"));
        }
        let stranger: IpAddr = "203.0.113.9".parse().unwrap();
        assert!(t.check(stranger, Some("alice")).is_err());
        assert_eq!(t.check(home, Some("alice")), Ok(()));
        // Guessing alice's password from her own group is limited by her
        // failures there, which another user's success does not clear.
        let t = Throttle::default();
        t.succeeded(home, Some("alice"));
        for _ in 0..3 {
            for _ in 0..=FREE_FAILURES {
                t.failed(home, Some("alice"));
            }
            t.succeeded(home, Some("mallory"));
        }
        assert!(t.check(home, Some("alice")).is_err());
        assert_eq!(t.check(home, Some("mallory")), Ok(()));
        // Her signing in at home does not clear what guessing from
        // elsewhere earned.
        let t = Throttle::default();
        t.succeeded(home, Some("alice"));
        for i in 0..=FREE_FAILURES {
            t.failed(format!("198.51.100.{i}").parse().unwrap(), Some("alice"));
        }
        t.succeeded(home, Some("alice"));
        assert!(t.check(stranger, Some("alice")).is_err());
        // Its own address failing still blocks it.
        for _ in 0..=FREE_FAILURES {
            t.failed(home, Some("alice"));
        }
        assert!(t.check(home, Some("alice")).is_err());
    }
}
