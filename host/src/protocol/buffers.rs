//! The server's budget for the bodies it holds: a state arriving in a
//! request, as it arrives, and a state it answers, until the client has
//! taken it. Without it, clients reading slowly (or sending big states)
//! over many connections made the server hold as many whole states as
//! they had connections, outside every other bound. Past the budget a
//! request is refused at once (503 with `Retry-After`) rather than
//! queued, so waiting for memory holds nothing.

use super::error::ApiError;
use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
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
    /// Units answers leave free, so one arriving body of the largest size
    /// always fits: readers cannot hold the budget against every write.
    reserve: usize,
}

/// Part of the budget, held until dropped.
#[derive(Debug, Default)]
pub struct Held(Option<OwnedSemaphorePermit>);

impl Held {
    fn units(&self) -> u64 {
        self.0.as_ref().map_or(0, |p| p.num_permits() as u64)
    }
}

impl BodyBudget {
    /// A budget of `limit` bytes, of which answers leave `reserve` free.
    pub fn new(limit: u64, reserve: u64) -> Self {
        let units = (limit / UNIT).clamp(1, Semaphore::MAX_PERMITS as u64) as usize;
        BodyBudget {
            units: Arc::new(Semaphore::new(units)),
            limit,
            reserve: (reserve.div_ceil(UNIT) as usize).min(units),
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

    /// Make `held` cover `bytes` in all (it only grows), or 503 when the
    /// budget has no room. Charging the running total, not each piece
    /// rounded up, keeps many small frames from costing a unit each.
    pub fn hold_total(&self, held: &mut Held, bytes: usize) -> Result<(), ApiError> {
        let more = (bytes as u64).div_ceil(UNIT).saturating_sub(held.units());
        if more == 0 {
            return Ok(());
        }
        let permit = u32::try_from(more)
            .ok()
            .and_then(|n| self.units.clone().try_acquire_many_owned(n).ok())
            .ok_or_else(|| self.full())?;
        match &mut held.0 {
            Some(all) => all.merge(permit),
            none => *none = Some(permit),
        }
        Ok(())
    }

    /// A state answered (200, JSON), charged (its whole allocation) until
    /// the last slice of it is freed, i.e. until the connection has
    /// written it or dropped it. Answers leave the reserve free.
    pub fn answer(&self, state: Vec<u8>) -> Result<Response, ApiError> {
        Ok((
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            self.charged(state)?,
        )
            .into_response())
    }

    /// `state` as a body, charged as [`Self::answer`] says.
    fn charged(&self, mut state: Vec<u8>) -> Result<Body, ApiError> {
        // A state gathered in growing chunks may have twice its length
        // allocated; give the rest back (a large shrink is a remap, not a
        // copy) so the charge is what it holds.
        state.shrink_to_fit();
        let units = (state.capacity() as u64).div_ceil(UNIT);
        let fits = (self.units.available_permits() as u64) >= units + self.reserve as u64;
        let permit = u32::try_from(units)
            .ok()
            .filter(|_| fits)
            .and_then(|n| self.units.clone().try_acquire_many_owned(n).ok())
            .ok_or_else(|| self.full())?;
        let owned = Owned {
            state,
            _held: Held(Some(permit)),
        };
        Ok(Body::new(Slices {
            rest: Bytes::from_owner(owned),
        }))
    }

    fn full(&self) -> ApiError {
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
    }
}

/// A state's bytes with their charge: every slice of it shares this
/// owner, so the charge is given back when the last slice is freed.
struct Owned {
    state: Vec<u8>,
    _held: Held,
}

impl AsRef<[u8]> for Owned {
    fn as_ref(&self) -> &[u8] {
        &self.state
    }
}

/// A body handed out a slice at a time.
struct Slices {
    rest: Bytes,
}

impl http_body::Body for Slices {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if self.rest.is_empty() {
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
    async fn an_answer_is_charged_until_its_last_slice_is_freed() {
        let budget = BodyBudget::new(4 << 20, 0);
        let mut body = budget.charged(vec![7u8; 3 << 20]).unwrap();
        assert_eq!(budget.in_use(), 3 << 20);
        assert!(matches!(
            budget.charged(vec![7u8; 2 << 20]),
            Err(ApiError::RetryAfter(StatusCode::SERVICE_UNAVAILABLE, ..))
        ));
        // As hyper does: take the frames, drop the body at its end, keep
        // the last frame until it is written.
        let mut last = None;
        while let Some(frame) = body.frame().await {
            last = Some(frame.unwrap().into_data().unwrap());
        }
        drop(body);
        assert_eq!(
            budget.in_use(),
            3 << 20,
            "released before the last slice was written"
        );
        drop(last);
        assert_eq!(budget.in_use(), 0);
        drop(budget.charged(vec![7u8; 2 << 20]).unwrap());
    }

    #[test]
    fn answers_leave_the_reserve_for_arriving_bodies() {
        let budget = BodyBudget::new(8 << 20, 4 << 20);
        let answer = budget.charged(vec![0u8; 4 << 20]).unwrap();
        assert!(budget.charged(vec![0u8; 1 << 10]).is_err());
        let mut arriving = Held::default();
        budget.hold_total(&mut arriving, 4 << 20).unwrap();
        drop((answer, arriving));
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn small_pieces_are_charged_by_their_total() {
        let budget = BodyBudget::new(4 << 20, 0);
        let mut held = Held::default();
        let mut total = 0;
        for _ in 0..30_000 {
            total += 100;
            budget.hold_total(&mut held, total).unwrap();
        }
        assert_eq!(budget.in_use(), (3_000_000u64).div_ceil(UNIT) * UNIT);
        assert!(budget.hold_total(&mut Held::default(), 2 << 20).is_err());
        drop(held);
        assert_eq!(budget.in_use(), 0);
    }
}
