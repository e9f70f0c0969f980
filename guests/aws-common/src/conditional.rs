//! Contract 0.3.0 on S3: a state's head from one ranged GET, state writes
//! that are S3's own compare-and-swap (`If-Match: <ETag>`,
//! `If-None-Match: *`), and each workspace's metadata in an object beside
//! its state that Terraform's `backend "s3"` never lists:
//!
//! ```text
//! <state key>.wasmstate-metadata
//! ```
//!
//! Terraform counts a key as a workspace only when it is exactly
//! `<prefix>/<ws>/<key>` (its `keyEnv`), so neither this suffix nor
//! `.tflock` is one; [`S3State::list_workspaces`] applies the same rule.

use crate::s3::S3State;
use crate::writes::{Condition, Outcome, metadata};
use crate::{block_on, sdk_error, status_of};
use aws_sdk_s3::operation::get_object::GetObjectError;
use aws_sdk_s3::types::ServerSideEncryption;
use wasmstate_guest::{Error, Expect, Head, Metadata, StateReader};

/// Bytes a head fetches. Terraform and OpenTofu write `version`,
/// `terraform_version`, `serial` and `lineage` first (about 120 bytes), and
/// the conformance kit asks a head for at least 256 bytes of a state that
/// has them. The head's bytes are read on top of Terraform's own read of the
/// state in every apply, so it takes no more than that: a larger state is
/// never read whole to write it (docs/benchmarks.md counts the bytes).
/// When the prefix holds no serial (a state written in another key order,
/// a host-sealed one), the size tells the host it is not the whole state.
pub const HEAD_BYTES: u64 = 256;

/// What follows a state's key in the key of its workspace's metadata.
pub const METADATA_SUFFIX: &str = ".wasmstate-metadata";

/// Largest metadata object read: what the host writes at most.
const MAX_METADATA_BYTES: u64 = 64 << 10;

/// How many times a PUT answered `409 ConditionalRequestConflict` is sent
/// again (AWS: "On a 409 failure you should retry the upload") before the
/// write fails as unavailable, which Terraform retries.
const CONFLICT_ATTEMPTS: usize = 3;

/// `md5:<hex>` of an object's bytes when its ETag provably is their MD5:
/// a single-part upload, stored plain or with SSE-S3. Not for a multipart
/// upload (`<hex>-<parts>`), nor SSE-KMS, DSSE-KMS or SSE-C, whose ETags
/// are not a digest of the bytes.
fn md5_of(
    etag: &str,
    encryption: Option<&ServerSideEncryption>,
    customer_key: bool,
) -> Option<String> {
    let hex = etag.trim_matches('"');
    let plain_or_s3 = matches!(encryption, None | Some(ServerSideEncryption::Aes256));
    let is_md5 = hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit());
    (plain_or_s3 && !customer_key && is_md5).then(|| format!("md5:{}", hex.to_ascii_lowercase()))
}

impl S3State {
    /// The key of `workspace`'s metadata object.
    pub fn metadata_key(&self, workspace: &str) -> String {
        format!("{}{METADATA_SUFFIX}", self.settings.state_key(workspace))
    }

    /// The head of `workspace`'s state, its first bytes (up to
    /// [`HEAD_BYTES`]) written into `prefix`, from one ranged GET: the
    /// ETag is the version, `Content-Range` gives the size. `None` when
    /// there is no state (no object, or an empty one, as a read says).
    pub fn state_head(
        &self,
        workspace: &str,
        prefix: &mut dyn std::io::Write,
    ) -> Result<Option<Head>, Error> {
        let key = self.settings.state_key(workspace);
        block_on(async {
            let answer = self
                .client
                .get_object()
                .bucket(&self.settings.bucket)
                .key(&key)
                .range(format!("bytes=0-{}", HEAD_BYTES - 1))
                .send()
                .await;
            let answer = match answer {
                Ok(answer) => answer,
                Err(e)
                    if matches!(e.as_service_error(), Some(GetObjectError::NoSuchKey(_)))
                        || matches!(status_of(&e), Some(404 | 416)) =>
                {
                    // 416: an empty object has no byte to range over.
                    return Ok(None);
                }
                Err(e) => return Err(sdk_error(&format!("reading {}", self.url(&key)), e)),
            };
            let size = answer
                .content_range()
                .and_then(|r| r.rsplit('/').next())
                .and_then(|t| t.parse::<u64>().ok())
                .or(answer.content_length().and_then(|l| u64::try_from(l).ok()))
                .unwrap_or(0);
            let version = answer.e_tag().unwrap_or_default().to_string();
            let digest = md5_of(
                &version,
                answer.server_side_encryption(),
                answer.sse_customer_algorithm().is_some(),
            );
            let bytes = answer
                .body
                .collect()
                .await
                .map_err(|e| Error::Unavailable(format!("reading {}: {e}", self.url(&key))))?
                .into_bytes();
            if size == 0 || version.is_empty() {
                return Ok(None);
            }
            // The host stops taking bytes once it has enough: not a failure.
            let _ = prefix.write_all(&bytes);
            Ok(Some(Head {
                version,
                size,
                digest,
            }))
        })
    }

    /// Replace `workspace`'s state with what `state` yields only if the
    /// stored object is as `expect` says, in one step of S3 (`If-Match`
    /// the expected ETag; `If-None-Match: *` for none, or `If-Match` the
    /// empty object a created workspace holds, which a head reports as no
    /// state). `Ok(false)`: it is not, and nothing was written. `each`
    /// sees every chunk on its way (a digest), `tag` goes with the object
    /// as [`crate::WRITE_TAG`].
    ///
    /// `locked`: the writer holds the workspace's lock (checked by the
    /// caller). Then a store answering 501 to conditional writes gets the
    /// write without its condition, with a warning, as before contract
    /// 0.3.0; without a lock the write fails, since nothing else would
    /// keep two writers apart.
    pub fn write_state_if(
        &self,
        workspace: &str,
        state: &mut StateReader<'_>,
        mut each: impl FnMut(&[u8]),
        tag: Option<&str>,
        expect: &Expect,
        locked: bool,
    ) -> Result<bool, Error> {
        let key = self.settings.state_key(workspace);
        let condition = |c: Condition| match locked {
            true => Condition::Preferably(Box::new(c)),
            false => c,
        };
        let conflict = || {
            Err(Error::Unavailable(format!(
                "a concurrent request on {} conflicted with this write (409 \
                 ConditionalRequestConflict), so it was not written; retry",
                self.url(&key)
            )))
        };
        if state.size() > crate::s3::PART_BYTES {
            // A multipart upload cannot be sent again (the state streams
            // past once), so what the condition will meet is looked at
            // first: a stale write is refused before any part goes up.
            // The condition on the completion is what makes it atomic.
            let first = match (expect, self.object_head(&key)?) {
                (Expect::Any, _) => Condition::Always,
                (Expect::Absent, None) => Condition::IfAbsent,
                (Expect::Absent, Some((etag, 0))) => Condition::IfMatch(etag),
                (Expect::Version(v), Some((etag, _))) if *v == etag => Condition::IfMatch(etag),
                _ => return Ok(false),
            };
            return match self.send_from(&key, state, each, &condition(first), tag)? {
                Outcome::Written => Ok(true),
                Outcome::Refused => Ok(false),
                Outcome::Conflict => conflict(),
            };
        }
        let serial = state.serial();
        let bytes = state.read_all();
        each(&bytes);
        let mut sent = match expect {
            Expect::Any => Condition::Always,
            Expect::Absent => Condition::IfAbsent,
            Expect::Version(v) => Condition::IfMatch(v.clone()),
        };
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.send_bytes(
                &key,
                &bytes,
                &condition(sent.clone()),
                metadata(tag, serial),
            )? {
                Outcome::Written => return Ok(true),
                Outcome::Conflict if attempts < CONFLICT_ATTEMPTS => continue,
                Outcome::Conflict => return conflict(),
                // A created, never written workspace holds an empty object,
                // which counts as no state: replace it only while it is
                // still that empty object.
                Outcome::Refused if sent == Condition::IfAbsent => match self.object_head(&key)? {
                    Some((etag, 0)) => sent = Condition::IfMatch(etag),
                    _ => return Ok(false),
                },
                Outcome::Refused => return Ok(false),
            }
        }
    }

    /// ETag and size of the object at `key` (a HEAD), `None` when there is none.
    fn object_head(&self, key: &str) -> Result<Option<(String, u64)>, Error> {
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
                    head.content_length().unwrap_or(0).max(0) as u64,
                ))),
                Err(e) if status_of(&e) == Some(404) => Ok(None),
                Err(e) => Err(sdk_error(&format!("looking for {}", self.url(key)), e)),
            }
        })
    }

    /// `workspace`'s metadata and its ETag, `None` when there is none.
    pub fn read_metadata(&self, workspace: &str) -> Result<Option<Metadata>, Error> {
        let key = self.metadata_key(workspace);
        let Some((bytes, version)) = self.get_with_etag(&key)? else {
            return Ok(None);
        };
        if bytes.len() as u64 > MAX_METADATA_BYTES {
            return Err(Error::Internal(format!(
                "{} holds {} bytes, more than the {MAX_METADATA_BYTES} workspace metadata may: \
                 it was not written by wasmstate; delete it",
                self.url(&key),
                bytes.len()
            )));
        }
        let content = String::from_utf8(bytes).map_err(|_| {
            Error::Internal(format!(
                "{} is not UTF-8, so it is no metadata wasmstate wrote; delete it",
                self.url(&key)
            ))
        })?;
        Ok(Some(Metadata { content, version }))
    }

    /// Set (`Some`) or remove (`None`) `workspace`'s metadata only if it
    /// is as `expect` says, in one step of S3 (`If-Match`,
    /// `If-None-Match: *` on the PUT; `If-Match` on the DELETE);
    /// `Ok(false)` when it is not.
    pub fn write_metadata(
        &self,
        workspace: &str,
        content: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, Error> {
        let key = self.metadata_key(workspace);
        let Some(content) = content else {
            return match expect {
                Expect::Any => self.remove(&key).map(|()| true),
                // Nothing to remove, if indeed nothing is there.
                Expect::Absent => Ok(self.object_head(&key)?.is_none()),
                Expect::Version(v) => self.remove_when(&key, &Condition::IfMatch(v.clone())),
            };
        };
        let condition = match expect {
            Expect::Any => Condition::Always,
            Expect::Absent => Condition::IfAbsent,
            Expect::Version(v) => Condition::IfMatch(v.clone()),
        };
        for _ in 0..CONFLICT_ATTEMPTS {
            match self.send_bytes(&key, content.as_bytes(), &condition, None)? {
                Outcome::Written => return Ok(true),
                Outcome::Refused => return Ok(false),
                Outcome::Conflict => continue,
            }
        }
        Err(Error::Unavailable(format!(
            "concurrent requests on {} kept conflicting with this metadata write (409 \
             ConditionalRequestConflict); retry",
            self.url(&key)
        )))
    }

    /// Remove `workspace`'s metadata, if any (its workspace is deleted).
    pub fn remove_metadata(&self, workspace: &str) -> Result<(), Error> {
        self.remove(&self.metadata_key(workspace))
    }
}
