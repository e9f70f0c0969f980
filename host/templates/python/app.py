"""A wasmstate storage guest in Python (componentize-py).

Each workspace is a directory in the one directory the operator grants
(`/data`), the layout of wasmstate's own `local` guest:

    /data/<workspace>/terraform.tfstate        the state
    /data/<workspace>/terraform.tfstate.lock   LockInfo JSON while locked

Two atomic filesystem operations carry correctness across requests and
hosts: a rename replaces a state whole (readers never see a torn one), and
a hard link creates the lock file with its full content or fails because it
exists (a lock is never granted twice, never seen half-written).

A state moves in chunks of about 1 MiB between the file and the host (the
`body` interface's `state-source` and `state-sink`), so this guest never
holds a whole state in memory, whatever its size.

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
from wit_world.imports import body, host

ROOT = "/data"
STATE = "terraform.tfstate"
LOCK = "terraform.tfstate.lock"
# Bytes moved per call between a file and the host.
CHUNK = 1 << 20
# The keys this guest understands; any other is reported by `validate`.
KNOWN_KEYS = {"fsync"}


def settings():
    return dict(host.get_config())


def fsync_enabled():
    return settings().get("fsync", "true") != "false"


def guarded(method):
    """Turn any exception but the contract's `Err` into `internal`."""

    @functools.wraps(method)
    def call(*args):
        try:
            return method(*args)
        except Err:
            raise
        except Exception as e:  # noqa: BLE001 - a guest must not crash
            host.log(host.LogLevel.ERROR, traceback.format_exc())
            # The client learns the kind of failure; its text (paths, data)
            # stays in the server's log.
            raise Err(t.Error_Internal(f"{type(e).__name__} in the guest; details in the server log"))

    return call


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


def chunks_of(source: body.StateSource):
    """The bytes of a state the host hands us, chunk by chunk, to its end."""
    while True:
        chunk = source.read(CHUNK)
        if not chunk:
            return
        yield chunk


def write_temp(workspace, chunks):
    """Write `chunks` (bytes, in order) to a new, uniquely named file beside
    the target; the caller renames or links it into place."""
    os.makedirs(path(workspace), exist_ok=True)
    while True:
        temp = path(workspace, ".tmp-" + os.urandom(8).hex())
        try:
            f = open(temp, "xb")
        except FileExistsError:
            continue
        try:
            with f:
                for chunk in chunks:
                    f.write(chunk)
                f.flush()
                if fsync_enabled():
                    os.fsync(f.fileno())
            return temp
        except BaseException:
            remove(temp)
            raise


def copy_to(file, into: body.StateSink):
    """Hand the file's bytes to the host in chunks, to the end of the file or
    until the host says it has what it needs."""
    with open(file, "rb") as f:
        while True:
            chunk = f.read(CHUNK)
            if not chunk or not into.write(chunk):
                return


def remove(file):
    try:
        os.remove(file)
    except FileNotFoundError:
        pass


class Storage(exports.Storage):
    @guarded
    def read(self, workspace, into):
        try:
            copy_to(path(workspace, STATE), into)
            return True
        except FileNotFoundError:
            return False

    @guarded
    def write(self, workspace, state, lock_id):
        check_lock(workspace, lock_id)
        temp = write_temp(workspace, chunks_of(state))
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
        temp = write_temp(workspace, [lock_to_json(info)])
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
