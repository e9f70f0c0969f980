//! The `local` guest's file layout and protocol (guests/local: lib.rs,
//! cas.rs, stamp.rs), natively in Rust: the baseline that tells what the
//! sandbox costs. Same files, same syscalls: a state or metadata document
//! goes to a temp file (fsync), then under the write marker
//! (`.<name>.writing`, create-new) the lock is checked again, the stored
//! file's version compared, the temp file's modification time set past the
//! stored one's and the temp file renamed into place; the directory is
//! synced after. A version is (dev, ino) + modification time in ns + size,
//! as the guest's stamp. A lock is a hard link; an unlock reads the lock
//! twice before removing it. Left out, as the bench never meets them:
//! breaking a stale marker (a killed writer's) and sweeping old temp files
//! (the guest's sweep is one directory listing per eight locks, kept here).

use std::fs;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use wasmstate::backend::{
    Expect, Head, LockInfo, MAX_METADATA_BYTES, Metadata, Storage, StorageError, StorageResult,
};

const STATE_FILE: &str = "terraform.tfstate";
const LOCK_FILE: &str = "terraform.tfstate.lock";
const METADATA_DIR: &str = ".wasmstate/metadata";
const TEMP_PREFIX: &str = ".tmp-";
/// The guest's marker rules (stamp.rs): hold it at most 2 s, wait for
/// another writer's at most 8 s.
const HOLD_LIMIT: Duration = Duration::from_secs(2);
const WAIT_LIMIT: Duration = Duration::from_secs(8);
const STALE_TEMP: Duration = Duration::from_secs(2 * 3600);

/// Native twin of `guests/local`.
pub struct NativeLocal {
    root: PathBuf,
    next: AtomicU64,
}

fn io(context: &str, e: std::io::Error) -> StorageError {
    StorageError::Internal(format!("{context}: {e}"))
}

/// What one stored file is (the guest's `stamp::Stamp`).
#[derive(Clone, Copy)]
struct Stamp {
    identity: u64,
    modified: u128,
    size: u64,
}

impl Stamp {
    fn of(meta: &fs::Metadata) -> Stamp {
        let mut hasher = DefaultHasher::new();
        (meta.dev(), meta.ino()).hash(&mut hasher);
        Stamp {
            identity: hasher.finish(),
            modified: meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos()),
            size: meta.len(),
        }
    }

    fn version(&self) -> String {
        let second = 1_000_000_000;
        format!(
            "{:016x}.{}.{:09}.{}",
            self.identity,
            self.modified / second,
            self.modified % second,
            self.size
        )
    }
}

/// A zero-byte file is nothing stored, as for the guest.
fn stored(stamp: Option<Stamp>) -> Option<Stamp> {
    stamp.filter(|s| s.size > 0)
}

fn matches(expect: &Expect, current: Option<&Stamp>) -> bool {
    match (expect, current) {
        (Expect::Any, _) | (Expect::Absent, None) => true,
        (Expect::Absent, Some(_)) | (Expect::Version(_), None) => false,
        (Expect::Version(version), Some(stamp)) => *version == stamp.version(),
    }
}

fn stamp_at(path: &Path) -> StorageResult<Option<Stamp>> {
    match fs::symlink_metadata(path) {
        Ok(meta) => Ok(Some(Stamp::of(&meta))),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io("stat", e)),
    }
}

/// `path` opened, with the stamp of the open file; `None` when missing.
fn open(path: &Path) -> StorageResult<Option<(fs::File, Stamp)>> {
    let file = match fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("open", e)),
    };
    let stamp = Stamp::of(&file.metadata().map_err(|e| io("stat", e))?);
    Ok(Some((file, stamp)))
}

/// Take the write marker at `path`, waiting for another writer's; `None`
/// when its directory does not exist.
fn take_marker(path: &Path) -> StorageResult<Option<(fs::File, Instant)>> {
    let start = Instant::now();
    for attempt in 0u32.. {
        match fs::File::create_new(path) {
            Ok(file) => return Ok(Some((file, Instant::now()))),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io("create marker", e)),
        }
        if start.elapsed() >= WAIT_LIMIT {
            break;
        }
        std::thread::sleep(Duration::from_micros(
            (100u64 << attempt.min(8)).min(20_000),
        ));
    }
    Err(StorageError::Unavailable(format!(
        "{} held",
        path.display()
    )))
}

/// The guest's `cas::switch`: replace `dir/name` with `temp` (`None`:
/// remove it) only if it is as `expect` says and `guard` passes, under the
/// marker.
fn switch(
    dir: &Path,
    name: &str,
    temp: Option<(&Path, &fs::File)>,
    expect: &Expect,
    guard: impl FnOnce() -> StorageResult<()>,
) -> StorageResult<bool> {
    let marker = dir.join(format!(".{name}.writing"));
    let Some((_held, since)) = take_marker(&marker)? else {
        guard()?;
        return Ok(matches(expect, None));
    };
    let outcome = swap_under(&dir.join(name), temp, expect, guard, since);
    let _ = fs::remove_file(&marker);
    outcome
}

fn swap_under(
    target: &Path,
    temp: Option<(&Path, &fs::File)>,
    expect: &Expect,
    guard: impl FnOnce() -> StorageResult<()>,
    since: Instant,
) -> StorageResult<bool> {
    guard()?;
    let found = stamp_at(target)?;
    if !matches(expect, stored(found).as_ref()) {
        return Ok(false);
    }
    let in_time = || {
        if since.elapsed() < HOLD_LIMIT {
            return Ok(());
        }
        Err(StorageError::Unavailable("marker held too long".into()))
    };
    match temp {
        Some((temp, file)) => {
            // Past the file it replaces, so no version repeats (stamp.rs).
            let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
            let when = found.map_or(now.as_nanos(), |f| now.as_nanos().max(f.modified + 1_000));
            file.set_modified(UNIX_EPOCH + Duration::from_nanos(when as u64))
                .map_err(|e| io("set mtime", e))?;
            in_time()?;
            fs::rename(temp, target).map_err(|e| io("rename", e))?;
        }
        None => {
            in_time()?;
            match fs::remove_file(target) {
                Err(e) if e.kind() != ErrorKind::NotFound => return Err(io("remove", e)),
                _ => {}
            }
        }
    }
    Ok(true)
}

impl NativeLocal {
    /// Store under `root`.
    pub fn new(root: &Path) -> Self {
        fs::create_dir_all(root).unwrap();
        NativeLocal {
            root: root.to_path_buf(),
            next: AtomicU64::new(0),
        }
    }

    /// A fresh temp file in `dir` holding `bytes`, synced; `make_dir` is
    /// asked only when `dir` is missing, as the guest does.
    fn write_temp(
        &self,
        dir: &Path,
        bytes: &[u8],
        make_dir: impl Fn() -> StorageResult<()>,
    ) -> StorageResult<(PathBuf, fs::File)> {
        let mut made = false;
        loop {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!("{TEMP_PREFIX}{n:016x}"));
            let mut file = match fs::File::create_new(&path) {
                Ok(file) => file,
                Err(e) if e.kind() == ErrorKind::NotFound && !made => {
                    make_dir()?;
                    made = true;
                    continue;
                }
                Err(e) => return Err(io("create", e)),
            };
            if let Err(e) = file.write_all(bytes).and_then(|()| file.sync_all()) {
                let _ = fs::remove_file(&path);
                return Err(io("write", e));
            }
            return Ok((path, file));
        }
    }

    /// Create `dir` unless it exists, syncing its parent.
    fn ensure_dir(&self, dir: &Path) -> StorageResult<()> {
        match fs::create_dir(dir) {
            Ok(()) => self.sync_dir(dir.parent().unwrap()),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(io("mkdir", e)),
        }
    }

    /// After [`switch`]: remove the temp file unless it took the target's
    /// place, and sync the directory when it did.
    fn settle(
        &self,
        temp: &Path,
        switched: StorageResult<bool>,
        dir: &Path,
    ) -> StorageResult<bool> {
        if !matches!(switched, Ok(true)) {
            let _ = fs::remove_file(temp);
        }
        let switched = switched?;
        if switched {
            self.sync_dir(dir)?;
        }
        Ok(switched)
    }

    fn holder(&self, ws: &str) -> StorageResult<Option<LockInfo>> {
        match fs::read(self.root.join(ws).join(LOCK_FILE)) {
            Ok(bytes) => Ok(Some(
                serde_json::from_slice(&bytes)
                    .map_err(|e| StorageError::Internal(e.to_string()))?,
            )),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("read lock", e)),
        }
    }

    /// Make the directory entries of `dir` durable, as the guest does.
    fn sync_dir(&self, dir: &Path) -> StorageResult<()> {
        fs::File::open(dir)
            .and_then(|dir| dir.sync_all())
            .map_err(|e| io("fsync dir", e))
    }

    fn check_lock(&self, ws: &str, lock_id: Option<&str>) -> StorageResult<()> {
        match (self.holder(ws)?, lock_id) {
            (Some(h), Some(id)) if h.id == id => Ok(()),
            (Some(h), _) => Err(StorageError::Locked(h)),
            (None, Some(_)) => Err(StorageError::LockMismatch(None)),
            (None, None) => Ok(()),
        }
    }

    /// The guest's sweep of temp files older than two hours.
    fn sweep_debris(&self, dir: &Path) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX)
                && let Ok(meta) = entry.metadata()
                && meta
                    .modified()
                    .is_ok_and(|t| t.elapsed().unwrap_or_default() > STALE_TEMP)
            {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

impl Storage for NativeLocal {
    fn conditional_writes(&self) -> bool {
        true
    }

    async fn read(&self, ws: &str) -> StorageResult<Option<Vec<u8>>> {
        match fs::read(self.root.join(ws).join(STATE_FILE)) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("read", e)),
        }
    }

    /// What a native backend would do for the stale-write guard: read
    /// only the beginning of the file.
    async fn read_prefix(&self, ws: &str, max: usize) -> StorageResult<Option<Vec<u8>>> {
        let file = match fs::File::open(self.root.join(ws).join(STATE_FILE)) {
            Ok(file) => file,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("open", e)),
        };
        let mut prefix = Vec::with_capacity(max);
        file.take(max as u64)
            .read_to_end(&mut prefix)
            .map_err(|e| io("read", e))?;
        Ok(Some(prefix))
    }

    /// Open once, stat the open file, read its first bytes as the guest
    /// and the host's head sink do: a state of up to 64 KiB whole, a
    /// larger one's first 4 KiB, and more (to 64 KiB) only if lineage and
    /// serial are not in them.
    async fn head(&self, ws: &str) -> StorageResult<Option<Head>> {
        let Some((file, stamp)) = open(&self.root.join(ws).join(STATE_FILE))? else {
            return Ok(None);
        };
        let Some(stamp) = stored(Some(stamp)) else {
            return Ok(None);
        };
        let max = stamp.size.min(wasmstate::statefile::PREFIX_BYTES as u64);
        let first = if stamp.size <= max { max } else { 4 << 10 };
        let mut prefix = Vec::with_capacity(first as usize);
        let mut file = file.take(max);
        (&mut file)
            .take(first)
            .read_to_end(&mut prefix)
            .map_err(|e| io("read", e))?;
        if wasmstate::statefile::version_in_prefix(&prefix).is_none() {
            file.read_to_end(&mut prefix).map_err(|e| io("read", e))?;
        }
        Ok(Some(Head {
            version: stamp.version(),
            size: stamp.size,
            digest: None,
            prefix,
        }))
    }

    async fn write(
        &self,
        ws: &str,
        state: bytes::Bytes,
        lock_id: Option<&str>,
    ) -> StorageResult<()> {
        self.write_if(ws, state, lock_id, Expect::Any)
            .await
            .map(|_| ())
    }

    async fn write_if(
        &self,
        ws: &str,
        state: bytes::Bytes,
        lock_id: Option<&str>,
        expect: Expect,
    ) -> StorageResult<bool> {
        // The lock is checked before the body is written and again under
        // the marker, as the guest does.
        self.check_lock(ws, lock_id)?;
        let dir = self.root.join(ws);
        let (temp, file) = self.write_temp(&dir, &state, || self.ensure_dir(&dir))?;
        let switched = switch(&dir, STATE_FILE, Some((&temp, &file)), &expect, || {
            self.check_lock(ws, lock_id)
        });
        self.settle(&temp, switched, &dir)
    }

    async fn delete(&self, ws: &str, lock_id: Option<&str>) -> StorageResult<()> {
        self.check_lock(ws, lock_id)?;
        let dir = self.root.join(ws);
        switch(&dir, STATE_FILE, None, &Expect::Any, || {
            self.check_lock(ws, lock_id)
        })?;
        match self.sync_dir(&dir) {
            Err(_) if !dir.is_dir() => Ok(()),
            other => other,
        }
    }

    async fn lock(&self, ws: &str, info: LockInfo) -> StorageResult<()> {
        let dir = self.root.join(ws);
        let json = serde_json::to_vec(&info).unwrap();
        let (temp, _) = self.write_temp(&dir, &json, || self.ensure_dir(&dir))?;
        let linked = fs::hard_link(&temp, dir.join(LOCK_FILE));
        let _ = fs::remove_file(&temp);
        // As the guest: one lock in eight sweeps (the guest's are at random).
        if self.next.load(Ordering::Relaxed).is_multiple_of(8) {
            self.sweep_debris(&dir);
        }
        match linked {
            Ok(()) => self.sync_dir(&dir),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => match self.holder(ws)? {
                Some(h) if h.id == info.id => Ok(()),
                Some(h) => Err(StorageError::Locked(h)),
                None => Err(StorageError::Unavailable("retry".into())),
            },
            Err(e) => Err(io("link", e)),
        }
    }

    /// As the guest: read the lock, check the id, read it again and remove
    /// it only if unchanged.
    async fn unlock(&self, ws: &str, id: &str) -> StorageResult<()> {
        let path = self.root.join(ws).join(LOCK_FILE);
        let read = || match fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("read lock", e)),
        };
        let Some(first) = read()? else {
            return Ok(());
        };
        match serde_json::from_slice::<LockInfo>(&first) {
            Ok(h) if h.id == id => {}
            h => return Err(StorageError::LockMismatch(h.ok())),
        }
        match read()? {
            Some(again) if again == first => {}
            Some(other) => {
                return Err(StorageError::LockMismatch(
                    serde_json::from_slice(&other).ok(),
                ));
            }
            None => return Ok(()),
        }
        let _ = fs::remove_file(&path);
        self.sync_dir(&self.root.join(ws))
    }

    async fn current_lock(&self, ws: &str) -> StorageResult<Option<LockInfo>> {
        self.holder(ws)
    }

    async fn force_unlock(&self, ws: &str) -> StorageResult<Option<LockInfo>> {
        let holder = self.holder(ws);
        let _ = fs::remove_file(self.root.join(ws).join(LOCK_FILE));
        self.sync_dir(&self.root.join(ws))?;
        Ok(holder.unwrap_or(None))
    }

    async fn list_workspaces(&self) -> StorageResult<Vec<String>> {
        Ok(fs::read_dir(&self.root)
            .map_err(|e| io("list", e))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect())
    }

    async fn create_workspace(&self, name: &str) -> StorageResult<bool> {
        match fs::create_dir(self.root.join(name)) {
            Ok(()) => self.sync_dir(&self.root).map(|()| true),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(io("mkdir", e)),
        }
    }

    async fn delete_workspace(&self, name: &str) -> StorageResult<()> {
        if !self.root.join(name).is_dir() {
            return Err(StorageError::NotFound);
        }
        if let Some(h) = self.holder(name)? {
            return Err(StorageError::Locked(h));
        }
        // Metadata first, as the guest: never left for a new namesake.
        self.write_metadata(name, None, Expect::Any).await?;
        fs::remove_dir_all(self.root.join(name)).map_err(|e| io("rmdir", e))?;
        self.sync_dir(&self.root)
    }

    async fn read_metadata(&self, ws: &str) -> StorageResult<Option<Metadata>> {
        let path = self.root.join(METADATA_DIR).join(format!("{ws}.json"));
        let Some((mut file, stamp)) = open(&path)? else {
            return Ok(None);
        };
        let Some(stamp) = stored(Some(stamp)) else {
            return Ok(None);
        };
        if stamp.size > MAX_METADATA_BYTES as u64 {
            return Err(StorageError::Internal("metadata over 64 KiB".into()));
        }
        let mut content = String::new();
        file.read_to_string(&mut content)
            .map_err(|e| io("read metadata", e))?;
        Ok(Some(Metadata {
            content,
            version: stamp.version(),
        }))
    }

    async fn write_metadata(
        &self,
        ws: &str,
        content: Option<String>,
        expect: Expect,
    ) -> StorageResult<bool> {
        let dir = self.root.join(METADATA_DIR);
        let name = format!("{ws}.json");
        let Some(content) = content else {
            let removed = switch(&dir, &name, None, &expect, || Ok(()))?;
            if removed && dir.is_dir() {
                self.sync_dir(&dir)?;
            }
            return Ok(removed);
        };
        if content.is_empty() || content.len() > MAX_METADATA_BYTES {
            return Err(StorageError::InvalidInput(format!(
                "workspace metadata must be 1 byte to 64 KiB, not {} bytes",
                content.len()
            )));
        }
        let (temp, file) = self.write_temp(&dir, content.as_bytes(), || {
            self.ensure_dir(dir.parent().unwrap())?;
            self.ensure_dir(&dir)
        })?;
        let switched = switch(&dir, &name, Some((&temp, &file)), &expect, || Ok(()));
        self.sweep_debris(&dir);
        self.settle(&temp, switched, &dir)
    }
}
