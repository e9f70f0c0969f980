//! Calls to key services (KMS): what encryption with a service's key
//! costs, per backend. `call` is `generate` (one per write), `unwrap` (a
//! read whose data key was not cached) or `cached` (a read that needed no
//! call). KMS bills per request, and throttles: this is the number to
//! watch.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    backend: String,
    call: String,
}

/// The family, registered once.
pub(super) struct KeyServiceMetrics {
    calls: Family<CallLabels, Counter>,
}

impl KeyServiceMetrics {
    pub(super) fn new(registry: &mut Registry) -> Self {
        let calls = Family::default();
        registry.register(
            "key_service_calls",
            "Key service (KMS) use by encryption at rest: call=\"generate\" per write, \"unwrap\" per read of a data key not cached, \"cached\" per read that needed no call",
            calls.clone(),
        );
        KeyServiceMetrics { calls }
    }

    pub(super) fn for_backend(&self, backend: String) -> KeyCalls {
        let counter = |call: &str| {
            self.calls
                .get_or_create(&CallLabels {
                    backend: backend.clone(),
                    call: call.into(),
                })
                .clone()
        };
        KeyCalls {
            generate: counter("generate"),
            unwrap: counter("unwrap"),
            cached: counter("cached"),
        }
    }
}

/// One backend's counters, held by its sealer (a clone counts into the
/// same series).
#[derive(Clone, Debug, Default)]
pub struct KeyCalls {
    /// Data keys generated (one per write).
    pub generate: Counter,
    /// Data keys unwrapped by the service.
    pub unwrap: Counter,
    /// Data keys found in the cache.
    pub cached: Counter,
}
