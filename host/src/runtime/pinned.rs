//! Sending one granted outbound request: resolve its host once, check every
//! address against the policy, connect to a checked one, verify TLS for
//! the name. The HTTP/1.1 exchange after the connection is hyper's, driven
//! as wasmtime-wasi-http's own sender drives it (`default_send_request`,
//! whose connect step resolves names itself and cannot be checked).

use crate::policy::OutboundPolicy;
use bytes::Bytes;
use http::uri::Scheme;
use http_body_util::combinators::UnsyncBoxBody;
use std::net::{IpAddr, SocketAddr};
use std::pin::{Pin, pin};
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::ServerName;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error, RequestOptions};

/// wasmtime-wasi-http's defaults when a guest sets no timeouts.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

trait Stream: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static> Stream for T {}

/// The connection's half of a sent request: drive it to completion.
type Driver = Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>;

/// Send `request` (already allowed by origin) to an address the policy
/// allows for its host.
pub async fn send<B>(
    mut request: http::Request<B>,
    options: Option<RequestOptions>,
    policy: &OutboundPolicy,
    backend: &str,
) -> Result<
    (
        http::Response<ResponseBody>,
        impl Future<Output = Result<(), Error>> + Send + use<B>,
    ),
    Error,
>
where
    B: http_body::Body<Data = Bytes, Error = Error> + Send + 'static,
{
    let uri = request.uri().clone();
    let tls = uri.scheme() == Some(&Scheme::HTTPS);
    let host = uri
        .host()
        .ok_or(Error::HttpRequestUriInvalid)?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let timeout = |pick: fn(&RequestOptions) -> Option<Duration>| {
        options.as_ref().and_then(pick).unwrap_or(DEFAULT_TIMEOUT)
    };
    let connect_timeout = timeout(|o| o.connect_timeout);
    let first_byte_timeout = timeout(|o| o.first_byte_timeout);
    let between_bytes_timeout = timeout(|o| o.between_bytes_timeout);

    // Resolve once; every address must pass, so a mixed answer (one public,
    // one internal) cannot slip through by ordering.
    let addresses: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::time::timeout(
            connect_timeout,
            tokio::net::lookup_host((host.as_str(), port)),
        )
        .await
        .map_err(|_| Error::DnsTimeout)?
        .map_err(|e| Error::DnsError {
            rcode: Some(e.to_string()),
            info_code: None,
        })?
        .collect(),
    };
    if addresses.is_empty() {
        return Err(Error::DestinationNotFound);
    }
    for address in &addresses {
        if let Err(reason) = policy.check_address(&host, address.ip()) {
            tracing::warn!(
                backend,
                "refused outbound request to {host}:{port}: {reason}"
            );
            return Err(Error::HttpRequestDenied);
        }
    }
    let tcp = tokio::time::timeout(connect_timeout, async {
        let mut last = None;
        for address in &addresses {
            match TcpStream::connect(address).await {
                Ok(stream) => return Ok(stream),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("at least one address"))
    })
    .await
    .map_err(|_| Error::ConnectionTimeout)?
    .map_err(Error::Connect)?;
    let stream: Box<dyn Stream> = if tls {
        let name = match host.parse::<IpAddr>() {
            Ok(ip) => ServerName::from(ip),
            Err(_) => ServerName::try_from(host.clone())?,
        };
        let connector = tokio_rustls::TlsConnector::from(crate::capabilities::tls_client());
        Box::new(connector.connect(name, tcp).await.map_err(Error::Tls)?)
    } else {
        Box::new(tcp)
    };
    let (mut sender, conn) = tokio::time::timeout(
        connect_timeout,
        hyper::client::conn::http1::Builder::new().handshake(TokioIo::new(stream)),
    )
    .await
    .map_err(|_| Error::ConnectionTimeout)??;
    // The request line carries only the path: not addressing a proxy.
    *request.uri_mut() = http::Uri::builder()
        .path_and_query(uri.path_and_query().map_or("/", |p| p.as_str()))
        .build()
        .expect("a path from a valid URI");
    // One connection per request: say so, so the server closes first and
    // keeps the closed connection's TIME_WAIT. (The "connection reset" seen
    // against fake-gcs-server and Azurite under parallel clients, once put
    // down to port reuse, was the request body closed under the guest; see
    // `KeepOpen`.)
    request.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );

    let request = request.map(KeepOpen::new);

    let sending = async move {
        let response = tokio::time::timeout(first_byte_timeout, sender.send_request(request))
            .await
            .map_err(|_| Error::ConnectionReadTimeout)?
            .map_err(Error::from)?;
        let mut timeout = tokio::time::interval(between_bytes_timeout.max(Duration::from_nanos(1)));
        timeout.reset();
        Ok::<_, Error>(response.map(|incoming| ResponseBody { incoming, timeout }))
    };
    let mut sending = pin!(sending);
    let mut conn: Option<Driver> = Some(Box::pin(async move {
        conn.await.map_err(|e| {
            if e.is_timeout() {
                Error::HttpResponseTimeout
            } else {
                e.into()
            }
        })
    }));
    // Wait for the answer while driving the connection.
    let response = std::future::poll_fn(|cx| match sending.as_mut().poll(cx) {
        Poll::Ready(result) => Poll::Ready(result),
        Poll::Pending => {
            let Some(driver) = conn.as_mut() else {
                return Poll::Pending;
            };
            let done = ready!(driver.as_mut().poll(cx));
            conn = None;
            match done {
                Ok(()) => sending.as_mut().poll(cx),
                Err(e) => Poll::Ready(Err(e)),
            }
        }
    })
    .await?;
    Ok((response, async move {
        match conn {
            Some(driver) => driver.await,
            None => Ok(()),
        }
    }))
}

/// Longest a request body hyper let go of is read on in the background.
const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// A request body as hyper gets it, kept open for the guest after hyper
/// lets go of it.
///
/// Hyper drops a body it will send no more of (its `Content-Length` is
/// reached, or it is 0, or a GET or HEAD goes without one) as soon as the
/// head is written: often before the guest has written its (empty) body,
/// for the guest writes after `handle` returns. The guest's next
/// `check-write` then finds the stream closed, and wstd, which writes the
/// body and awaits the answer together, fails the whole request with
/// "connection reset", though it went out and is answered. Under load (the
/// host's task outruns the guest's) that was about 1 request in 50, read
/// for a reset connection. Dropped before its end, the body is read on
/// and discarded in the background instead, until the guest finishes or
/// drops it (its store gone), or [`DRAIN_LIMIT`] passes.
struct KeepOpen {
    body: Option<UnsyncBoxBody<Bytes, Error>>,
    ended: bool,
}

impl KeepOpen {
    fn new<B>(body: B) -> Self
    where
        B: http_body::Body<Data = Bytes, Error = Error> + Send + 'static,
    {
        KeepOpen {
            body: Some(http_body_util::BodyExt::boxed_unsync(body)),
            ended: false,
        }
    }
}

impl http_body::Body for KeepOpen {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Error>>> {
        let Some(body) = self.body.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = ready!(Pin::new(body).poll_frame(cx));
        if !matches!(frame, Some(Ok(_))) {
            self.ended = true;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| http_body::SizeHint::with_exact(0), |b| b.size_hint())
    }
}

impl Drop for KeepOpen {
    fn drop(&mut self) {
        let Some(mut body) = self.body.take() else {
            return;
        };
        if self.ended || http_body::Body::is_end_stream(&body) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            use http_body_util::BodyExt;
            let drain = async { while let Some(Ok(_)) = body.frame().await {} };
            let _ = tokio::time::timeout(DRAIN_LIMIT, drain).await;
        });
    }
}

/// A response body with the guest's between-bytes timeout.
pub struct ResponseBody {
    incoming: hyper::body::Incoming,
    timeout: tokio::time::Interval,
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Error>>> {
        match Pin::new(&mut self.incoming).poll_frame(cx) {
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(if e.is_timeout() {
                Error::HttpResponseTimeout
            } else {
                Error::from(e)
            }))),
            Poll::Ready(Some(Ok(frame))) => {
                self.timeout.reset();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                ready!(self.timeout.poll_tick(cx));
                Poll::Ready(Some(Err(Error::ConnectionReadTimeout)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.incoming.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::mpsc;

    /// A request body fed by a channel, as wasmtime-wasi-http's outgoing
    /// body is fed by the guest's writes.
    struct Channel(mpsc::Receiver<Bytes>);

    impl http_body::Body for Channel {
        type Data = Bytes;
        type Error = Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, Error>>> {
            self.0
                .poll_recv(cx)
                .map(|chunk| chunk.map(|c| Ok(http_body::Frame::data(c))))
        }
    }

    /// A server that answers one request 200 as soon as its head is in,
    /// and closes.
    async fn answer_once() -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).await.unwrap() == 1 {
                head.push(byte[0]);
            }
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .await
                .unwrap();
        });
        port
    }

    /// The guest writes its empty body only after the host sent the
    /// request and got the answer (a slow guest): the body stream must
    /// still take the write, or the guest fails an answered request.
    #[tokio::test]
    async fn a_body_hyper_is_done_with_stays_open_for_the_guest() {
        for (method, length) in [("PUT", Some("0")), ("GET", None), ("HEAD", None)] {
            let port = answer_once().await;
            let (guest, body) = mpsc::channel::<Bytes>(2);
            let mut request = http::Request::builder()
                .method(method)
                .uri(format!("http://127.0.0.1:{port}/c/blob?comp=metadata"));
            if let Some(length) = length {
                request = request.header("content-length", length);
            }
            let request = request.body(Channel(body)).unwrap();
            let (response, io) = send(request, None, &OutboundPolicy::default(), "test")
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            io.await.unwrap();
            assert!(
                !guest.is_closed(),
                "{method}: the body stream closed under the guest"
            );
            guest.send(Bytes::new()).await.unwrap();
        }
    }
}
