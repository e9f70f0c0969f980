//! Who may do what: HTTP Basic users (argon2 password hashes) and bearer
//! tokens (stored as SHA-256), each with grants `backend:workspaces:role`.
//!
//! Roles are ordered: `read` (GET state, list workspaces) < `write` (+ POST,
//! LOCK, UNLOCK, create workspaces) < `admin` (+ force-unlock, DELETE state,
//! delete workspaces). A grant's backend and workspace parts are a name, a
//! prefix ending in `*`, or `*`.
//!
//! Verifying argon2 takes tens of milliseconds by design, and Terraform sends
//! many requests per run, so a successful verification is remembered for a
//! few minutes, keyed by a hash of the credentials.

use base64::Engine as _;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;

/// How long a verified password stays verified.
const VERIFIED_FOR: Duration = Duration::from_secs(300);

/// What a request wants to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Read states and list workspaces.
    Read,
    /// Also write states, lock and unlock, create workspaces.
    Write,
    /// Also force-unlock and delete states and workspaces.
    Admin,
}

impl Role {
    fn parse(text: &str) -> Result<Role, String> {
        match text {
            "read" => Ok(Role::Read),
            "write" => Ok(Role::Write),
            "admin" => Ok(Role::Admin),
            other => Err(format!("unknown role {other:?}: use read, write or admin")),
        }
    }
}

/// `backend:workspaces:role`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    backend: String,
    workspaces: String,
    role: Role,
}

fn matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

impl Grant {
    /// Parse `backend:workspaces:role`, e.g. `prod:*:write`.
    pub fn parse(text: &str) -> Result<Grant, String> {
        let parts: Vec<&str> = text.split(':').collect();
        let [backend, workspaces, role] = parts.as_slice() else {
            return Err(format!(
                "grant {text:?} must be backend:workspaces:role, e.g. \"prod:*:write\""
            ));
        };
        Ok(Grant {
            backend: backend.to_string(),
            workspaces: workspaces.to_string(),
            role: Role::parse(role)?,
        })
    }

    fn allows(&self, backend: &str, workspace: Option<&str>, role: Role) -> bool {
        self.role >= role
            && matches(&self.backend, backend)
            && workspace.is_none_or(|ws| matches(&self.workspaces, ws))
    }
}

/// A user who signs in with HTTP Basic.
#[derive(Debug, Clone)]
pub struct User {
    /// User name.
    pub name: String,
    /// PHC-format argon2 hash, from `wasmstate hash-password`.
    pub password_hash: String,
    /// What the user may do.
    pub grants: Vec<Grant>,
}

/// A bearer token, for automation.
#[derive(Debug, Clone)]
pub struct Token {
    /// Name, for logs.
    pub name: String,
    /// SHA-256 of the token, hex.
    pub sha256: String,
    /// What the token may do.
    pub grants: Vec<Grant>,
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// User or token name.
    pub name: String,
    grants: Vec<Grant>,
}

impl Identity {
    /// Whether this caller may act as `role` on `backend` (and `workspace`,
    /// when the action concerns one).
    pub fn may(&self, backend: &str, workspace: Option<&str>, role: Role) -> bool {
        self.grants
            .iter()
            .any(|g| g.allows(backend, workspace, role))
    }
}

/// Why a request was not authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// No usable credentials were sent.
    Missing,
    /// Credentials were sent and are wrong.
    Invalid,
}

/// Checks credentials against the configured users and tokens.
#[derive(Debug, Default)]
pub struct Authenticator {
    users: Vec<User>,
    tokens: Vec<Token>,
    verified: Mutex<HashMap<[u8; 32], Instant>>,
}

impl Authenticator {
    /// An authenticator for these users and tokens.
    pub fn new(users: Vec<User>, tokens: Vec<Token>) -> Self {
        Authenticator {
            users,
            tokens,
            verified: Mutex::new(HashMap::new()),
        }
    }

    /// Whether any user or token is configured (otherwise everyone is
    /// allowed everything, which the server permits only on loopback).
    pub fn enabled(&self) -> bool {
        !self.users.is_empty() || !self.tokens.is_empty()
    }

    /// Who sent a request with this `Authorization` header.
    pub fn authenticate(&self, header: Option<&str>) -> Result<Identity, AuthError> {
        let header = header.ok_or(AuthError::Missing)?;
        let (scheme, credentials) = header.trim().split_once(' ').ok_or(AuthError::Missing)?;
        match scheme.to_ascii_lowercase().as_str() {
            "basic" => self.basic(credentials.trim()),
            "bearer" => self.bearer(credentials.trim()),
            _ => Err(AuthError::Missing),
        }
    }

    fn basic(&self, encoded: &str) -> Result<Identity, AuthError> {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|_| AuthError::Invalid)?;
        let text = String::from_utf8(decoded).map_err(|_| AuthError::Invalid)?;
        let (name, password) = text.split_once(':').ok_or(AuthError::Invalid)?;
        let user = self
            .users
            .iter()
            .find(|u| u.name == name)
            .ok_or(AuthError::Invalid)?;
        let key: [u8; 32] =
            Sha256::digest(format!("{}\0{name}\0{password}", user.password_hash)).into();
        let mut verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = verified
            .get(&key)
            .is_some_and(|at| at.elapsed() < VERIFIED_FOR);
        if !fresh {
            drop(verified);
            if !verify_password(password, &user.password_hash) {
                return Err(AuthError::Invalid);
            }
            verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
            verified.retain(|_, at| at.elapsed() < VERIFIED_FOR);
            verified.insert(key, Instant::now());
        }
        Ok(Identity {
            name: user.name.clone(),
            grants: user.grants.clone(),
        })
    }

    fn bearer(&self, token: &str) -> Result<Identity, AuthError> {
        let digest = hex::encode(Sha256::digest(token.as_bytes()));
        // Compare against every token in constant time, so timing says
        // nothing about which prefix matched.
        let mut found = None;
        for t in &self.tokens {
            if bool::from(t.sha256.as_bytes().ct_eq(digest.as_bytes())) {
                found = Some(t);
            }
        }
        found
            .map(|t| Identity {
                name: t.name.clone(),
                grants: t.grants.clone(),
            })
            .ok_or(AuthError::Invalid)
    }
}

/// Hash `password` with argon2id and a fresh salt (PHC string).
pub fn hash_password(password: &str) -> String {
    use argon2::password_hash::{PasswordHasher, SaltString, rand_core::OsRng};
    let salt = SaltString::generate(&mut OsRng);
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .expect("argon2 with default parameters")
        .to_string()
}

fn verify_password(password: &str, hash: &str) -> bool {
    use argon2::password_hash::{PasswordHash, PasswordVerifier};
    PasswordHash::new(hash).is_ok_and(|parsed| {
        argon2::Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok()
    })
}

/// Whether `hash` is a PHC string this server can verify.
pub fn check_hash(hash: &str) -> Result<(), String> {
    argon2::password_hash::PasswordHash::new(hash)
        .map(|_| ())
        .map_err(|e| {
            format!("not an argon2 PHC hash ({e}); make one with `wasmstate hash-password`")
        })
}

/// A new random bearer token and its SHA-256 (what the config stores).
pub fn generate_token() -> (String, String) {
    use argon2::password_hash::rand_core::{OsRng, RngCore};
    let mut bytes = [0u8; 32];
    OsRng.fill_bytes(&mut bytes);
    let token = format!("wst_{}", hex::encode(bytes));
    let digest = hex::encode(Sha256::digest(token.as_bytes()));
    (token, digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth() -> (Authenticator, String) {
        let (token, digest) = generate_token();
        let users = vec![User {
            name: "alice".into(),
            password_hash: hash_password("s3cret"),
            grants: vec![
                Grant::parse("prod:team-a-*:write").unwrap(),
                Grant::parse("*:*:read").unwrap(),
            ],
        }];
        let tokens = vec![Token {
            name: "ci".into(),
            sha256: digest,
            grants: vec![Grant::parse("dev:*:admin").unwrap()],
        }];
        (Authenticator::new(users, tokens), token)
    }

    fn basic(user: &str, password: &str) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )
    }

    #[test]
    fn basic_users_and_their_grants() {
        let (auth, _) = auth();
        let alice = auth.authenticate(Some(&basic("alice", "s3cret"))).unwrap();
        assert!(alice.may("prod", Some("team-a-net"), Role::Write));
        assert!(!alice.may("prod", Some("team-b"), Role::Write));
        assert!(alice.may("prod", Some("team-b"), Role::Read));
        assert!(!alice.may("prod", Some("team-a-net"), Role::Admin));
        // The second check is served from the verification cache.
        assert_eq!(
            auth.authenticate(Some(&basic("alice", "s3cret"))).unwrap(),
            alice
        );
        assert_eq!(
            auth.authenticate(Some(&basic("alice", "wrong"))),
            Err(AuthError::Invalid)
        );
        assert_eq!(
            auth.authenticate(Some(&basic("mallory", "s3cret"))),
            Err(AuthError::Invalid)
        );
        assert_eq!(auth.authenticate(None), Err(AuthError::Missing));
        assert_eq!(auth.authenticate(Some("Digest x")), Err(AuthError::Missing));
    }

    #[test]
    fn bearer_tokens() {
        let (auth, token) = auth();
        let ci = auth.authenticate(Some(&format!("Bearer {token}"))).unwrap();
        assert!(ci.may("dev", Some("anything"), Role::Admin));
        assert!(!ci.may("prod", None, Role::Read));
        assert_eq!(
            auth.authenticate(Some("Bearer wst_nope")),
            Err(AuthError::Invalid)
        );
    }

    #[test]
    fn grants_are_validated() {
        assert!(Grant::parse("prod:*").is_err());
        assert!(Grant::parse("prod:*:owner").is_err());
        assert!(check_hash("plaintext").is_err());
        assert!(check_hash(&hash_password("x")).is_ok());
    }
}
