//! The server's budget for the bodies it holds: a state arriving in a
//! request, as it arrives, and a state it answers, until the client has
//! taken it. Without it, clients reading slowly (or sending big states)
//! over many connections made the server hold as many whole states as
//! they had connections, outside every other bound. Past the budget a
//! request is refused at once (503 with `Retry-After`) rather than
//! queued, so waiting for memory holds nothing.

use super::error::ApiError;
use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget counts in KiB: a semaphore's permits are counted in `u32`
/// per acquisition, and bodies reach gigabytes.
const UNIT: u64 = 1024;
/// An answer is handed to the connection this much at a time, so the
/// charge is held until the client has taken all but about one slice
/// (and hyper's write buffer); small enough for that, large enough that
/// a 10 MiB state is ten frames, not a hundred and sixty (measured: 64
/// KiB slices cost an in-process 10 MiB GET 0.9 ms).
const SLICE: usize = 1 << 20;

/// Bytes of bodies the server holds at once (`max_buffered_mib`).
#[derive(Debug, Clone)]
pub struct BodyBudget {
    units: Arc<Semaphore>,
    limit: u64,
}

/// Part of the budget, held until dropped.
#[derive(Debug, Default)]
pub struct Held(Option<OwnedSemaphorePermit>);

impl BodyBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Self {
        let units = (limit / UNIT).clamp(1, Semaphore::MAX_PERMITS as u64) as usize;
        BodyBudget {
            units: Arc::new(Semaphore::new(units)),
            limit,
        }
    }

    /// The budget in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes held now.
    pub fn in_use(&self) -> u64 {
        let total = (self.limit / UNIT).max(1);
        total.saturating_sub(self.units.available_permits() as u64) * UNIT
    }

    /// Add `bytes` to what `held` holds, or 503 when the budget has no room.
    pub fn hold(&self, held: &mut Held, bytes: usize) -> Result<(), ApiError> {
        let units = (bytes as u64).div_ceil(UNIT);
        let permit = u32::try_from(units)
            .ok()
            .and_then(|n| self.units.clone().try_acquire_many_owned(n).ok())
            .ok_or_else(|| {
                ApiError::RetryAfter(
                    StatusCode::SERVICE_UNAVAILABLE,
                    2,
                    format!(
                        "the server already holds {} MiB of states being sent and received \
                         (max_buffered_mib = {}); retry shortly",
                        self.in_use() >> 20,
                        self.limit >> 20
                    ),
                )
            })?;
        match &mut held.0 {
            Some(all) => all.merge(permit),
            none => *none = Some(permit),
        }
        Ok(())
    }

    /// An answer of `bytes`, charged to the budget until the client has
    /// taken it (or gone away).
    pub fn answer(&self, bytes: Bytes) -> Result<Body, ApiError> {
        let mut held = Held::default();
        self.hold(&mut held, bytes.len())?;
        Ok(Body::new(ChargedBody { rest: bytes, held }))
    }
}

/// A body handed out a slice at a time, holding its charge until dropped.
struct ChargedBody {
    rest: Bytes,
    #[allow(dead_code)] // Held for its drop.
    held: Held,
}

impl http_body::Body for ChargedBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if self.rest.is_empty() {
            self.held = Held::default();
            return Poll::Ready(None);
        }
        let n = self.rest.len().min(SLICE);
        let slice = self.rest.split_to(n);
        Poll::Ready(Some(Ok(http_body::Frame::data(slice))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.rest.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn an_answer_holds_its_bytes_until_taken_and_the_budget_refuses_past_it() {
        let budget = BodyBudget::new(4 << 20);
        let first = budget.answer(Bytes::from(vec![7u8; 3 << 20])).unwrap();
        assert_eq!(budget.in_use(), 3 << 20);
        let refused = budget.answer(Bytes::from(vec![7u8; 2 << 20]));
        assert!(matches!(
            refused,
            Err(ApiError::RetryAfter(StatusCode::SERVICE_UNAVAILABLE, ..))
        ));
        let taken = first.collect().await.unwrap().to_bytes();
        assert_eq!(taken.len(), 3 << 20);
        assert_eq!(budget.in_use(), 0);
        drop(budget.answer(Bytes::from(vec![7u8; 2 << 20])).unwrap());
    }

    #[test]
    fn holds_add_up_and_are_given_back_when_dropped() {
        let budget = BodyBudget::new(1 << 20);
        let mut held = Held::default();
        budget.hold(&mut held, 300 << 10).unwrap();
        budget.hold(&mut held, 300 << 10).unwrap();
        assert_eq!(budget.in_use(), 600 << 10);
        assert!(budget.hold(&mut Held::default(), 500 << 10).is_err());
        drop(held);
        assert_eq!(budget.in_use(), 0);
    }
}
