//! Who may do what: HTTP Basic users (argon2 password hashes) and bearer
//! tokens (stored as SHA-256), each with grants `backend:workspaces:role`.
//! A user may also send `Bearer user:password` (the cloud block sends only
//! bearer tokens), and a token may be sent as the Basic password with any
//! user name (Terraform's http backend sends only Basic).
//!
//! Roles are ordered: `outputs` (a state's outputs that are not sensitive,
//! as a state without resources) < `read` (GET state, list workspaces) <
//! `write` (+ POST, LOCK, UNLOCK, create workspaces) < `admin` (+
//! force-unlock, DELETE state, delete workspaces). A grant's backend and workspace parts are a name, a
//! prefix ending in `*`, or `*`.
//!
//! Verifying argon2 takes tens of milliseconds by design, and Terraform sends
//! many requests per run, so a successful verification is remembered for a
//! few minutes, keyed by a hash of the credentials. Verifications run on
//! the blocking pool, a few at a time, so a flood of wrong passwords never
//! holds the threads that serve everyone else; failures are throttled per
//! client address and per user name ([`throttle`]). An unknown user name is
//! verified against a hash of the same cost, so it is refused in the same
//! time as a known one.

pub mod oidc;
pub mod throttle;

use base64::Engine as _;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;
use throttle::Throttle;

/// How long a verified password stays verified.
const VERIFIED_FOR: Duration = Duration::from_secs(300);

/// What a request wants to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// See the outputs of states (not the sensitive ones), and nothing
    /// else of them: what `terraform_remote_state` needs of another team's
    /// workspace. Every check that asks for `Read` refuses it.
    Outputs,
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
            "outputs" => Ok(Role::Outputs),
            "read" => Ok(Role::Read),
            "write" => Ok(Role::Write),
            "admin" => Ok(Role::Admin),
            other => Err(format!(
                "unknown role {other:?}: use outputs, read, write or admin"
            )),
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
            && match workspace {
                Some(ws) => matches(&self.workspaces, ws),
                // The backend itself. Reading or writing it means some
                // workspace of it (listings then filter each name);
                // administering it (what it is made of, its guest, its
                // grants) takes a grant on every workspace.
                None => role < Role::Admin || self.workspaces == "*",
            }
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
    /// What the audit trail keeps of an OIDC caller's claims.
    pub claims: std::collections::BTreeMap<String, String>,
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
    /// Too many failures from this address or for this user name: try
    /// again after this long.
    Throttled(Duration),
}

/// Checks credentials against the configured users and tokens.
#[derive(Debug)]
pub struct Authenticator {
    users: Vec<User>,
    tokens: Vec<Token>,
    verified: Mutex<HashMap<[u8; 32], Instant>>,
    throttle: Throttle,
    /// Password verifications running at once (each takes a core for tens
    /// of milliseconds).
    verifying: Arc<tokio::sync::Semaphore>,
    /// What an unknown user name's password is checked against.
    decoy_hash: String,
    /// Issuers whose tokens sign callers in.
    oidc: Vec<oidc::Issuer>,
}

impl Default for Authenticator {
    fn default() -> Self {
        Authenticator::new(Vec::new(), Vec::new())
    }
}

impl Authenticator {
    /// An authenticator for these users and tokens.
    pub fn new(users: Vec<User>, tokens: Vec<Token>) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        // Only needed (and only paid for) when users sign in with passwords.
        let decoy_hash = if users.is_empty() {
            String::new()
        } else {
            hash_password(&generate_token().0)
        };
        // Configured users' failures are tracked apart from other names'.
        let throttle = Throttle::for_users(users.iter().map(|u| u.name.as_str()));
        Authenticator {
            users,
            tokens,
            verified: Mutex::new(HashMap::new()),
            throttle,
            verifying: Arc::new(tokio::sync::Semaphore::new(cores)),
            decoy_hash,
            oidc: Vec::new(),
        }
    }

    /// Also sign in callers with tokens from these issuers.
    pub fn with_oidc(mut self, issuers: Vec<oidc::Issuer>) -> Self {
        self.oidc = issuers;
        self
    }

    /// The configured issuer `token` says it is from, if it is a JWT.
    fn issuer_of(&self, token: &str) -> Option<&oidc::Issuer> {
        if self.oidc.is_empty() {
            return None;
        }
        let claimed = oidc::unchecked_issuer(token)?;
        self.oidc.iter().find(|i| i.issuer() == claimed)
    }

    /// Sign in with an OIDC token: a valid one is never slowed by anyone's
    /// failures; a bad one counts against its address like a wrong
    /// password.
    async fn oidc_sign_in(
        &self,
        issuer: &oidc::Issuer,
        token: &str,
        client: IpAddr,
    ) -> Result<Identity, AuthError> {
        let result = issuer.verify(token).await;
        self.token_failures_count(result, client)
    }

    /// A token checked without waiting on anyone's failures: a bad one
    /// counts against its address (and is refused unchecked while the
    /// address is backing off).
    fn token_failures_count(
        &self,
        result: Result<Identity, AuthError>,
        client: IpAddr,
    ) -> Result<Identity, AuthError> {
        if result.is_err() {
            self.throttle
                .check(client, None)
                .map_err(AuthError::Throttled)?;
            self.throttle.failed(client, None);
        }
        result
    }

    /// Whether `password` is a token of a configured OIDC issuer.
    pub fn is_oidc_token(&self, password: &str) -> bool {
        self.issuer_of(password).is_some()
    }

    /// Whether `password` is a configured `[[tokens]]` token (which signs
    /// in to the API as a Basic password too, but never to the console).
    pub fn is_api_token(&self, password: &str) -> bool {
        self.bearer(password).is_ok()
    }

    /// Whether any user or token is configured (otherwise everyone is
    /// allowed everything, which the server permits only on loopback).
    pub fn enabled(&self) -> bool {
        !self.users.is_empty() || !self.tokens.is_empty() || !self.oidc.is_empty()
    }

    /// Who sent a request with this `Authorization` header, from `client`.
    pub async fn authenticate(
        &self,
        header: Option<&str>,
        client: IpAddr,
    ) -> Result<Identity, AuthError> {
        let header = header.ok_or(AuthError::Missing)?;
        let (scheme, credentials) = header.trim().split_once(' ').ok_or(AuthError::Missing)?;
        match scheme.to_ascii_lowercase().as_str() {
            "basic" => {
                let (name, password) = split_basic(credentials.trim())?;
                // Terraform sends an OIDC token as the password
                // (TF_HTTP_PASSWORD), with any user name.
                // A `[[tokens]]` token too (any user name), so Terraform's
                // http backend, which cannot send a bearer, can use CI tokens.
                match self.issuer_of(&password) {
                    Some(issuer) => self.oidc_sign_in(issuer, &password, client).await,
                    None => match self.bearer(&password) {
                        Ok(token) => Ok(token),
                        Err(_) => self.basic(&name, &password, client).await,
                    },
                }
            }
            "bearer" => {
                let credentials = credentials.trim();
                if let Some(issuer) = self.issuer_of(credentials) {
                    return self.oidc_sign_in(issuer, credentials, client).await;
                }
                // A user signs in to the cloud block (which sends only
                // bearer tokens) with `user:password` as the token; tokens
                // and OIDC tokens never hold a colon. A configured token
                // that does still signs in as itself.
                if let Some((name, password)) = credentials.split_once(':')
                    && self.bearer(credentials).is_err()
                {
                    return self.basic(name, password, client).await;
                }
                // A valid token is a hash away: never slowed by anyone's
                // failures. Wrong ones count against their address.
                self.token_failures_count(self.bearer(credentials), client)
            }
            _ => Err(AuthError::Missing),
        }
    }

    async fn basic(
        &self,
        name: &str,
        password: &str,
        client: IpAddr,
    ) -> Result<Identity, AuthError> {
        let user = self.users.iter().find(|u| u.name == name);
        // A sign-in that worked minutes ago is not slowed by anyone.
        let hash = user.map_or(self.decoy_hash.as_str(), |u| u.password_hash.as_str());
        let key: [u8; 32] = Sha256::digest(format!("{hash}\0{name}\0{password}")).into();
        let fresh = self
            .verified
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .is_some_and(|at| at.elapsed() < VERIFIED_FOR);
        if let (true, Some(user)) = (fresh, user) {
            return Ok(identity_of(user));
        }
        self.throttle
            .check(client, Some(name))
            .map_err(AuthError::Throttled)?;
        let matches = self.verify(password, hash).await;
        match user {
            Some(user) if matches => {
                self.throttle.succeeded(client, Some(name));
                let mut verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
                verified.retain(|_, at| at.elapsed() < VERIFIED_FOR);
                verified.insert(key, Instant::now());
                Ok(identity_of(user))
            }
            _ => {
                self.throttle.failed(client, Some(name));
                Err(AuthError::Invalid)
            }
        }
    }

    /// Verify on the blocking pool, a few at a time.
    async fn verify(&self, password: &str, hash: &str) -> bool {
        let Ok(_turn) = self.verifying.acquire().await else {
            return false;
        };
        let (password, hash) = (password.to_string(), hash.to_string());
        tokio::task::spawn_blocking(move || verify_password(&password, &hash))
            .await
            .unwrap_or(false)
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
                claims: Default::default(),
            })
            .ok_or(AuthError::Invalid)
    }
}

/// The user name and password of HTTP Basic credentials.
fn split_basic(encoded: &str) -> Result<(String, String), AuthError> {
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| AuthError::Invalid)?;
    let text = String::from_utf8(decoded).map_err(|_| AuthError::Invalid)?;
    let (name, password) = text.split_once(':').ok_or(AuthError::Invalid)?;
    Ok((name.to_string(), password.to_string()))
}

fn identity_of(user: &User) -> Identity {
    Identity {
        name: user.name.clone(),
        grants: user.grants.clone(),
        claims: Default::default(),
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
mod tests;
