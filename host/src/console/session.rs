//! Browser sessions for the console: who signed in, and the token every
//! admin form must carry (a cross-site page can make a browser send the
//! cookie, never read the token).
//!
//! The cookie is `HttpOnly`, `SameSite=Strict` and `Path=/ui`; sessions
//! live in memory (a restart signs everyone out) for at most
//! [`SESSION_LIFETIME`], and their number is capped.

use crate::auth::Identity;
use aes_gcm::aead::OsRng;
use aes_gcm::aead::rand_core::RngCore;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;

/// The session cookie's name.
pub const COOKIE: &str = "wasmstate_console";
/// How long a sign-in lasts.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(8 * 3600);
/// Most sessions kept; the oldest go first.
const MAX_SESSIONS: usize = 10_000;
/// Most sessions of one user: signing in again and again pushes out that
/// user's own oldest, never someone else's.
const MAX_PER_USER: usize = 16;

/// One signed-in browser.
#[derive(Debug, Clone)]
pub struct Session {
    /// Who it is; `None` when the server has no users (everyone may act).
    pub identity: Option<Identity>,
    /// The token admin forms carry.
    pub csrf: String,
    expires: Instant,
}

impl Session {
    /// Whether `token` is this session's CSRF token (compared in constant
    /// time).
    pub fn csrf_matches(&self, token: &str) -> bool {
        bool::from(self.csrf.as_bytes().ct_eq(token.as_bytes()))
    }
}

/// Every live session, by cookie value.
#[derive(Default)]
pub struct Sessions {
    by_id: Mutex<HashMap<String, Session>>,
}

/// 256 random bits, URL-safe: session ids, CSRF tokens, lock ids.
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    OsRng.fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

impl Sessions {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        self.by_id.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Start a session for `identity`; returns its cookie value.
    pub fn start(&self, identity: Option<Identity>) -> String {
        let id = random_token();
        let now = Instant::now();
        let mut map = self.map();
        map.retain(|_, s| s.expires > now);
        let user = identity.as_ref().map(|i| i.name.clone());
        let theirs = |s: &Session| s.identity.as_ref().map(|i| &i.name) == user.as_ref();
        let full =
            map.values().filter(|s| theirs(s)).count() >= MAX_PER_USER || map.len() >= MAX_SESSIONS;
        if full
            && let Some(oldest) = map
                .iter()
                .filter(|(_, s)| theirs(s) || map.len() >= MAX_SESSIONS)
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        map.insert(
            id.clone(),
            Session {
                identity,
                csrf: random_token(),
                expires: now + SESSION_LIFETIME,
            },
        );
        id
    }

    /// The live session with cookie value `id`.
    pub fn get(&self, id: &str) -> Option<Session> {
        let mut map = self.map();
        match map.get(id) {
            Some(s) if s.expires > Instant::now() => Some(s.clone()),
            Some(_) => {
                map.remove(id);
                None
            }
            None => None,
        }
    }

    /// Sign out.
    pub fn end(&self, id: &str) {
        self.map().remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::Sessions;

    #[test]
    fn sessions_are_found_by_their_id_and_end() {
        let sessions = Sessions::default();
        let id = sessions.start(None);
        let session = sessions.get(&id).expect("live");
        assert!(session.csrf_matches(&session.csrf.clone()));
        assert!(!session.csrf_matches("forged"));
        assert!(sessions.get("other").is_none());
        sessions.end(&id);
        assert!(sessions.get(&id).is_none());
    }
}
