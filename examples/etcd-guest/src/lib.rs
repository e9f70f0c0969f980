//! An example third-party wasmstate guest: Terraform state and locks in
//! etcd v3, through etcd's JSON gateway, written only against the
//! `wasmstate-guest` SDK.
//!
//! Keys, under `prefix` (default `wasmstate/`):
//!
//! ```text
//! <prefix>workspaces/<ws>                  workspace marker (empty value)
//! <prefix>states/<ws>                      manifest: {"generation", "chunks", "size"}
//! <prefix>chunks/<ws>/<generation>/<n>     the state, in chunks of `chunk_kib`
//! <prefix>locks/<ws>                       LockInfo JSON while locked
//! <prefix>metadata/<ws>                    the workspace's metadata
//! ```
//!
//! A state larger than etcd's request limit (1.5 MiB by default) is written
//! as chunks under a fresh generation, then published by one transaction
//! that replaces the manifest only if the lock is still what the writer
//! saw and the manifest is the one the writer expects — so a write is
//! atomic, honours the lock and is a compare-and-swap, across many hosts.
//! A state's version is its manifest's `mod_revision`, a metadata's its
//! key's: etcd never gives one revision twice, not even to a key deleted
//! and created again.
//! Readers follow the manifest; old generations are deleted after the
//! switch, and a reader that loses that race is refused as unavailable
//! (Terraform reads again). Both directions stream a chunk at a time, so
//! the guest's memory holds one chunk, never a state.
//!
//! Configuration: `endpoint` (required, e.g. `http://127.0.0.1:2379`),
//! `prefix`, `chunk_kib` (default 512). Grant the host capability with
//! `allow_http = ["<endpoint>"]`.

mod etcd;

use etcd::{Compare, Etcd, Kv, Op};
use serde::{Deserialize, Serialize};
use std::io::Write;
use wasmstate_guest::{
    Backend, Config, Diagnostic, Error, Expect, Head, LockInfo, Metadata, StateReader, StateWriter,
    register_backend,
};

struct EtcdBackend {
    etcd: Etcd,
    prefix: String,
    chunk_size: usize,
}

#[derive(Serialize, Deserialize)]
struct Manifest {
    generation: String,
    chunks: usize,
    size: usize,
}

/// How often to retry when a concurrent change got in between a read and a
/// conditional write.
const RACE_RETRIES: usize = 20;

fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u8(0);
    format!("{:016x}", h.finish())
}

/// The condition on `key` that `expect` asks of a transaction (`None`:
/// none), or `Err(())` for a version this guest never hands out, which no
/// stored key can match.
fn expect_condition<'a>(key: &'a str, expect: &Expect) -> Result<Option<Compare<'a>>, ()> {
    match expect {
        Expect::Any => Ok(None),
        Expect::Absent => Ok(Some(Compare::Absent(key))),
        Expect::Version(v) => v
            .parse()
            .map(|revision| Some(Compare::ModRevision(key, revision)))
            .map_err(|_| ()),
    }
}

/// Whether `kv` (the key as stored now, `None`: absent) is as `expect` says.
fn is_expected(kv: Option<&Kv>, expect: &Expect) -> bool {
    match (expect, kv) {
        (Expect::Any, _) | (Expect::Absent, None) => true,
        (Expect::Absent, Some(_)) | (Expect::Version(_), None) => false,
        (Expect::Version(v), Some(kv)) => *v == kv.mod_revision.to_string(),
    }
}

fn lock_from(kv: &Kv) -> Result<LockInfo, Error> {
    LockInfo::from_json(&kv.value).map_err(|e| {
        Error::Internal(format!(
            "lock in etcd is not LockInfo JSON ({e}); force-unlock it"
        ))
    })
}

impl EtcdBackend {
    fn workspace_key(&self, ws: &str) -> String {
        format!("{}workspaces/{ws}", self.prefix)
    }
    fn manifest_key(&self, ws: &str) -> String {
        format!("{}states/{ws}", self.prefix)
    }
    fn chunks_prefix(&self, ws: &str, generation: &str) -> String {
        format!("{}chunks/{ws}/{generation}/", self.prefix)
    }
    fn lock_key(&self, ws: &str) -> String {
        format!("{}locks/{ws}", self.prefix)
    }
    fn metadata_key(&self, ws: &str) -> String {
        format!("{}metadata/{ws}", self.prefix)
    }

    /// The lock as stored, with its revision, for conditional writes.
    fn lock_kv(&self, ws: &str) -> Result<Option<(LockInfo, i64)>, Error> {
        match self.etcd.get(&self.lock_key(ws))? {
            Some(kv) => Ok(Some((lock_from(&kv)?, kv.mod_revision))),
            None => Ok(None),
        }
    }

    /// The condition under which a change by `lock_id` may proceed: the lock
    /// is exactly as seen now. Fails at once when it already may not.
    fn lock_condition(&self, ws: &str, lock_id: Option<&str>) -> Result<Option<i64>, Error> {
        let seen = self.lock_kv(ws)?;
        let revision = seen.as_ref().map(|(_, rev)| *rev);
        wasmstate_guest::check_lock(seen.map(|(holder, _)| holder), lock_id)?;
        Ok(revision)
    }

    fn drop_generation(&self, ws: &str, manifest: Option<Kv>) {
        if let Some(old) =
            manifest.and_then(|kv| serde_json::from_slice::<Manifest>(&kv.value).ok())
        {
            // Best effort: a leftover generation wastes space, nothing else.
            let _ = self
                .etcd
                .delete_prefix(&self.chunks_prefix(ws, &old.generation));
        }
    }

    /// Replace (`Some`, streamed chunk by chunk: the guest never holds the
    /// whole state) or remove (`None`) the state, if the lock still allows
    /// it and the manifest is as `expect` says when the switch happens;
    /// `false` when the manifest is not (nothing changed then).
    fn publish(
        &self,
        ws: &str,
        state: Option<&mut StateReader<'_>>,
        lock_id: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, Error> {
        let manifest_key = self.manifest_key(ws);
        let Ok(expected) = expect_condition(&manifest_key, expect) else {
            return Ok(false);
        };
        let generation = random_hex();
        let manifest = match state {
            Some(state) => {
                let prefix = self.chunks_prefix(ws, &generation);
                let (mut chunks, mut size) = (0usize, 0usize);
                loop {
                    let chunk = state.next_chunk(self.chunk_size);
                    if chunk.is_empty() {
                        break;
                    }
                    if let Err(e) = self.etcd.put(&format!("{prefix}{chunks:06}"), &chunk) {
                        let _ = self.etcd.delete_prefix(&prefix);
                        return Err(e);
                    }
                    chunks += 1;
                    size += chunk.len();
                }
                let m = Manifest {
                    generation: generation.clone(),
                    chunks,
                    size,
                };
                Some(serde_json::to_vec(&m).expect("manifest serialises"))
            }
            None => None,
        };
        // A transaction that fails (`?` below) leaves the new generation's
        // chunks behind rather than deleting them: it may have been applied
        // though its answer was lost. They only waste space.
        for _ in 0..RACE_RETRIES {
            let condition = match self.lock_condition(ws, lock_id) {
                Ok(c) => c,
                Err(e) => {
                    let _ = self
                        .etcd
                        .delete_prefix(&self.chunks_prefix(ws, &generation));
                    return Err(e);
                }
            };
            let lock_key = self.lock_key(ws);
            let mut compare = vec![match condition {
                Some(rev) => Compare::ModRevision(&lock_key, rev),
                None => Compare::Absent(&lock_key),
            }];
            compare.extend(expected.clone());
            let workspace_key = self.workspace_key(ws);
            // On failure, the manifest as it is: did it change, or the lock?
            let failure = [Op::Get(&manifest_key)];
            let outcome = match &manifest {
                Some(m) => self.etcd.txn(
                    &compare,
                    &[Op::Put(&manifest_key, m), Op::Put(&workspace_key, b"")],
                    &failure,
                )?,
                None => self
                    .etcd
                    .txn(&compare, &[Op::Delete(&manifest_key)], &failure)?,
            };
            let previous = outcome.kvs.into_iter().next().flatten();
            if outcome.succeeded {
                self.drop_generation(ws, previous);
                return Ok(true);
            }
            if !is_expected(previous.as_ref(), expect) {
                let _ = self
                    .etcd
                    .delete_prefix(&self.chunks_prefix(ws, &generation));
                // The lock rules come first: a writer that lost its lock
                // meanwhile hears that, not "changed".
                self.lock_condition(ws, lock_id)?;
                return Ok(false);
            }
            // The lock changed between our look and our write: look again.
        }
        Err(Error::Unavailable(format!(
            "workspace {ws:?}: the lock kept changing during the write"
        )))
    }
}

impl Backend for EtcdBackend {
    fn new(config: &Config) -> Result<Self, Error> {
        config.reject_unknown(&["endpoint", "prefix", "chunk_kib"])?;
        let endpoint = config.required("endpoint")?;
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(Error::InvalidConfig(vec![Diagnostic::key(
                "endpoint",
                format!("{endpoint:?} must start with http:// or https://"),
            )]));
        }
        let chunk_kib: usize = config.parse_or("chunk_kib", 512)?;
        if !(1..=1024).contains(&chunk_kib) {
            return Err(Error::InvalidConfig(vec![Diagnostic::key(
                "chunk_kib",
                "must be between 1 and 1024 (etcd refuses requests over 1.5 MiB by default)",
            )]));
        }
        Ok(EtcdBackend {
            etcd: Etcd::new(endpoint),
            prefix: config.get("prefix").unwrap_or("wasmstate/").to_string(),
            chunk_size: chunk_kib * 1024,
        })
    }

    fn read_into(&self, ws: &str, out: &mut StateWriter<'_>) -> Result<bool, Error> {
        let Some(kv) = self.etcd.get(&self.manifest_key(ws))? else {
            return Ok(false);
        };
        let manifest: Manifest = serde_json::from_slice(&kv.value)
            .map_err(|e| Error::Internal(format!("manifest of {ws:?} is corrupt: {e}")))?;
        // Chunk by chunk into the host, never the whole state here. A
        // writer replacing this generation meanwhile removes its chunks:
        // the read is then refused as unavailable (the client retries).
        let replaced = || {
            Error::Unavailable(format!(
                "workspace {ws:?}: the state was replaced while being read; read it again"
            ))
        };
        let prefix = self.chunks_prefix(ws, &manifest.generation);
        let mut size = 0usize;
        for i in 0..manifest.chunks {
            let chunk = self
                .etcd
                .get(&format!("{prefix}{i:06}"))?
                .ok_or_else(replaced)?;
            size += chunk.value.len();
            if out.write_all(&chunk.value).is_err() {
                // The host has what it needs (the beginning): a success.
                return Ok(true);
            }
        }
        if size != manifest.size {
            return Err(replaced());
        }
        Ok(true)
    }

    fn head(&self, ws: &str, prefix: &mut StateWriter<'_>) -> Result<Option<Head>, Error> {
        'look: for _ in 0..RACE_RETRIES {
            let Some(kv) = self.etcd.get(&self.manifest_key(ws))? else {
                return Ok(None);
            };
            let manifest: Manifest = serde_json::from_slice(&kv.value)
                .map_err(|e| Error::Internal(format!("manifest of {ws:?} is corrupt: {e}")))?;
            // The first chunks only, until the host has what it needs (etcd
            // reads a value whole: a state of one chunk is read whole).
            let chunks = self.chunks_prefix(ws, &manifest.generation);
            for i in 0..manifest.chunks {
                let Some(chunk) = self.etcd.get(&format!("{chunks}{i:06}"))? else {
                    if i == 0 {
                        // Replaced between the two reads (its writer drops
                        // the old chunks): look at the new manifest.
                        continue 'look;
                    }
                    return Err(Error::Unavailable(format!(
                        "workspace {ws:?}: the state was replaced while being read; read it again"
                    )));
                };
                if prefix.write_all(&chunk.value).is_err() {
                    break;
                }
            }
            return Ok(Some(Head {
                version: kv.mod_revision.to_string(),
                size: manifest.size as u64,
                digest: None,
            }));
        }
        Err(Error::Unavailable(format!(
            "workspace {ws:?}: the state kept being replaced while its head was read"
        )))
    }

    fn write_from(
        &self,
        ws: &str,
        state: &mut StateReader<'_>,
        lock_id: Option<&str>,
    ) -> Result<(), Error> {
        self.publish(ws, Some(state), lock_id, &Expect::Any)
            .map(|_| ())
    }

    fn write_if(
        &self,
        ws: &str,
        state: &mut StateReader<'_>,
        lock_id: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, Error> {
        self.publish(ws, Some(state), lock_id, expect)
    }

    fn delete(&self, ws: &str, lock_id: Option<&str>) -> Result<(), Error> {
        self.publish(ws, None, lock_id, &Expect::Any).map(|_| ())
    }

    fn lock(&self, ws: &str, info: &LockInfo) -> Result<(), Error> {
        let lock_key = self.lock_key(ws);
        for _ in 0..RACE_RETRIES {
            let outcome = self.etcd.txn(
                &[Compare::Absent(&lock_key)],
                &[Op::Put(&lock_key, &info.to_json())],
                &[Op::Get(&lock_key)],
            )?;
            if outcome.succeeded {
                return Ok(());
            }
            match outcome.kvs.into_iter().next().flatten() {
                Some(kv) => {
                    let holder = lock_from(&kv)?;
                    return if holder.id == info.id {
                        Ok(())
                    } else {
                        Err(Error::locked(holder))
                    };
                }
                None => continue, // released in between: try again
            }
        }
        Err(Error::Unavailable(format!(
            "workspace {ws:?}: the lock kept changing hands"
        )))
    }

    fn unlock(&self, ws: &str, id: &str) -> Result<(), Error> {
        for _ in 0..RACE_RETRIES {
            let Some((holder, rev)) = self.lock_kv(ws)? else {
                return Ok(());
            };
            if holder.id != id {
                return Err(Error::lock_mismatch(Some(holder)));
            }
            let lock_key = self.lock_key(ws);
            if self
                .etcd
                .txn(
                    &[Compare::ModRevision(&lock_key, rev)],
                    &[Op::Delete(&lock_key)],
                    &[],
                )?
                .succeeded
            {
                return Ok(());
            }
        }
        Err(Error::Unavailable(format!(
            "workspace {ws:?}: the lock kept changing hands"
        )))
    }

    fn current_lock(&self, ws: &str) -> Result<Option<LockInfo>, Error> {
        Ok(self.lock_kv(ws)?.map(|(holder, _)| holder))
    }

    fn force_unlock(&self, ws: &str) -> Result<Option<LockInfo>, Error> {
        // A corrupt lock is removed too: that is what force is for.
        Ok(self
            .etcd
            .delete(&self.lock_key(ws))?
            .and_then(|kv| lock_from(&kv).ok()))
    }

    fn list_workspaces(&self) -> Result<Vec<String>, Error> {
        let prefix = format!("{}workspaces/", self.prefix);
        Ok(self
            .etcd
            .list(&prefix, true)?
            .into_iter()
            .filter_map(|kv| {
                String::from_utf8(kv.key)
                    .ok()?
                    .strip_prefix(&prefix)
                    .map(str::to_string)
            })
            .collect())
    }

    fn create_workspace(&self, ws: &str) -> Result<bool, Error> {
        let key = self.workspace_key(ws);
        Ok(self
            .etcd
            .txn(&[Compare::Absent(&key)], &[Op::Put(&key, b"")], &[])?
            .succeeded)
    }

    fn delete_workspace(&self, ws: &str) -> Result<(), Error> {
        let (workspace_key, lock_key, manifest_key, metadata_key) = (
            self.workspace_key(ws),
            self.lock_key(ws),
            self.manifest_key(ws),
            self.metadata_key(ws),
        );
        let outcome = self.etcd.txn(
            &[Compare::Present(&workspace_key), Compare::Absent(&lock_key)],
            &[
                Op::Delete(&manifest_key),
                Op::Delete(&metadata_key),
                Op::Delete(&workspace_key),
            ],
            &[Op::Get(&workspace_key), Op::Get(&lock_key)],
        )?;
        if outcome.succeeded {
            let _ = self
                .etcd
                .delete_prefix(&format!("{}chunks/{ws}/", self.prefix));
            return Ok(());
        }
        let mut kvs = outcome.kvs.into_iter();
        let (marker, lock) = (kvs.next().flatten(), kvs.next().flatten());
        match (marker, lock) {
            (None, _) => Err(Error::NotFound),
            (Some(_), Some(kv)) => Err(Error::locked(lock_from(&kv)?)),
            (Some(_), None) => Err(Error::Unavailable(format!(
                "workspace {ws:?} changed during delete; try again"
            ))),
        }
    }

    fn read_metadata(&self, ws: &str) -> Result<Option<Metadata>, Error> {
        let Some(kv) = self.etcd.get(&self.metadata_key(ws))? else {
            return Ok(None);
        };
        let content = String::from_utf8(kv.value).map_err(|_| {
            Error::Internal(format!(
                "metadata of {ws:?} in etcd is not UTF-8; delete it"
            ))
        })?;
        Ok(Some(Metadata {
            content,
            version: kv.mod_revision.to_string(),
        }))
    }

    fn write_metadata(
        &self,
        ws: &str,
        content: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, Error> {
        let key = self.metadata_key(ws);
        let Ok(expected) = expect_condition(&key, expect) else {
            return Ok(false);
        };
        let change = match content {
            Some(content) => Op::Put(&key, content.as_bytes()),
            None => Op::Delete(&key),
        };
        // One transaction: the comparison and the change are one step.
        let compare: Vec<Compare> = expected.into_iter().collect();
        Ok(self.etcd.txn(&compare, &[change], &[])?.succeeded)
    }
}

register_backend!(EtcdBackend);
wasmstate_guest::manifest!(include_str!("../guest.toml"));
