//! `wasi:http` outgoing requests, filtered by the backend's
//! [`OutboundPolicy`] before anything leaves the host: the URI's origin
//! first, then every address its host resolves to. The host resolves the
//! name once and connects only to an address it checked (no second
//! lookup for DNS to answer differently), with TLS verified for the name.

use crate::policy::OutboundPolicy;
use std::future::Future;
use std::sync::Arc;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

/// The hooks object of one sandbox: checks each request's URI against the
/// policy, logs and refuses what is not granted, sends the rest with
/// wasmtime's default client.
pub struct Outbound {
    /// What this backend may reach.
    pub policy: Arc<OutboundPolicy>,
    /// Backend name, for the log line of a refusal.
    pub backend: Arc<str>,
}

type ResponseFuture = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), Error>> + Send>,
                ),
                Error,
            >,
        > + Send,
>;

impl WasiHttpHooks for Outbound {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> ResponseFuture {
        if let Err(reason) = self.policy.check(request.uri()) {
            // Scheme, authority and path only: queries may carry signatures.
            let uri = request.uri();
            let shown = format!(
                "{}://{}{}",
                uri.scheme_str().unwrap_or("?"),
                uri.authority().map_or("", |a| a.as_str()),
                uri.path()
            );
            tracing::warn!(backend = %self.backend, "refused outbound request to {shown}: {reason}");
            return Box::new(async move {
                // Take the body the guest is still writing before refusing:
                // clients (wstd among them) send the body and await the
                // answer together, and a body cut off would reach them as a
                // broken connection, hiding the refusal. The guest's
                // deadline bounds this; dropping the store aborts it.
                use http_body_util::BodyExt;
                let mut body = request.into_body();
                while let Some(Ok(_)) = body.frame().await {}
                Err(Error::HttpRequestDenied)
            });
        }
        drop(fut);
        let (policy, backend) = (self.policy.clone(), self.backend.clone());
        Box::new(async move {
            use http_body_util::BodyExt;
            let (response, io) = super::pinned::send(request, options, &policy, &backend).await?;
            Ok((
                response.map(BodyExt::boxed_unsync),
                Box::new(io) as Box<dyn Future<Output = Result<(), Error>> + Send>,
            ))
        })
    }
}
