//! A connection's clocks: how long a client may take to send a request's
//! header, how long a keep-alive connection may sit idle between requests,
//! and how long a write to a client that stopped reading may wait.
//!
//! The connection is in one of three phases. *Header*: from accept, or
//! from the first byte after an idle spell, until the request reaches the
//! application. *Busy*: while requests are being answered (the body's own
//! deadline is the handler's, `body_timeout_secs`). *Idle*: after the last
//! answer, until the next byte. Past a phase's deadline, reads fail with
//! `TimedOut` and hyper closes the connection.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
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
        }
    }

    /// Which deadline closed the connection, if one did.
    pub fn expired(&self) -> Option<Expired> {
        self.expired
    }

    /// Move between phases as the application sees requests come and go.
    fn update_phase(&mut self) {
        let started = self.in_flight.started.load(Ordering::Acquire);
        if self.in_flight.active.load(Ordering::Acquire) > 0 {
            self.phase = Phase::Busy;
            self.seen = started;
        } else if self.phase == Phase::Busy || started != self.seen {
            // Every request so far was answered: idle until the next byte.
            self.phase = Phase::Idle;
            self.seen = started;
            let idle = Instant::now() + self.clocks.idle;
            self.read_deadline.as_mut().reset(idle);
        }
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
        this.update_phase();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if this.phase == Phase::Idle && buf.filled().len() > before {
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
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, data);
        this.timed_write(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
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

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_is_cut_off() {
        let (_client, server) = tokio::io::duplex(16);
        let mut io = TimedIo::new(server, CLOCKS, Arc::default());
        let err = io.write_all(&[0u8; 1024]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(io.expired(), Some(Expired::Write));
    }
}
