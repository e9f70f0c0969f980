// A wasmstate storage guest in JavaScript (componentize-js).
//
// Each workspace is a directory in the one directory the operator grants
// (`/data`), the layout of wasmstate's own `local` guest:
//
//   /data/<workspace>/terraform.tfstate        the state
//   /data/<workspace>/terraform.tfstate.lock   LockInfo JSON while locked
//   /data/<workspace>/metadata/<n>.json        metadata version n: a random token line, the document
//
// Two atomic filesystem operations carry correctness across requests and
// hosts: a rename replaces a state whole (readers never see a torn one), and
// a hard link creates a file with its full content or fails because it
// exists (a lock is never granted twice, never seen half-written; metadata
// version n+1 is written by exactly one of two racing writers).
//
// A conditional write (contract 0.3.0: `expect`) must check what is stored
// and replace it in one step. A directory has no "rename if the target is
// still this file", so the check and the rename run under the workspace's
// lock: the caller's, or, for a write sent without one, a lock this guest
// takes for those few calls (a racing writer waits for it, then finds the
// state changed; a write the host stopped inside, at its timeout, leaves
// that lock, which the next writer or locker removes once it is older than
// any request runs: `staleWriteLock`). A state's version is its file's identity: inode, size
// and modification time, whose nanoseconds a write sets at random so that
// a reused inode never brings back an old version.
//
// A state moves between its file and the host without entering this guest's
// memory: `into.copyFrom(stream)` and `state.copyTo(stream)` (the `body`
// interface, contract 0.2.1) copy a WASI file stream in one call, host-side.
// Reading 1 MiB chunks with `state.read(max)` or `file.read(…)` instead
// would keep every chunk's buffer until the instance ends (componentize-js
// does not free what an import returns), so a state larger than the memory
// cap would fail.
//
// The host makes a fresh instance for every request: keep nothing in memory
// between calls. A contract error is thrown as the variant itself
// (`{ tag: 'locked', val: holder }`); anything else thrown is caught, logged
// with its stack, and reported as `internal`, so a bug reads as a message,
// not a crash.

import { subscribeDuration } from 'wasi:clocks/monotonic-clock@0.2.12';
import { now } from 'wasi:clocks/wall-clock@0.2.12';
import { getDirectories } from 'wasi:filesystem/preopens@0.2.12';
import { getRandomBytes } from 'wasi:random/random@0.2.12';
import { getConfig, log } from 'wasmstate:backend/host@0.3.0';

const STATE = 'terraform.tfstate';
const LOCK = 'terraform.tfstate.lock';
const META = 'metadata';
// The operation named in the lock this guest takes for a write sent
// without one (a client sees it only if it asks while such a write runs).
const WRITE_LOCK = 'wasmstate-guest-write';
// The operation named in the lock a workspace delete takes while it runs.
const DELETE_LOCK = 'wasmstate-guest-delete';
// A write whose workspace a delete removed while it was under way.
const DELETED_MEANWHILE = 'the workspace was deleted while this write was under way; nothing was stored';
// Older than any request may run (the host stops each within its timeout,
// at most an hour): superseded metadata versions are removed after it.
const STALE_AFTER_S = 2n * 3600n;
// The keys this guest understands; any other is reported by `validate`.
const KNOWN_KEYS = ['fsync'];
// Bytes read per call from a small file (a lock).
const CHUNK = 64n << 10n;

const NOFOLLOW = { symlinkFollow: false };

/** A contract error, thrown as the variant. */
class Failure {
  constructor(tag, val) {
    this.tag = tag;
    if (val !== undefined) this.val = val;
  }
}

/** The WASI error code of a failed filesystem call (`exist`, `no-entry`…). */
function code(e) {
  return e && typeof e === 'object' && 'payload' in e ? e.payload : undefined;
}

/** Run `body`; anything but a contract error becomes `internal`. */
function guarded(body) {
  return (...args) => {
    try {
      return body(...args);
    } catch (e) {
      if (e instanceof Failure) throw e;
      const detail = code(e) ?? (e && e.message) ?? String(e);
      log('error', `${detail}\n${(e && e.stack) || ''}`);
      // The client learns the kind of failure; its text (paths, data)
      // stays in the server's log.
      const kind = code(e) ?? (e && e.name) ?? 'error';
      throw new Failure('internal', `filesystem: ${kind}; details in the server log`);
    }
  };
}

function root() {
  const found = getDirectories().find(([, path]) => path === '/data');
  if (!found) throw new Failure('internal', 'no directory was granted at /data (the backend needs `dir`)');
  return found[0];
}

function settings() {
  return new Map(getConfig());
}

function fsyncEnabled() {
  return settings().get('fsync') !== 'false';
}

/** The file opened for reading; `undefined` when missing. */
function openRead(dir, path) {
  try {
    return dir.openAt(NOFOLLOW, path, {}, { read: true });
  } catch (e) {
    if (code(e) === 'no-entry') return undefined;
    throw e;
  }
}

/** The chunks of an open file, in order, to its end (a read may return fewer bytes). */
function* fileChunks(file) {
  let offset = 0n;
  for (;;) {
    const [bytes, end] = file.read(CHUNK, offset);
    if (bytes.length > 0) yield bytes;
    offset += BigInt(bytes.length);
    if (end || bytes.length === 0) return;
  }
}

/** Run a host-side copy (`copyTo`, `copyFrom`); its failure (a message)
 * as a contract error. */
function copied(what, copy) {
  try {
    return copy();
  } catch (e) {
    throw new Failure('internal', `${what}: ${code(e) ?? e}`);
  }
}

/** Let the host copy a file to its `state-sink`, to the end of the file or
 * until it has what it needs; `false` when the file is missing. */
function copyToSink(dir, path, into) {
  const file = openRead(dir, path);
  if (file === undefined) return false;
  copied('reading the state file', () => into.copyFrom(file.readViaStream(0n)));
  return true;
}

/** The whole of a small file (a lock); `undefined` when missing. */
function readFile(dir, path) {
  const file = openRead(dir, path);
  if (file === undefined) return undefined;
  const parts = [];
  let total = 0;
  for (const bytes of fileChunks(file)) {
    parts.push(bytes);
    total += bytes.length;
  }
  const out = new Uint8Array(total);
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.length;
  }
  return out;
}

/** A `fill` for `writeTemp`: these few bytes (a lock). */
function writeBytes(bytes) {
  return (file) => {
    let done = 0;
    while (done < bytes.length) done += Number(file.write(bytes.subarray(done), BigInt(done)));
  };
}

/** A `fill` for `writeTemp`: the state the host hands us, copied by the
 * host into the file's stream, then stamped with random nanoseconds (the
 * version `versionOf` reads). */
function writeState(state) {
  return (file) => {
    copied('writing the state file', () => state.copyTo(file.writeViaStream(0n)));
    const nanoseconds = new DataView(getRandomBytes(4n).buffer).getUint32(0) % 1_000_000_000;
    file.setTimes({ tag: 'no-change' }, { tag: 'timestamp', val: { seconds: now().seconds, nanoseconds } });
  };
}

/** An open file's version (identity, modification time, size) and size. */
function versionOf(file) {
  const { lower } = file.metadataHash();
  const { size, dataModificationTimestamp: m } = file.stat();
  return [`${lower.toString(16)}.${m.seconds.toString(16)}.${m.nanoseconds.toString(16)}.${size.toString(16)}`, size];
}

/** Whether the stored version (`undefined`: nothing stored) is as `expect` says. */
function expected(version, expect) {
  if (expect.tag === 'version') return version === expect.val;
  if (expect.tag === 'absent') return version === undefined;
  return true;
}

function isDir(dir, path) {
  try {
    return dir.statAt(NOFOLLOW, path).type === 'directory';
  } catch (e) {
    if (code(e) === 'no-entry') return false;
    throw e;
  }
}

/** Make directory `path` unless it exists; whether it was made now. */
function ensureDir(dir, path) {
  try {
    dir.createDirectoryAt(path);
    return true;
  } catch (e) {
    if (code(e) !== 'exist') throw e;
    return false;
  }
}

function remove(dir, path) {
  try {
    dir.unlinkFileAt(path);
  } catch (e) {
    if (code(e) !== 'no-entry') throw e;
  }
}

/** The entries of directory `path` (`[]` once it is gone). */
function entriesOf(dir, path) {
  const found = [];
  try {
    const entries = dir.openAt(NOFOLLOW, path, { directory: true }, { read: true }).readDirectory();
    for (let entry = entries.readDirectoryEntry(); entry; entry = entries.readDirectoryEntry()) found.push(entry);
  } catch (e) {
    if (code(e) !== 'no-entry') throw e;
  }
  return found;
}

function randomName() {
  return Array.from(getRandomBytes(8n), (b) => b.toString(16).padStart(2, '0')).join('');
}

/** Create a new, uniquely named file beside the target, written by
 * `fill(file)`; the caller renames or links it into place. `make`: create
 * the workspace's directory if missing. */
function writeTemp(dir, workspace, fill, make = true) {
  let made = make && ensureDir(dir, workspace);
  // A delete may remove the directory between its making and the file's
  // creation: it is made again, twice more at most, as for a request a
  // moment later.
  let remade = 0;
  for (;;) {
    const temp = `${workspace}/.tmp-${randomName()}`;
    let file;
    try {
      file = dir.openAt(NOFOLLOW, temp, { create: true, exclusive: true }, { write: true });
    } catch (e) {
      if (code(e) === 'exist') continue;
      if (!make || code(e) !== 'no-entry') throw e;
      if (remade === 2 && !made) {
        // Found there by the last make, yet refusing the file (a dangling
        // link, most likely): not a race, and no retry helps.
        throw new Failure('internal', `cannot create a file in ${workspace}: no-entry, though it exists`);
      }
      if (remade === 2) throw e;
      remade += 1;
      made = ensureDir(dir, workspace);
      continue;
    }
    try {
      fill(file);
      if (fsyncEnabled()) file.syncData();
      return temp;
    } catch (e) {
      remove(dir, temp);
      throw e;
    }
  }
}

const FIELDS = [
  ['id', 'ID'],
  ['operation', 'Operation'],
  ['info', 'Info'],
  ['who', 'Who'],
  ['version', 'Version'],
  ['created', 'Created'],
  ['path', 'Path'],
];

function lockToJson(info) {
  return new TextEncoder().encode(JSON.stringify(Object.fromEntries(FIELDS.map(([k, j]) => [j, info[k]]))));
}

/** The lock holder, or `undefined` when unlocked. */
function holder(dir, workspace) {
  const bytes = readFile(dir, `${workspace}/${LOCK}`);
  if (bytes === undefined) return undefined;
  try {
    const json = JSON.parse(new TextDecoder().decode(bytes));
    return Object.fromEntries(FIELDS.map(([k, j]) => [k, String(json[j] ?? '')]));
  } catch (e) {
    throw new Failure('internal', `lock file of workspace "${workspace}" is not LockInfo JSON (${e}); force-unlock it`);
  }
}

function checkLock(dir, workspace, lockId) {
  const current = holder(dir, workspace);
  if (current !== undefined && current.id !== lockId) {
    if (lockId === undefined && current.operation === WRITE_LOCK) return; // `writeTurn` waits for it
    throw new Failure('locked', current);
  }
  if (current === undefined && lockId !== undefined) throw new Failure('lock-mismatch', undefined);
}

/** Link a lock file holding `info` into place; `locked` when someone else
 * holds the lock. A workspace delete running beside it may remove the
 * workspace, temporary file and all: then the lock is taken again, after
 * the delete (`make` false: the workspace must exist). */
function takeLock(dir, workspace, info, make = true) {
  for (let vanished = 0; vanished < 3; vanished++) {
    if (!make && !isDir(dir, workspace)) throw new Failure('not-found');
    let temp;
    try {
      temp = writeTemp(dir, workspace, writeBytes(lockToJson(info)), make);
      for (let attempt = 0; attempt < 100; attempt++) {
        try {
          dir.linkAt(NOFOLLOW, temp, dir, `${workspace}/${LOCK}`);
          return;
        } catch (e) {
          if (code(e) !== 'exist') throw e; // 'no-entry': deleted meanwhile, below
          const current = holder(dir, workspace);
          if (current === undefined) continue; // its holder just unlocked: try again
          if (current.id === info.id) return; // a retry of a lock we hold
          if (staleWriteLock(current) && takeOver(dir, workspace, current)) continue;
          throw new Failure('locked', current);
        }
      }
      throw new Failure('unavailable', `the lock of "${workspace}" kept changing hands`);
    } catch (e) {
      if (code(e) !== 'no-entry') throw e; // lock it afresh
    } finally {
      if (temp !== undefined) remove(dir, temp);
    }
  }
  throw new Failure('unavailable', `"${workspace}" was deleted three times while being locked; try again`);
}

/** Whether `current` is a lock this guest took for a write sent without
 * one, taken longer ago than any request runs: the host stopped that write
 * between its lock and its release (a timeout), and nobody else will ever
 * remove it. */
function staleWriteLock(current) {
  if (current.operation !== WRITE_LOCK) return false;
  const created = Date.parse(current.created);
  if (Number.isNaN(created)) return false;
  return BigInt(Math.floor(created / 1000)) < now().seconds - STALE_AFTER_S;
}

/** Remove the stale guest-write lock `stale`, by one writer only: the one
 * that links its marker `.stale-<id>` first. Without the marker, a second
 * writer that read the same stale lock could remove the first one's fresh
 * lock. A marker outlives any request that may have read its lock (it is
 * swept after the same bound), so it is never won twice. Whether this
 * writer removed it (false: another one is). */
function takeOver(dir, workspace, stale) {
  const cutoff = now().seconds - STALE_AFTER_S;
  for (const entry of entriesOf(dir, workspace)) {
    if (!entry.name.startsWith('.stale-')) continue;
    const marker = `${workspace}/${entry.name}`;
    try {
      if (dir.statAt(NOFOLLOW, marker).dataModificationTimestamp.seconds < cutoff) remove(dir, marker);
    } catch (e) {
      if (code(e) !== 'no-entry') throw e;
    }
  }
  const temp = writeTemp(dir, workspace, writeBytes(new Uint8Array(0)));
  try {
    dir.linkAt(NOFOLLOW, temp, dir, `${workspace}/.stale-${stale.id}`);
  } catch (e) {
    if (code(e) !== 'exist') throw e;
    return false;
  } finally {
    remove(dir, temp);
  }
  const current = holder(dir, workspace);
  if (current !== undefined && current.id === stale.id) {
    log('warn', `removed the lock of a write to "${workspace}" stopped mid-way (created ${stale.created})`);
    remove(dir, `${workspace}/${LOCK}`);
  }
  return true;
}

/** Remove the lock if `id` holds it; `lock-mismatch` if another does. */
function release(dir, workspace, id) {
  const current = holder(dir, workspace);
  if (current === undefined) return;
  if (current.id !== id) throw new Failure('lock-mismatch', current);
  remove(dir, `${workspace}/${LOCK}`);
}

/** Run `body` while the workspace is held for a write's check and switch:
 * under the caller's lock (checked again just before), or under a lock of
 * our own, taken for these few calls. */
function writeTurn(dir, workspace, lockId, body) {
  if (lockId !== undefined) {
    checkLock(dir, workspace, lockId);
    return body();
  }
  const id = randomName() + randomName();
  const info = { id, operation: WRITE_LOCK, info: 'a write sent without a lock', who: 'wasmstate', version: '', created: new Date().toISOString(), path: '' };
  for (let attempt = 0; ; attempt++) {
    try {
      takeLock(dir, workspace, info, false);
      break;
    } catch (e) {
      if (e instanceof Failure && e.tag === 'not-found') throw new Failure('unavailable', DELETED_MEANWHILE);
      if (!(e instanceof Failure && e.tag === 'locked' && e.val.operation === WRITE_LOCK)) throw e;
      // 5 s at most: such a lock is held for a few calls.
      if (attempt === 500) throw new Failure('unavailable', `another write to "${workspace}" held it for 5 s; try again (a write the server stopped mid-way leaves its lock, operation ${WRITE_LOCK}: it is removed ${STALE_AFTER_S / 3600n} h after it was taken, or force-unlock the workspace)`);
      subscribeDuration(10_000_000n).block();
    }
  }
  try {
    return body();
  } finally {
    try {
      release(dir, workspace, id);
    } catch (e) {
      if (!(e instanceof Failure)) throw e; // force-unlocked meanwhile: not ours to remove
    }
  }
}

/**
 * The workspace's metadata directory, opened (`undefined` when there is
 * none). A write reads the newest version and links the next through this
 * one descriptor: a delete that removes the directory meanwhile makes the
 * link fail (nothing can be made in a removed directory), where a path would
 * reach a directory made again since, by a create or a first version, and
 * put a version of the deleted workspace on top of it.
 */
function openMetadata(dir, workspace) {
  try {
    return dir.openAt(NOFOLLOW, `${workspace}/${META}`, { directory: true }, { read: true });
  } catch (e) {
    if (code(e) === 'no-entry') return undefined;
    throw e;
  }
}

/** The number of a metadata version's file (`N.json`); `undefined` for
 * any other name. */
function versionNumber(name) {
  const match = /^(\d+)\.json$/.exec(name);
  return match ? Number(match[1]) : undefined;
}

/** The metadata versions in the opened metadata directory, as numbers. A
 * listing that meets an entry removed as it was listed (a delete, a sweep)
 * is made again. */
function metadataVersions(meta) {
  for (let attempt = 0; attempt < 100; attempt++) {
    const versions = [];
    try {
      const entries = meta.readDirectory();
      for (let entry = entries.readDirectoryEntry(); entry; entry = entries.readDirectoryEntry()) {
        const number = versionNumber(entry.name);
        if (number !== undefined) versions.push(number);
      }
    } catch (e) {
      if (code(e) !== 'no-entry') throw e;
      continue;
    }
    return versions;
  }
  throw new Failure('unavailable', 'a metadata directory kept changing while it was listed; try again');
}

/** [newest number or 0, its version, its document or `undefined` when
 * removed], in the opened metadata directory `meta` (`undefined`: none).
 * The version adds the file's random token to its number, so it never
 * comes back after the workspace is deleted and made again. */
function currentMetadata(meta, workspace) {
  if (meta === undefined) return [0, undefined, undefined];
  for (let attempt = 0; attempt < 100; attempt++) {
    const versions = metadataVersions(meta);
    if (versions.length === 0) return [0, undefined, undefined];
    const newest = Math.max(...versions);
    const bytes = readFile(meta, `${newest}.json`);
    if (bytes === undefined) continue; // removed as superseded meanwhile: look again
    const text = new TextDecoder().decode(bytes);
    const newline = text.indexOf('\n');
    return [newest, `${newest}.${text.slice(0, newline)}`, text.slice(newline + 1) || undefined];
  }
  throw new Failure('unavailable', `the metadata of "${workspace}" kept changing`);
}

/** Remove metadata versions up to `upto` (superseded) written longer ago
 * than any request runs: no writer that read one of them as the newest can
 * still be linking its successor. Best effort: it runs after the write it
 * follows was stored, and a later write sweeps again. */
function sweepMetadata(meta, upto) {
  const cutoff = now().seconds - STALE_AFTER_S;
  try {
    for (const version of metadataVersions(meta)) {
      const old = `${version}.json`;
      try {
        const written = meta.statAt(NOFOLLOW, old).dataModificationTimestamp;
        if (version <= upto && written !== undefined && written.seconds < cutoff) remove(meta, old);
      } catch (e) {
        if (code(e) === undefined) throw e; // a WASI error: removed meanwhile
      }
    }
  } catch (e) {
    // The write it follows was stored: never a failure.
    log('warn', `removing superseded metadata versions failed: ${code(e) ?? e?.tag ?? e}`);
  }
}

/** After a first metadata version's directory could not be made: a
 * workspace that is gone was deleted meanwhile (503); anything else looks
 * again. */
function goneUnlessThere(dir, workspace) {
  if (!isDir(dir, workspace)) {
    throw new Failure('unavailable', `workspace "${workspace}" was deleted meanwhile; nothing was stored`);
  }
}

/**
 * Empty and remove a workspace's metadata directory (files only). A version
 * a racing write links in as this runs stays, with its directory: the delete
 * then answers "delete it again".
 */
function removeMetadataDir(dir, path) {
  const number = (name) => versionNumber(name) ?? -1;
  // Oldest first, so no reader takes an older version for the newest.
  const entries = entriesOf(dir, path).sort((a, b) => number(a.name) - number(b.name));
  for (const entry of entries) remove(dir, `${path}/${entry.name}`);
  try {
    dir.removeDirectoryAt(path);
  } catch (e) {
    if (code(e) !== 'no-entry' && code(e) !== 'not-empty') throw e;
  }
}

export const storage = {
  head: guarded((workspace, prefix) => {
    const file = openRead(root(), `${workspace}/${STATE}`);
    if (file === undefined) return undefined;
    const [version, size] = versionOf(file);
    // The host takes the first bytes it needs and stops the copy.
    copied('reading the state file', () => prefix.copyFrom(file.readViaStream(0n)));
    return { version, size, digest: undefined };
  }),

  read: guarded((workspace, into) => copyToSink(root(), `${workspace}/${STATE}`, into)),

  write: guarded((workspace, state, lockId, expect) => {
    const dir = root();
    checkLock(dir, workspace, lockId); // a refused write costs nothing
    let temp;
    try {
      temp = writeTemp(dir, workspace, writeState(state));
    } catch (e) {
      if (code(e) === 'no-entry') throw new Failure('unavailable', DELETED_MEANWHILE);
      throw e;
    }
    try {
      return writeTurn(dir, workspace, lockId, () => {
        const file = openRead(dir, `${workspace}/${STATE}`);
        if (!expected(file && versionOf(file)[0], expect)) return false;
        try {
          dir.renameAt(temp, dir, `${workspace}/${STATE}`);
        } catch (e) {
          if (code(e) === 'no-entry') throw new Failure('unavailable', DELETED_MEANWHILE);
          throw e;
        }
        return true;
      });
    } finally {
      remove(dir, temp); // gone once renamed; left by a refused write
    }
  }),

  delete: guarded((workspace, lockId) => {
    const dir = root();
    checkLock(dir, workspace, lockId);
    if (openRead(dir, `${workspace}/${STATE}`) === undefined) return;
    // Not between a conditional write's check and its rename.
    writeTurn(dir, workspace, lockId, () => remove(dir, `${workspace}/${STATE}`));
  }),

  lock: guarded((workspace, info) => takeLock(root(), workspace, info)),

  unlock: guarded((workspace, id) => release(root(), workspace, id)),

  currentLock: guarded((workspace) => holder(root(), workspace)),

  forceUnlock: guarded((workspace) => {
    const dir = root();
    let current;
    try {
      current = holder(dir, workspace);
    } catch (e) {
      current = undefined; // a corrupt lock is still removed: that is what force is for
    }
    remove(dir, `${workspace}/${LOCK}`);
    return current;
  }),
};

export const workspaces = {
  listWorkspaces: guarded(() => {
    const names = [];
    const entries = root().readDirectory();
    for (let entry = entries.readDirectoryEntry(); entry; entry = entries.readDirectoryEntry()) {
      if (entry.type === 'directory' && !entry.name.startsWith('.')) names.push(entry.name);
    }
    return names;
  }),

  createWorkspace: guarded((name) => {
    try {
      root().createDirectoryAt(name);
      return true;
    } catch (e) {
      if (code(e) === 'exist') return false;
      throw e;
    }
  }),

  // Under a lock of its own, as Terraform's CLI deletes a workspace: a
  // client's lock is refused while it runs (423), never removed with the
  // workspace; what lands once it let go is kept.
  deleteWorkspace: guarded((name) => {
    const dir = root();
    const about = 'a workspace delete; if none runs, force-unlock and delete again';
    const info = { id: randomName() + randomName(), operation: DELETE_LOCK, info: about, who: 'wasmstate', version: '', created: new Date().toISOString(), path: '' };
    try {
      takeLock(dir, name, info, false);
    } catch (e) {
      if (e instanceof Failure && e.tag === 'locked' && e.val.operation === DELETE_LOCK) {
        throw new Failure('unavailable', `another delete of "${name}" is under way; if none is, force-unlock it`);
      }
      throw e;
    }
    try {
      if (holder(dir, name)?.id !== info.id) throw new Failure('unavailable', `the delete's lock of "${name}" was force-unlocked; delete it again`);
      for (const entry of entriesOf(dir, name)) {
        if (entry.name === LOCK) continue;
        if (entry.type === 'directory') removeMetadataDir(dir, `${name}/${entry.name}`);
        else remove(dir, `${name}/${entry.name}`);
      }
    } finally {
      try {
        release(dir, name, info.id);
      } catch (e) {
        if (!(e instanceof Failure)) throw e; // force-unlocked meanwhile: not ours
      }
    }
    // A refused lock's or a stopped write's temporary file may still be
    // there (none of theirs was acknowledged): removed, and tried again.
    for (let attempt = 0; attempt < 4; attempt++) {
      try {
        dir.removeDirectoryAt(name);
        return;
      } catch (e) {
        if (code(e) === 'no-entry') return;
        if (code(e) !== 'not-empty') throw e;
      }
      if (attempt === 3) break;
      const left = entriesOf(dir, name).map((entry) => entry.name);
      if (left.some((entry) => !entry.startsWith('.tmp-'))) break;
      for (const entry of left) remove(dir, `${name}/${entry}`);
    }
    throw new Failure('unavailable', `a lock or write reached "${name}" as it was deleted; it is kept: delete it again`);
  }),

  readMetadata: guarded((name) => {
    const [, version, content] = currentMetadata(openMetadata(root(), name), name);
    return content === undefined ? undefined : { content, version };
  }),

  writeMetadata: guarded((name, content, expect) => {
    const dir = root();
    // Version n+1 is linked into place, which fails if a racing writer made
    // it first: then look again (an `expect` it no longer meets answers false).
    for (let attempt = 0; attempt < 100; attempt++) {
      const meta = openMetadata(dir, name);
      const [number, version, current] = currentMetadata(meta, name);
      if (!expected(current === undefined ? undefined : version, expect)) return false;
      if (content === undefined && current === undefined) return true; // nothing to remove
      if (meta === undefined) {
        // A first version makes the metadata directory, then looks again
        // through it. The workspace itself is never made here (a state
        // write or createWorkspace makes it): a delete may have removed it,
        // and making it again would bring it back.
        try {
          ensureDir(dir, `${name}/${META}`);
        } catch (e) {
          if (code(e) !== 'no-entry') throw e;
          goneUnlessThere(dir, name);
        }
        continue;
      }
      const document = `${randomName()}\n${content ?? ''}`; // no document: removed
      let temp;
      try {
        temp = writeTemp(dir, name, writeBytes(new TextEncoder().encode(document)), false);
      } catch (e) {
        if (code(e) !== 'no-entry') throw e;
        continue; // the workspace was deleted meanwhile: look again
      }
      try {
        dir.linkAt(NOFOLLOW, temp, meta, `${number + 1}.json`);
      } catch (e) {
        if (code(e) === 'exist') continue; // a racing writer made it first
        // A delete removed the temporary file or the metadata directory
        // read above (even if one was made again since): look again.
        if (code(e) !== 'no-entry') throw e;
        continue;
      } finally {
        try {
          remove(dir, temp);
        } catch (e) {
          // Best effort once linked: a temporary file left behind is
          // removed with its workspace, or by a workspace delete.
          if (code(e) === undefined) throw e;
        }
      }
      sweepMetadata(meta, number);
      return true;
    }
    throw new Failure('unavailable', `the metadata of "${name}" kept changing; try again`);
  }),
};

export const history = {
  // No history of its own: the host keeps versions.
  listVersions: guarded(() => undefined),
  readVersion: guarded(() => false), // no such version: this storage keeps none
};

export const config = {
  validate() {
    const problems = [];
    for (const [key, value] of getConfig()) {
      if (!KNOWN_KEYS.includes(key)) {
        problems.push({ key, message: `unknown key "${key}"; this guest knows: ${KNOWN_KEYS.join(', ')}` });
      } else if (key === 'fsync' && value !== 'true' && value !== 'false') {
        problems.push({ key, message: 'fsync must be true or false' });
      }
    }
    return problems;
  },
};
