// A wasmstate storage guest in JavaScript (componentize-js).
//
// Each workspace is a directory in the one directory the operator grants
// (`/data`), the layout of wasmstate's own `local` guest:
//
//   /data/<workspace>/terraform.tfstate        the state
//   /data/<workspace>/terraform.tfstate.lock   LockInfo JSON while locked
//
// Two atomic filesystem operations carry correctness across requests and
// hosts: a rename replaces a state whole (readers never see a torn one), and
// a hard link creates the lock file with its full content or fails because
// it exists (a lock is never granted twice, never seen half-written).
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

import { getDirectories } from 'wasi:filesystem/preopens@0.2.12';
import { getRandomBytes } from 'wasi:random/random@0.2.12';
import { getConfig, log } from 'wasmstate:backend/host@0.2.1';

const STATE = 'terraform.tfstate';
const LOCK = 'terraform.tfstate.lock';
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

/** Create a new file and let `fill(file)` write it (`exist` when it is
 * there already). */
function createFile(dir, path, fill) {
  const file = dir.openAt(NOFOLLOW, path, { create: true, exclusive: true }, { write: true });
  fill(file);
  if (fsyncEnabled()) file.syncData();
}

/** A `fill` for `createFile`: these few bytes (a lock). */
function writeBytes(bytes) {
  return (file) => {
    let done = 0;
    while (done < bytes.length) done += Number(file.write(bytes.subarray(done), BigInt(done)));
  };
}

/** A `fill` for `createFile`: the state the host hands us, copied by the
 * host into the file's stream. */
function writeState(state) {
  return (file) => copied('writing the state file', () => state.copyTo(file.writeViaStream(0n)));
}

function isDir(dir, path) {
  try {
    return dir.statAt(NOFOLLOW, path).type === 'directory';
  } catch (e) {
    if (code(e) === 'no-entry') return false;
    throw e;
  }
}

function ensureDir(dir, path) {
  try {
    dir.createDirectoryAt(path);
  } catch (e) {
    if (code(e) !== 'exist') throw e;
  }
}

function remove(dir, path) {
  try {
    dir.unlinkFileAt(path);
  } catch (e) {
    if (code(e) !== 'no-entry') throw e;
  }
}

function randomName() {
  return Array.from(getRandomBytes(8n), (b) => b.toString(16).padStart(2, '0')).join('');
}

/** Create a new, uniquely named file beside the target, written by
 * `fill(file)`; the caller renames or links it into place. */
function writeTemp(dir, workspace, fill) {
  ensureDir(dir, workspace);
  for (;;) {
    const temp = `${workspace}/.tmp-${randomName()}`;
    try {
      createFile(dir, temp, fill);
      return temp;
    } catch (e) {
      if (code(e) !== 'exist') {
        remove(dir, temp);
        throw e;
      }
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
  if (current !== undefined && current.id !== lockId) throw new Failure('locked', current);
  if (current === undefined && lockId !== undefined) throw new Failure('lock-mismatch', undefined);
}

function removeTree(dir, path) {
  const folder = dir.openAt(NOFOLLOW, path, { directory: true }, { read: true });
  const entries = folder.readDirectory();
  for (let entry = entries.readDirectoryEntry(); entry; entry = entries.readDirectoryEntry()) {
    const child = `${path}/${entry.name}`;
    if (entry.type === 'directory') removeTree(dir, child);
    else dir.unlinkFileAt(child);
  }
  dir.removeDirectoryAt(path);
}

export const storage = {
  read: guarded((workspace, into) => copyToSink(root(), `${workspace}/${STATE}`, into)),

  write: guarded((workspace, state, lockId) => {
    const dir = root();
    checkLock(dir, workspace, lockId);
    const temp = writeTemp(dir, workspace, writeState(state));
    try {
      dir.renameAt(temp, dir, `${workspace}/${STATE}`);
    } catch (e) {
      remove(dir, temp);
      throw e;
    }
  }),

  delete: guarded((workspace, lockId) => {
    const dir = root();
    checkLock(dir, workspace, lockId);
    remove(dir, `${workspace}/${STATE}`);
  }),

  lock: guarded((workspace, info) => {
    const dir = root();
    const temp = writeTemp(dir, workspace, writeBytes(lockToJson(info)));
    try {
      for (let attempt = 0; attempt < 100; attempt++) {
        try {
          dir.linkAt(NOFOLLOW, temp, dir, `${workspace}/${LOCK}`);
          return;
        } catch (e) {
          if (code(e) !== 'exist') throw e;
          const current = holder(dir, workspace);
          if (current === undefined) continue; // its holder just unlocked: try again
          if (current.id === info.id) return; // a retry of a lock we hold
          throw new Failure('locked', current);
        }
      }
      throw new Failure('unavailable', `the lock of "${workspace}" kept changing hands`);
    } finally {
      remove(dir, temp);
    }
  }),

  unlock: guarded((workspace, id) => {
    const dir = root();
    const current = holder(dir, workspace);
    if (current === undefined) return;
    if (current.id !== id) throw new Failure('lock-mismatch', current);
    remove(dir, `${workspace}/${LOCK}`);
  }),

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

  deleteWorkspace: guarded((name) => {
    const dir = root();
    if (!isDir(dir, name)) throw new Failure('not-found');
    const current = holder(dir, name);
    if (current !== undefined) throw new Failure('locked', current);
    removeTree(dir, name);
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
