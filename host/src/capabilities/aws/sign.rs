//! SigV4 on the host: a request's signature.

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode, sign as sigv4,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use std::time::SystemTime;

/// Headers that carry a signature: whatever the guest put there is
/// dropped before the host signs.
const SIGNATURE_HEADERS: &[&str] = &[
    "authorization",
    "x-amz-date",
    "x-amz-security-token",
    "x-amz-content-sha256",
];

/// Sign `request` for `service` in `region` with `credentials` (the
/// service is the host's choice: [`super::SigningScope::check`]).
pub fn sign(
    request: &mut http::Request<bytes::Bytes>,
    credentials: &Credentials,
    region: &str,
    service: &str,
) -> Result<(), String> {
    for name in SIGNATURE_HEADERS {
        request.headers_mut().remove(*name);
    }
    let mut settings = SigningSettings::default();
    if service == "s3" {
        // S3's own rules: the payload hash as a header, the path as sent.
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    }
    let identity: Identity = credentials.clone().into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(SystemTime::now())
        .settings(settings)
        .build()
        .map_err(|e| format!("cannot sign for {service}: {e}"))?
        .into();
    let uri = request.uri().to_string();
    let headers: Vec<(&str, &str)> = request
        .headers()
        .iter()
        .filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str(), v)))
        .collect();
    let signable = SignableRequest::new(
        request.method().as_str(),
        &uri,
        headers.into_iter(),
        SignableBody::Bytes(request.body()),
    )
    .map_err(|e| format!("cannot sign the request: {e}"))?;
    let (instructions, _) = sigv4(signable, &params)
        .map_err(|e| format!("cannot sign the request: {e}"))?
        .into_parts();
    instructions.apply_to_request_http1x(request);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guests_own_signature_is_replaced() {
        let mut request = http::Request::builder()
            .method("GET")
            .uri("http://127.0.0.1:9000/bucket/key")
            .header("authorization", "AWS4-HMAC-SHA256 Credential=FORGED/…")
            .header("x-amz-security-token", "forged")
            .body(bytes::Bytes::new())
            .unwrap();
        let credentials = Credentials::new("AKIDHOST", "secret", Some("session".into()), None, "t");
        sign(&mut request, &credentials, "us-east-1", "s3").unwrap();
        let auth = request.headers()["authorization"].to_str().unwrap();
        assert!(
            auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDHOST/"),
            "{auth}"
        );
        assert!(auth.contains("/us-east-1/s3/aws4_request"), "{auth}");
        assert_eq!(request.headers()["x-amz-security-token"], "session");
        assert!(request.headers().contains_key("x-amz-content-sha256"));
    }
}
