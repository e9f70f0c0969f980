//! An HTTP/1 server for the tests on a free loopback port, on a runtime of
//! its own, each request handled by the test's function; stopped when
//! dropped. The fault proxy and the Google front are such servers.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::sync::Arc;

/// A running server.
pub struct LoopbackServer {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    runtime: Option<tokio::runtime::Runtime>,
}

impl LoopbackServer {
    /// Serve the handler `make(url)` returns; `keep_alive: false` closes
    /// every connection after one request. A handler's error closes the
    /// connection without an answer.
    pub fn start<H, F>(name: &str, keep_alive: bool, make: impl FnOnce(&str) -> H) -> LoopbackServer
    where
        H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
        F: Future<Output = Result<Response<Full<Bytes>>, std::io::Error>> + Send + 'static,
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("a runtime for the {name}: {e}"));
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap_or_else(|e| panic!("a port for the {name}: {e}"));
        let url = format!("http://{}", listener.local_addr().unwrap());
        let handle = Arc::new(make(&url));
        runtime.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let handle = handle.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| handle(request));
                    // An error here is a dropped connection, chosen or a
                    // client's: nothing to do either way.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(keep_alive)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        LoopbackServer {
            url,
            runtime: Some(runtime),
        }
    }
}

impl Drop for LoopbackServer {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
