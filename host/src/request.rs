//! What a storage keeps from one call of a request for the next call of
//! the same request: the runtime keeps the guest instance a call used, so
//! a write's head and its conditional write run in one instance (one
//! instance per request, as the isolation model says), not two.
//!
//! The protocol marks where a request's storage calls run together
//! ([`as_one_request`]); a storage call says it is under way
//! ([`call_under_way`]), keeps at most one thing as it ends ([`keep`]) and
//! takes it back on the next call ([`take`]). Whatever is kept is given
//! back (dropped: its `Drop` returns it) when the request ends, when
//! another call is under way beside the one ending (two calls at once of
//! one request must not wait for each other's slots), and before the
//! request waits for anything slow that is not a storage call
//! ([`give_back`]: a key service, a queue for the host's work, the
//! host's history on disk). Below
//! the storage seam: it knows nothing of what is kept.

use std::any::Any;
use std::cell::RefCell;
use std::future::Future;

/// One request's storage calls: what the last one kept, and how many are
/// under way.
#[derive(Default)]
struct Scope {
    kept: Option<Box<dyn Any + Send>>,
    calls: usize,
}

tokio::task_local! {
    static SCOPE: RefCell<Scope>;
}

/// Run `work`, whose storage calls are one request's: a call may leave
/// what it used for the next one.
pub async fn as_one_request<F: Future>(work: F) -> F::Output {
    SCOPE.scope(RefCell::new(Scope::default()), work).await
}

/// A storage call of the request under way, until dropped: taken before
/// the call waits for anything, so a call ending beside it keeps nothing
/// this one could wait for.
pub struct CallUnderWay(bool);

/// Count a storage call as under way (nothing, outside a request).
pub fn call_under_way() -> CallUnderWay {
    CallUnderWay(SCOPE.try_with(|s| s.borrow_mut().calls += 1).is_ok())
}

impl Drop for CallUnderWay {
    fn drop(&mut self) {
        if self.0 {
            let _ = SCOPE.try_with(|s| s.borrow_mut().calls -= 1);
        }
    }
}

/// Keep `value` for this request's next call, from the call ending now;
/// given back when no request is marked ([`as_one_request`]), something is
/// kept already, or another call of the request is under way.
pub fn keep<T: Any + Send>(value: T) -> Result<(), T> {
    let mut value = Some(value);
    let _ = SCOPE.try_with(|scope| {
        let mut scope = scope.borrow_mut();
        if scope.kept.is_none() && scope.calls <= 1 {
            scope.kept = value.take().map(|v| Box::new(v) as Box<dyn Any + Send>);
        }
    });
    match value {
        None => Ok(()),
        Some(value) => Err(value),
    }
}

/// What this request kept, if it is a `T`. Anything else kept is given
/// back before this returns: a request holds at most one kept thing.
pub fn take<T: Any + Send>() -> Option<T> {
    take_any()?.downcast::<T>().ok().map(|kept| *kept)
}

/// Give back what this request kept, before it waits for something slow
/// that is not one of its storage calls: what is kept holds the storage's
/// share of the server (an instance slot) meanwhile.
pub fn give_back() {
    drop(take_any());
}

fn take_any() -> Option<Box<dyn Any + Send>> {
    // Taken out under the borrow, dropped after it: a `Drop` may do work.
    SCOPE
        .try_with(|scope| scope.borrow_mut().kept.take())
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct GivenBack(Arc<AtomicUsize>);
    impl Drop for GivenBack {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn count() -> (Arc<AtomicUsize>, impl Fn() -> usize) {
        let n = Arc::new(AtomicUsize::new(0));
        let read = n.clone();
        (n, move || read.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn outside_a_request_nothing_is_kept() {
        let _call = call_under_way();
        assert_eq!(keep(7u32), Err(7));
        assert_eq!(take::<u32>(), None);
        give_back();
    }

    #[tokio::test]
    async fn the_next_call_takes_what_the_last_kept_and_the_end_gives_back() {
        let (n, given_back) = count();
        as_one_request(async {
            let call = call_under_way();
            assert!(keep(1u32).is_ok());
            // One thing at a time: a second is handed back.
            assert_eq!(keep(2u32), Err(2));
            drop(call);
            assert_eq!(take::<u32>(), Some(1));
            assert_eq!(take::<u32>(), None);
            assert!(keep(GivenBack(n.clone())).is_ok());
            assert_eq!(given_back(), 0);
        })
        .await;
        assert_eq!(given_back(), 1, "kept past the request");
    }

    #[tokio::test]
    async fn taking_another_kind_or_giving_back_drops_what_was_kept() {
        let (n, given_back) = count();
        as_one_request(async {
            assert!(keep(GivenBack(n.clone())).is_ok());
            assert_eq!(take::<u32>(), None);
            assert_eq!(given_back(), 1);
            assert!(keep(GivenBack(n.clone())).is_ok());
            give_back();
            assert_eq!(given_back(), 2);
        })
        .await;
        assert_eq!(given_back(), 2);
    }

    #[tokio::test]
    async fn a_call_ending_beside_another_keeps_nothing() {
        as_one_request(async {
            let first = call_under_way();
            let second = call_under_way();
            assert_eq!(keep(1u32), Err(1), "the other call could wait for it");
            drop(second);
            assert!(keep(1u32).is_ok());
            drop(first);
        })
        .await;
    }
}
