//! States in S3, where Terraform's `backend "s3"` keeps them.

use crate::condition::Condition;
use crate::{AwsSettings, block_on, sdk_error, status_of};
use aws_sdk_s3::Client;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::{BehaviorVersion, RequestChecksumCalculation, ResponseChecksumValidation};
use aws_sdk_s3::operation::get_object::GetObjectError;
use wasmstate_guest::Error;

/// Bytes fetched by a read's first ranged GET: enough for the host's look
/// at the serial, small enough that the look stays cheap.
const FIRST_RANGE: u64 = 1 << 20;
/// Bytes fetched by each later ranged GET, and the size of each part of
/// an upload: what the guest holds of a state at once.
pub const PART_BYTES: u64 = 8 << 20;

/// User metadata (`x-amz-meta-wasmstate-write`) naming the write that put
/// a state object: the dynamodb guest's way to tell a write that landed
/// without its digest from a state changed behind its back.
pub const WRITE_TAG: &str = "wasmstate-write";

/// User metadata (`x-amz-meta-wasmstate-serial`) holding the serial of the
/// state an object holds, as the host read it: a version's serial for the
/// history listing without reading the version (a sealed state keeps its
/// serial after the ciphertext).
pub const SERIAL_TAG: &str = "wasmstate-serial";

/// An object read by [`S3State::get_to`].
#[derive(Debug, Clone, Default)]
pub struct Got {
    /// Its size in bytes.
    pub size: u64,
    /// Its [`WRITE_TAG`] metadata, if any.
    pub tag: Option<String>,
}

/// An S3 client bound to the configured bucket and layout.
pub struct S3State {
    pub(crate) client: Client,
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

    pub(crate) fn url(&self, key: &str) -> String {
        format!("s3://{}/{key}", self.settings.bucket)
    }

    /// The object at `key`, `None` when there is none.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.get_with_etag(key)?.map(|(bytes, _)| bytes))
    }

    /// Copy the object at `key` (its `version`, or the current one) into
    /// `out` by ranged GETs, each pinned to
    /// the first one's ETag (a state replaced mid-read fails, to be
    /// retried, instead of mixing two states); its size, `None` when there
    /// is no object.
    pub(crate) fn get_to(
        &self,
        key: &str,
        version: Option<&str>,
        out: &mut dyn std::io::Write,
    ) -> Result<Option<Got>, Error> {
        block_on(async {
            let (mut start, mut want, mut etag) = (0u64, FIRST_RANGE, None::<String>);
            let mut tag = None;
            loop {
                let mut request = self
                    .client
                    .get_object()
                    .bucket(&self.settings.bucket)
                    .key(key)
                    .set_version_id(version.map(str::to_string))
                    .range(format!("bytes={start}-{}", start + want - 1));
                if let Some(tag) = &etag {
                    request = request.if_match(tag);
                }
                let answer = match request.send().await {
                    Ok(answer) => answer,
                    // A version id S3 does not take (400), or a delete
                    // marker (405): no such version.
                    Err(e)
                        if start == 0
                            && (matches!(
                                e.as_service_error(),
                                Some(GetObjectError::NoSuchKey(_))
                            ) || status_of(&e) == Some(404)
                                || (version.is_some()
                                    && matches!(status_of(&e), Some(400 | 405)))) =>
                    {
                        return Ok(None);
                    }
                    // An empty object has no byte to range over.
                    Err(e) if start == 0 && status_of(&e) == Some(416) => {
                        return Ok(Some(Got::default()));
                    }
                    Err(e) if status_of(&e) == Some(412) => {
                        return Err(Error::Unavailable(format!(
                            "{} was replaced while it was read; retry",
                            self.url(key)
                        )));
                    }
                    Err(e) => return Err(sdk_error(&format!("reading {}", self.url(key)), e)),
                };
                // `Content-Range: bytes 0-1048575/12345678`; without one, the
                // store sent the whole object.
                let total = answer
                    .content_range()
                    .and_then(|r| r.rsplit('/').next())
                    .and_then(|t| t.parse::<u64>().ok())
                    .or(answer.content_length().and_then(|l| u64::try_from(l).ok()))
                    .unwrap_or(0);
                etag = answer.e_tag().map(str::to_string);
                if start == 0 {
                    tag = answer.metadata().and_then(|m| m.get(WRITE_TAG)).cloned();
                }
                let bytes = answer
                    .body
                    .collect()
                    .await
                    .map_err(|e| Error::Unavailable(format!("reading {}: {e}", self.url(key))))?
                    .into_bytes();
                out.write_all(&bytes)
                    .map_err(|e| Error::io("handing the state to the host", e))?;
                start += bytes.len() as u64;
                if bytes.is_empty() || start >= total {
                    return Ok(Some(Got { size: total, tag }));
                }
                want = PART_BYTES;
            }
        })
    }

    /// Whether an object exists at `key` (a HEAD: nothing is downloaded).
    pub fn exists(&self, key: &str) -> Result<bool, Error> {
        Ok(self.etag_of(key)?.is_some())
    }

    /// The ETag of the object at `key` (a HEAD), `None` when there is none.
    pub fn etag_of(&self, key: &str) -> Result<Option<String>, Error> {
        block_on(async {
            match self
                .client
                .head_object()
                .bucket(&self.settings.bucket)
                .key(key)
                .send()
                .await
            {
                Ok(head) => Ok(Some(head.e_tag().unwrap_or_default().to_string())),
                Err(e) if status_of(&e) == Some(404) => Ok(None),
                Err(e) => Err(sdk_error(&format!("looking for {}", self.url(key)), e)),
            }
        })
    }

    /// The [`WRITE_TAG`] of the object at `key` (a HEAD): `None` when
    /// there is no object, `Some(None)` for one without a tag.
    pub fn write_tag_of(&self, key: &str) -> Result<Option<Option<String>>, Error> {
        Ok(self.labelled(key, WRITE_TAG)?.map(|(_, tag)| tag))
    }

    /// The ETag of the object at `key` and its user metadata `name`
    /// (`x-amz-meta-<name>`), from a HEAD: `None` when there is no object.
    pub fn labelled(
        &self,
        key: &str,
        name: &str,
    ) -> Result<Option<(String, Option<String>)>, Error> {
        block_on(async {
            match self
                .client
                .head_object()
                .bucket(&self.settings.bucket)
                .key(key)
                .send()
                .await
            {
                Ok(head) => Ok(Some((
                    head.e_tag().unwrap_or_default().to_string(),
                    head.metadata().and_then(|m| m.get(name)).cloned(),
                ))),
                Err(e) if status_of(&e) == Some(404) => Ok(None),
                Err(e) => Err(sdk_error(&format!("looking for {}", self.url(key)), e)),
            }
        })
    }

    /// The object at `key` with its ETag, `None` when there is none.
    pub fn get_with_etag(&self, key: &str) -> Result<Option<(Vec<u8>, String)>, Error> {
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
                    let etag = out.e_tag().unwrap_or_default().to_string();
                    let bytes = out.body.collect().await.map_err(|e| {
                        Error::Unavailable(format!("reading {}: {e}", self.url(key)))
                    })?;
                    Ok(Some((bytes.into_bytes().to_vec(), etag)))
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

    /// Delete the object at `key` only while it is still `etag`
    /// (`If-Match`): `Ok(false)` when it changed or is gone.
    pub fn remove_if_match(&self, key: &str, etag: &str) -> Result<bool, Error> {
        self.remove_when(key, &Condition::IfMatch(etag.to_string()))
    }

    /// Delete the object at `key` if `condition` (an [`Condition::IfMatch`],
    /// maybe [`Condition::Preferably`]) holds: `Ok(false)` when the object
    /// changed or is gone. A store answering 501 to conditional deletes
    /// fails the call, unless the condition is only preferred: then the
    /// object is deleted without it, with a warning.
    pub fn remove_when(&self, key: &str, condition: &Condition) -> Result<bool, Error> {
        let request = |condition: &Condition| {
            let request = self
                .client
                .delete_object()
                .bucket(&self.settings.bucket)
                .key(key);
            match condition {
                Condition::IfMatch(etag) => request.if_match(etag),
                _ => request,
            }
        };
        let what = || format!("deleting {}", self.url(key));
        block_on(async {
            match request(condition.sent()).send().await {
                Ok(_) => Ok(true),
                Err(e) if matches!(status_of(&e), Some(412 | 404)) => Ok(false),
                Err(e) if condition.optional() && status_of(&e) == Some(501) => {
                    wasmstate_guest::log::warn(&format!(
                        "{} does not support conditional deletes: deleted without one",
                        self.url(key)
                    ));
                    request(&Condition::Always)
                        .send()
                        .await
                        .map(|_| true)
                        .map_err(|e| sdk_error(&what(), e))
                }
                Err(e) if status_of(&e) == Some(501) => Err(Error::Internal(format!(
                    "the S3 endpoint does not support conditional deletes (DeleteObject with \
                     If-Match), which a safe unlock needs: it answered 501 Not Implemented for {}. \
                     Use a store that supports them, or the dynamodb guest",
                    self.url(key)
                ))),
                Err(e) => Err(sdk_error(&what(), e)),
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
}
