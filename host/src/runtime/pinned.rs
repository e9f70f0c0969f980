//! Sending one granted outbound request: resolve its host once, check every
//! address against the policy, connect to a checked one, verify TLS for
//! the name. The HTTP/1.1 exchange after the connection is hyper's, driven
//! as wasmtime-wasi-http's own sender drives it (`default_send_request`,
//! whose connect step resolves names itself and cannot be checked).

use crate::policy::OutboundPolicy;
use bytes::Bytes;
use http::uri::Scheme;
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
    // One connection per request: say so, and the server closes first and
    // keeps the closed connection's TIME_WAIT. Otherwise this side does, and
    // Linux reuses such a port on loopback at once (tcp_tw_reuse = 2) while
    // a busy server may still be closing it: the new connection is reset
    // (seen against fake-gcs-server under parallel clients, about 2 % of
    // requests).
    request.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );

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
