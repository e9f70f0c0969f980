//! Accepting connections and keeping them honest: every deployment that
//! matters is reachable by strangers, who need no password to cost us.
//!
//! - At most `max_connections` open at once, and `max_connections_per_address`
//!   (an IPv6 client counted by its /64, see [`crate::policy::client_group`])
//!   from one client address. At either cap, the oldest idle keep-alive
//!   connection (of that address, for its cap) is closed to make room, as
//!   mature servers do; at `max_connections`, when none is idle, the
//!   oldest one still waiting for a request header (or in its TLS
//!   handshake) with nothing started: neither idle connections nor
//!   strangers' half-sent headers can lock out a new client, nor a
//!   liveness probe. (At an address's own cap its half-sent headers are
//!   its own: the new one is refused, saying why.) A connection answering a request, or
//!   still writing an answer, is never closed to make room. Only when none
//!   can be closed is a connection past a cap answered 503 (with
//!   `Retry-After`) and closed, and past a small allowance for those
//!   answers it is closed at once.
//! - A connection's clocks ([`timed_io`]): a header must arrive within
//!   `header_read_timeout_secs`, an idle keep-alive connection closes after
//!   `keepalive_timeout_secs`, a client that stops reading is cut off.
//! - TLS handshakes run inside each connection's task, under the same caps
//!   and a 10 s limit.
//! - Graceful shutdown with a deadline: on the signal the server stops
//!   accepting, idle connections close at once, requests under way may
//!   finish until `shutdown_timeout_secs`, and then the rest are dropped.
//!   (Guest calls already started finish on their own: a write completes or
//!   never starts; see [`crate::runtime`].)

pub mod timed_io;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use timed_io::{Clocks, InFlight, Place, TimedIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

/// A TLS client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections past a cap that still get a 503 (the rest are closed at once).
const REFUSALS_ANSWERED: usize = 64;
/// How long a refused connection may take to send its request.
const REFUSAL_HEADER_TIMEOUT: Duration = Duration::from_secs(2);

/// The limits of the listener (`[network]` in the config).
#[derive(Debug, Clone)]
pub struct NetworkLimits {
    /// The connection clocks.
    pub clocks: Clocks,
    /// Connections open at once.
    pub max_connections: usize,
    /// Connections open at once from one client address.
    pub max_connections_per_address: usize,
    /// How long requests under way may take to finish after the signal.
    pub shutdown_timeout: Duration,
}

/// The client address of a request, put in its extensions by the listener.
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub SocketAddr);

/// What happened to connections, for metrics and logs.
pub trait ConnectionEvents: Send + Sync + 'static {
    /// A connection was opened (`true`) or closed (`false`).
    fn open(&self, opened: bool);
    /// A connection was refused: `reason` is `total` or `address`.
    fn refused(&self, reason: &'static str);
    /// A connection's deadline closed it: `header`, `idle` or `write`.
    fn timed_out(&self, phase: &'static str);
}

/// Open connections, in total and by address, and each one's place.
#[derive(Default)]
struct Counts {
    total: usize,
    by_address: HashMap<IpAddr, usize>,
    /// Each admitted connection still counted: its address and place.
    places: HashMap<u64, (IpAddr, Arc<Place>)>,
    next: u64,
}

/// How many idle connections a new one may try to close (each found busy
/// again by the time it is asked) before it is refused.
const ROOM_TRIES: usize = 8;

impl Counts {
    /// Stop counting connection `id` (closed, or closed to make room).
    fn release(&mut self, id: u64) {
        let Some((address, _)) = self.places.remove(&id) else {
            return;
        };
        self.total -= 1;
        if let Some(n) = self.by_address.get_mut(&address) {
            *n -= 1;
            if *n == 0 {
                self.by_address.remove(&address);
            }
        }
    }

    /// Close the connection (of `from`, if given) idle the longest, or
    /// failing that (if `headers`) the one waiting longest for a header,
    /// and give its place back now. Whether one was. A scan of the open
    /// connections, made only at a cap.
    fn make_room(&mut self, from: Option<IpAddr>, headers: bool) -> bool {
        for _ in 0..ROOM_TRIES {
            let oldest = self
                .places
                .iter()
                .filter(|(_, (address, _))| from.is_none_or(|f| *address == f))
                .filter_map(|(id, (_, place))| Some((place.closable_since()?, *id)))
                .filter(|((rank, _), _)| headers || *rank == 0)
                .min();
            let Some((_, id)) = oldest else {
                return false;
            };
            if self.places[&id].1.close_if_unused() {
                self.release(id);
                return true;
            }
        }
        false
    }
}

/// One admitted connection; gives its place back when dropped.
struct Admitted {
    counts: Arc<Mutex<Counts>>,
    id: u64,
    place: Arc<Place>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        lock(&self.counts).release(self.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn admit(
    counts: &Arc<Mutex<Counts>>,
    limits: &NetworkLimits,
    address: IpAddr,
) -> Result<Admitted, &'static str> {
    let mut c = lock(counts);
    let mine = c.by_address.get(&address).copied().unwrap_or(0);
    if mine >= limits.max_connections_per_address && !c.make_room(Some(address), false) {
        return Err("address");
    }
    if c.total >= limits.max_connections && !c.make_room(None, true) {
        return Err("total");
    }
    *c.by_address.entry(address).or_insert(0) += 1;
    c.total += 1;
    let (id, place) = (c.next, Arc::new(Place::default()));
    c.next += 1;
    c.places.insert(id, (address, place.clone()));
    Ok(Admitted {
        counts: counts.clone(),
        id,
        place,
    })
}

/// Serve `app` on `listener` until `shutdown` completes, then drain.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    app: Router,
    limits: NetworkLimits,
    events: Arc<dyn ConnectionEvents>,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = tls.map(TlsAcceptor::from);
    let counts = Arc::new(Mutex::new(Counts::default()));
    let refusals = Arc::new(Semaphore::new(REFUSALS_ANSWERED));
    let graceful = GracefulShutdown::new();
    let mut tasks = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            accepted = listener.accept() => {
                let (tcp, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: back off
                        // briefly instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                match admit(&counts, &limits, crate::policy::client_group(peer.ip())) {
                    Ok(admitted) => {
                        let watcher = graceful.watcher();
                        let (app, acceptor, events, clocks) =
                            (app.clone(), acceptor.clone(), events.clone(), limits.clocks);
                        tasks.spawn(async move {
                            events.open(true);
                            let place = admitted.place.clone();
                            let conn = Conn { peer, app, clocks, watcher, place: place.clone() };
                            tokio::select! {
                                () = connection(tcp, acceptor, conn, &*events) => {}
                                // Closed to make room while it waited for a
                                // header: nothing was started on it.
                                () = place.dropped() => {
                                    events.timed_out("room");
                                    tracing::debug!(%peer, "connection waiting for a header closed to make room");
                                }
                            }
                            events.open(false);
                            drop(admitted);
                        });
                    }
                    Err(reason) => {
                        events.refused(reason);
                        tracing::info!(%peer, reason, "connection refused: too many open");
                        if let Ok(permit) = refusals.clone().try_acquire_owned() {
                            tasks.spawn(async move {
                                refuse(tcp, reason).await;
                                drop(permit);
                            });
                        }
                    }
                }
            }
        }
    }
    drop(listener);
    tracing::info!(
        open = graceful.count(),
        "shutting down: no new connections; requests under way may finish for {} s",
        limits.shutdown_timeout.as_secs()
    );
    if tokio::time::timeout(limits.shutdown_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            left = tasks.len(),
            "shutdown deadline passed: dropping the connections still open"
        );
    }
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
}

/// What serving one admitted connection takes.
struct Conn {
    peer: SocketAddr,
    app: Router,
    clocks: Clocks,
    watcher: hyper_util::server::graceful::Watcher,
    place: Arc<Place>,
}

/// One connection: TLS if configured, then HTTP/1.1 until it closes.
async fn connection(
    tcp: TcpStream,
    acceptor: Option<TlsAcceptor>,
    conn: Conn,
    events: &dyn ConnectionEvents,
) {
    let _ = tcp.set_nodelay(true);
    let peer = conn.peer;
    match acceptor {
        None => http(tcp, conn, events).await,
        Some(acceptor) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
        {
            Ok(Ok(tls)) => http(tls, conn, events).await,
            Ok(Err(e)) => tracing::info!(%peer, error = %e, "TLS handshake failed"),
            Err(_) => {
                events.timed_out("header");
                tracing::info!(%peer, "TLS handshake timed out");
            }
        },
    }
}

async fn http<I: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    io: I,
    conn: Conn,
    events: &dyn ConnectionEvents,
) {
    let Conn {
        peer,
        app,
        clocks,
        watcher,
        place,
    } = conn;
    let in_flight: Arc<InFlight> = Arc::default();
    let timed = TimedIo::new(io, clocks, in_flight.clone()).with_place(place.clone());
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        let app = app.clone();
        let answering = in_flight.start();
        let begun = place.begin();
        request.extensions_mut().insert(ClientAddr(peer));
        async move {
            if !begun {
                // Closed to make room just before: start nothing.
                return Ok(closing());
            }
            let response = app.oneshot(request.map(axum::body::Body::new)).await;
            // The request stays under way until its body is sent (or
            // dropped): the connection is neither idle nor on the idle
            // clock while a download goes out.
            response.map(|r| {
                r.map(|body| {
                    axum::body::Body::new(Answering {
                        body,
                        _request: answering,
                    })
                })
            })
        }
    });
    // The connection's own I/O object is moved into hyper; its clocks are
    // read back through this handle when it ends.
    let (timed, expired) = Expiry::wrap(timed);
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(timed), service);
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
    match expired.get() {
        Some("room") => {
            events.timed_out("room");
            tracing::debug!(%peer, "idle connection closed to make room for a new one");
        }
        Some(phase) => {
            events.timed_out(phase);
            tracing::info!(%peer, phase, "connection closed: its deadline passed");
        }
        None => {}
    }
}

/// An answer's body, holding its request's [`timed_io::InFlightGuard`]
/// until hyper has taken the last frame or dropped it (the bytes hyper still
/// buffers after that are [`TimedIo`]'s to see out).
struct Answering {
    body: axum::body::Body,
    _request: timed_io::InFlightGuard,
}

impl http_body::Body for Answering {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, axum::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    /// Passed through: hyper sends a `Content-Length` from it.
    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The answer to a request on a connection closed to make room just as it
/// arrived.
fn closing() -> hyper::Response<axum::body::Body> {
    hyper::Response::builder()
        .status(hyper::StatusCode::SERVICE_UNAVAILABLE)
        .header(hyper::header::RETRY_AFTER, "1")
        .header(hyper::header::CONNECTION, "close")
        .body(axum::body::Body::from("too many connections; retry\n"))
        .expect("a valid response")
}

/// Reads which deadline closed a connection after hyper has consumed it.
struct Expiry<I> {
    inner: TimedIo<I>,
    cell: Arc<Mutex<Option<&'static str>>>,
}

#[derive(Clone)]
struct ExpiryCell(Arc<Mutex<Option<&'static str>>>);

impl ExpiryCell {
    fn get(&self) -> Option<&'static str> {
        *lock(&self.0)
    }
}

impl<I> Expiry<I> {
    fn wrap(inner: TimedIo<I>) -> (Self, ExpiryCell) {
        let cell = Arc::new(Mutex::new(None));
        (
            Expiry {
                inner,
                cell: cell.clone(),
            },
            ExpiryCell(cell),
        )
    }

    fn record(&self) {
        if let Some(expired) = self.inner.expired() {
            *lock(&self.cell) = Some(match expired {
                timed_io::Expired::Header => "header",
                timed_io::Expired::Idle => "idle",
                timed_io::Expired::Write => "write",
                timed_io::Expired::Room => "room",
            });
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Expiry<I> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        self.record();
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Expiry<I> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, data);
        self.record();
        polled
    }

    /// Passed through, so hyper writes answer bodies without copying them.
    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, data);
        self.record();
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Answer a connection past a cap with 503 and close it.
async fn refuse(tcp: TcpStream, reason: &'static str) {
    let message = match reason {
        "address" => {
            "too many connections from your address (max_connections_per_address); retry later\n"
        }
        _ => "too many connections to this server (max_connections); retry later\n",
    };
    let service =
        hyper::service::service_fn(move |_request: hyper::Request<Incoming>| async move {
            Ok::<_, std::convert::Infallible>(
                hyper::Response::builder()
                    .status(hyper::StatusCode::SERVICE_UNAVAILABLE)
                    .header(hyper::header::RETRY_AFTER, "1")
                    .header(hyper::header::CONNECTION, "close")
                    .header(hyper::header::CONTENT_TYPE, "text/plain; charset=utf-8")
                    .body(http_body_util::Full::new(bytes::Bytes::from_static(
                        message.as_bytes(),
                    )))
                    .expect("a valid response"),
            )
        });
    let clocks = Clocks {
        header: REFUSAL_HEADER_TIMEOUT,
        idle: REFUSAL_HEADER_TIMEOUT,
        write: REFUSAL_HEADER_TIMEOUT,
    };
    let io = TimedIo::new(tcp, clocks, Arc::default());
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .serve_connection(TokioIo::new(io), service);
    let _ = conn.await;
}

#[cfg(test)]
mod tests;
