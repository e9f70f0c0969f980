//! The keys a backend seals its states with, and where they come from.
//!
//! A key is either **material** (32 bytes from a file or an environment
//! variable, which seals states directly, as since the first encryption
//! release) or a **key service's key** (AWS KMS today): then every write
//! asks the service for a fresh data key, seals the state with it and
//! stores the data key wrapped by the service beside the state, bound to
//! the state's place and version by the service's encryption context
//! ([`Context`]). A read asks the service to unwrap that data key, unless
//! this host wrapped or unwrapped the same one within the cache's lifetime
//! ([`cache`]).
//!
//! # Adding a key service
//!
//! GCP KMS, Azure Key Vault and Vault Transit are each one module beside
//! [`aws_kms`]: a [`KeyProvider`] with two calls, plus a variant of
//! [`KeySource`] the config reads. Each of those services has the same
//! two calls (GCP: `encrypt`/`decrypt` with `additionalAuthenticatedData`;
//! Azure: `wrapKey`/`unwrapKey`, with the context bound by the AES-GCM
//! associated data alone, since Key Vault takes none; Vault Transit:
//! `datakey/plaintext` and `decrypt` with `context` on a derived key). The
//! envelope, the cache, the errors and `wasmstate state reseal` are shared.

pub mod aws_kms;
pub mod cache;
#[cfg(test)]
pub mod fake;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// A future a [`KeyProvider`] returns: boxed, so providers can sit behind
/// one trait object.
pub type KeyFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, KeyError>> + Send + 'a>>;

/// A key service holding one key: it wraps fresh data keys and unwraps
/// them. Implementations are cheap to clone behind an `Arc` and reach
/// their service with the host's own credentials, never a guest's.
pub trait KeyProvider: Send + Sync {
    /// Which key, for the console, the log and errors: "AWS KMS arn:…".
    fn describe(&self) -> String;
    /// A fresh 32-byte data key, and the same wrapped by the service for
    /// `context`.
    fn generate<'a>(&'a self, context: &'a Context) -> KeyFuture<'a, DataKey>;
    /// The data key `wrapped` holds; the service refuses another context.
    fn unwrap<'a>(&'a self, wrapped: &'a [u8], context: &'a Context) -> KeyFuture<'a, [u8; 32]>;
}

/// A data key fresh from a key service.
pub struct DataKey {
    /// What seals the state.
    pub plain: [u8; 32],
    /// What is stored beside it, for the service to unwrap.
    pub wrapped: Vec<u8>,
}

/// Why a key service did not answer with a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The service could not be reached, refused the host's credentials,
    /// or throttled it: a retry (or a fixed grant) may succeed. 503.
    #[error("{0}")]
    Unavailable(String),
    /// The service says the wrapped key is not its own for this context:
    /// the stored state was altered or moved. 500, never retried.
    #[error("{0}")]
    Refused(String),
}

/// What a data key is bound to: where the state belongs and which
/// version it is. The same fields as the AES-GCM associated data.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Context {
    /// The backend's name.
    pub backend: String,
    /// The workspace's name.
    pub workspace: String,
    /// Terraform's `lineage`, when the state has one.
    pub lineage: Option<String>,
    /// Terraform's `serial`, when the state has one.
    pub serial: Option<u64>,
}

impl Context {
    /// The pairs a key service binds: `wasmstate:backend`, `…:workspace`,
    /// and `…:lineage`/`…:serial` when the state has them (a service may
    /// refuse empty values).
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = vec![
            ("wasmstate:backend", self.backend.clone()),
            ("wasmstate:workspace", self.workspace.clone()),
        ];
        if let Some(lineage) = self.lineage.as_ref().filter(|l| !l.is_empty()) {
            pairs.push(("wasmstate:lineage", lineage.clone()));
        }
        if let Some(serial) = self.serial {
            pairs.push(("wasmstate:serial", serial.to_string()));
        }
        pairs
    }
}

/// Where a configured key comes from.
#[derive(Clone)]
pub enum KeySource {
    /// 32 bytes of AES-256 key from a file or the environment.
    Material([u8; 32]),
    /// A key in AWS KMS (boxed: its credential settings are large).
    AwsKms(Box<aws_kms::AwsKmsKey>),
    /// A key service given in code (tests, embedders).
    Provider(Arc<dyn KeyProvider>),
}

/// One configured key: its id (written into every envelope it seals) and
/// where it comes from.
#[derive(Clone)]
pub struct KeySpec {
    /// Short name written into every envelope, e.g. `2026-12`.
    pub id: String,
    /// Its material, or the service holding it.
    pub source: KeySource,
}

impl fmt::Debug for KeySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print key material, not even in debug logs.
        match &self.source {
            KeySource::Material(_) => write!(f, "KeySpec({:?}, <material>)", self.id),
            KeySource::AwsKms(key) => write!(f, "KeySpec({:?}, {})", self.id, key.arn),
            KeySource::Provider(p) => write!(f, "KeySpec({:?}, {})", self.id, p.describe()),
        }
    }
}

impl PartialEq for KeySpec {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
            && match (&self.source, &other.source) {
                (KeySource::Material(a), KeySource::Material(b)) => a == b,
                (KeySource::AwsKms(a), KeySource::AwsKms(b)) => a == b,
                (KeySource::Provider(a), KeySource::Provider(b)) => Arc::ptr_eq(a, b),
                _ => false,
            }
    }
}

/// How long a data key a service wrapped or unwrapped is kept in memory,
/// unless the config says otherwise.
pub const DEFAULT_CACHE: Duration = Duration::from_secs(300);

/// A backend's encryption settings, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct EncryptionSpec {
    /// The keys; the first seals every new write.
    pub keys: Vec<KeySpec>,
    /// Also read states stored before encryption (migration).
    pub accept_plain: bool,
    /// How long a key service's data key is kept after it was wrapped or
    /// unwrapped here; zero: ask the service at every read.
    pub data_key_cache: Duration,
}

/// A key ready to seal or open with.
#[derive(Clone)]
pub enum Key {
    /// Seals directly (envelope format 2).
    Material([u8; 32]),
    /// Wraps a fresh data key per write (envelope format 3).
    Service(Arc<dyn KeyProvider>),
}

impl Key {
    /// The ready key for `source`; a service's client is made on first use.
    pub fn new(source: &KeySource) -> Key {
        match source {
            KeySource::Material(material) => Key::Material(*material),
            KeySource::AwsKms(key) => Key::Service(Arc::new(aws_kms::AwsKms::new((**key).clone()))),
            KeySource::Provider(provider) => Key::Service(provider.clone()),
        }
    }

    /// "file or environment key" / the service's description.
    pub fn describe(&self) -> String {
        match self {
            Key::Material(_) => "AES-256 key from the config".into(),
            Key::Service(provider) => provider.describe(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_pairs_leave_out_what_the_state_lacks() {
        let mut context = Context {
            backend: "prod".into(),
            workspace: "net".into(),
            lineage: Some("abc".into()),
            serial: Some(7),
        };
        let names = |c: &Context| c.pairs().into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        assert_eq!(
            names(&context),
            [
                "wasmstate:backend",
                "wasmstate:workspace",
                "wasmstate:lineage",
                "wasmstate:serial"
            ]
        );
        assert!(context.pairs().contains(&("wasmstate:serial", "7".into())));
        context.lineage = Some(String::new());
        context.serial = None;
        assert_eq!(
            names(&context),
            ["wasmstate:backend", "wasmstate:workspace"]
        );
    }

    #[test]
    fn debug_never_prints_material() {
        let spec = KeySpec {
            id: "k1".into(),
            source: KeySource::Material([7; 32]),
        };
        assert_eq!(format!("{spec:?}"), "KeySpec(\"k1\", <material>)");
    }
}
