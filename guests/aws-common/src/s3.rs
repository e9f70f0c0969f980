//! States in S3, where Terraform's `backend "s3"` keeps them.

use crate::{AwsSettings, block_on, sdk_error, status_of};
use aws_sdk_s3::Client;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::{BehaviorVersion, RequestChecksumCalculation, ResponseChecksumValidation};
use aws_sdk_s3::operation::get_object::GetObjectError;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::ServerSideEncryption;
use wasmstate_guest::Error;

/// An S3 client bound to the configured bucket and layout.
pub struct S3State {
    client: Client,
    /// The settings it was built from.
    pub settings: AwsSettings,
}

impl S3State {
    /// A client for `settings`. It never retries on its own: Terraform
    /// retries 5xx answers, and a refusal by the host is final.
    pub fn new(settings: AwsSettings) -> Self {
        let mut config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(settings.region())
            // Unsigned: the host signs every request with credentials
            // this guest never sees.
            .allow_no_auth()
            .http_client(crate::http_client())
            .sleep_impl(aws_smithy_wasm::wasi::WasiSleep)
            .retry_config(RetryConfig::disabled())
            // States can be many MiB: no checksum work the store does not ask for.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
            .force_path_style(settings.path_style);
        if let Some(endpoint) = &settings.s3_endpoint {
            config = config.endpoint_url(endpoint);
        }
        S3State {
            client: Client::from_conf(config.build()),
            settings,
        }
    }

    fn url(&self, key: &str) -> String {
        format!("s3://{}/{key}", self.settings.bucket)
    }

    /// The object at `key`, `None` when there is none.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        block_on(async {
            let result = self
                .client
                .get_object()
                .bucket(&self.settings.bucket)
                .key(key)
                .send()
                .await;
            match result {
                Ok(out) => {
                    let bytes = out.body.collect().await.map_err(|e| {
                        Error::Unavailable(format!("reading {}: {e}", self.url(key)))
                    })?;
                    Ok(Some(bytes.into_bytes().to_vec()))
                }
                Err(e)
                    if matches!(e.as_service_error(), Some(GetObjectError::NoSuchKey(_)))
                        || status_of(&e) == Some(404) =>
                {
                    Ok(None)
                }
                Err(e) => Err(sdk_error(&format!("reading {}", self.url(key)), e)),
            }
        })
    }

    /// Write `bytes` at `key`. With `if_absent`, only if no object exists
    /// there (`If-None-Match: *`): `Ok(false)` when one does.
    pub fn put(&self, key: &str, bytes: &[u8], if_absent: bool) -> Result<bool, Error> {
        let s = &self.settings;
        let mut request = self
            .client
            .put_object()
            .bucket(&s.bucket)
            .key(key)
            .content_type("application/json")
            .body(ByteStream::from(bytes.to_vec()));
        if let Some(kms) = &s.kms_key_id {
            request = request
                .server_side_encryption(ServerSideEncryption::AwsKms)
                .ssekms_key_id(kms);
        } else if s.encrypt {
            request = request.server_side_encryption(ServerSideEncryption::Aes256);
        }
        if if_absent {
            request = request.if_none_match("*");
        }
        block_on(async {
            match request.send().await {
                Ok(_) => Ok(true),
                Err(e) if if_absent && matches!(status_of(&e), Some(412 | 409)) => Ok(false),
                Err(e) if if_absent && status_of(&e) == Some(501) => Err(Error::Internal(format!(
                    "the S3 endpoint does not support conditional writes (PutObject with If-None-Match), \
                     which lock files need: it answered 501 Not Implemented for {}. Use a store that \
                     supports them, or the dynamodb guest",
                    self.url(key)
                ))),
                Err(e) => Err(sdk_error(&format!("writing {}", self.url(key)), e)),
            }
        })
    }

    /// Delete the object at `key`; a missing one is fine.
    pub fn remove(&self, key: &str) -> Result<(), Error> {
        block_on(async {
            match self
                .client
                .delete_object()
                .bucket(&self.settings.bucket)
                .key(key)
                .send()
                .await
            {
                Ok(_) => Ok(()),
                Err(e) if status_of(&e) == Some(404) => Ok(()),
                Err(e) => Err(sdk_error(&format!("deleting {}", self.url(key)), e)),
            }
        })
    }

    /// The state of `workspace`; an empty object (a created, never written
    /// workspace) counts as none.
    pub fn read_state(&self, workspace: &str) -> Result<Option<Vec<u8>>, Error> {
        Ok(self
            .get(&self.settings.state_key(workspace))?
            .filter(|bytes| !bytes.is_empty()))
    }

    /// Replace the state of `workspace`.
    pub fn write_state(&self, workspace: &str, bytes: &[u8]) -> Result<(), Error> {
        self.put(&self.settings.state_key(workspace), bytes, false)
            .map(|_| ())
    }

    /// Delete the state of `workspace`.
    pub fn delete_state(&self, workspace: &str) -> Result<(), Error> {
        self.remove(&self.settings.state_key(workspace))
    }

    /// Whether `workspace` exists (has a state object, maybe empty).
    pub fn workspace_exists(&self, workspace: &str) -> Result<bool, Error> {
        Ok(self.get(&self.settings.state_key(workspace))?.is_some())
    }

    /// Create `workspace` as an empty state object; `false` if it existed.
    pub fn create_workspace(&self, workspace: &str) -> Result<bool, Error> {
        self.put(&self.settings.state_key(workspace), b"", true)
    }

    /// Workspaces as Terraform lists them: every key exactly
    /// `<prefix>/<ws>/<key>` (so lock files and other objects are not
    /// workspaces).
    pub fn list_workspaces(&self) -> Result<Vec<String>, Error> {
        let s = &self.settings;
        let prefix = if s.workspace_prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", s.workspace_prefix)
        };
        let mut names = Vec::new();
        let mut token: Option<String> = None;
        block_on(async {
            loop {
                let mut request = self
                    .client
                    .list_objects_v2()
                    .bucket(&s.bucket)
                    .prefix(&prefix);
                if let Some(t) = token.take() {
                    request = request.continuation_token(t);
                }
                let out = request
                    .send()
                    .await
                    .map_err(|e| sdk_error(&format!("listing s3://{}/{prefix}", s.bucket), e))?;
                for object in out.contents() {
                    let Some(rest) = object.key().and_then(|k| k.strip_prefix(&prefix)) else {
                        continue;
                    };
                    if let Some((ws, tail)) = rest.split_once('/')
                        && tail == s.key
                        && !ws.is_empty()
                    {
                        names.push(ws.to_string());
                    }
                }
                match out.next_continuation_token() {
                    Some(t) if out.is_truncated() == Some(true) => token = Some(t.to_string()),
                    _ => return Ok(names),
                }
            }
        })
    }
}
