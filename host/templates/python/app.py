"""A wasmstate storage guest in Python (componentize-py).

Each workspace is a directory in the one directory the operator grants
(`/data`), the layout of wasmstate's own `local` guest:

    /data/<workspace>/terraform.tfstate        the state
    /data/<workspace>/terraform.tfstate.lock   LockInfo JSON while locked
    /data/<workspace>/metadata/<n>.json        metadata version n: a random token line, the document

Two atomic filesystem operations carry correctness across requests and
hosts: a rename replaces a state whole (readers never see a torn one), and
a hard link creates a file with its full content or fails because it
exists (a lock is never granted twice, never seen half-written; metadata
version n+1 is written by exactly one of two racing writers).

A conditional write (contract 0.3.0: `expect`) must check what is stored
and replace it in one step. A directory has no "rename if the target is
still this file", so the check and the rename run under the workspace's
lock: the caller's, or, for a write sent without one, a lock this guest
takes for those few calls (a racing writer waits for it, then finds the
state changed; a write the host stopped inside, at its timeout, leaves
that lock, which the next writer or locker removes once it is older than
any request runs: `stale_write_lock`). A state's version is its file's
identity: inode, size and modification time, whose nanoseconds a write
sets at random so that a reused inode never brings back an old version.

A state moves between its file and the host without entering this guest's
memory: `into.copy_from(stream)` and `state.copy_to(stream)` (the `body`
interface, contract 0.2.1) copy a WASI file stream in one call, host-side.
Passing 1 MiB chunks through `into.write(chunk)` instead would keep every
chunk's buffer until the call returns (componentize-py frees what it lends
an import only then), so a state larger than the memory cap would fail.

The host makes a fresh instance for every request: keep nothing in memory
between calls. Every exported method raises `Err(...)` with one of the
contract's errors; anything else is caught, logged with its traceback, and
reported as `internal`, so a bug reads as a message, not a crash.
"""

import contextlib
import datetime
import errno
import functools
import json
import os
import traceback

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.storage import StateHead
from wit_world.imports import backend_types as t
from wit_world.imports import host, monotonic_clock, preopens, wall_clock
from wit_world.imports import wasi_filesystem_types as fs

ROOT = "/data"
STATE = "terraform.tfstate"
LOCK = "terraform.tfstate.lock"
META = "metadata"
# The operation named in the lock this guest takes for a write sent
# without one (a client sees it only if it asks while such a write runs).
WRITE_LOCK = "wasmstate-guest-write"
# The operation named in the lock a workspace delete takes while it runs.
DELETE_LOCK = "wasmstate-guest-delete"
# A write whose workspace a delete removed while it was under way.
DELETED_MEANWHILE = "the workspace was deleted while this write was under way; nothing was stored"
# Older than any request may run (the host stops each within its timeout,
# at most an hour): superseded metadata versions are removed after it.
STALE_AFTER_S = 2 * 3600
# The keys this guest understands; any other is reported by `validate`.
KNOWN_KEYS = {"fsync"}


def settings():
    return dict(host.get_config())


def fsync_enabled():
    return settings().get("fsync", "true") != "false"


# The contract's errors: an `Err` carrying anything else (a WASI error
# code, a copy's message) must not reach the host as it is.
CONTRACT_ERRORS = (
    t.Error_NotFound,
    t.Error_Locked,
    t.Error_LockMismatch,
    t.Error_InvalidInput,
    t.Error_InvalidConfig,
    t.Error_Unavailable,
    t.Error_Internal,
)


def guarded(method):
    """Turn any exception but the contract's own errors into `internal`."""

    @functools.wraps(method)
    def call(*args):
        try:
            return method(*args)
        except Err as e:
            if isinstance(e.value, CONTRACT_ERRORS):
                raise
            host.log(host.LogLevel.ERROR, f"{method.__name__}: {e.value}\n{traceback.format_exc()}")
            raise Err(t.Error_Internal(f"{method.__name__}: {e.value}"))
        except Exception as e:  # noqa: BLE001 - a guest must not crash
            host.log(host.LogLevel.ERROR, traceback.format_exc())
            # The client learns the kind of failure; its text (paths, data)
            # stays in the server's log.
            raise Err(t.Error_Internal(f"{type(e).__name__} in the guest; details in the server log"))

    return call


_root = None


def root():
    """The granted directory as a WASI descriptor (for the state files'
    streams). Looked up once per instance, which serves one request."""
    global _root
    if _root is None:
        for descriptor, where in preopens.get_directories():
            if where == ROOT:
                _root = descriptor
        if _root is None:
            raise Err(t.Error_Internal(f"no directory was granted at {ROOT} (the backend needs `dir`)"))
    return _root


def wasi_code(e):
    """The WASI error code an `Err` carries, if it carries one."""
    return e.value if isinstance(e.value, fs.ErrorCode) else None


def path(workspace, name=None):
    return os.path.join(ROOT, workspace, name) if name else os.path.join(ROOT, workspace)


def lock_to_json(info):
    return json.dumps(
        {
            "ID": info.id,
            "Operation": info.operation,
            "Info": info.info,
            "Who": info.who,
            "Version": info.version,
            "Created": info.created,
            "Path": info.path,
        }
    ).encode()


def holder(workspace):
    """The lock holder, or None when unlocked."""
    try:
        with open(path(workspace, LOCK), "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    try:
        d = json.loads(raw)
        return t.LockInfo(
            d["ID"], d["Operation"], d["Info"], d["Who"], d["Version"], d["Created"], d["Path"]
        )
    except (ValueError, KeyError) as e:
        raise Err(
            t.Error_Internal(
                f"lock file of workspace {workspace!r} is not LockInfo JSON ({e}); force-unlock it"
            )
        )


def check_lock(workspace, lock_id):
    current = holder(workspace)
    if current is not None and current.id != lock_id:
        if lock_id is None and current.operation == WRITE_LOCK:
            return  # another unlocked write: `write_turn` waits for it
        raise Err(t.Error_Locked(current))
    if current is None and lock_id is not None:
        raise Err(t.Error_LockMismatch(None))


def take_lock(workspace, info, make=True):
    """Link a lock file holding `info` into place; `Error_Locked` when
    someone else holds the lock. A workspace delete running beside it may
    remove the workspace, temporary file and all: then the lock is taken
    again, after the delete (`make` False: the workspace must exist)."""
    for _ in range(3):
        if not make and not os.path.isdir(path(workspace)):
            raise Err(t.Error_NotFound())
        temp = None
        try:
            temp = write_temp(workspace, write_bytes(lock_to_json(info)), make)
            for _ in range(100):
                try:
                    os.link(temp, path(workspace, LOCK))
                    return
                except FileExistsError:
                    current = holder(workspace)
                    if current is None:
                        continue  # its holder just unlocked: try again
                    if current.id == info.id:
                        return  # a retry of a lock we hold
                    if stale_write_lock(current) and take_over(workspace, current):
                        continue
                    raise Err(t.Error_Locked(current))
            raise Err(t.Error_Unavailable(f"the lock of {workspace!r} kept changing hands"))
        except FileNotFoundError:
            continue  # deleted meanwhile: lock it afresh
        except Err as e:
            if wasi_code(e) != fs.ErrorCode.NO_ENTRY:
                raise
            continue  # the same, met through WASI itself
        finally:
            if temp is not None:
                remove(temp)
    raise Err(t.Error_Unavailable(f"{workspace!r} was deleted three times while being locked; try again"))


def stale_write_lock(current):
    """Whether `current` is a lock this guest took for a write sent without
    one, taken longer ago than any request runs: the host stopped that
    write between its lock and its release (a timeout), and nobody else
    will ever remove it."""
    if current.operation != WRITE_LOCK:
        return False
    try:
        created = datetime.datetime.fromisoformat(current.created.replace("Z", "+00:00"))
    except ValueError:
        return False
    return created.timestamp() < wall_clock.now().seconds - STALE_AFTER_S


def take_over(workspace, stale):
    """Remove the stale guest-write lock `stale`, by one writer only: the one
    that links its marker `.stale-<id>` first. Without the marker, a second
    writer that read the same stale lock could remove the first one's fresh
    lock. A marker outlives any request that may have read its lock (it is
    swept after the same bound), so it is never won twice. Whether this
    writer removed it (False: another one is)."""
    cutoff = wall_clock.now().seconds - STALE_AFTER_S
    for name in listdir(path(workspace)) or []:
        if name.startswith(".stale-"):
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path(workspace, name)).st_mtime < cutoff:
                    remove(path(workspace, name))
    temp = write_temp(workspace, write_bytes(b""))
    try:
        os.link(temp, path(workspace, f".stale-{stale.id}"))
    except FileExistsError:
        return False
    finally:
        remove(temp)
    current = holder(workspace)
    if current is not None and current.id == stale.id:
        host.log(host.LogLevel.WARN, f"removed the lock of a write to {workspace!r} stopped mid-way (created {stale.created})")
        remove(path(workspace, LOCK))
    return True


def release(workspace, id):
    """Remove the lock if `id` holds it; `Error_LockMismatch` if another does."""
    current = holder(workspace)
    if current is None:
        return
    if current.id != id:
        raise Err(t.Error_LockMismatch(current))
    remove(path(workspace, LOCK))


@contextlib.contextmanager
def write_turn(workspace, lock_id):
    """Hold the workspace while a write checks what is stored and replaces
    it: under the caller's lock (checked again just before the switch), or
    under a lock of our own, taken for these few calls."""
    if lock_id is not None:
        check_lock(workspace, lock_id)
        yield
        return
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    info = t.LockInfo(os.urandom(16).hex(), WRITE_LOCK, "a write sent without a lock", "wasmstate", "", now, "")
    for _ in range(500):  # 5 s at most: such a lock is held for a few calls
        try:
            take_lock(workspace, info, make=False)
            break
        except Err as e:
            if isinstance(e.value, t.Error_NotFound):
                raise Err(t.Error_Unavailable(DELETED_MEANWHILE))
            if not (isinstance(e.value, t.Error_Locked) and e.value.value.operation == WRITE_LOCK):
                raise
            with monotonic_clock.subscribe_duration(10_000_000) as pause:
                pause.block()
    else:
        raise Err(
            t.Error_Unavailable(
                f"another write to {workspace!r} held it for 5 s; try again (a write the server "
                f"stopped mid-way leaves its lock, operation {WRITE_LOCK}: it is removed {STALE_AFTER_S // 3600} h "
                "after it was taken, or force-unlock the workspace)"
            )
        )
    try:
        yield
    finally:
        with contextlib.suppress(Err):  # force-unlocked meanwhile: not ours to remove
            release(workspace, info.id)


def version_of(file):
    """An open file's version (identity, modification time, size) and size."""
    identity = file.metadata_hash()
    stat = file.stat()
    mtime = stat.data_modification_timestamp
    return f"{identity.lower:x}.{mtime.seconds:x}.{mtime.nanoseconds:x}.{stat.size:x}", stat.size


def expected(version, expect):
    """Whether the stored version (None: nothing stored) is as `expect` says."""
    if isinstance(expect, t.Expect_Version):
        return version == expect.value
    if isinstance(expect, t.Expect_Absent):
        return version is None
    return True


def make_dir(workspace):
    """Make the workspace's directory (or one beneath it: `ws/metadata`)
    unless it exists; whether it was made now. One level, and not
    `makedirs`: a delete removing the directory between its `mkdir` and its
    check made that raise FileExistsError."""
    try:
        os.mkdir(path(workspace))
        return True
    except FileExistsError:
        return False


def write_temp(workspace, fill, make=True):
    """Create a new, uniquely named file beside the target and let
    `fill(descriptor)` write it; its path. The caller renames or links it
    into place. `make`: create the workspace's directory if missing."""
    made = make and make_dir(workspace)
    create = fs.OpenFlags.CREATE | fs.OpenFlags.EXCLUSIVE
    remade = 0
    while True:
        name = f"{workspace}/.tmp-{os.urandom(8).hex()}"
        try:
            file = root().open_at(fs.PathFlags(0), name, create, fs.DescriptorFlags.WRITE)
        except Err as e:
            if wasi_code(e) == fs.ErrorCode.EXIST:
                continue
            # A delete may remove the directory between its making and this
            # open (nothing is taken from `fill` yet): made again, twice
            # more at most, as for a request a moment later.
            if not make or wasi_code(e) != fs.ErrorCode.NO_ENTRY:
                raise
            if remade == 2 and not made:
                # Found there by the last make, yet refusing the file (a
                # dangling link, most likely): not a race; no retry helps.
                raise Err(t.Error_Internal(f"cannot create a file in {workspace!r}: no-entry, though it exists"))
            if remade == 2:
                raise
            remade += 1
            made = make_dir(workspace)
            continue
        temp = os.path.join(ROOT, name)
        try:
            with file:
                fill(file)
                if fsync_enabled():
                    file.sync_data()
            return temp
        except BaseException:
            remove(temp)
            raise


def write_bytes(data):
    """A `fill` for `write_temp`: these few bytes (a lock)."""

    def fill(file):
        done = 0
        while done < len(data):
            done += file.write(data[done:], done)

    return fill


def write_state(state):
    """A `fill` for `write_temp`: the state the host hands us, copied by the
    host into the file's stream, then stamped with random nanoseconds (the
    version `version_of` reads)."""

    def fill(file):
        with file.write_via_stream(0) as out:
            state.copy_to(out)
        now = wall_clock.now()
        stamp = wall_clock.Datetime(now.seconds, int.from_bytes(os.urandom(4)) % 1_000_000_000)
        file.set_times(fs.NewTimestamp_NoChange(), fs.NewTimestamp_Timestamp(stamp))

    return fill


def open_state(workspace):
    """The state file opened for reading; None when there is none."""
    try:
        return root().open_at(fs.PathFlags(0), f"{workspace}/{STATE}", fs.OpenFlags(0), fs.DescriptorFlags.READ)
    except Err as e:
        if wasi_code(e) == fs.ErrorCode.NO_ENTRY:
            return None
        raise


def remove(file):
    try:
        os.remove(file)
    except FileNotFoundError:
        pass


def listdir(directory):
    """`os.listdir`, or None when `directory` does not exist. A listing
    that fails with FileNotFoundError while the directory is still there
    (an entry another request removed as it was listed) is made again."""
    for _ in range(100):
        try:
            return os.listdir(directory)
        except FileNotFoundError:
            if not os.path.isdir(directory):
                return None
    raise Err(t.Error_Unavailable(f"{directory!r} kept changing while it was listed; try again"))


def gone_unless_there(workspace):
    """After a first metadata version's directory could not be made: a
    workspace that is gone was deleted meanwhile (503); anything else
    looks again."""
    if not os.path.isdir(path(workspace)):
        raise Err(t.Error_Unavailable(f"workspace {workspace!r} was deleted meanwhile; nothing was stored"))


def remove_metadata_dir(directory):
    """Empty and remove a workspace's metadata directory (files only). A
    version a racing write links in as this runs stays, with its
    directory: the delete then answers "delete it again"."""
    # Oldest version first, so no reader takes an older one for the newest.
    def newest_last(entry):
        number = version_number(entry)
        return -1 if number is None else number

    for entry in sorted(listdir(directory) or [], key=newest_last):
        remove(os.path.join(directory, entry))
    try:
        os.rmdir(directory)
    except FileNotFoundError:
        pass
    except OSError as e:
        if e.errno != errno.ENOTEMPTY:
            raise


def open_metadata(workspace):
    """The workspace's metadata directory, opened (None when there is
    none). A write reads the newest version and links the next through
    this one descriptor: a delete that removes the directory meanwhile
    makes the link fail (nothing can be made in a removed directory), where
    a path would reach a directory made again since, by a create or a first
    version, and put a version of the deleted workspace on top of it."""
    try:
        return root().open_at(fs.PathFlags(0), f"{workspace}/{META}", fs.OpenFlags.DIRECTORY, fs.DescriptorFlags.READ)
    except Err as e:
        if wasi_code(e) == fs.ErrorCode.NO_ENTRY:
            return None
        raise


def metadata_versions(meta):
    """The metadata versions in the opened metadata directory, as numbers.
    A listing that meets an entry removed as it was listed (a delete, a
    sweep) is made again."""
    for _ in range(100):
        names = []
        try:
            with meta.read_directory() as entries:
                while (entry := entries.read_directory_entry()) is not None:
                    names.append(entry.name)
        except Err as e:
            if wasi_code(e) != fs.ErrorCode.NO_ENTRY:
                raise
            continue
        return [n for n in map(version_number, names) if n is not None]
    raise Err(t.Error_Unavailable("a metadata directory kept changing while it was listed; try again"))


def read_small(directory, name):
    """The whole of small file `name` in the opened `directory`; None when
    it is missing."""
    try:
        file = directory.open_at(fs.PathFlags(0), name, fs.OpenFlags(0), fs.DescriptorFlags.READ)
    except Err as e:
        if wasi_code(e) == fs.ErrorCode.NO_ENTRY:
            return None
        raise
    data = b""
    with file:
        while True:
            chunk, end = file.read(64 << 10, len(data))
            data += chunk
            if end or not chunk:
                return data


def version_number(name):
    """The number of a metadata version's file (`N.json`); None for any
    other name."""
    stem = name[:-5]
    return int(stem) if name.endswith(".json") and stem.isascii() and stem.isdecimal() else None


def sweep_metadata(meta, upto):
    """Remove metadata versions up to `upto` (superseded) written longer
    ago than any request runs: no writer that read one of them as the
    newest can still be linking its successor. Best effort: it runs after
    the write it follows was stored, and a later write sweeps again."""
    cutoff = wall_clock.now().seconds - STALE_AFTER_S
    try:
        for version in metadata_versions(meta):
            old = f"{version}.json"
            with contextlib.suppress(Err):  # removed meanwhile
                written = meta.stat_at(fs.PathFlags(0), old).data_modification_timestamp
                if version <= upto and written is not None and written.seconds < cutoff:
                    meta.unlink_file_at(old)
    except Exception as e:  # the write it follows was stored: never a failure
        host.log(host.LogLevel.WARN, f"removing superseded metadata versions failed: {getattr(e, 'value', e)}")


def current_metadata(meta, workspace):
    """(newest number or 0, its version or None, its document or None when
    removed), in the opened metadata directory `meta` (None: none). The
    version adds the file's random token to its number, so it never comes
    back after the workspace is deleted and made again."""
    if meta is None:
        return 0, None, None
    for _ in range(100):
        versions = metadata_versions(meta)
        if not versions:
            return 0, None, None
        newest = max(versions)
        raw = read_small(meta, f"{newest}.json")
        if raw is None:
            continue  # removed as superseded meanwhile: look again
        token, _, document = raw.decode().partition("\n")
        return newest, f"{newest}.{token}", document or None
    raise Err(t.Error_Unavailable(f"the metadata of {workspace!r} kept changing"))


class Storage(exports.Storage):
    @guarded
    def head(self, workspace, prefix):
        file = open_state(workspace)
        if file is None:
            return None
        with file:
            version, size = version_of(file)
            # The host takes the first bytes it needs and stops the copy.
            with file.read_via_stream(0) as stream:
                prefix.copy_from(stream)
        return StateHead(version, size, None)

    @guarded
    def read(self, workspace, into):
        file = open_state(workspace)
        if file is None:
            return False
        # The host copies the file to its end (or until it has what it
        # needs: a read of the beginning only is a success too).
        with file, file.read_via_stream(0) as stream:
            into.copy_from(stream)
        return True

    @guarded
    def write(self, workspace, state, lock_id, expect):
        check_lock(workspace, lock_id)  # a refused write costs nothing
        try:
            temp = write_temp(workspace, write_state(state))
        except Err as e:
            if wasi_code(e) == fs.ErrorCode.NO_ENTRY:
                raise Err(t.Error_Unavailable(DELETED_MEANWHILE))
            raise
        try:
            with write_turn(workspace, lock_id):
                file = open_state(workspace)
                stored = None
                if file is not None:
                    with file:
                        stored, _ = version_of(file)
                if not expected(stored, expect):
                    return False
                try:
                    os.replace(temp, path(workspace, STATE))
                except FileNotFoundError:
                    raise Err(t.Error_Unavailable(DELETED_MEANWHILE))
                return True
        finally:
            remove(temp)  # gone once renamed; left by a refused write

    @guarded
    def delete(self, workspace, lock_id):
        check_lock(workspace, lock_id)
        if os.path.exists(path(workspace, STATE)):
            # Not between a conditional write's check and its rename.
            with write_turn(workspace, lock_id):
                remove(path(workspace, STATE))

    @guarded
    def lock(self, workspace, info):
        take_lock(workspace, info)

    @guarded
    def unlock(self, workspace, id):
        release(workspace, id)

    @guarded
    def current_lock(self, workspace):
        return holder(workspace)

    @guarded
    def force_unlock(self, workspace):
        try:
            current = holder(workspace)
        except Err:
            current = None  # a corrupt lock is still removed: that is what force is for
        remove(path(workspace, LOCK))
        return current


class Workspaces(exports.Workspaces):
    @guarded
    def list_workspaces(self):
        names = listdir(ROOT)
        if names is None:
            root()  # says no directory was granted
        return [name for name in names or [] if not name.startswith(".") and os.path.isdir(path(name))]

    @guarded
    def create_workspace(self, name):
        try:
            os.mkdir(path(name))
            return True
        except FileExistsError:
            return False

    @guarded
    def delete_workspace(self, name):
        # Under a lock of its own, as Terraform's CLI deletes a workspace:
        # a client's lock is refused while it runs (423), never removed
        # with the workspace; what lands once it let go is kept.
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        info = t.LockInfo(
            os.urandom(16).hex(), DELETE_LOCK,
            "a workspace delete; if none runs, force-unlock and delete again", "wasmstate", "", now, "",
        )
        try:
            take_lock(name, info, make=False)
        except Err as e:
            if isinstance(e.value, t.Error_Locked) and e.value.value.operation == DELETE_LOCK:
                raise Err(t.Error_Unavailable(f"another delete of {name!r} is under way; if none is, force-unlock it"))
            raise
        try:
            current = holder(name)
            if current is None or current.id != info.id:
                raise Err(t.Error_Unavailable(f"the delete's lock of {name!r} was force-unlocked; delete it again"))
            # None: deleted meanwhile by another delete (after a force-unlock).
            for entry in listdir(path(name)) or []:
                target = path(name, entry)
                if entry == LOCK:
                    continue
                if os.path.isdir(target) and not os.path.islink(target):
                    remove_metadata_dir(target)
                else:
                    remove(target)
        finally:
            with contextlib.suppress(Err):  # force-unlocked meanwhile: not ours
                release(name, info.id)
        # A refused lock's or a stopped write's temporary file may still be
        # there (none of theirs was acknowledged): removed, and tried again.
        for attempt in range(4):
            try:
                os.rmdir(path(name))
                return
            except FileNotFoundError:
                return
            except OSError as e:
                if e.errno != errno.ENOTEMPTY:
                    raise
            if attempt == 3:
                break
            left = listdir(path(name))
            if left is None:
                return
            if any(not entry.startswith(".tmp-") for entry in left):
                break
            for entry in left:
                remove(path(name, entry))
        raise Err(t.Error_Unavailable(f"a lock or write reached {name!r} as it was deleted; it is kept: delete it again"))

    @guarded
    def read_metadata(self, name):
        _, version, content = current_metadata(open_metadata(name), name)
        return None if content is None else t.Metadata(content, version)

    @guarded
    def write_metadata(self, name, content, expect):
        # Version n+1 is linked into place, which fails if a racing writer
        # made it first: then look again (an `expect` it no longer meets
        # answers False).
        for _ in range(100):
            meta = open_metadata(name)
            number, version, current = current_metadata(meta, name)
            if not expected(None if current is None else version, expect):
                return False
            if content is None and current is None:
                return True  # nothing to remove
            if meta is None:
                # A first version makes the metadata directory, then looks
                # again through it. The workspace itself is never made here
                # (a state write or create-workspace makes it): a delete may
                # have removed it, and making it again would bring it back.
                try:
                    make_dir(os.path.join(name, META))
                except FileNotFoundError:
                    gone_unless_there(name)
                continue
            document = f"{os.urandom(8).hex()}\n{content or ''}"  # no document: removed
            try:
                temp = write_temp(name, write_bytes(document.encode()), make=False)
            except Err as e:
                if wasi_code(e) != fs.ErrorCode.NO_ENTRY:
                    raise
                continue  # the workspace was deleted meanwhile: look again
            try:
                root().link_at(fs.PathFlags(0), os.path.relpath(temp, ROOT), meta, f"{number + 1}.json")
            except Err as e:
                if wasi_code(e) == fs.ErrorCode.EXIST:
                    continue  # a racing writer made it first
                # A delete removed the temporary file or the metadata
                # directory read above (even if one was made again since):
                # look again.
                if wasi_code(e) != fs.ErrorCode.NO_ENTRY:
                    raise
                continue
            finally:
                # Best effort once linked: a temporary file left behind is
                # removed with its workspace, or by a workspace delete.
                with contextlib.suppress(OSError):
                    remove(temp)
            sweep_metadata(meta, number)
            return True
        raise Err(t.Error_Unavailable(f"the metadata of {name!r} kept changing; try again"))


class History(exports.History):
    @guarded
    def list_versions(self, workspace):
        return None  # no history of its own: the host keeps versions

    @guarded
    def read_version(self, workspace, id, into):
        return False  # no such version: this storage keeps none


class Config(exports.Config):
    def validate(self):
        problems = []
        for key, value in host.get_config():
            if key not in KNOWN_KEYS:
                problems.append(
                    t.Diagnostic(key, f"unknown key {key!r}; this guest knows: {', '.join(sorted(KNOWN_KEYS))}")
                )
            elif key == "fsync" and value not in ("true", "false"):
                problems.append(t.Diagnostic(key, "fsync must be true or false"))
        return problems
