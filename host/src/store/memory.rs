//! One workspace's storage in memory with conditional writes of its own
//! (a version per write, compared in one step with the switch), counting
//! every call: for the tests of the write path
//! ([`crate::protocol`]'s conditional writes) and of [`super::Store`].

use crate::backend::{Expect, Head, LockInfo, Storage, StorageError, StorageResult};
use bytes::Bytes;
use std::sync::Mutex;

/// See the module.
#[derive(Default)]
pub(crate) struct Memory {
    /// The stored state and its version.
    state: Mutex<Option<(u64, Vec<u8>)>>,
    versions: std::sync::atomic::AtomicU64,
    lock: Mutex<Option<LockInfo>>,
    /// Every call, by name, in order.
    pub calls: Mutex<Vec<&'static str>>,
    /// The first `racers` heads wait for each other after answering, so
    /// racers all judge the same stored state before any of them writes.
    pub racers: usize,
    barrier: std::sync::OnceLock<tokio::sync::Barrier>,
    heads: std::sync::atomic::AtomicUsize,
    /// Heads carry the `md5:` digest of the stored bytes.
    pub digest: bool,
    /// Conditional writes all answer `false` (a state that keeps changing).
    pub always_changed: bool,
    /// The expectation of every conditional write, in order.
    pub expected: Mutex<Vec<(Expect, Option<String>)>>,
    /// Stored (as another writer's) just before the next read answers.
    pub before_read: Mutex<Option<Vec<u8>>>,
    /// Stored (as an unlocked write that passed its lock check earlier)
    /// just after the `n`th read (from 1) answers: `(n, bytes)`.
    pub after_read: Mutex<Option<(usize, Vec<u8>)>>,
    reads: std::sync::atomic::AtomicUsize,
}

impl Memory {
    /// Storage holding `bytes` (as if written once).
    pub(crate) fn holding(bytes: &[u8]) -> Memory {
        let memory = Memory::default();
        memory.put(bytes);
        memory
    }

    /// Replace the stored state (another writer), as a new version.
    pub(crate) fn put(&self, bytes: &[u8]) {
        let version = self.next_version();
        *self.state.lock().unwrap() = Some((version, bytes.to_vec()));
    }

    /// The stored bytes.
    pub(crate) fn stored(&self) -> Option<Vec<u8>> {
        self.state.lock().unwrap().as_ref().map(|(_, b)| b.clone())
    }

    /// The calls made so far, then forget them.
    pub(crate) fn take_calls(&self) -> Vec<&'static str> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }

    fn next_version(&self) -> u64 {
        self.versions
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1
    }

    fn call(&self, name: &'static str) {
        self.calls.lock().unwrap().push(name);
    }

    fn check_lock(&self, id: Option<&str>) -> StorageResult<()> {
        match (&*self.lock.lock().unwrap(), id) {
            (Some(held), Some(id)) if held.id == id => Ok(()),
            (Some(held), _) => Err(StorageError::Locked(held.clone())),
            (None, Some(_)) => Err(StorageError::LockMismatch(None)),
            (None, None) => Ok(()),
        }
    }
}

impl Storage for Memory {
    fn conditional_writes(&self) -> bool {
        true
    }
    async fn head(&self, _: &str) -> StorageResult<Option<Head>> {
        self.call("head");
        let head = self.state.lock().unwrap().as_ref().map(|(version, bytes)| {
            use md5::Digest;
            Head {
                version: version.to_string(),
                size: bytes.len() as u64,
                digest: self
                    .digest
                    .then(|| format!("md5:{}", hex::encode(md5::Md5::digest(bytes)))),
                prefix: bytes[..bytes.len().min(crate::statefile::PREFIX_BYTES)].to_vec(),
            }
        });
        let nth = self.heads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if nth < self.racers {
            let barrier = self
                .barrier
                .get_or_init(|| tokio::sync::Barrier::new(self.racers));
            barrier.wait().await;
        }
        Ok(head)
    }
    async fn write_if(
        &self,
        _: &str,
        state: Bytes,
        lock_id: Option<&str>,
        expect: Expect,
    ) -> StorageResult<bool> {
        self.call("write_if");
        self.expected
            .lock()
            .unwrap()
            .push((expect.clone(), lock_id.map(str::to_string)));
        self.check_lock(lock_id)?;
        let mut stored = self.state.lock().unwrap();
        let as_expected = match (&expect, &*stored) {
            (Expect::Any, _) | (Expect::Absent, None) => true,
            (Expect::Version(v), Some((version, _))) => *v == version.to_string(),
            _ => false,
        };
        if !as_expected || self.always_changed {
            return Ok(false);
        }
        *stored = Some((self.next_version(), state.to_vec()));
        Ok(true)
    }
    async fn read(&self, _: &str) -> StorageResult<Option<Vec<u8>>> {
        self.call("read");
        if let Some(bytes) = self.before_read.lock().unwrap().take() {
            self.put(&bytes);
        }
        let answer = self.stored();
        let nth = self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let mut after = self.after_read.lock().unwrap();
        if after.as_ref().is_some_and(|(n, _)| *n == nth) {
            let (_, bytes) = after.take().unwrap();
            self.put(&bytes);
        }
        Ok(answer)
    }
    async fn read_prefix(&self, _: &str, max: usize) -> StorageResult<Option<Vec<u8>>> {
        self.call("read_prefix");
        Ok(self.stored().map(|mut b| {
            b.truncate(max);
            b
        }))
    }
    async fn holds(&self, _: &str, state: &Bytes) -> StorageResult<bool> {
        self.call("holds");
        Ok(self.stored().as_deref() == Some(&state[..]))
    }
    async fn write(&self, _: &str, state: Bytes, lock_id: Option<&str>) -> StorageResult<()> {
        self.call("write");
        self.check_lock(lock_id)?;
        self.put(&state);
        Ok(())
    }
    async fn delete(&self, _: &str, lock_id: Option<&str>) -> StorageResult<()> {
        self.call("delete");
        self.check_lock(lock_id)?;
        *self.state.lock().unwrap() = None;
        Ok(())
    }
    async fn lock(&self, _: &str, info: LockInfo) -> StorageResult<()> {
        self.call("lock");
        let mut lock = self.lock.lock().unwrap();
        match &*lock {
            Some(held) if held.id != info.id => Err(StorageError::Locked(held.clone())),
            _ => {
                *lock = Some(info);
                Ok(())
            }
        }
    }
    async fn unlock(&self, _: &str, id: &str) -> StorageResult<()> {
        self.call("unlock");
        let mut lock = self.lock.lock().unwrap();
        match &*lock {
            Some(held) if held.id != id => Err(StorageError::LockMismatch(Some(held.clone()))),
            _ => {
                *lock = None;
                Ok(())
            }
        }
    }
    async fn current_lock(&self, _: &str) -> StorageResult<Option<LockInfo>> {
        Ok(self.lock.lock().unwrap().clone())
    }
    async fn force_unlock(&self, _: &str) -> StorageResult<Option<LockInfo>> {
        Ok(self.lock.lock().unwrap().take())
    }
    async fn list_workspaces(&self) -> StorageResult<Vec<String>> {
        Ok(vec!["default".into()])
    }
    async fn create_workspace(&self, _: &str) -> StorageResult<bool> {
        Ok(false)
    }
    async fn delete_workspace(&self, _: &str) -> StorageResult<()> {
        *self.state.lock().unwrap() = None;
        Ok(())
    }
}
