//! A connection's clocks: how long a client may take to send a request's
//! header, how long a keep-alive connection may sit idle between requests,
//! and how long a write to a client that stopped reading may wait.
//!
//! The connection is in one of three phases. *Header*: from accept, or
//! from the first byte after an idle spell, until the request reaches the
//! application. *Busy*: while requests are being answered, until the last
//! byte of the last answer has been handed to the socket (the body's own
//! deadline is the handler's, `body_timeout_secs`; a client that stops
//! reading is cut off by the write clock). *Idle*: after that, until the
//! next byte. Past a phase's deadline, reads fail with `TimedOut` and
//! hyper closes the connection. A connection's [`Place`] tells the
//! listener whether it can be closed to make room for a new connection:
//! when idle (the client sees the end of an idle keep-alive connection,
//! which every HTTP client expects) or when waiting for a header with
//! nothing started, never while an answer is being written.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// The clocks of every connection.
#[derive(Debug, Clone, Copy)]
pub struct Clocks {
    /// Time to send a request's header.
    pub header: Duration,
    /// Time a keep-alive connection may wait for its next request.
    pub idle: Duration,
    /// Time a write may wait for the client to read.
    pub write: Duration,
}

/// Requests of one connection: how many reached the application, and how
/// many are being answered now. The service counts them.
#[derive(Debug, Default)]
pub struct InFlight {
    started: AtomicUsize,
    active: AtomicUsize,
    /// The connection's reader, woken when its last request is answered:
    /// hyper does not read again on its own while it waits, so the idle
    /// clock could not start otherwise.
    reader: std::sync::Mutex<Option<std::task::Waker>>,
}

impl InFlight {
    /// A request reached the application; the guard marks it answered.
    pub fn start(self: &Arc<Self>) -> InFlightGuard {
        self.started.fetch_add(1, Ordering::AcqRel);
        self.active.fetch_add(1, Ordering::AcqRel);
        InFlightGuard(self.clone())
    }
}

/// Marks one request answered when dropped.
pub struct InFlightGuard(Arc<InFlight>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            let reader = self
                .0
                .reader
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            if let Some(reader) = reader {
                reader.wake();
            }
        }
    }
}

/// An admitted connection as the listener sees it: whether it sits idle
/// between requests or waits for a header with nothing started, and since
/// when, so that the oldest such one can be closed when a new connection
/// needs its place.
#[derive(Debug)]
pub struct Place {
    /// [`HEADER`], [`ACTIVE`], [`IDLE`] or [`CLOSED`].
    state: AtomicU8,
    /// When it last became idle or began waiting for a header, in
    /// nanoseconds since [`epoch`].
    idle_since: AtomicU64,
    /// Its reader, woken when it is closed.
    reader: std::sync::Mutex<Option<std::task::Waker>>,
    /// Told when it is closed while waiting for a header (perhaps still in
    /// its TLS handshake, where no read of ours would notice): the
    /// listener drops the connection.
    dropped: tokio::sync::Notify,
}

/// Answering a request, or writing an answer: never closed to make room.
const ACTIVE: u8 = 0;
/// Every answer written, waiting for the next request.
const IDLE: u8 = 1;
const CLOSED: u8 = 2;
/// Waiting for a request's header (from accept, or after an idle spell),
/// nothing started.
const HEADER: u8 = 3;

impl Default for Place {
    /// A connection just accepted: waiting for its first header.
    fn default() -> Self {
        Place {
            state: AtomicU8::new(HEADER),
            idle_since: AtomicU64::new(nanos(std::time::Instant::now())),
            reader: std::sync::Mutex::default(),
            dropped: tokio::sync::Notify::new(),
        }
    }
}

fn nanos(at: std::time::Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(epoch()).as_nanos()).unwrap_or(u64::MAX)
}

/// What `idle_since` counts from.
fn epoch() -> std::time::Instant {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

impl Place {
    /// Since when it has been idle (nanoseconds since a fixed instant), if
    /// it is (`None`: answering, reading a request, not yet asked
    /// anything, or closed).
    pub fn idle_since(&self) -> Option<u64> {
        let since = self.idle_since.load(Ordering::Acquire);
        (self.state.load(Ordering::Acquire) == IDLE).then_some(since)
    }

    /// Whether it may be closed to make room, and which first: idle ones
    /// (rank 0) before ones waiting for a header (rank 1), each the oldest
    /// first. `None` while a request is answered or its answer written.
    pub fn closable_since(&self) -> Option<(u8, u64)> {
        let since = self.idle_since.load(Ordering::Acquire);
        match self.state.load(Ordering::Acquire) {
            IDLE => Some((0, since)),
            HEADER => Some((1, since)),
            _ => None,
        }
    }

    /// Close it if it is still idle or waiting for a header with nothing
    /// started (never one that has begun a request or is writing an
    /// answer). Whether it was closed.
    pub fn close_if_unused(&self) -> bool {
        let idle = self
            .state
            .compare_exchange(IDLE, CLOSED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        let waiting = !idle
            && self
                .state
                .compare_exchange(HEADER, CLOSED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
        if waiting {
            self.dropped.notify_one();
        }
        if idle || waiting {
            let reader = self.reader.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(reader) = reader {
                reader.wake();
            }
        }
        idle || waiting
    }

    /// Completes once it was closed while waiting for a header.
    pub async fn dropped(&self) {
        self.dropped.notified().await;
    }

    /// A request reached the application: from now on the connection is
    /// not closed to make room. `false` if it was closed first (the
    /// request must not be started).
    pub fn begin(&self) -> bool {
        for from in [HEADER, IDLE] {
            let _ = self
                .state
                .compare_exchange(from, ACTIVE, Ordering::AcqRel, Ordering::Acquire);
        }
        !self.is_closed()
    }

    pub(super) fn idle(&self, now: std::time::Instant) {
        self.idle_since.store(nanos(now), Ordering::Release);
        let _ = self
            .state
            .compare_exchange(ACTIVE, IDLE, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The first byte of the next request arrived: waiting for its header
    /// from now. `false` if the place was closed first.
    fn wake_up(&self) -> bool {
        self.idle_since
            .store(nanos(std::time::Instant::now()), Ordering::Release);
        let _ = self
            .state
            .compare_exchange(IDLE, HEADER, Ordering::AcqRel, Ordering::Acquire);
        !self.is_closed()
    }

    fn is_closed(&self) -> bool {
        self.state.load(Ordering::Acquire) == CLOSED
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Header,
    Busy,
    Idle,
}

/// Which deadline closed a connection, for the log and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// The client was too slow sending a header.
    Header,
    /// The connection sat idle too long.
    Idle,
    /// The client stopped reading the answer.
    Write,
    /// Idle when a new connection needed its place.
    Room,
}

/// `io` with the connection's clocks.
pub struct TimedIo<T> {
    io: T,
    clocks: Clocks,
    in_flight: Arc<InFlight>,
    /// Requests started as of the last phase change.
    seen: usize,
    phase: Phase,
    read_deadline: Pin<Box<Sleep>>,
    write_deadline: Option<Pin<Box<Sleep>>>,
    expired: Option<Expired>,
    /// Its place among the admitted connections, if it can be closed to
    /// make room.
    place: Option<Arc<Place>>,
    /// Bytes were written and not yet flushed: an answer is still going
    /// out (hyper may have dropped the body, and marked its request
    /// answered, with the body's last bytes still in its buffer).
    writing: bool,
}

impl<T> TimedIo<T> {
    /// Start the header clock now.
    pub fn new(io: T, clocks: Clocks, in_flight: Arc<InFlight>) -> Self {
        TimedIo {
            io,
            clocks,
            in_flight,
            seen: 0,
            phase: Phase::Header,
            read_deadline: Box::pin(tokio::time::sleep(clocks.header)),
            write_deadline: None,
            expired: None,
            place: None,
            writing: false,
        }
    }

    /// Let the listener close it while it sits idle ([`Place`]).
    pub fn with_place(mut self, place: Arc<Place>) -> Self {
        self.place = Some(place);
        self
    }

    /// Which deadline closed the connection, if one did.
    pub fn expired(&self) -> Option<Expired> {
        self.expired
    }

    /// Move between phases as the application sees requests come and go.
    fn update_phase(&mut self) {
        let started = self.in_flight.started.load(Ordering::Acquire);
        if self.in_flight.active.load(Ordering::Acquire) > 0 || self.writing {
            self.phase = Phase::Busy;
            self.seen = started;
        } else if self.phase == Phase::Busy || started != self.seen {
            // Every request so far was answered: idle until the next byte.
            self.phase = Phase::Idle;
            self.seen = started;
            let now = Instant::now();
            self.read_deadline.as_mut().reset(now + self.clocks.idle);
            if let Some(place) = &self.place {
                place.idle(now.into_std());
            }
        }
    }

    /// Closed to make room: read as the end of the connection.
    fn made_room(&mut self) -> Poll<io::Result<()>> {
        self.expired = Some(Expired::Room);
        Poll::Ready(Ok(()))
    }
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what.to_string())
}

impl<T: AsyncRead + Unpin> AsyncRead for TimedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.place.as_ref().is_some_and(|p| p.is_closed()) {
            return this.made_room();
        }
        this.update_phase();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if this.phase == Phase::Idle && buf.filled().len() > before {
                    if this.place.as_ref().is_some_and(|p| !p.wake_up()) {
                        // Closed just before: its request is not taken up.
                        buf.set_filled(before);
                        return this.made_room();
                    }
                    // The next request has begun: its header is on the clock.
                    this.phase = Phase::Header;
                    let header = Instant::now() + this.clocks.header;
                    this.read_deadline.as_mut().reset(header);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                if this.phase == Phase::Busy {
                    *this
                        .in_flight
                        .reader
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
                }
                if this.phase != Phase::Busy
                    && let Some(place) = &this.place
                {
                    *place.reader.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(cx.waker().clone());
                    // Closed between the look above and the waker set.
                    if place.is_closed() {
                        return this.made_room();
                    }
                }
                if this.phase != Phase::Busy && this.read_deadline.as_mut().poll(cx).is_ready() {
                    let (expired, what) = match this.phase {
                        Phase::Idle => (Expired::Idle, "idle keep-alive connection timed out"),
                        _ => (Expired::Header, "request header not received in time"),
                    };
                    this.expired = Some(expired);
                    return Poll::Ready(Err(timed_out(what)));
                }
                Poll::Pending
            }
        }
    }
}

impl<T> TimedIo<T> {
    /// Run the write clock around one write: a write that makes no progress
    /// for `write` fails; progress (or an error) starts it afresh.
    fn timed_write(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match polled {
            Poll::Pending => {
                let write = self.clocks.write;
                let deadline = self
                    .write_deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(write)));
                if deadline.as_mut().poll(cx).is_ready() {
                    self.expired = Some(Expired::Write);
                    return Poll::Ready(Err(timed_out("the client stopped reading the answer")));
                }
                Poll::Pending
            }
            ready => {
                self.write_deadline = None;
                ready
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for TimedIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        this.writing = true;
        let polled = Pin::new(&mut this.io).poll_write(cx, data);
        this.timed_write(cx, polled)
    }

    /// Passed through: without it hyper copies every answer body into one
    /// flat buffer before writing (a second copy of a big state).
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        this.writing = true;
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, data);
        this.timed_write(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    /// hyper flushes once it has written all it buffered: the answer is
    /// out, so the reader is woken to start the idle clock.
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        if this.writing && matches!(polled, Poll::Ready(Ok(()))) {
            this.writing = false;
            let reader = this
                .in_flight
                .reader
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            if let Some(reader) = reader {
                reader.wake();
            }
        }
        polled
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const CLOCKS: Clocks = Clocks {
        header: Duration::from_millis(100),
        idle: Duration::from_millis(300),
        write: Duration::from_millis(100),
    };

    #[tokio::test(start_paused = true)]
    async fn a_silent_client_is_cut_off_at_the_header_deadline() {
        let (client, server) = tokio::io::duplex(64);
        let mut io = TimedIo::new(server, CLOCKS, Arc::default());
        let mut buf = [0u8; 8];
        let err = io.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(io.expired(), Some(Expired::Header));
        drop(client);
    }

    #[tokio::test(start_paused = true)]
    async fn busy_connections_wait_and_idle_ones_get_their_own_clock() {
        let (mut client, server) = tokio::io::duplex(64);
        let in_flight: Arc<InFlight> = Arc::default();
        let mut io = TimedIo::new(server, CLOCKS, in_flight.clone());
        client.write_all(b"GET").await.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(io.read(&mut buf).await.unwrap(), 3);
        // A request is being answered: no read deadline applies.
        let request = in_flight.start();
        let waited = tokio::time::timeout(Duration::from_millis(500), io.read(&mut buf)).await;
        assert!(waited.is_err(), "a busy connection must not time out");
        drop(request);
        // Idle: the longer idle clock, not the header clock.
        let started = Instant::now();
        let err = io.read(&mut buf).await.unwrap_err();
        assert_eq!(io.expired(), Some(Expired::Idle), "{err}");
        assert!(started.elapsed() >= CLOCKS.idle);
    }

    /// hyper marks a request answered once it has taken the body's last
    /// bytes into its buffer; until they are flushed to the client the
    /// connection is neither idle (closable to make room) nor on the idle
    /// clock.
    #[tokio::test(start_paused = true)]
    async fn an_answer_still_being_written_is_not_idle() {
        let (mut client, server) = tokio::io::duplex(16);
        let in_flight: Arc<InFlight> = Arc::default();
        let place = Arc::new(Place::default());
        let mut io = TimedIo::new(server, CLOCKS, in_flight.clone()).with_place(place.clone());
        client.write_all(b"GET").await.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(io.read(&mut buf).await.unwrap(), 3);
        let request = in_flight.start();
        assert!(place.begin());
        assert_eq!(io.write(&[7u8; 64]).await.unwrap(), 16, "the rest waits");
        drop(request);
        let waited = tokio::time::timeout(Duration::from_millis(500), io.read(&mut buf)).await;
        assert!(
            waited.is_err(),
            "an answer being written must not time out as idle"
        );
        assert_eq!(place.closable_since(), None, "nor be closed to make room");
        let mut answer = [0u8; 16];
        client.read_exact(&mut answer).await.unwrap();
        io.flush().await.unwrap();
        let err = io.read(&mut buf).await.unwrap_err();
        assert_eq!(io.expired(), Some(Expired::Idle), "{err}");
        assert!(matches!(place.closable_since(), Some((0, _))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_is_cut_off() {
        let (_client, server) = tokio::io::duplex(16);
        let mut io = TimedIo::new(server, CLOCKS, Arc::default());
        let err = io.write_all(&[0u8; 1024]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(io.expired(), Some(Expired::Write));
    }
}
