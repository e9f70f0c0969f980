//! wasmstate guest: Terraform state in S3 with lock files, the layout of
//! Terraform's `backend "s3"` with `use_lockfile = true`:
//!
//! - state at `key`, or `<workspace_key_prefix>/<ws>/<key>`;
//! - lock object `<state key>.tflock` holding LockInfo JSON with
//!   `Path = "<bucket>/<state key>"`, created with `If-None-Match: *`;
//! - workspace metadata (wasmstate's own) in `<state key>.wasmstate-metadata`,
//!   which Terraform never lists as a workspace.
//!
//! A conditional write (contract 0.3.0) is S3's own compare-and-swap:
//! `If-Match` the ETag the host's head read, or `If-None-Match: *`.
//!
//! So native Terraform and wasmstate exclude each other on the same bucket,
//! and either reads the state the other wrote.

use wasmstate_aws_common::{AwsSettings, Condition, S3State};
use wasmstate_guest::{
    Backend, Config, Error, Expect, Head, LockInfo, Metadata, StateReader, StateWriter, Version,
    check_lock, lock_by_creating, register_backend, unlock_if_unchanged,
};

struct S3Lockfile {
    s3: S3State,
}

/// User metadata (`x-amz-meta-wasmstate-lock-id`) on a lock object this
/// guest creates: its ID, in the same PUT as its body. A write's lock check
/// and an unlock then learn the holder from a HEAD, without reading the
/// lock; a lock object Terraform wrote carries none, and is read.
const LOCK_ID_TAG: &str = "wasmstate-lock-id";

/// Whether `id` can travel as an S3 metadata value unchanged (printable
/// ASCII, short); any other is left to the lock's body alone.
fn fits_metadata(id: &str) -> bool {
    !id.is_empty() && id.len() <= 256 && id.bytes().all(|b| b.is_ascii_graphic())
}

impl S3Lockfile {
    fn lock_key(&self, ws: &str) -> String {
        format!("{}.tflock", self.s3.settings.state_key(ws))
    }

    /// [`check_lock`] from a HEAD of the lock object when it names its
    /// holder in [`LOCK_ID_TAG`] and that is the writer (or there is no
    /// lock); else from its body, which an error names.
    fn check_writer(&self, ws: &str, lock_id: Option<&str>) -> Result<(), Error> {
        match self.s3.labelled(&self.lock_key(ws), LOCK_ID_TAG)? {
            None => check_lock(None, lock_id),
            Some((_, Some(holder))) if Some(holder.as_str()) == lock_id => Ok(()),
            Some(_) => check_lock(self.holder(ws)?, lock_id),
        }
    }

    fn holder(&self, ws: &str) -> Result<Option<LockInfo>, Error> {
        match self.s3.get(&self.lock_key(ws))? {
            None => Ok(None),
            Some(bytes) => LockInfo::from_json(&bytes).map(Some).map_err(|e| {
                Error::Internal(format!(
                    "lock object {} is not LockInfo JSON ({e}); force-unlock to remove it",
                    self.lock_key(ws)
                ))
            }),
        }
    }
}

impl Backend for S3Lockfile {
    fn new(config: &Config) -> Result<Self, Error> {
        Ok(S3Lockfile {
            s3: S3State::new(AwsSettings::from_config(config, &[])?),
        })
    }

    fn read_into(&self, ws: &str, out: &mut StateWriter<'_>) -> Result<bool, Error> {
        self.s3.read_state_to(ws, out)
    }

    fn write_from(
        &self,
        ws: &str,
        state: &mut StateReader<'_>,
        lock_id: Option<&str>,
    ) -> Result<(), Error> {
        self.s3
            .write_state_from(ws, state, |_| {}, None, || self.check_writer(ws, lock_id))
    }

    /// One ranged GET: the first bytes, the ETag and the size.
    fn head(&self, ws: &str, prefix: &mut StateWriter<'_>) -> Result<Option<Head>, Error> {
        self.s3.state_head(ws, prefix)
    }

    /// The lock rules, then one conditional PUT (or multipart upload
    /// completed conditionally).
    fn write_if(
        &self,
        ws: &str,
        state: &mut StateReader<'_>,
        lock_id: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, Error> {
        if *expect == Expect::Any {
            return self.write_from(ws, state, lock_id).map(|()| true);
        }
        self.check_writer(ws, lock_id)?;
        self.s3
            .write_state_if(ws, state, |_| {}, None, expect, lock_id.is_some())
    }

    fn read_metadata(&self, ws: &str) -> Result<Option<Metadata>, Error> {
        self.s3.read_metadata(ws)
    }

    fn write_metadata(
        &self,
        ws: &str,
        content: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, Error> {
        self.s3.write_metadata(ws, content, expect)
    }

    /// Deletes only the object there before the lock check (`If-Match`):
    /// a delete applied late never removes a newer state.
    fn delete(&self, ws: &str, lock_id: Option<&str>) -> Result<(), Error> {
        let etag = self.s3.state_etag(ws)?;
        self.check_writer(ws, lock_id)?;
        match etag {
            None => Ok(()),
            Some(etag) => self
                .s3
                .delete_state_read(ws, &etag, || check_lock(self.holder(ws)?, lock_id)),
        }
    }

    fn lock(&self, ws: &str, info: &LockInfo) -> Result<(), Error> {
        let mut info = info.clone();
        info.path = self.s3.settings.lock_path(ws);
        let json = info.to_json();
        let key = self.lock_key(ws);
        let create = || match fits_metadata(&info.id) {
            true => {
                self.s3
                    .put_labelled(&key, &json, &Condition::IfAbsent, (LOCK_ID_TAG, &info.id))
            }
            false => self.s3.put(&key, &json, true),
        };
        lock_by_creating(ws, &info.id, create, || self.holder(ws))
    }

    /// Delete the lock object only while it is still the one read
    /// (`If-Match` its ETag): a lock force-unlocked and taken by someone
    /// else after the read is left alone.
    /// A lock this guest created names its holder in [`LOCK_ID_TAG`]: a
    /// HEAD, then the delete, without reading it.
    fn unlock(&self, ws: &str, id: &str) -> Result<(), Error> {
        let key = self.lock_key(ws);
        match self.s3.labelled(&key, LOCK_ID_TAG)? {
            None => return Ok(()),
            Some((etag, Some(holder))) if holder == id => {
                if self.s3.remove_if_match(&key, &etag)? {
                    return Ok(());
                }
            }
            Some(_) => {}
        }
        unlock_if_unchanged(
            id,
            || self.s3.get_with_etag(&key),
            |etag| self.s3.remove_if_match(&key, &etag),
            || self.holder(ws),
        )
    }

    fn current_lock(&self, ws: &str) -> Result<Option<LockInfo>, Error> {
        self.holder(ws)
    }

    fn force_unlock(&self, ws: &str) -> Result<Option<LockInfo>, Error> {
        // A corrupt lock object is removed too: that is what force is for.
        let holder = self.holder(ws).unwrap_or(None);
        self.s3.remove(&self.lock_key(ws))?;
        Ok(holder)
    }

    fn list_workspaces(&self) -> Result<Vec<String>, Error> {
        self.s3.list_workspaces()
    }

    fn create_workspace(&self, ws: &str) -> Result<bool, Error> {
        self.s3.create_workspace(ws)
    }

    /// The state, then its metadata. Metadata left without a state (its
    /// workspace deleted by Terraform itself) goes too, as not found.
    fn delete_workspace(&self, ws: &str) -> Result<(), Error> {
        let Some(etag) = self.s3.state_etag(ws)? else {
            self.s3.remove_metadata(ws)?;
            return Err(Error::NotFound);
        };
        check_lock(self.holder(ws)?, None)?;
        self.s3
            .delete_state_read(ws, &etag, || check_lock(self.holder(ws)?, None))?;
        self.s3.remove_metadata(ws)
    }

    /// The bucket's object versions, when it has versioning on.
    fn list_versions(&self, ws: &str) -> Result<Option<Vec<Version>>, Error> {
        self.s3.list_versions(ws)
    }

    fn read_version_into(
        &self,
        ws: &str,
        id: &str,
        out: &mut StateWriter<'_>,
    ) -> Result<bool, Error> {
        self.s3.read_version_to(ws, id, out)
    }
}

register_backend!(S3Lockfile);
