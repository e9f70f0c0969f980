//! Writes to S3: one PUT, or a multipart upload for a large state, each
//! with the condition ([`Condition`]) that makes it S3's own
//! compare-and-swap.

pub use crate::condition::Condition;
use crate::s3::{PART_BYTES, S3State, SERIAL_TAG, WRITE_TAG};
use crate::{block_on, sdk_error, status_of};
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart, ServerSideEncryption};
use std::collections::HashMap;
use wasmstate_guest::{Error, StateReader};

/// Age past which an unfinished multipart upload is abandoned: longer than
/// any request may run (the host caps a backend's `timeout_ms` at an hour).
const ABANDONED_AFTER_SECS: u64 = 2 * 3600;

/// The user metadata a state write carries.
pub(crate) fn metadata(tag: Option<&str>, serial: Option<u64>) -> Option<HashMap<String, String>> {
    let pairs: HashMap<String, String> = tag
        .map(|t| (WRITE_TAG.to_string(), t.to_string()))
        .into_iter()
        .chain(serial.map(|s| (SERIAL_TAG.to_string(), s.to_string())))
        .collect();
    (!pairs.is_empty()).then_some(pairs)
}

/// How a conditional request ended, when S3 answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Written.
    Written,
    /// Its condition did not hold (412; for `If-Match`, also 404
    /// `NoSuchKey`: no object at all): nothing written.
    Refused,
    /// `409 ConditionalRequestConflict`: a concurrent request on the key
    /// conflicted with this one, which S3 did not apply; AWS's advice is to
    /// send it again.
    Conflict,
}

/// What a failed request's answer says about its `sent` condition, if
/// anything: `None` for every other failure.
fn refusal<E>(error: &SdkError<E, HttpResponse>, sent: &Condition) -> Option<Outcome>
where
    E: ProvideErrorMetadata,
{
    match (status_of(error), sent) {
        (_, Condition::Always) => None,
        (Some(412), _) => Some(Outcome::Refused),
        (Some(409), _) => Some(Outcome::Conflict),
        // Not a missing bucket, which is a 404 too.
        (Some(404), Condition::IfMatch(_)) if error.code() == Some("NoSuchKey") => {
            Some(Outcome::Refused)
        }
        _ => None,
    }
}

impl S3State {
    /// Write what `state` yields at `key`, handing every chunk to `each`
    /// on its way (for a digest). Up to [`PART_BYTES`] it is one PUT;
    /// larger states go up as a multipart upload of parts that size, which
    /// S3 makes visible all at once when it completes (and discards when
    /// it is aborted).
    ///
    /// `Ok(false)` when `condition` did not hold: nothing was written.
    pub fn put_from(
        &self,
        key: &str,
        state: &mut StateReader<'_>,
        each: impl FnMut(&[u8]),
        condition: &Condition,
        tag: Option<&str>,
    ) -> Result<bool, Error> {
        Ok(self.send_from(key, state, each, condition, tag)? == Outcome::Written)
    }

    /// [`S3State::put_from`], telling a refusal from a conflict.
    pub(crate) fn send_from(
        &self,
        key: &str,
        state: &mut StateReader<'_>,
        mut each: impl FnMut(&[u8]),
        condition: &Condition,
        tag: Option<&str>,
    ) -> Result<Outcome, Error> {
        let serial = state.serial();
        if state.size() <= PART_BYTES {
            let bytes = state.read_all();
            each(&bytes);
            return self.send_bytes(key, &bytes, condition, metadata(tag, serial));
        }
        self.abort_abandoned_uploads(key);
        let s = &self.settings;
        let mut create = self
            .client
            .create_multipart_upload()
            .bucket(&s.bucket)
            .key(key)
            .set_metadata(metadata(tag, serial))
            .content_type("application/json");
        if let Some(kms) = &s.kms_key_id {
            create = create
                .server_side_encryption(ServerSideEncryption::AwsKms)
                .ssekms_key_id(kms);
        } else if s.encrypt {
            create = create.server_side_encryption(ServerSideEncryption::Aes256);
        }
        let what = || format!("writing {}", self.url(key));
        let upload = block_on(create.send()).map_err(|e| sdk_error(&what(), e))?;
        let id = upload.upload_id().unwrap_or_default().to_string();
        let uploaded = self.upload_parts(key, &id, state, &mut each, condition);
        // Refused by its condition or failed: never the state.
        if !matches!(uploaded, Ok(Outcome::Written)) {
            // Best effort: an upload left open is removed by the bucket's
            // lifecycle rules, and never becomes the state.
            let _ = block_on(
                self.client
                    .abort_multipart_upload()
                    .bucket(&s.bucket)
                    .key(key)
                    .upload_id(&id)
                    .send(),
            );
        }
        uploaded
    }

    fn upload_parts(
        &self,
        key: &str,
        id: &str,
        state: &mut StateReader<'_>,
        each: &mut impl FnMut(&[u8]),
        condition: &Condition,
    ) -> Result<Outcome, Error> {
        let what = || format!("writing {}", self.url(key));
        let mut parts = Vec::new();
        for number in 1.. {
            let mut part = Vec::with_capacity(PART_BYTES as usize);
            while (part.len() as u64) < PART_BYTES {
                let chunk = state.next_chunk(PART_BYTES as usize - part.len());
                if chunk.is_empty() {
                    break;
                }
                part.extend_from_slice(&chunk);
            }
            if part.is_empty() {
                break;
            }
            each(&part);
            let sent = block_on(
                self.client
                    .upload_part()
                    .bucket(&self.settings.bucket)
                    .key(key)
                    .upload_id(id)
                    .part_number(number)
                    .body(ByteStream::from(part))
                    .send(),
            )
            .map_err(|e| sdk_error(&what(), e))?;
            parts.push(
                CompletedPart::builder()
                    .part_number(number)
                    .set_e_tag(sent.e_tag().map(str::to_string))
                    .build(),
            );
        }
        // S3 checks the condition of a multipart upload when it completes
        // (`If-Match`/`If-None-Match` on CompleteMultipartUpload), in one
        // step with making the object visible.
        let complete = |condition: &Condition| {
            let complete = self
                .client
                .complete_multipart_upload()
                .bucket(&self.settings.bucket)
                .key(key)
                .upload_id(id)
                .multipart_upload(
                    CompletedMultipartUpload::builder()
                        .set_parts(Some(parts.clone()))
                        .build(),
                );
            match condition {
                Condition::IfAbsent => complete.if_none_match("*"),
                Condition::IfMatch(etag) => complete.if_match(etag),
                _ => complete,
            }
        };
        match block_on(complete(condition.sent()).send()) {
            Ok(_) => Ok(Outcome::Written),
            Err(e) if refusal(&e, condition.sent()).is_some() => {
                Ok(refusal(&e, condition.sent()).unwrap_or(Outcome::Refused))
            }
            Err(e) if condition.optional() && status_of(&e) == Some(501) => {
                block_on(complete(&Condition::Always).send())
                    .map(|_| Outcome::Written)
                    .map_err(|e| sdk_error(&what(), e))
            }
            Err(e) => Err(sdk_error(&what(), e)),
        }
    }

    /// Abort uploads to `key` begun longer ago than any request may run:
    /// writes stopped between their first part and their completion (a
    /// deadline, a killed host), which S3 keeps, and bills, until aborted.
    /// Best effort: a store that cannot list them keeps them for its
    /// lifecycle rules.
    fn abort_abandoned_uploads(&self, key: &str) {
        let bucket = &self.settings.bucket;
        let Ok(listed) = block_on(
            self.client
                .list_multipart_uploads()
                .bucket(bucket)
                .prefix(key)
                .send(),
        ) else {
            return;
        };
        let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) else {
            return;
        };
        for upload in listed.uploads() {
            let old = upload.initiated().is_some_and(|t| {
                now.as_secs().saturating_sub(t.secs().max(0) as u64) > ABANDONED_AFTER_SECS
            });
            if upload.key() == Some(key) && old {
                let _ = block_on(
                    self.client
                        .abort_multipart_upload()
                        .bucket(bucket)
                        .key(key)
                        .set_upload_id(upload.upload_id().map(str::to_string))
                        .send(),
                );
            }
        }
    }

    /// Write `bytes` at `key`. With `if_absent`, only if no object exists
    /// there (`If-None-Match: *`): `Ok(false)` when one does.
    pub fn put(&self, key: &str, bytes: &[u8], if_absent: bool) -> Result<bool, Error> {
        let condition = match if_absent {
            true => Condition::IfAbsent,
            false => Condition::Always,
        };
        self.put_tagged(key, bytes, &condition, None, None)
    }

    /// Write `bytes` at `key` if `condition` holds (`Ok(false)` when it
    /// does not, or a concurrent request conflicted), carrying `tag` as
    /// [`WRITE_TAG`] metadata and `serial` as [`SERIAL_TAG`].
    pub fn put_tagged(
        &self,
        key: &str,
        bytes: &[u8],
        condition: &Condition,
        tag: Option<&str>,
        serial: Option<u64>,
    ) -> Result<bool, Error> {
        Ok(self.send_bytes(key, bytes, condition, metadata(tag, serial))? == Outcome::Written)
    }

    /// Write `bytes` at `key` if `condition` holds (`Ok(false)` when it
    /// does not, or a concurrent request conflicted), with the user
    /// metadata `name: value` (`x-amz-meta-<name>`).
    pub fn put_labelled(
        &self,
        key: &str,
        bytes: &[u8],
        condition: &Condition,
        (name, value): (&str, &str),
    ) -> Result<bool, Error> {
        let meta = HashMap::from([(name.to_string(), value.to_string())]);
        Ok(self.send_bytes(key, bytes, condition, Some(meta))? == Outcome::Written)
    }

    /// [`S3State::put_tagged`], telling a refusal from a conflict.
    pub(crate) fn send_bytes(
        &self,
        key: &str,
        bytes: &[u8],
        condition: &Condition,
        meta: Option<HashMap<String, String>>,
    ) -> Result<Outcome, Error> {
        let s = &self.settings;
        let request = |condition: &Condition| {
            let mut request = self
                .client
                .put_object()
                .bucket(&s.bucket)
                .key(key)
                .set_metadata(meta.clone())
                .content_type("application/json")
                .body(ByteStream::from(bytes.to_vec()));
            if let Some(kms) = &s.kms_key_id {
                request = request
                    .server_side_encryption(ServerSideEncryption::AwsKms)
                    .ssekms_key_id(kms);
            } else if s.encrypt {
                request = request.server_side_encryption(ServerSideEncryption::Aes256);
            }
            match condition {
                Condition::IfAbsent => request.if_none_match("*"),
                Condition::IfMatch(etag) => request.if_match(etag),
                _ => request,
            }
        };
        let conditional = *condition.sent() != Condition::Always;
        let what = || format!("writing {}", self.url(key));
        block_on(async {
            match request(condition.sent()).send().await {
                Ok(_) => Ok(Outcome::Written),
                Err(e) if refusal(&e, condition.sent()).is_some() => {
                    Ok(refusal(&e, condition.sent()).unwrap_or(Outcome::Refused))
                }
                Err(e) if condition.optional() && status_of(&e) == Some(501) => {
                    wasmstate_guest::log::warn(&format!(
                        "{} does not support conditional writes: written without one",
                        self.url(key)
                    ));
                    request(&Condition::Always)
                        .send()
                        .await
                        .map(|_| Outcome::Written)
                        .map_err(|e| sdk_error(&what(), e))
                }
                Err(e) if conditional && status_of(&e) == Some(501) => {
                    Err(Error::Internal(format!(
                        "the S3 endpoint does not support conditional writes (PutObject with \
                         If-None-Match or If-Match), which lock files and writes without a lock \
                         need: it answered 501 Not Implemented for {}. Use a store that supports \
                         them, or the dynamodb guest with every write under a lock",
                        self.url(key)
                    )))
                }
                Err(e) => Err(sdk_error(&what(), e)),
            }
        })
    }
}
