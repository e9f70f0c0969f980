//! Which key seals a backend's new states and which open its stored ones,
//! fetching data keys from a key service where a key lives in one
//! ([`super::keys`]), and doing the AES work as the backend's host work
//! ([`crate::work`]), off the async workers when a state is big.
//!
//! With encryption on, what storage hands back must be an envelope: a
//! plain state (which a storage guest could return in place of the real
//! one) is refused, as is a format-1 envelope, unless the backend is in
//! the one-time migration mode (`encryption.accept_plain`).
//!
//! A key service that cannot be reached, or refuses the host's
//! credentials, fails the request with a 503 that names the key and the
//! cause ([`StorageError::KeyUnavailable`]); a write then stores nothing,
//! never a plain state.

use super::envelope::{self, Label, Place, Sealing, StateHeader};
use super::keys::cache::DataKeyCache;
use super::keys::{Context, EncryptionSpec, Key, KeyError};
use super::rollback::Stamp;
use crate::backend::{StorageError, StorageResult};
use crate::metrics::KeyCalls;
use crate::work::HostWork;
use bytes::Bytes;
use std::sync::Arc;

/// Seals and opens one backend's states with its keys; the first seals.
pub struct Sealer {
    keys: Vec<(String, Key)>,
    accept_plain: bool,
    cache: DataKeyCache,
    cache_lifetime: std::time::Duration,
    calls: KeyCalls,
}

/// A stored state that does not open, and why (one line).
pub type Refusal = String;

/// What reading a stored state gave: the plain state and its clear
/// fields, or why it does not open.
pub type Opened = Result<(Vec<u8>, StateHeader), Refusal>;

fn key_error(id: &str, e: KeyError) -> Result<StorageError, Refusal> {
    match e {
        KeyError::Unavailable(cause) => {
            Ok(StorageError::KeyUnavailable(format!("key {id:?}: {cause}")))
        }
        KeyError::Refused(cause) => Err(format!("key {id:?}: {cause}")),
    }
}

/// Whether `stored` is Terraform's plain empty state: version 4, serial 1,
/// no resources, no outputs, and nothing else but a lineage, a Terraform
/// version and empty check results, each key once. It is what the
/// `postgres` guest writes when a workspace is created through the API, as
/// Terraform's own `pg` backend does (so native clients sharing the
/// database read the new workspace). Under encryption the store reads it
/// as no state at all (`Store::read_stored`): never served, never judged
/// by the rollback marks, so storage that plants one gains nothing it
/// could not have by deleting the state (a planted empty state of another
/// lineage cannot reset the marks, and one with outputs behind duplicate
/// keys, which Go's JSON decoder merges, is never served).
///
/// Why this rather than the host sealing that state at creation: sealing
/// at creation would need either a change to the contract
/// (`create-workspace` carries no state; the guest writes what it writes)
/// or a second write after the guest's, unlocked, which could land over a
/// client's first write. Every other plain state is refused under
/// encryption.
pub fn is_plain_empty_state(stored: &[u8]) -> bool {
    /// Larger than any empty state with a sane lineage and version.
    const MOST: usize = 1024;
    /// The one shape taken; derived, so a key given twice is an error.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // read only to be checked
    struct EmptyState {
        version: u64,
        serial: u64,
        lineage: String,
        #[serde(default)]
        terraform_version: Option<String>,
        outputs: serde_json::Map<String, serde_json::Value>,
        resources: Vec<serde_json::Value>,
        #[serde(default)]
        check_results: Option<Vec<serde_json::Value>>,
    }
    if stored.len() > MOST {
        return false;
    }
    let Ok(state) = serde_json::from_slice::<EmptyState>(stored) else {
        return false;
    };
    state.version == 4
        && state.serial == 1
        && state.outputs.is_empty()
        && state.resources.is_empty()
        && state.check_results.is_none_or(|c| c.is_empty())
}

impl Sealer {
    /// A sealer for `spec`; `None` without keys.
    pub fn new(spec: &EncryptionSpec) -> Option<Self> {
        (!spec.keys.is_empty()).then(|| Sealer {
            keys: spec
                .keys
                .iter()
                .map(|k| (k.id.clone(), Key::new(&k.source)))
                .collect(),
            accept_plain: spec.accept_plain,
            cache: DataKeyCache::new(spec.data_key_cache),
            cache_lifetime: spec.data_key_cache,
            calls: KeyCalls::default(),
        })
    }

    /// Count key service calls in `calls` (the server's metrics).
    pub fn counting(mut self, calls: KeyCalls) -> Self {
        self.calls = calls;
        self
    }

    /// One line for the console: which key seals, how many open.
    pub fn describe(&self) -> String {
        let (id, key) = &self.keys[0];
        let cached = match key {
            Key::Service(_) => format!(
                "; a fresh data key per write, unwrapped keys kept {} s",
                self.cache_lifetime.as_secs()
            ),
            Key::Material(_) => String::new(),
        };
        format!(
            "AES-256-GCM, sealing with key {id:?} ({}{cached}), {} key(s) to open{}",
            key.describe(),
            self.keys.len(),
            if self.accept_plain {
                ", plain states accepted (migration)"
            } else {
                ""
            }
        )
    }

    /// The id of the key new states are sealed with.
    pub fn sealing_key(&self) -> &str {
        &self.keys[0].0
    }

    /// Whether states stored before encryption are read (migration).
    pub fn accepts_plain(&self) -> bool {
        self.accept_plain
    }

    /// Seal `state` for `backend`/`workspace` with the first key; its
    /// clear fields (with the `started` that `stamp` gives its lineage)
    /// and the envelope. `restarts`: written with `allow_force_push`.
    pub async fn seal(
        &self,
        work: &HostWork,
        backend: &Arc<str>,
        workspace: &str,
        state: Bytes,
        restarts: bool,
        stamp: Stamp,
    ) -> StorageResult<(StateHeader, Bytes)> {
        let (id, key) = &self.keys[0];
        let (backend, workspace, id_owned) = (backend.clone(), workspace.to_string(), id.clone());
        let (material, header, wrapped) = match key {
            // The clear fields are read in the same piece of work.
            Key::Material(material) => (*material, None, None),
            Key::Service(provider) => {
                let read = state.clone();
                let header = work.run(read.len(), move || StateHeader::of(&read)).await?;
                let context = Context {
                    backend: backend.to_string(),
                    workspace: workspace.clone(),
                    lineage: header.lineage.clone(),
                    serial: header.serial,
                };
                self.calls.generate.inc();
                // A key service answers in its own time: the request holds
                // nothing kept for its next storage call meanwhile.
                crate::request::give_back();
                let data_key = provider
                    .generate(&context)
                    .await
                    .map_err(|e| key_error(id, e).unwrap_or_else(StorageError::Encryption))?;
                // Reading back this replica's own write asks KMS nothing.
                self.cache
                    .put(id, &data_key.wrapped, &context, data_key.plain);
                (data_key.plain, Some(header), Some(data_key.wrapped))
            }
        };
        let sealed = work.run(state.len(), move || {
            let mut header = header.unwrap_or_else(|| StateHeader::of(&state));
            header.started = stamp.started_for(header.lineage.as_deref());
            let sealing = Sealing {
                key_id: &id_owned,
                key: &material,
                wrapped: wrapped.as_deref(),
            };
            let place = Place {
                backend: &backend,
                workspace: &workspace,
            };
            envelope::seal(sealing, place, &state, &header, restarts)
                .map(|stored| (header, Bytes::from(stored)))
        });
        sealed.await?.map_err(StorageError::Encryption)
    }

    /// Open what storage returned for `backend`/`workspace`. `Ok(Err)`:
    /// it does not open (not sealed, sealed by an unknown key or for
    /// another place, altered); `Err`: a key service is unavailable.
    pub async fn open(
        &self,
        work: &HostWork,
        backend: &str,
        workspace: &str,
        stored: Vec<u8>,
    ) -> StorageResult<Opened> {
        if !envelope::is_sealed(&stored) {
            if self.accept_plain {
                let opened = work.run(stored.len(), move || {
                    let header = StateHeader::of(&stored);
                    (stored, header)
                });
                return Ok(Ok(opened.await?));
            }
            return Ok(Err(
                "storage returned a state that is not sealed, though encryption is on for this backend; \
                 refused (it could be anyone's). To read states written before encryption was enabled, \
                 set encryption.accept_plain = true once, until each has been written again"
                    .into(),
            ));
        }
        let accept_unbound = self.accept_plain;
        let parsed = work
            .run(stored.len(), move || {
                envelope::parse(&stored, accept_unbound)
            })
            .await?;
        let parsed = match parsed {
            Ok(parsed) => parsed,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let Some((id, key)) = self.keys.iter().find(|(id, _)| *id == parsed.key_id) else {
            return Ok(Err(not_configured(&parsed.key_id, &self.keys)));
        };
        let data_key = match (key, &parsed.wrapped) {
            (Key::Material(material), None) => *material,
            (Key::Service(provider), Some(wrapped)) => {
                let context = Context {
                    backend: backend.to_string(),
                    workspace: workspace.to_string(),
                    lineage: parsed.header.lineage.clone(),
                    serial: parsed.header.serial,
                };
                match self.cache.get(id, wrapped, &context) {
                    Some(key) => {
                        self.calls.cached.inc();
                        key
                    }
                    None => {
                        self.calls.unwrap.inc();
                        crate::request::give_back();
                        let unwrapped = provider.unwrap(wrapped, &context).await;
                        match unwrapped {
                            Ok(key) => {
                                self.cache.put(id, wrapped, &context, key);
                                key
                            }
                            Err(e) => {
                                return match key_error(id, e) {
                                    Ok(unavailable) => Err(unavailable),
                                    Err(refusal) => Ok(Err(refusal)),
                                };
                            }
                        }
                    }
                }
            }
            (Key::Material(_), Some(_)) => {
                return Ok(Err(format!(
                    "the stored state names key {id:?} and carries a wrapped data key, but {id:?} is \
                     configured as key material here, not a key service's key"
                )));
            }
            (Key::Service(_), None) => {
                return Ok(Err(format!(
                    "the stored state names key {id:?} but carries no wrapped data key, though {id:?} \
                     is a key service's key here"
                )));
            }
        };
        let (backend, workspace) = (backend.to_string(), workspace.to_string());
        let size = parsed.ciphertext_len();
        let opened = work.run(size, move || {
            let place = Place {
                backend: &backend,
                workspace: &workspace,
            };
            envelope::decrypt(&parsed, &data_key, place).map(|state| (state, parsed.header))
        });
        Ok(opened.await?)
    }

    /// Why `stored` would be sealed again by `wasmstate state reseal`:
    /// the key that sealed it when not the sealing key, "plain", or
    /// "format 1"; `None` when it is current (or not an envelope of ours).
    pub fn stale_key(&self, stored: &[u8]) -> Option<String> {
        if !envelope::is_sealed(stored) {
            return Some("plain".into());
        }
        match envelope::label(stored) {
            Some(Label { format, .. }) if format == envelope::FORMAT_UNBOUND => {
                Some("format 1".into())
            }
            Some(Label { key_id, .. }) if key_id != self.sealing_key() => Some(key_id),
            _ => None,
        }
    }
}

fn not_configured(key_id: &str, keys: &[(String, Key)]) -> Refusal {
    let known: Vec<&str> = keys.iter().map(|(id, _)| id.as_str()).collect();
    format!(
        "the stored state is encrypted with key {key_id:?}, which is not configured for this backend \
         (configured: [{}]); add it to the backend's encryption.keys",
        known.join(", ")
    )
}

/// Open `stored` on a backend without keys: a plain state passes, a
/// sealed one says which key it needs instead of reaching Terraform as
/// ciphertext. The clear fields are not read (an empty header): without
/// keys there are no rollback marks to check them against, and parsing a
/// whole state at every read would cost more than the read.
pub fn open_unkeyed(stored: Vec<u8>) -> Opened {
    if !envelope::is_sealed(&stored) {
        return Ok((stored, StateHeader::default()));
    }
    match envelope::label(&stored) {
        Some(label) => Err(not_configured(&label.key_id, &[])),
        None => Err("the stored state looks encrypted but its envelope is malformed".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::keys::fake::FakeService;
    use crate::store::keys::{KeySource, KeySpec};
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    const STATE: &[u8] =
        br#"{"version":4,"serial":7,"lineage":"abc","outputs":{"pw":{"value":"hunter2"}}}"#;

    fn material(id: &str) -> KeySpec {
        KeySpec {
            id: id.into(),
            source: KeySource::Material(
                envelope::parse_material(id, &envelope::generate_material()).unwrap(),
            ),
        }
    }

    fn service(id: &str, fake: &Arc<FakeService>) -> KeySpec {
        KeySpec {
            id: id.into(),
            source: KeySource::Provider(fake.clone()),
        }
    }

    fn sealer(keys: Vec<KeySpec>, cache: Duration) -> Sealer {
        Sealer::new(&EncryptionSpec {
            keys,
            accept_plain: false,
            data_key_cache: cache,
        })
        .unwrap()
    }

    fn backend() -> Arc<str> {
        Arc::from("prod")
    }

    async fn seal(sealer: &Sealer, workspace: &str) -> StorageResult<Bytes> {
        let work = HostWork::default();
        let backend = backend();
        let state = Bytes::from_static(STATE);
        let sealed = sealer.seal(&work, &backend, workspace, state, false, Stamp::keep(9));
        Ok(sealed.await?.1)
    }

    async fn open(sealer: &Sealer, workspace: &str, stored: &[u8]) -> StorageResult<Opened> {
        let work = HostWork::default();
        sealer.open(&work, "prod", workspace, stored.to_vec()).await
    }

    #[tokio::test]
    async fn a_service_key_costs_one_call_per_write_and_none_for_a_cached_read() {
        let fake = Arc::new(FakeService::default());
        let sealer = sealer(vec![service("kms", &fake)], Duration::from_secs(60));
        let stored = seal(&sealer, "net").await.unwrap();
        assert_eq!(envelope::label(&stored).unwrap().format, 3);
        assert_eq!(fake.generated.load(Ordering::SeqCst), 1);
        let (state, header) = open(&sealer, "net", &stored).await.unwrap().unwrap();
        assert_eq!((state.as_slice(), header.serial), (STATE, Some(7)));
        assert_eq!(
            fake.unwrapped.load(Ordering::SeqCst),
            0,
            "own write is cached"
        );
        // Another replica (no cache) asks the service once, then not again.
        let other = sealer_sharing(&fake, Duration::from_secs(60));
        for _ in 0..3 {
            assert!(open(&other, "net", &stored).await.unwrap().is_ok());
        }
        assert_eq!(fake.unwrapped.load(Ordering::SeqCst), 1);
        // Without a cache, every read asks.
        let uncached = sealer_sharing(&fake, Duration::ZERO);
        for _ in 0..2 {
            assert!(open(&uncached, "net", &stored).await.unwrap().is_ok());
        }
        assert_eq!(fake.unwrapped.load(Ordering::SeqCst), 3);
        // A second write gets a fresh data key.
        seal(&sealer, "net").await.unwrap();
        assert_eq!(fake.generated.load(Ordering::SeqCst), 2);
    }

    fn sealer_sharing(fake: &Arc<FakeService>, cache: Duration) -> Sealer {
        sealer(vec![service("kms", fake)], cache)
    }

    #[tokio::test]
    async fn a_service_that_is_down_fails_the_write_and_the_read_naming_the_key() {
        let fake = Arc::new(FakeService::default());
        let sealer = sealer(vec![service("kms", &fake)], Duration::ZERO);
        let stored = seal(&sealer, "net").await.unwrap();
        fake.down.store(true, Ordering::SeqCst);
        let Err(StorageError::KeyUnavailable(e)) = seal(&sealer, "net").await else {
            panic!("a write must fail, not fall back to plain");
        };
        assert!(
            e.contains("key \"kms\"") && e.contains("cannot reach"),
            "{e}"
        );
        let Err(StorageError::KeyUnavailable(e)) = open(&sealer, "net", &stored).await else {
            panic!("a read must fail as unavailable");
        };
        assert!(e.contains("key \"kms\""), "{e}");
    }

    #[tokio::test]
    async fn a_wrapped_key_moved_to_another_workspace_is_refused_by_the_service() {
        let fake = Arc::new(FakeService::default());
        let sealer = sealer(vec![service("kms", &fake)], Duration::from_secs(60));
        let stored = seal(&sealer, "net").await.unwrap();
        let refusal = open(&sealer, "other", &stored).await.unwrap().unwrap_err();
        assert!(refusal.contains("InvalidCiphertext"), "{refusal}");
    }

    #[tokio::test]
    async fn rotation_opens_old_states_with_the_key_they_name() {
        let fake = Arc::new(FakeService::default());
        let old = material("old");
        let before = sealer(vec![old.clone()], Duration::ZERO);
        let stored = seal(&before, "net").await.unwrap();
        let rotated = sealer(vec![service("new", &fake), old], Duration::ZERO);
        assert_eq!(rotated.sealing_key(), "new");
        assert_eq!(rotated.stale_key(&stored).as_deref(), Some("old"));
        assert_eq!(
            open(&rotated, "net", &stored).await.unwrap().unwrap().0,
            STATE
        );
        let resealed = seal(&rotated, "net").await.unwrap();
        assert_eq!(rotated.stale_key(&resealed), None);
        assert_eq!(rotated.stale_key(STATE).as_deref(), Some("plain"));
    }

    #[tokio::test]
    async fn unknown_keys_plain_states_and_mismatched_kinds_are_refused() {
        let fake = Arc::new(FakeService::default());
        let by_k1 = seal(&sealer(vec![material("k1")], Duration::ZERO), "net")
            .await
            .unwrap();
        let missing = open(&sealer(vec![material("k2")], Duration::ZERO), "net", &by_k1)
            .await
            .unwrap()
            .unwrap_err();
        assert!(
            missing.contains("key \"k1\", which is not configured"),
            "{missing}"
        );
        let wrong = open(&sealer(vec![material("k1")], Duration::ZERO), "net", &by_k1)
            .await
            .unwrap()
            .unwrap_err();
        assert!(wrong.contains("does not open with key \"k1\""), "{wrong}");
        // The same id configured as a service's key: refused, not tried.
        let kinds = open(
            &sealer(vec![service("k1", &fake)], Duration::ZERO),
            "net",
            &by_k1,
        )
        .await
        .unwrap()
        .unwrap_err();
        assert!(kinds.contains("no wrapped data key"), "{kinds}");
        let plain = open(&sealer(vec![material("k1")], Duration::ZERO), "net", STATE)
            .await
            .unwrap()
            .unwrap_err();
        assert!(
            plain.contains("not sealed") && plain.contains("accept_plain"),
            "{plain}"
        );
        assert!(open_unkeyed(by_k1.to_vec()).unwrap_err().contains("\"k1\""));
        // Terraform's empty state, which the postgres guest writes for a
        // workspace created through the API, is recognised (the store reads
        // it as no state) but never opened as a state; nothing else plain
        // is recognised, a key given twice included.
        let sealer = sealer(vec![material("k1")], Duration::ZERO);
        let empty = br#"{"version":4,"terraform_version":"1.0.0","serial":1,"lineage":"a1b2","outputs":{},"resources":[],"check_results":null}"#;
        assert!(is_plain_empty_state(empty));
        let refusal = open(&sealer, "net", empty).await.unwrap();
        assert!(refusal.unwrap_err().contains("not sealed"));
        for twice in [
            r#"{"version":4,"serial":1,"serial":1,"lineage":"a","outputs":{},"resources":[]}"#,
            r#"{"version":4,"serial":1,"lineage":"a","outputs":{"o":{"value":"x","type":"string"}},"resources":[],"outputs":{}}"#,
        ] {
            assert!(!is_plain_empty_state(twice.as_bytes()), "{twice}");
        }
        for holding in [
            r#"{"version":4,"serial":1,"lineage":"a","outputs":{"pw":{"value":"x"}},"resources":[]}"#,
            r#"{"version":4,"serial":1,"lineage":"a","outputs":{},"resources":[{"mode":"managed"}]}"#,
            r#"{"version":4,"serial":2,"lineage":"a","outputs":{},"resources":[]}"#,
            r#"{"version":4,"serial":1,"lineage":"a","outputs":{},"resources":[],"encryption_version":"v0"}"#,
            r#"{"version":4,"serial":1,"lineage":"a","outputs":{}}"#,
            r#"{"version":3,"serial":1,"lineage":"a","modules":[{"resources":{"x":1}}]}"#,
            r#"{"version":4,"serial":1,"lineage":"a","outputs":{},"resources":[],"check_results":[{"x":1}]}"#,
        ] {
            let refusal = open(&sealer, "net", holding.as_bytes()).await.unwrap();
            assert!(refusal.unwrap_err().contains("not sealed"), "{holding}");
            assert!(!is_plain_empty_state(holding.as_bytes()), "{holding}");
        }
        assert_eq!(open_unkeyed(STATE.to_vec()).unwrap().0, STATE);
        assert_eq!(
            open_unkeyed(STATE.to_vec()).unwrap().1,
            StateHeader::default()
        );
    }
}
