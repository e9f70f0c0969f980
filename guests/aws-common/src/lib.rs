//! What wasmstate's AWS guests (`s3-lockfile`, `dynamodb`) share: their
//! configuration, named as in Terraform's `backend "s3"`; AWS clients that
//! run inside the sandbox (requests through `wasi:http`, sent unsigned:
//! the host holds the credentials and signs them); and the S3 state
//! layout, byte-compatible with Terraform's:
//!
//! ```text
//! <key>                                 state of workspace "default"
//! <workspace_key_prefix>/<ws>/<key>     state of workspace <ws> (prefix default "env:")
//! <state key>.wasmstate-metadata        that workspace's metadata (wasmstate's own;
//!                                       Terraform never lists it as a workspace)
//! ```

mod condition;
mod conditional;
mod s3;
mod state;
mod versions;
mod writes;

pub use aws_smithy_wasm::wasi::WasiSleep;
pub use conditional::{HEAD_BYTES, METADATA_SUFFIX};
pub use s3::{S3State, SERIAL_TAG, WRITE_TAG};
pub use versions::MAX_VERSIONS;
pub use writes::Condition;

use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::{Region, SharedHttpClient};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use wasmstate_guest::{Config, Diagnostic, Error};

/// Configuration keys every AWS guest understands.
pub const COMMON_KEYS: &[&str] = &[
    "bucket",
    "key",
    "region",
    "endpoint",
    "endpoints.s3",
    "use_path_style",
    "workspace_key_prefix",
    "encrypt",
    "kms_key_id",
];

/// Validated settings.
#[derive(Debug, Clone)]
pub struct AwsSettings {
    /// S3 bucket holding the states.
    pub bucket: String,
    /// State object key of the default workspace.
    pub key: String,
    /// AWS region.
    pub region: String,
    /// S3 endpoint override (`endpoints.s3`, or the older `endpoint`).
    pub s3_endpoint: Option<String>,
    /// Path-style S3 addressing (needed by most S3-compatible stores).
    pub path_style: bool,
    /// Prefix of non-default workspaces' keys.
    pub workspace_prefix: String,
    /// Server-side encryption of written objects.
    pub encrypt: bool,
    /// KMS key for server-side encryption (implies `encrypt`).
    pub kms_key_id: Option<String>,
}

fn invalid(key: &str, message: impl Into<String>) -> Error {
    Error::InvalidConfig(vec![Diagnostic::key(key, message)])
}

impl AwsSettings {
    /// Read the settings; `extra_keys` are the calling guest's own keys.
    pub fn from_config(config: &Config, extra_keys: &[&str]) -> Result<Self, Error> {
        let known: Vec<&str> = COMMON_KEYS.iter().chain(extra_keys).copied().collect();
        config.reject_unknown(&known)?;
        let bucket = config.required("bucket")?.to_string();
        let key = config.required("key")?.to_string();
        if key.is_empty() || key.starts_with('/') || key.ends_with('/') {
            return Err(invalid(
                "key",
                "must be an object key such as \"app/terraform.tfstate\" (no leading or trailing '/')",
            ));
        }
        let endpoint = config.get("endpoints.s3").or(config.get("endpoint"));
        if let Some(e) = endpoint
            && !(e.starts_with("http://") || e.starts_with("https://"))
        {
            return Err(invalid(
                "endpoints.s3",
                format!("{e:?} must start with http:// or https://"),
            ));
        }
        let kms_key_id = config.get("kms_key_id").map(str::to_string);
        Ok(AwsSettings {
            bucket,
            key,
            region: config.get("region").unwrap_or("us-east-1").to_string(),
            s3_endpoint: endpoint.map(str::to_string),
            path_style: config.parse_or("use_path_style", false)?,
            workspace_prefix: config
                .get("workspace_key_prefix")
                .unwrap_or("env:")
                .to_string(),
            encrypt: config.parse_or("encrypt", false)? || kms_key_id.is_some(),
            kms_key_id,
        })
    }

    /// The state object key of `workspace`.
    pub fn state_key(&self, workspace: &str) -> String {
        match (workspace, self.workspace_prefix.as_str()) {
            ("default", _) => self.key.clone(),
            (ws, "") => format!("{ws}/{}", self.key),
            (ws, prefix) => format!("{prefix}/{ws}/{}", self.key),
        }
    }

    /// `<bucket>/<state key>`: Terraform's lock `Path` and DynamoDB `LockID`.
    pub fn lock_path(&self, workspace: &str) -> String {
        format!("{}/{}", self.bucket, self.state_key(workspace))
    }

    /// The region.
    pub fn region(&self) -> Region {
        Region::new(self.region.clone())
    }
}

/// The HTTP client every AWS SDK client in a guest uses: `wasi:http`,
/// filtered by the host's grants.
pub fn http_client() -> SharedHttpClient {
    aws_smithy_wasm::wasi::WasiHttpClientBuilder::new().build()
}

/// Run an SDK future to completion inside the guest.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    wstd::runtime::block_on(future)
}

/// Turn an SDK failure into the guest error the host maps to a status:
/// a refusal by the host's grants is final and says what to grant; network
/// trouble and 5xx are worth a retry; the rest is an internal error.
pub fn sdk_error<E>(what: &str, error: SdkError<E, HttpResponse>) -> Error
where
    E: std::error::Error + ProvideErrorMetadata + Send + Sync + 'static,
{
    // A service's own words (`NoSuchBucket: The specified bucket does not
    // exist`) when it answered; the whole cause chain when it did not.
    let text = match (error.code(), error.message()) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code.to_string(),
        _ => format!("{}", aws_sdk_s3::error::DisplayErrorContext(&error)),
    };
    let status = error.raw_response().map(|r| r.status().as_u16());
    match &error {
        SdkError::DispatchFailure(_) if text.contains("signing scope") => {
            Error::Internal(format!("{what}: {text}"))
        }
        SdkError::DispatchFailure(_) if text.to_ascii_lowercase().contains("denied") => {
            Error::Internal(format!(
                "{what}: the host refused the request: grant the endpoint with allow_http in the backend's config ({text})"
            ))
        }
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) | SdkError::ResponseError(_) => {
            Error::Unavailable(format!("{what}: {text}"))
        }
        _ if status.is_some_and(|s| s >= 500 && s != 501) || status == Some(429) => {
            Error::Unavailable(format!("{what}: {text}"))
        }
        _ => Error::Internal(format!("{what}: {text}")),
    }
}

/// The HTTP status of a failed call, when a response arrived.
pub fn status_of<E>(error: &SdkError<E, HttpResponse>) -> Option<u16> {
    error.raw_response().map(|r| r.status().as_u16())
}
