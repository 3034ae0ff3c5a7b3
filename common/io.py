"""The one file writer: atomic, fsynced and error-mapped, for every package.

Atomic: `atomic_write(path, write)` creates `path.tmp<pid>` in the same folder, fsyncs it and
os.replace()s it onto `path`, so a reader, or a run resumed after a kill, sees the old file or the
new one, never half of one. JSON, text/YAML/CSV, PNG and safetensors (common/weights.py) all go
through it; the checkpoint files inside a checkpoint's temporary directory go through
`write_file` (the directory rename is their atomic step, training/checkpoint/files.py).

Error-mapped: an OSError while writing (ENOSPC, EDQUOT, EROFS, EACCES, ENOTDIR, EIO, ...; also when
torch or safetensors wrap it in their own exception) removes the temporary file and raises
`WriteError`, a UserError whose message is one line naming the path and the cause (and, for a full
disk, the space needed and free). Entry points exit with its `exit_code`, 74 (EX_IOERR from
sysexits.h). `writing(path)` maps the OSErrors of other writes the same way (appends, mkdir,
the run lock's files).

Temporary files: every one is named `NAME.tmp<pid>` (`temp_path`); a process killed mid-write
leaves one behind, which `remove_stale_temp` deletes (only when that pid is gone) under the lock of
the folder at the next start (training/checkpoint/files.py for a run directory; common.runlock.writing_into
for the outputs of eval.py, predict.py, scripts/export.py and scripts/extract_features.py).

Before the expensive work: `prepare_output(path)` creates the folder an output goes into and
checks that a file can be created there, with the same error mapping (one line, exit 74), so a
bad --output is refused before a forward pass over a dataset rather than after it (`make=False`:
checked the same way, then the folders it made are removed, so a later refusal leaves none behind).

JSON: strict JSON everywhere (checkpoints, summary.json, metrics.jsonl, eval results). JSON has
no NaN or infinity, so a non-finite float is written as null: a skipped update's loss, an empty
split's accuracy, an unreachable conformal threshold. Readers treat null as "no finite value".

Test seam: `_open_for_write(path)` is the file object every write goes through; tests replace it
to fail like a full disk part-way through a file.
"""
import contextlib
import errno
import json
import math
import os
import re
import shutil

from .errors import UserError

EXIT_WRITE_FAILED = 74  # EX_IOERR (sysexits.h): a write failed on an OSError such as a full disk
_TEMP_NAME = re.compile(r"^.+\.tmp\d+$")  # what atomic writes leave behind when killed: NAME.tmp<pid>
_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class WriteError(UserError):
    """A file could not be written (disk full, quota, read-only filesystem, permissions, a path
    through a file, I/O error). The message is one line; entry points exit with `exit_code`."""

    exit_code = EXIT_WRITE_FAILED


# ----------------------------------------------------------------------------- error mapping
def os_error_of(err):
    """The OSError behind a failed write, or None. torch.save reports a failed write of its file
    object as RuntimeError('... unexpected pos ...') with the OSError as its context; safetensors
    as SafetensorError('... (os error 28)')."""
    seen = err
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__context__
    match = re.search(r"os error (\d+)", str(err))
    if match:
        code = int(match.group(1))
        return OSError(code, os.strerror(code))
    return None


def human_bytes(nbytes):
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(nbytes) < 1024 or unit == "TB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024.0
    return f"{nbytes:.1f} TB"


def free_bytes(path):
    """Free space of the filesystem that holds `path` (its nearest existing folder), or None."""
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    while folder and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        return shutil.disk_usage(folder or ".").free
    except OSError:
        return None


def _default_hint(err):
    if err.errno in _SPACE_ERRNOS:
        return "free some space or write to a larger disk"
    if err.errno == errno.ENOTDIR:
        return "a part of the path is a file, not a folder: choose another path"
    if err.errno == errno.EROFS:
        return "the filesystem is read-only: choose a writable path"
    return "check the folder's permissions and filesystem"


def write_error(path, err, *, needed=None, kept=None, hint=None):
    """WriteError (one line) for the OSError `err` while writing `path`: the path, the cause, for a
    full disk the space `needed` (bytes, if known) and free; `kept` says what is intact; `hint` how on."""
    reason = err.strerror or str(err)
    msg = f"cannot write {path}: {reason}"
    if err.errno in _SPACE_ERRNOS:
        free = free_bytes(path)
        parts = ([f"the save needs about {human_bytes(needed)}"] if needed else []) + \
                ([f"{human_bytes(free)} free"] if free is not None else [])
        msg += f" ({', '.join(parts) or 'no space left'})"
    parts = [msg] + ([kept] if kept else []) + [hint or _default_hint(err)]
    return WriteError("; ".join(" ".join(p.split()) for p in parts))


@contextlib.contextmanager
def writing(path, **describe):
    """Any OSError inside the block becomes write_error(path, ...) (kwargs as write_error's)."""
    try:
        yield
    except WriteError:
        raise
    except OSError as err:
        raise write_error(path, err, **describe) from None


# ----------------------------------------------------------------------------- writing
def _open_for_write(path):
    """The file object every write goes through (a seam: tests make it fail like a full disk)."""
    return open(path, "wb")


def temp_path(path):
    """The temporary name of `path` while this process writes it."""
    return f"{path}.tmp{os.getpid()}"


def is_temp_name(name):
    return bool(_TEMP_NAME.match(name))


def remove_quietly(path):
    try:
        os.remove(path)
    except OSError:
        pass


def pid_alive(pid):
    """Whether process `pid` exists on this host (one owned by another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, owned by someone else
        return True
    return True


def temp_writer_pid(name):
    """The pid in a temporary file's name `NAME.tmp<pid>`, or None for another name."""
    return int(name.rsplit(".tmp", 1)[1]) if is_temp_name(name) else None


def _written_by_another_live_process(name):
    pid = temp_writer_pid(name)
    return pid != os.getpid() and pid_alive(pid)


def ensure_folder(path):
    """os.makedirs(path, exist_ok=True), where a file in the way is ENOTDIR (makedirs says EEXIST)."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path) from None


def prepare_output(path, *, folder=False, make=True):
    """Before the expensive work: create the folder `path` will be written into (`path` itself
    when `folder`) and create and remove a temporary file there, so a path through a file, a
    read-only filesystem or a folder without write permission is WriteError (one line naming
    `path` and the cause, exit 74) now, not after the work. The probe is this process's own
    temporary name, so a kill in between leaves what the next writer removes anyway.
    `make=False`: the folders made for the probe are removed again (the writer makes them when it
    writes, as atomic_write and common.runlock.writing_into do), so a refusal after this check
    leaves no empty folder behind."""
    where = path if folder else os.path.dirname(os.path.abspath(path))
    probe = temp_path(os.path.join(where, ".write-check") if folder else path)
    made = _missing_folders(where)
    try:
        with writing(path):
            ensure_folder(where)
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT, 0o600))
            os.remove(probe)
    finally:
        for folder_made in made if not make else ():  # deepest first; one another process filled stays
            try:
                os.rmdir(folder_made)
            except OSError:
                break


def _missing_folders(path):
    """The folders of `path` that do not exist yet, deepest first."""
    missing, path = [], os.path.abspath(path)
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    return missing


def through_file(write_to):
    """A `write(path)` that opens `path` (through the seam) and calls write_to(file object)."""
    def write(path):
        with _open_for_write(path) as f:
            write_to(f)
    return write


def current_umask():
    """The process umask (os.umask can only be read by setting it: set and restored at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path):
    """Give `path` the mode open() would (0666 less the umask). Some writers create their file
    0600 whatever the umask (safetensors does), which a teammate on a shared filesystem cannot read."""
    os.chmod(path, 0o666 & ~current_umask())


def write_file(path, write, after_written=None):
    """Create `path` with write(path), fsynced, with the mode the umask gives (not atomic: for files
    inside a temporary folder). On a failed write the partial file is removed and the OSError
    behind it raised; other errors (bugs) propagate after the same clean-up. `after_written(path)`: a test hook."""
    try:
        write(path)
        follow_umask(path)
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
    except BaseException as err:
        remove_quietly(path)
        os_error = os_error_of(err) if isinstance(err, Exception) else None
        if os_error is None:
            raise
        raise os_error from None
    if after_written is not None:
        after_written(path)


def atomic_write(path, write, *, needed=None, kept=None, hint=None):
    """Write `path` atomically with write(temp path) (see the module docstring); creates the parent
    folder. Any OSError -> WriteError naming `path`; no temporary file is left, the old `path` is intact."""
    tmp = temp_path(path)
    try:
        ensure_folder(os.path.dirname(os.path.abspath(path)))
        write_file(tmp, write)
        os.replace(tmp, path)
    except OSError as err:
        remove_quietly(tmp)
        raise write_error(path, err, needed=needed, kept=kept, hint=hint) from None
    except BaseException:
        remove_quietly(tmp)
        raise


def atomic_write_bytes(path, data, **describe):
    atomic_write(path, through_file(lambda f: f.write(data)), needed=len(data), **describe)


def atomic_write_text(path, text, **describe):
    """Text (UTF-8): YAML, CSV, JSON lines, markdown."""
    atomic_write_bytes(path, text.encode(), **describe)


def strict_json(obj):
    """`obj` with every non-finite float replaced by None (recursively through dicts, lists, tuples)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def json_text(obj, indent=None):
    """The one JSON encoding: strict (NaN/inf -> null), key order kept."""
    return json.dumps(strict_json(obj), indent=indent, allow_nan=False)


def json_file_text(obj):
    """The text of a JSON file (indent 1, trailing newline)."""
    return json_text(obj, indent=1) + "\n"


def write_json(obj, path, **describe):
    """Atomic strict-JSON file (indent 1, trailing newline); creates the parent folder."""
    atomic_write_text(path, json_file_text(obj), **describe)


def read_json(path):
    with open(path) as f:
        return json.load(f)


class DamagedJSON(ValueError):
    """A record that is not the strict JSON this project writes; the message says how, without the path."""


def read_json_record(path, *, max_bytes=1 << 20, max_depth=8):
    """The JSON value of a small record this project wrote, read whole; DamagedJSON for a file of more
    than `max_bytes`, not UTF-8, not JSON, with NaN or Infinity (never written: strict JSON), or nested
    deeper than `max_depth` (deep nesting overflows Python's stack in the parser, or after it)."""
    try:
        size = os.path.getsize(path)
        if size > max_bytes:
            raise DamagedJSON(f"it holds {size} bytes, far more than such a record")
        with open(path, "rb") as f:
            raw = f.read()
        value = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except OSError as err:
        raise DamagedJSON(f"it cannot be read ({err.strerror or err})") from None
    except UnicodeDecodeError as err:
        raise DamagedJSON(f"it is not UTF-8 text (byte {err.start})") from None
    except RecursionError:
        raise DamagedJSON(f"its JSON is nested deeper than {max_depth} levels") from None
    except DamagedJSON:
        raise
    except ValueError as err:  # json.JSONDecodeError, and _refuse_constant's
        raise DamagedJSON(f"it is not JSON ({str(err).splitlines()[0][:200]})") from None
    if _depth_over(value, max_depth):
        raise DamagedJSON(f"its JSON is nested deeper than {max_depth} levels")
    return value


def _refuse_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def _depth_over(value, limit):
    """Whether lists and objects nest more than `limit` deep in `value` (iteratively: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def remove_stale_temp(folder, names=None):
    """Delete the `NAME.tmp<pid>` files killed writes left in `folder` (only those of `names` when
    given, and only where process <pid> is gone); -> their paths. Call it only while holding the
    folder's lock (common/runlock.py), so no writer of the folder is live; the pid check also keeps
    the files of a live writer that does not take that lock. One named with this process's own pid
    is a predecessor's (a restarted container reuses pids): this process writes none while it cleans."""
    if not os.path.isdir(folder):
        return []
    prefixes = None if names is None else tuple(os.path.basename(n) + ".tmp" for n in names)
    removed = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if is_temp_name(name) and (prefixes is None or name.startswith(prefixes)) \
                and os.path.isfile(path) and not os.path.islink(path) and not _written_by_another_live_process(name):
            remove_quietly(path)
            removed.append(path)
    return removed
