//! wasmstate guest: Terraform state in S3 with lock files, the layout of
//! Terraform's `backend "s3"` with `use_lockfile = true`:
//!
//! - state at `key`, or `<workspace_key_prefix>/<ws>/<key>`;
//! - lock object `<state key>.tflock` holding LockInfo JSON with
//!   `Path = "<bucket>/<state key>"`, created with `If-None-Match: *`.
//!
//! So native Terraform and wasmstate exclude each other on the same bucket,
//! and either reads the state the other wrote.

use wasmstate_aws_common::{AwsSettings, S3State};
use wasmstate_guest::{
    Backend, Config, Error, LockInfo, StateReader, StateWriter, Version, check_lock,
    lock_by_creating, register_backend, unlock_if_unchanged,
};

struct S3Lockfile {
    s3: S3State,
}

impl S3Lockfile {
    fn lock_key(&self, ws: &str) -> String {
        format!("{}.tflock", self.s3.settings.state_key(ws))
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
        self.s3.write_state_from(
            ws,
            state,
            |_| {},
            None,
            || check_lock(self.holder(ws)?, lock_id),
        )
    }

    /// Deletes only the object there before the lock check (`If-Match`):
    /// a delete applied late never removes a newer state.
    fn delete(&self, ws: &str, lock_id: Option<&str>) -> Result<(), Error> {
        let etag = self.s3.state_etag(ws)?;
        check_lock(self.holder(ws)?, lock_id)?;
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
        lock_by_creating(
            ws,
            &info.id,
            || self.s3.put(&self.lock_key(ws), &json, true),
            || self.holder(ws),
        )
    }

    /// Delete the lock object only while it is still the one read
    /// (`If-Match` its ETag): a lock force-unlocked and taken by someone
    /// else after the read is left alone.
    fn unlock(&self, ws: &str, id: &str) -> Result<(), Error> {
        let key = self.lock_key(ws);
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

    fn delete_workspace(&self, ws: &str) -> Result<(), Error> {
        let Some(etag) = self.s3.state_etag(ws)? else {
            return Err(Error::NotFound);
        };
        check_lock(self.holder(ws)?, None)?;
        self.s3
            .delete_state_read(ws, &etag, || check_lock(self.holder(ws)?, None))
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
