"""A wasmstate storage guest in Python (componentize-py).

Each workspace is a directory in the one directory the operator grants
(`/data`), the layout of wasmstate's own `local` guest:

    /data/<workspace>/terraform.tfstate        the state
    /data/<workspace>/terraform.tfstate.lock   LockInfo JSON while locked

Two atomic filesystem operations carry correctness across requests and
hosts: a rename replaces a state whole (readers never see a torn one), and
a hard link creates the lock file with its full content or fails because it
exists (a lock is never granted twice, never seen half-written).

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

import functools
import json
import os
import shutil
import traceback

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import backend_types as t
from wit_world.imports import host, preopens
from wit_world.imports import wasi_filesystem_types as fs

ROOT = "/data"
STATE = "terraform.tfstate"
LOCK = "terraform.tfstate.lock"
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
        raise Err(t.Error_Locked(current))
    if current is None and lock_id is not None:
        raise Err(t.Error_LockMismatch(None))


def write_temp(workspace, fill):
    """Create a new, uniquely named file beside the target and let
    `fill(descriptor)` write it; its path. The caller renames or links it
    into place."""
    os.makedirs(path(workspace), exist_ok=True)
    create = fs.OpenFlags.CREATE | fs.OpenFlags.EXCLUSIVE
    while True:
        name = f"{workspace}/.tmp-{os.urandom(8).hex()}"
        try:
            file = root().open_at(fs.PathFlags(0), name, create, fs.DescriptorFlags.WRITE)
        except Err as e:
            if wasi_code(e) == fs.ErrorCode.EXIST:
                continue
            raise
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
    host into the file's stream."""

    def fill(file):
        with file.write_via_stream(0) as out:
            state.copy_to(out)

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


class Storage(exports.Storage):
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
    def write(self, workspace, state, lock_id):
        check_lock(workspace, lock_id)
        temp = write_temp(workspace, write_state(state))
        try:
            os.replace(temp, path(workspace, STATE))
        except BaseException:
            remove(temp)
            raise

    @guarded
    def delete(self, workspace, lock_id):
        check_lock(workspace, lock_id)
        remove(path(workspace, STATE))

    @guarded
    def lock(self, workspace, info):
        temp = write_temp(workspace, write_bytes(lock_to_json(info)))
        try:
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
                    raise Err(t.Error_Locked(current))
            raise Err(t.Error_Unavailable(f"the lock of {workspace!r} kept changing hands"))
        finally:
            remove(temp)

    @guarded
    def unlock(self, workspace, id):
        current = holder(workspace)
        if current is None:
            return
        if current.id != id:
            raise Err(t.Error_LockMismatch(current))
        remove(path(workspace, LOCK))

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
        return [
            name
            for name in os.listdir(ROOT)
            if not name.startswith(".") and os.path.isdir(path(name))
        ]

    @guarded
    def create_workspace(self, name):
        try:
            os.mkdir(path(name))
            return True
        except FileExistsError:
            return False

    @guarded
    def delete_workspace(self, name):
        if not os.path.isdir(path(name)):
            raise Err(t.Error_NotFound())
        current = holder(name)
        if current is not None:
            raise Err(t.Error_Locked(current))
        shutil.rmtree(path(name))


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
