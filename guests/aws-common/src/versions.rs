//! Previous versions of a state from the bucket's own object versions
//! (S3 versioning), the history Terraform's S3 users already rely on: every
//! replica lists the same versions, and a replica that starts with an empty
//! data directory loses none.
//!
//! A bucket without versioning keeps no history: the listing answers
//! `None`, and the host keeps versions itself.

use crate::s3::{S3State, SERIAL_TAG};
use crate::{block_on, sdk_error, status_of};
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::types::BucketVersioningStatus;
use wasmstate_guest::{Error, Version, log, version_in_prefix, version_in_tail};

/// Most versions listed, the newest: each costs one small ranged GET for
/// its serial.
pub const MAX_VERSIONS: usize = 100;

/// Bytes of a version read for its serial when it carries no
/// [`SERIAL_TAG`] (written by Terraform itself): Terraform writes `serial`
/// and `lineage` within its first few hundred bytes.
const SERIAL_PREFIX: usize = 4096;

/// Bytes at the end of a version read for its serial when its first bytes
/// hold none: a sealed envelope keeps `serial` and `lineage` there.
const ENVELOPE_TAIL_BYTES: usize = 64 << 10;

/// The longest version id S3 hands out is far below this; anything longer
/// is no id of ours.
const MAX_ID_BYTES: usize = 1024;

/// One entry of the key's history, before its serial is looked up.
struct Entry {
    id: String,
    created_unix_ms: u64,
    /// 0 for a delete marker.
    bytes: u64,
}

impl S3State {
    /// Whether the bucket keeps object versions (versioning `Enabled`; a
    /// `Suspended` bucket keeps none of the new writes).
    fn versioning_enabled(&self) -> Result<bool, Listing> {
        let bucket = &self.settings.bucket;
        match block_on(self.client.get_bucket_versioning().bucket(bucket).send()) {
            Ok(answer) => Ok(answer.status() == Some(&BucketVersioningStatus::Enabled)),
            // Some S3-compatible stores (moto 5.2, for a bucket that never
            // had versioning) answer 200 under another XML root than the
            // SDK accepts: the answer's own words decide then.
            Err(e) if status_of(&e) == Some(200) => Ok(e
                .raw_response()
                .and_then(|r| r.body().bytes())
                .is_some_and(|body| {
                    String::from_utf8_lossy(body).contains("<Status>Enabled</Status>")
                })),
            Err(e) => Err(Listing::of(
                &format!("reading the versioning of s3://{bucket}"),
                e,
            )),
        }
    }

    /// The versions of `workspace`'s state object, newest first (at most
    /// [`MAX_VERSIONS`]); `None` when the bucket has versioning off.
    ///
    /// A delete marker, or an empty object (a workspace created and not yet
    /// written), is listed with 0 bytes: a moment the workspace had no
    /// state. It cannot be read, and the host's rollback check starts
    /// afresh after it.
    pub fn list_versions(&self, workspace: &str) -> Result<Option<Vec<Version>>, Error> {
        match self.listed_versions(workspace) {
            Err(Refused(why)) => {
                log::warn(&format!(
                    "{why}; this replica keeps versions in its own data directory. Grant \
                     s3:GetBucketVersioning, s3:ListBucketVersions and s3:GetObjectVersion so every \
                     replica sees the bucket's versions"
                ));
                Ok(None)
            }
            Err(Failed(e)) => Err(e),
            Ok(listed) => Ok(listed),
        }
    }

    fn listed_versions(&self, workspace: &str) -> Result<Option<Vec<Version>>, Listing> {
        if !self.versioning_enabled()? {
            log::warn(&format!(
                "s3://{} has versioning off, so it keeps no previous states: this replica keeps \
                 versions in its own data directory. Turn it on (aws s3api put-bucket-versioning \
                 --bucket {} --versioning-configuration Status=Enabled) so every replica sees \
                 every version",
                self.settings.bucket, self.settings.bucket
            ));
            return Ok(None);
        }
        let key = self.settings.state_key(workspace);
        let mut versions = Vec::new();
        for entry in self.history_of(&key)? {
            let serial = match entry.bytes {
                0 => None,
                size => self.serial_of(&key, &entry.id, size)?,
            };
            versions.push(Version {
                id: entry.id,
                serial,
                created_unix_ms: entry.created_unix_ms,
                bytes: entry.bytes,
            });
        }
        Ok(Some(versions))
    }

    /// Copy version `id` of `workspace`'s state into `out`; `false` when
    /// the key has no such version, or it is a delete marker or empty.
    pub fn read_version_to(
        &self,
        workspace: &str,
        id: &str,
        out: &mut dyn std::io::Write,
    ) -> Result<bool, Error> {
        if id.is_empty() || id.len() > MAX_ID_BYTES || id.chars().any(char::is_control) {
            return Ok(false);
        }
        let key = self.settings.state_key(workspace);
        Ok(self
            .get_to(&key, Some(id), out)?
            .is_some_and(|got| got.size > 0))
    }

    /// The newest entries of `key`'s history: versions and delete markers
    /// merged newest first. S3 lists each kind newest first, in two lists,
    /// with times to the second: at the same second a marker goes first. The
    /// host's rollback check then starts after it, so a tie can only make
    /// that check start later, never refuse a state written after a delete.
    fn history_of(&self, key: &str) -> Result<Vec<Entry>, Listing> {
        let bucket = &self.settings.bucket;
        let (mut versions, mut markers) = (Vec::new(), Vec::new());
        let mut next: Option<(String, Option<String>)> = None;
        loop {
            let mut request = self
                .client
                .list_object_versions()
                .bucket(bucket)
                .prefix(key);
            if let Some((key_marker, version_marker)) = next.take() {
                request = request
                    .key_marker(key_marker)
                    .set_version_id_marker(version_marker);
            }
            let page = block_on(request.send()).map_err(|e| {
                Listing::of(&format!("listing the versions of {}", self.url(key)), e)
            })?;
            for v in page.versions().iter().filter(|v| v.key() == Some(key)) {
                versions.push(Entry {
                    id: v.version_id().unwrap_or("null").to_string(),
                    created_unix_ms: millis(v.last_modified()),
                    bytes: v.size().unwrap_or(0).max(0) as u64,
                });
            }
            for m in page
                .delete_markers()
                .iter()
                .filter(|m| m.key() == Some(key))
            {
                markers.push(Entry {
                    id: m.version_id().unwrap_or("null").to_string(),
                    created_unix_ms: millis(m.last_modified()),
                    bytes: 0,
                });
            }
            // Keys come in order, so past `key` nothing more is its own.
            let past = page.next_key_marker().is_some_and(|k| k > key);
            let enough = versions.len() + markers.len() >= MAX_VERSIONS;
            match page.next_key_marker() {
                Some(k) if page.is_truncated() == Some(true) && !past && !enough => {
                    next = Some((
                        k.to_string(),
                        page.next_version_id_marker().map(str::to_string),
                    ));
                }
                _ => break,
            }
        }
        let mut merged = Vec::with_capacity(versions.len() + markers.len());
        let (mut versions, mut markers) = (
            versions.into_iter().peekable(),
            markers.into_iter().peekable(),
        );
        while merged.len() < MAX_VERSIONS {
            let take_marker = match (versions.peek(), markers.peek()) {
                (Some(v), Some(m)) => m.created_unix_ms >= v.created_unix_ms,
                (None, Some(_)) => true,
                (Some(_), None) => false,
                (None, None) => break,
            };
            let next = if take_marker {
                markers.next()
            } else {
                versions.next()
            };
            merged.extend(next);
        }
        Ok(merged)
    }

    /// The serial of version `id` of `key` (`size` bytes): its
    /// [`SERIAL_TAG`] when wasmstate wrote it, else read from its first
    /// bytes, or from its last (a sealed state written before the tag).
    fn serial_of(&self, key: &str, id: &str, size: u64) -> Result<Option<u64>, Listing> {
        let head = format!("bytes=0-{}", SERIAL_PREFIX - 1);
        let Some((bytes, tag)) = self.version_range(key, id, head)? else {
            return Ok(None);
        };
        if let Some(serial) = tag {
            return Ok(Some(serial));
        }
        if let Some((_, serial)) = version_in_prefix(&bytes) {
            return Ok(Some(serial));
        }
        if size <= SERIAL_PREFIX as u64 {
            return Ok(None);
        }
        let tail = format!("bytes=-{ENVELOPE_TAIL_BYTES}");
        Ok(self
            .version_range(key, id, tail)?
            .and_then(|(bytes, _)| version_in_tail(&bytes))
            .map(|(_, serial)| serial))
    }

    /// `range` of version `id` of `key`, with its [`SERIAL_TAG`]; `None`
    /// when it is gone (removed since the listing, by a lifecycle rule).
    fn version_range(
        &self,
        key: &str,
        id: &str,
        range: String,
    ) -> Result<Option<(Vec<u8>, Option<u64>)>, Listing> {
        let answer = block_on(
            self.client
                .get_object()
                .bucket(&self.settings.bucket)
                .key(key)
                .version_id(id)
                .range(range)
                .send(),
        );
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) if matches!(status_of(&e), Some(404 | 416)) => return Ok(None),
            Err(e) => {
                let what = format!("reading version {id} of {}", self.url(key));
                return Err(Listing::of(&what, e));
            }
        };
        let tag = answer
            .metadata()
            .and_then(|m| m.get(SERIAL_TAG))
            .and_then(|s| s.parse().ok());
        let bytes = block_on(answer.body.collect())
            .map_err(|e| {
                Failed(Error::Unavailable(format!(
                    "reading {}: {e}",
                    self.url(key)
                )))
            })?
            .into_bytes();
        Ok(Some((bytes.to_vec(), tag)))
    }
}

/// Why a listing of versions failed.
enum Listing {
    /// The store refused the history's calls (403: a policy without
    /// s3:GetBucketVersioning, s3:ListBucketVersions or s3:GetObjectVersion,
    /// as Terraform's least-privilege one; 501: a store without versions):
    /// the host keeps its own history then.
    Refused(String),
    /// Anything else, passed on (a 503 is worth a retry).
    Failed(Error),
}

use Listing::{Failed, Refused};

impl Listing {
    fn of<E>(what: &str, error: SdkError<E, HttpResponse>) -> Listing
    where
        E: std::error::Error + ProvideErrorMetadata + Send + Sync + 'static,
    {
        match status_of(&error) {
            Some(403 | 501) => Refused(sdk_error(what, error).to_string()),
            _ => Failed(sdk_error(what, error)),
        }
    }
}

fn millis(time: Option<&aws_sdk_s3::primitives::DateTime>) -> u64 {
    time.and_then(|t| t.to_millis().ok())
        .map_or(0, |ms| ms.max(0) as u64)
}
