//! A key service in memory, for unit tests: it wraps each data key under a
//! random handle, unwraps only for the context it was wrapped for, counts
//! its calls, and can be switched off.

use super::{Context, DataKey, KeyError, KeyFuture, KeyProvider};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// A data key and the context it was wrapped for.
type Wrapped = ([u8; 32], Context);

/// The fake service.
#[derive(Default)]
pub struct FakeService {
    wrapped: Mutex<HashMap<Vec<u8>, Wrapped>>,
    /// `generate` calls so far.
    pub generated: AtomicUsize,
    /// `unwrap` calls so far.
    pub unwrapped: AtomicUsize,
    /// While set, every call fails as unreachable.
    pub down: AtomicBool,
}

fn random_key() -> [u8; 32] {
    use aes_gcm::aead::{KeyInit, OsRng};
    aes_gcm::Aes256Gcm::generate_key(&mut OsRng).into()
}

impl KeyProvider for FakeService {
    fn describe(&self) -> String {
        "fake key service".into()
    }

    fn generate<'a>(&'a self, context: &'a Context) -> KeyFuture<'a, DataKey> {
        Box::pin(async move {
            self.generated.fetch_add(1, Ordering::SeqCst);
            if self.down.load(Ordering::SeqCst) {
                return Err(KeyError::Unavailable(
                    "fake: cannot reach the service".into(),
                ));
            }
            let (plain, handle) = (random_key(), random_key().to_vec());
            let mut wrapped = self.wrapped.lock().unwrap();
            wrapped.insert(handle.clone(), (plain, context.clone()));
            Ok(DataKey {
                plain,
                wrapped: handle,
            })
        })
    }

    fn unwrap<'a>(&'a self, wrapped: &'a [u8], context: &'a Context) -> KeyFuture<'a, [u8; 32]> {
        Box::pin(async move {
            self.unwrapped.fetch_add(1, Ordering::SeqCst);
            if self.down.load(Ordering::SeqCst) {
                return Err(KeyError::Unavailable(
                    "fake: cannot reach the service".into(),
                ));
            }
            match self.wrapped.lock().unwrap().get(wrapped) {
                Some((key, bound)) if bound == context => Ok(*key),
                _ => Err(KeyError::Refused("fake: InvalidCiphertextException".into())),
            }
        })
    }
}
