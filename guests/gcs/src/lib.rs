//! wasmstate guest: Terraform state in Google Cloud Storage, the layout of
//! Terraform's `backend "gcs"` (`internal/backend/remote-state/gcs`):
//!
//! - state `<prefix><workspace>.tfstate` (`prefix` without a leading `/`,
//!   with a trailing one when not empty);
//! - lock object `<prefix><workspace>.tflock`, created only where none
//!   exists (`ifGenerationMatch=0`), holding Terraform's LockInfo JSON with
//!   `Path = "gs://<bucket>/<lock object>"`; removed only while it is the
//!   generation that was read;
//! - workspaces: the `.tfstate` objects directly under the prefix;
//! - workspace metadata (wasmstate's own): `<prefix>wasmstate-metadata/
//!   <workspace>.json`, one folder down, so never listed as a workspace
//!   ([`metadata`]).
//!
//! A state's version is its object's generation: `head` reads the first
//! bytes, generation, size and MD5 in one ranged GET, and a conditional
//! write is an upload with `ifGenerationMatch` (`0` for none there), the
//! store's own compare-and-swap.
//!
//! So native Terraform and wasmstate exclude each other on the same
//! bucket, and either reads the state the other wrote. Terraform names a
//! lock by the lock object's generation; wasmstate's clients name it by
//! their LockInfo ID, which the object holds, so each side's unlock and
//! force-unlock work on its own locks and force-unlock works on both.
//!
//! With object versioning on, the bucket's noncurrent generations are the
//! state's history, seen by every replica.
//!
//! Settings, named as Terraform's: `bucket` (required), `prefix`,
//! `storage_custom_endpoint` (the JSON API's base, `…/storage/v1/`),
//! `kms_encryption_key`.

mod history;
mod metadata;
mod objects;

use objects::{Bucket, Condition};
use wasmstate_guest::{
    Backend, Config, Diagnostic, Error, Expect, Head, LockInfo, Metadata, StateReader, StateWriter,
    Version, check_lock, lock_by_creating, register_backend, unlock_if_unchanged,
};

/// Google's endpoint for the JSON API.
const DEFAULT_ENDPOINT: &str = "https://storage.googleapis.com/storage/v1/";

/// Bytes `head` asks for. Terraform and OpenTofu write serial and lineage
/// in the first 120 or so (the host reads the state whole when a prefix
/// leaves them out), and these bytes are read and billed on top of
/// Terraform's own read of the state in every apply: few, as the
/// conformance kit's floor (256) allows.
const HEAD_BYTES: u64 = 256;

struct Gcs {
    bucket: Bucket,
    prefix: String,
}

fn invalid(key: &str, message: impl Into<String>) -> Error {
    Error::InvalidConfig(vec![Diagnostic::key(key, message)])
}

impl Gcs {
    fn state(&self, ws: &str) -> String {
        format!("{}{ws}.tfstate", self.prefix)
    }

    fn lock_object(&self, ws: &str) -> String {
        format!("{}{ws}.tflock", self.prefix)
    }

    /// The lock object's bytes and the generation they are.
    fn lock_bytes(&self, ws: &str) -> Result<Option<(Vec<u8>, String)>, Error> {
        let mut bytes = Vec::new();
        let meta = self
            .bucket
            .read_to(&self.lock_object(ws), None, &mut bytes)?;
        Ok(meta.map(|meta| (bytes, meta.generation)))
    }

    /// The lock's holder and the generation that holds it.
    fn holder_with_generation(&self, ws: &str) -> Result<Option<(LockInfo, String)>, Error> {
        let name = self.lock_object(ws);
        let Some((bytes, generation)) = self.lock_bytes(ws)? else {
            return Ok(None);
        };
        let holder = LockInfo::from_json(&bytes).map_err(|e| {
            Error::Internal(format!(
                "lock object {} is not LockInfo JSON ({e}); force-unlock to remove it",
                self.bucket.url(&name)
            ))
        })?;
        Ok(Some((holder, generation)))
    }

    fn holder(&self, ws: &str) -> Result<Option<LockInfo>, Error> {
        Ok(self.holder_with_generation(ws)?.map(|(holder, _)| holder))
    }

    /// The condition that a write replaces exactly what is live at `name`
    /// now.
    fn live_condition(&self, name: &str) -> Result<Condition, Error> {
        Ok(match self.bucket.get(name)? {
            Some(live) => Condition::Generation(generation_number(&live.generation)?),
            None => Condition::Absent,
        })
    }

    /// Delete `name` only while it is `generation`; when it changed
    /// meanwhile (someone wrote or locked after the check), nothing is
    /// deleted and the caller is told to read again.
    fn delete_generation(&self, name: &str, generation: &str) -> Result<(), Error> {
        if self.bucket.delete(name, Some(generation))? {
            return Ok(());
        }
        Err(changed_while_deleting(&self.bucket.url(name)))
    }

    /// Delete the state `name` while it is `generation`, leaving an empty
    /// generation in the bucket's history between it and whatever comes
    /// next. Object versioning keeps no delete markers, and a delete
    /// followed by a new state within a second looks like an overwrite by
    /// the generations' times; the empty generation is the delete every
    /// replica's rollback check reads (`history.rs`), so a state deleted
    /// and pushed again starts afresh everywhere. An empty object reads as
    /// no state, so a delete stopped between the two steps is still one.
    fn delete_state(&self, name: &str, generation: &str) -> Result<(), Error> {
        let condition = Condition::Generation(generation_number(generation)?);
        if !self.bucket.upload(name, b"", condition, None)? {
            return Err(changed_while_deleting(&self.bucket.url(name)));
        }
        match self.bucket.get(name)? {
            Some(empty) if empty.bytes()? == 0 => {
                // Another writer may come between: its state then stands.
                self.bucket.delete(name, Some(empty.generation.as_str()))?;
                Ok(())
            }
            // Written again since the empty generation: the delete was
            // done, and the newer state stays.
            _ => Ok(()),
        }
    }
}

fn changed_while_deleting(url: &str) -> Error {
    Error::Unavailable(format!(
        "{url} changed while it was being deleted, so it was not; read it again"
    ))
}

fn generation_number(text: &str) -> Result<i64, Error> {
    text.parse()
        .map_err(|_| Error::Internal(format!("generation {text:?} is not a number")))
}

impl Backend for Gcs {
    fn new(config: &Config) -> Result<Self, Error> {
        config.reject_unknown(&[
            "bucket",
            "prefix",
            "storage_custom_endpoint",
            "kms_encryption_key",
        ])?;
        let bucket = config.required("bucket")?;
        if bucket.is_empty() || bucket.contains('/') {
            return Err(invalid(
                "bucket",
                "must be a bucket name such as \"acme-tf-state\"",
            ));
        }
        let endpoint = config
            .get("storage_custom_endpoint")
            .unwrap_or(DEFAULT_ENDPOINT);
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(invalid(
                "storage_custom_endpoint",
                format!(
                    "{endpoint:?} must start with http:// or https:// (e.g. \"https://storage.googleapis.com/storage/v1/\")"
                ),
            ));
        }
        // As Terraform: no leading `/`, a trailing one when not empty.
        let prefix = config.get("prefix").unwrap_or("").trim_start_matches('/');
        // Terraform cleans the prefix (`path.Join`); one it would write
        // otherwise would put the two on different objects, each unlocked
        // by the other's lock.
        if prefix
            .trim_end_matches('/')
            .split('/')
            .any(|segment| matches!(segment, "" | "." | ".."))
            && !prefix.is_empty()
        {
            return Err(invalid(
                "prefix",
                format!(
                    "{prefix:?} is not a clean path (no empty, `.` or `..` segments): write it as Terraform's gcs backend would clean it"
                ),
            ));
        }
        let prefix = match prefix {
            "" => String::new(),
            p if p.ends_with('/') => p.to_string(),
            p => format!("{p}/"),
        };
        let kms = config.get("kms_encryption_key").map(str::to_string);
        Ok(Gcs {
            bucket: Bucket::new(bucket, endpoint, kms),
            prefix,
        })
    }

    fn read_into(&self, ws: &str, out: &mut StateWriter<'_>) -> Result<bool, Error> {
        // An empty object is a workspace created and never written.
        Ok(self
            .bucket
            .read_to(&self.state(ws), None, out)?
            .is_some_and(|meta| meta.bytes().is_ok_and(|b| b > 0)))
    }

    /// The write replaces only the generation that was live before the
    /// lock was checked: a writer whose lock is taken over after the check
    /// finds the new holder's state there and is refused, and a request
    /// the store applies late cannot bring an older state back.
    fn write_from(
        &self,
        ws: &str,
        state: &mut StateReader<'_>,
        lock_id: Option<&str>,
    ) -> Result<(), Error> {
        let name = self.state(ws);
        let condition = self.live_condition(&name)?;
        check_lock(self.holder(ws)?, lock_id)?;
        if self.bucket.upload_from(&name, state, condition)? {
            return Ok(());
        }
        Err(Error::Unavailable(format!(
            "the state at {} changed while this write was under way, so it was not written; read it again",
            self.bucket.url(&name)
        )))
    }

    /// One ranged GET: the first bytes, and in its headers the generation,
    /// the size (`Content-Range`) and the MD5 (`x-goog-hash`).
    fn head(&self, ws: &str, prefix: &mut StateWriter<'_>) -> Result<Option<Head>, Error> {
        let Some(found) = self.bucket.first_bytes(&self.state(ws), HEAD_BYTES)? else {
            return Ok(None);
        };
        // An empty object is a workspace created and never written.
        if found.size == 0 {
            return Ok(None);
        }
        let Some(version) = found.generation else {
            return Err(Error::Internal(format!(
                "reading {} answered no x-goog-generation",
                self.bucket.url(&self.state(ws))
            )));
        };
        if let Err(e) = std::io::Write::write_all(prefix, &found.bytes)
            && !prefix.is_stopped()
        {
            return Err(Error::io("handing the state's first bytes to the host", e));
        }
        Ok(Some(Head {
            version,
            size: found.size,
            digest: found.md5.map(|hex| format!("md5:{hex}")),
        }))
    }

    /// An upload with `ifGenerationMatch`: the generation expected, or
    /// for `Absent` none (`0`) or the empty object of a workspace never
    /// written. What is live is read before the lock is checked, as for
    /// any write. Large states go up resumable, the condition given when
    /// the session starts and checked by GCS when it completes.
    fn write_if(
        &self,
        ws: &str,
        state: &mut StateReader<'_>,
        lock_id: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, Error> {
        let name = self.state(ws);
        let condition = match expect {
            Expect::Any => return self.write_from(ws, state, lock_id).map(|()| true),
            // Generations are positive numbers: anything else never was one.
            Expect::Version(v) => v
                .parse::<i64>()
                .ok()
                .filter(|g| *g > 0)
                .map(Condition::Generation),
            Expect::Absent => match self.bucket.get(&name)? {
                None => Some(Condition::Absent),
                Some(live) if live.bytes()? == 0 => {
                    Some(Condition::Generation(generation_number(&live.generation)?))
                }
                Some(_) => None,
            },
        };
        check_lock(self.holder(ws)?, lock_id)?;
        match condition {
            Some(condition) => self.bucket.upload_from(&name, state, condition),
            None => Ok(false),
        }
    }

    fn read_metadata(&self, ws: &str) -> Result<Option<Metadata>, Error> {
        metadata::read(&self.bucket, &metadata::object(&self.prefix, ws))
    }

    fn write_metadata(
        &self,
        ws: &str,
        content: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, Error> {
        let name = metadata::object(&self.prefix, ws);
        metadata::write(&self.bucket, &name, content, expect)
    }

    /// As a write: only the generation live before the lock was checked.
    fn delete(&self, ws: &str, lock_id: Option<&str>) -> Result<(), Error> {
        let name = self.state(ws);
        let Some(live) = self.bucket.get(&name)? else {
            return check_lock(self.holder(ws)?, lock_id);
        };
        check_lock(self.holder(ws)?, lock_id)?;
        self.delete_state(&name, &live.generation)
    }

    fn lock(&self, ws: &str, info: &LockInfo) -> Result<(), Error> {
        let name = self.lock_object(ws);
        let mut info = info.clone();
        info.path = self.bucket.url(&name);
        let json = info.to_json();
        lock_by_creating(
            ws,
            &info.id,
            || self.bucket.upload(&name, &json, Condition::Absent, None),
            || self.holder(ws),
        )
    }

    /// Remove the lock object only while it is the generation read: a
    /// lock force-unlocked and taken by someone else since is left alone.
    fn unlock(&self, ws: &str, id: &str) -> Result<(), Error> {
        let name = self.lock_object(ws);
        unlock_if_unchanged(
            id,
            || self.lock_bytes(ws),
            |generation| self.bucket.delete(&name, Some(&generation)),
            || self.holder(ws),
        )
    }

    fn current_lock(&self, ws: &str) -> Result<Option<LockInfo>, Error> {
        self.holder(ws)
    }

    /// Removes the generation whose holder is returned: a lock released
    /// and taken by someone else since that read is left alone (and
    /// reported as theirs on the next call).
    fn force_unlock(&self, ws: &str) -> Result<Option<LockInfo>, Error> {
        let name = self.lock_object(ws);
        match self.holder_with_generation(ws) {
            Ok(None) => Ok(None),
            Ok(Some((holder, generation))) => {
                self.delete_generation(&name, &generation)?;
                Ok(Some(holder))
            }
            // A corrupt lock object is removed too: that is what force is for.
            Err(_) => match self.bucket.get(&name)? {
                Some(live) => self
                    .delete_generation(&name, &live.generation)
                    .map(|()| None),
                None => Ok(None),
            },
        }
    }

    /// As Terraform lists them: the `.tfstate` objects directly under the
    /// prefix.
    fn list_workspaces(&self) -> Result<Vec<String>, Error> {
        let mut names = Vec::new();
        for object in self.bucket.list(&self.prefix, false)? {
            let Some(rest) = object.name.strip_prefix(&self.prefix) else {
                continue;
            };
            if let Some(ws) = rest.strip_suffix(".tfstate")
                && !ws.contains('/')
                && wasmstate_guest::validate_workspace_name(ws).is_ok()
            {
                names.push(ws.to_string());
            }
        }
        Ok(names)
    }

    fn create_workspace(&self, ws: &str) -> Result<bool, Error> {
        self.bucket
            .upload(&self.state(ws), b"", Condition::Absent, None)
    }

    fn delete_workspace(&self, ws: &str) -> Result<(), Error> {
        let name = self.state(ws);
        let Some(live) = self.bucket.get(&name)? else {
            return Err(Error::NotFound);
        };
        if let Some(holder) = self.holder(ws)? {
            return Err(Error::locked(holder));
        }
        self.delete_state(&name, &live.generation)?;
        // Then its metadata: after the state, so a workspace still listed
        // keeps its metadata whatever fails (a failure here leaves the
        // document behind, for a workspace of that name made later).
        self.bucket
            .delete(&metadata::object(&self.prefix, ws), None)
            .map(|_| ())
    }

    /// The bucket's generations of the state object, when it has object
    /// versioning on.
    fn list_versions(&self, ws: &str) -> Result<Option<Vec<Version>>, Error> {
        history::list(&self.bucket, &self.state(ws))
    }

    fn read_version_into(
        &self,
        ws: &str,
        id: &str,
        out: &mut StateWriter<'_>,
    ) -> Result<bool, Error> {
        // Generations are numbers: anything else is no version of ours.
        if id.is_empty() || id.len() > 20 || !id.bytes().all(|b| b.is_ascii_digit()) {
            return Ok(false);
        }
        Ok(self
            .bucket
            .read_to(&self.state(ws), Some(id), out)?
            .is_some_and(|meta| meta.bytes().is_ok_and(|b| b > 0)))
    }
}

register_backend!(Gcs);
