//! wasmstate guest: Terraform state in S3, locks in a DynamoDB table, the
//! layout of Terraform's `backend "s3"` with `dynamodb_table`:
//!
//! - state in S3 as for `s3-lockfile`;
//! - lock item `{LockID: "<bucket>/<state key>", Info: <LockInfo JSON>}`,
//!   put with `attribute_not_exists(LockID)`;
//! - after each write, digest item `{LockID: "<bucket>/<state key>-md5",
//!   Digest: hex(md5(state))}`, computed as the state streams up; a read
//!   whose state does not match a stored digest fails as unavailable (503,
//!   which Terraform retries) with the advice Terraform gives.
//!
//! A write that stops between the object and its digest (a killed host, a
//! deadline) must not leave the workspace unreadable. Terraform has the
//! same gap and asks a human to edit the digest. Here each write draws a
//! random tag, adds it to the digest item's `Pending` set before the object
//! goes up, sends the object with the tag as metadata
//! (`x-amz-meta-wasmstate-write`), then sets `Digest`, only while its tag
//! is still pending (a digest update applied late, after a newer write
//! recorded its own, changes nothing), clearing its tag and those
//! announced before it. A read whose state does not match `Digest` but
//! carries a pending tag is a write that landed without its digest: it is
//! served, and the digest repaired unless the item changed since the read
//! (a newer write). A state changed behind the table's back carries no
//! pending tag and still fails the check. Terraform reads only `Digest`.
//!
//! A state is deleted only while it is the object read before the lock
//! check (`If-Match`), so a delete applied late never removes a newer one.
//!
//! A conditional write (contract 0.3.0) is S3's own compare-and-swap
//! (`If-Match` the ETag the host's head read, or `If-None-Match: *`), with
//! the digest item kept as for every write: the tag announced before the
//! object goes up, the digest set once it landed; a refused write leaves
//! the object and its digest as they were. Workspace metadata lives in
//! `<state key>.wasmstate-metadata`, as for `s3-lockfile`.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::BehaviorVersion;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use md5::{Digest, Md5};
use wasmstate_aws_common::{AwsSettings, S3State, block_on, sdk_error};
use wasmstate_guest::{
    Backend, Config, Diagnostic, Error, Expect, Head, LockInfo, Metadata, StateReader, StateWriter,
    Version, check_lock, lock_by_creating, log, register_backend,
};

struct Dynamo {
    s3: S3State,
    ddb: Client,
    table: String,
}

fn s(value: &str) -> AttributeValue {
    AttributeValue::S(value.to_string())
}

impl Dynamo {
    fn lock_id(&self, ws: &str) -> String {
        self.s3.settings.lock_path(ws)
    }

    fn digest_id(&self, ws: &str) -> String {
        format!("{}-md5", self.lock_id(ws))
    }

    /// One string attribute of the item `id`, read consistently.
    fn get_attribute(&self, id: &str, attribute: &str) -> Result<Option<String>, Error> {
        block_on(async {
            let out = self
                .ddb
                .get_item()
                .table_name(&self.table)
                .key("LockID", s(id))
                .consistent_read(true)
                .send()
                .await
                .map_err(|e| sdk_error(&format!("reading {id} from table {}", self.table), e))?;
            Ok(out
                .item()
                .and_then(|item| item.get(attribute))
                .and_then(|v| v.as_s().ok())
                .cloned())
        })
    }

    fn delete_item(&self, id: &str) -> Result<(), Error> {
        block_on(async {
            self.ddb
                .delete_item()
                .table_name(&self.table)
                .key("LockID", s(id))
                .send()
                .await
                .map(|_| ())
                .map_err(|e| sdk_error(&format!("deleting {id} from table {}", self.table), e))
        })
    }

    fn holder(&self, ws: &str) -> Result<Option<LockInfo>, Error> {
        match self.get_attribute(&self.lock_id(ws), "Info")? {
            None => Ok(None),
            Some(json) => LockInfo::from_json(json.as_bytes()).map(Some).map_err(|e| {
                Error::Internal(format!(
                    "lock item {} is not LockInfo JSON ({e}); force-unlock it",
                    self.lock_id(ws)
                ))
            }),
        }
    }

    /// Announce a write tagged `tag` before its object is sent (see the
    /// module's doc); the tags announced before it. Must succeed: without
    /// it, a write that stopped half-way would leave the workspace
    /// unreadable.
    fn add_pending(&self, ws: &str, tag: &str) -> Result<Vec<String>, Error> {
        block_on(async {
            let out = self
                .ddb
                .update_item()
                .table_name(&self.table)
                .key("LockID", s(&self.digest_id(ws)))
                .update_expression("ADD Pending :t")
                .expression_attribute_values(":t", AttributeValue::Ss(vec![tag.into()]))
                .return_values(ReturnValue::UpdatedOld)
                .send()
                .await
                .map_err(|e| {
                    sdk_error(&format!("announcing a write in table {}", self.table), e)
                })?;
            Ok(out
                .attributes()
                .and_then(|a| a.get("Pending"))
                .and_then(|v| v.as_ss().ok())
                .cloned()
                .unwrap_or_default())
        })
    }

    /// Record `digest` as the state's, after the write tagged `tag` landed,
    /// only while `tag` is still pending: an update applied late (sent
    /// before a deadline stopped this guest), after a newer write recorded
    /// its own digest (which clears `tag`), changes nothing. It clears
    /// `tag` and the `earlier` tags, announced before it: once this
    /// write's conditional PUT landed, none of them can land any more
    /// (each PUT was conditioned on an older object). Tags announced after
    /// it stay: their writes may have landed already, and this digest may
    /// be applied after them; a read finds their tag pending and serves
    /// them. A failure is a warning, as in Terraform: the state is
    /// written, and a read finds its tag pending and repairs the digest.
    fn put_digest(&self, ws: &str, digest: &str, tag: &str, earlier: &[String]) {
        let mut done: Vec<String> = earlier.iter().filter(|t| *t != tag).cloned().collect();
        done.push(tag.to_string());
        let update = self
            .ddb
            .update_item()
            .table_name(&self.table)
            .key("LockID", s(&self.digest_id(ws)))
            .update_expression("SET Digest = :d DELETE Pending :done")
            .condition_expression("contains(Pending, :t)")
            .expression_attribute_values(":d", s(digest))
            .expression_attribute_values(":done", AttributeValue::Ss(done))
            .expression_attribute_values(":t", s(tag));
        match block_on(update.send()) {
            Ok(_) => {}
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                self.digest_if_still_current(ws, digest, tag);
            }
            Err(e) => log::warn(&format!(
                "could not record the state digest of {ws:?}: {}",
                sdk_error("put digest", e)
            )),
        }
    }

    /// Withdraw the announcement of a write its condition refused: its
    /// object never went up. Best effort: a tag left pending is cleared by
    /// the next write that lands, and matches no object meanwhile.
    fn drop_pending(&self, ws: &str, tag: &str) {
        let update = self
            .ddb
            .update_item()
            .table_name(&self.table)
            .key("LockID", s(&self.digest_id(ws)))
            .update_expression("DELETE Pending :t")
            .expression_attribute_values(":t", AttributeValue::Ss(vec![tag.into()]));
        if let Err(e) = block_on(update.send()) {
            log::warn(&format!(
                "could not withdraw a refused write of {ws:?} from table {}: {}",
                self.table,
                sdk_error("update", e)
            ));
        }
    }

    /// `tag` is no longer pending: a newer write cleared it, taking this
    /// write's PUT for one that can no longer land. Yet a PUT sent without
    /// its condition (a store answering 501, a multipart upload's
    /// completion, a store ignoring `If-Match`) or matching a repeated
    /// ETag may have landed after that newer write: then the object is
    /// this write's and no digest or pending tag matches it, and every
    /// read would answer 503. So: the digest item is read, then the
    /// object; if the object still carries `tag`, its digest is set,
    /// only while the item's digest is still the one read (a newer write
    /// recording its own after that read is never replaced).
    fn digest_if_still_current(&self, ws: &str, digest: &str, tag: &str) {
        let seen = match self.digests(ws) {
            Ok((seen, _)) => seen,
            Err(e) => return log::warn(&format!("could not check the digest of {ws:?}: {e}")),
        };
        match self.s3.state_write_tag(ws) {
            Ok(Some(Some(current))) if current == tag => {}
            Ok(_) => {
                return log::info(&format!(
                    "the digest of {ws:?} was not recorded: a newer write recorded its own"
                ));
            }
            Err(e) => return log::warn(&format!("could not check the state of {ws:?}: {e}")),
        }
        let mut update = self
            .ddb
            .update_item()
            .table_name(&self.table)
            .key("LockID", s(&self.digest_id(ws)))
            .update_expression("SET Digest = :d")
            .expression_attribute_values(":d", s(digest));
        update = match seen.is_empty() {
            true => update.condition_expression("attribute_not_exists(Digest)"),
            false => update
                .condition_expression("Digest = :seen")
                .expression_attribute_values(":seen", s(&seen)),
        };
        match block_on(update.send()) {
            Ok(_) => log::info(&format!(
                "the state of {ws:?} landed after a newer write's digest: its own is recorded"
            )),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) => {}
            Err(e) => log::warn(&format!(
                "could not record the state digest of {ws:?}: {}",
                sdk_error("put digest", e)
            )),
        }
    }

    /// A read's repair: the state it read carries `tag`, still pending, and
    /// `seen` is the digest it compared with. Only while both still hold: a
    /// newer write (which sets its own digest, or is itself pending) is
    /// never replaced by the older state this read saw.
    fn repair_digest(&self, ws: &str, digest: &str, tag: &str, seen: &str) {
        let mut update = self
            .ddb
            .update_item()
            .table_name(&self.table)
            .key("LockID", s(&self.digest_id(ws)))
            .update_expression("SET Digest = :d DELETE Pending :t")
            .expression_attribute_values(":d", s(digest))
            .expression_attribute_values(":t", AttributeValue::Ss(vec![tag.into()]))
            .expression_attribute_values(":one", s(tag));
        update = match seen.is_empty() {
            true => update
                .condition_expression("contains(Pending, :one) AND attribute_not_exists(Digest)"),
            false => update
                .condition_expression("contains(Pending, :one) AND Digest = :seen")
                .expression_attribute_values(":seen", s(seen)),
        };
        if let Err(e) = block_on(update.send()) {
            if e.as_service_error()
                .is_some_and(|e| e.is_conditional_check_failed_exception())
            {
                return;
            }
            log::warn(&format!(
                "could not record the state digest of {ws:?}: {}",
                sdk_error("put digest", e)
            ));
        }
    }

    /// The recorded digest and the tags of writes under way.
    fn digests(&self, ws: &str) -> Result<(String, Vec<String>), Error> {
        let id = self.digest_id(ws);
        block_on(async {
            let out = self
                .ddb
                .get_item()
                .table_name(&self.table)
                .key("LockID", s(&id))
                .consistent_read(true)
                .send()
                .await
                .map_err(|e| sdk_error(&format!("reading {id} from table {}", self.table), e))?;
            let item = out.item();
            let digest = item
                .and_then(|i| i.get("Digest"))
                .and_then(|v| v.as_s().ok())
                .cloned()
                .unwrap_or_default();
            let pending = item
                .and_then(|i| i.get("Pending"))
                .and_then(|v| v.as_ss().ok())
                .cloned()
                .unwrap_or_default();
            Ok((digest, pending))
        })
    }
}

impl Backend for Dynamo {
    fn new(config: &Config) -> Result<Self, Error> {
        let settings = AwsSettings::from_config(
            config,
            &["dynamodb_table", "endpoints.dynamodb", "dynamodb_endpoint"],
        )?;
        let table = config.required("dynamodb_table")?.to_string();
        let endpoint = config
            .get("endpoints.dynamodb")
            .or(config.get("dynamodb_endpoint"));
        if let Some(e) = endpoint
            && !(e.starts_with("http://") || e.starts_with("https://"))
        {
            return Err(Error::InvalidConfig(vec![Diagnostic::key(
                "endpoints.dynamodb",
                format!("{e:?} must start with http:// or https://"),
            )]));
        }
        let mut ddb = aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(settings.region())
            .allow_no_auth()
            .http_client(wasmstate_aws_common::http_client())
            .sleep_impl(wasmstate_aws_common::WasiSleep)
            .retry_config(RetryConfig::disabled());
        if let Some(e) = endpoint {
            ddb = ddb.endpoint_url(e);
        }
        Ok(Dynamo {
            s3: S3State::new(settings),
            ddb: Client::from_conf(ddb.build()),
            table,
        })
    }

    /// Streamed to the host as S3 sends it, with its MD5 computed on the
    /// way: a state that does not match the recorded digest is reported
    /// at the end (the host then discards what it received, and Terraform
    /// retries the 5xx), since its bytes have left by then.
    fn read_into(&self, ws: &str, out: &mut StateWriter<'_>) -> Result<bool, Error> {
        let mut hashing = Hashing {
            out,
            md5: Md5::new(),
        };
        let Some(tag) = self.s3.read_tagged_state_to(ws, &mut hashing)? else {
            return Ok(false);
        };
        let actual = hex::encode(hashing.md5.finalize());
        let (expected, pending) = self.digests(ws)?;
        if expected.is_empty() || expected == actual {
            return Ok(true);
        }
        if let Some(tag) = tag.filter(|t| pending.contains(t)) {
            // A write landed without its digest: serve it and repair.
            self.repair_digest(ws, &actual, &tag, &expected);
            return Ok(true);
        }
        Err(Error::Unavailable(format!(
            "state data in S3 does not have the expected content: its checksum is {actual} but \
             the DynamoDB table {} expects {expected}. S3 may not have caught up yet (try again), \
             or the state was written without updating the digest: then update the Digest of \
             item {:?} to {actual}",
            self.table,
            self.digest_id(ws)
        )))
    }

    fn write_from(
        &self,
        ws: &str,
        state: &mut StateReader<'_>,
        lock_id: Option<&str>,
    ) -> Result<(), Error> {
        let tag = hex::encode(wasmstate_guest::random_bytes(16));
        let mut md5 = Md5::new();
        let mut earlier = Vec::new();
        self.s3.write_state_from(
            ws,
            state,
            |chunk| md5.update(chunk),
            Some(&tag),
            || {
                check_lock(self.holder(ws)?, lock_id)?;
                earlier = self.add_pending(ws, &tag)?;
                Ok(())
            },
        )?;
        self.put_digest(ws, &hex::encode(md5.finalize()), &tag, &earlier);
        Ok(())
    }

    /// One ranged GET: the first bytes, the ETag and the size.
    fn head(&self, ws: &str, prefix: &mut StateWriter<'_>) -> Result<Option<Head>, Error> {
        self.s3.state_head(ws, prefix)
    }

    /// The lock rules, the write announced in the digest item, one
    /// conditional PUT (or multipart upload completed conditionally), then
    /// its digest; a refused write is withdrawn and changes nothing.
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
        check_lock(self.holder(ws)?, lock_id)?;
        let tag = hex::encode(wasmstate_guest::random_bytes(16));
        let earlier = self.add_pending(ws, &tag)?;
        let mut md5 = Md5::new();
        let written = self.s3.write_state_if(
            ws,
            state,
            |chunk| md5.update(chunk),
            Some(&tag),
            expect,
            lock_id.is_some(),
        );
        match written {
            Ok(true) => self.put_digest(ws, &hex::encode(md5.finalize()), &tag, &earlier),
            Ok(false) => self.drop_pending(ws, &tag),
            // Maybe written (a lost answer): the tag stays pending, so a
            // read serves the object and repairs the digest.
            Err(_) => {}
        }
        written
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
        check_lock(self.holder(ws)?, lock_id)?;
        if let Some(etag) = etag {
            self.s3
                .delete_state_read(ws, &etag, || check_lock(self.holder(ws)?, lock_id))?;
        }
        self.delete_item(&self.digest_id(ws))
    }

    fn lock(&self, ws: &str, info: &LockInfo) -> Result<(), Error> {
        let mut info = info.clone();
        info.path = self.lock_id(ws);
        let json = String::from_utf8(info.to_json()).expect("JSON is UTF-8");
        let create = || {
            let result = block_on(async {
                self.ddb
                    .put_item()
                    .table_name(&self.table)
                    .item("LockID", s(&self.lock_id(ws)))
                    .item("Info", s(&json))
                    .condition_expression("attribute_not_exists(LockID)")
                    .send()
                    .await
            });
            match result {
                Ok(_) => Ok(true),
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
                {
                    Ok(false)
                }
                Err(e) => Err(sdk_error(&format!("locking in table {}", self.table), e)),
            }
        };
        lock_by_creating(ws, &info.id, create, || self.holder(ws))
    }

    /// Delete the lock item only while it still holds `id`'s lock (a
    /// condition on its `Info`): a lock force-unlocked and taken by someone
    /// else after the read is left alone.
    fn unlock(&self, ws: &str, id: &str) -> Result<(), Error> {
        let Some(json) = self.get_attribute(&self.lock_id(ws), "Info")? else {
            return Ok(());
        };
        match LockInfo::from_json(json.as_bytes()) {
            Ok(holder) if holder.id == id => {}
            Ok(holder) => return Err(Error::lock_mismatch(Some(holder))),
            Err(_) => return Err(Error::lock_mismatch(None)),
        }
        let deleted = block_on(
            self.ddb
                .delete_item()
                .table_name(&self.table)
                .key("LockID", s(&self.lock_id(ws)))
                .condition_expression("Info = :info")
                .expression_attribute_values(":info", s(&json))
                .send(),
        );
        match deleted {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                match self.holder(ws)? {
                    None => Ok(()),
                    holder => Err(Error::lock_mismatch(holder)),
                }
            }
            Err(e) => Err(sdk_error(&format!("unlocking in table {}", self.table), e)),
        }
    }

    fn current_lock(&self, ws: &str) -> Result<Option<LockInfo>, Error> {
        self.holder(ws)
    }

    fn force_unlock(&self, ws: &str) -> Result<Option<LockInfo>, Error> {
        let holder = self.holder(ws).unwrap_or(None);
        self.delete_item(&self.lock_id(ws))?;
        Ok(holder)
    }

    fn list_workspaces(&self) -> Result<Vec<String>, Error> {
        self.s3.list_workspaces()
    }

    fn create_workspace(&self, ws: &str) -> Result<bool, Error> {
        self.s3.create_workspace(ws)
    }

    /// The state, its digest item, then its metadata. Metadata left
    /// without a state (its workspace deleted by Terraform itself) goes
    /// too, as not found.
    fn delete_workspace(&self, ws: &str) -> Result<(), Error> {
        let Some(etag) = self.s3.state_etag(ws)? else {
            self.s3.remove_metadata(ws)?;
            return Err(Error::NotFound);
        };
        check_lock(self.holder(ws)?, None)?;
        self.s3
            .delete_state_read(ws, &etag, || check_lock(self.holder(ws)?, None))?;
        self.delete_item(&self.digest_id(ws))?;
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

register_backend!(Dynamo);

/// Passes bytes on to the host while computing their MD5.
struct Hashing<'a, 'b> {
    out: &'a mut StateWriter<'b>,
    md5: Md5,
}

impl std::io::Write for Hashing<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.md5.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
