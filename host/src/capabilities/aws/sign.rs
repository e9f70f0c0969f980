//! SigV4 on the host: which service a request is for, and its signature.

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

/// The service a request is for: from an AWS host name
/// (`dynamodb.eu-west-1.amazonaws.com`, `bucket.s3.eu-west-1.amazonaws.com`),
/// else from the JSON protocol's `X-Amz-Target` (`DynamoDB_20120810.GetItem`,
/// `AWSSecurityTokenServiceV20110615.…`), else S3 (custom endpoints such as
/// MinIO speak S3).
pub fn service_of(host: &str, headers: &http::HeaderMap) -> &'static str {
    const KNOWN: &[&str] = &[
        "s3",
        "dynamodb",
        "sts",
        "kms",
        "sqs",
        "sns",
        "secretsmanager",
    ];
    if let Some(name) = host.strip_suffix(".amazonaws.com") {
        for label in name.split('.') {
            let label = label.split('-').next().unwrap_or(label);
            if let Some(known) = KNOWN.iter().find(|k| **k == label) {
                return known;
            }
        }
    }
    let target = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if target.starts_with("DynamoDB_") {
        "dynamodb"
    } else if target.starts_with("AWSSecurityTokenService") {
        "sts"
    } else {
        "s3"
    }
}

/// Sign `request` for `region` with `credentials`.
pub fn sign(
    request: &mut http::Request<bytes::Bytes>,
    credentials: &Credentials,
    region: &str,
) -> Result<(), String> {
    for name in SIGNATURE_HEADERS {
        request.headers_mut().remove(*name);
    }
    let host = request.uri().host().unwrap_or_default().to_string();
    let service = service_of(&host, request.headers());
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
    fn the_service_comes_from_the_host_or_the_target() {
        let none = http::HeaderMap::new();
        assert_eq!(
            service_of("dynamodb.eu-west-1.amazonaws.com", &none),
            "dynamodb"
        );
        assert_eq!(service_of("states.s3.eu-west-1.amazonaws.com", &none), "s3");
        assert_eq!(service_of("s3.amazonaws.com", &none), "s3");
        assert_eq!(service_of("s3-fips.us-east-1.amazonaws.com", &none), "s3");
        let mut ddb = http::HeaderMap::new();
        ddb.insert("x-amz-target", "DynamoDB_20120810.GetItem".parse().unwrap());
        assert_eq!(service_of("127.0.0.1", &ddb), "dynamodb");
        assert_eq!(service_of("minio.internal", &none), "s3");
    }

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
        sign(&mut request, &credentials, "us-east-1").unwrap();
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
