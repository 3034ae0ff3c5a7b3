"""One writer per run directory: RUN_DIR/run.lock.

The lock file is JSON: {"pid", "host", "since" (UTC, ISO 8601), "purpose" (training, eval,
overwrite, compare_heads, ...), "boot_id", "proc_start", "token"}. It is created atomically: the
content goes to a private file first, which is then hard-linked to `run.lock` (link fails if the
name exists, so exactly one of two racing processes wins, and nobody ever reads a half-written
lock); filesystems without hard links fall back to O_CREAT|O_EXCL.

A second writer gets one line naming the holder (pid, host, since) and the ways out. A stale lock
is taken over with a warning: same host and the pid is gone, or the pid now belongs to another
process (its start time differs, e.g. a container restarted with the same pid), or the host has
rebooted since (boot id differs). A lock held on another host is never taken over automatically
(its pid cannot be checked from here): the message says to delete the file if that run is gone.
Takeovers are serialised with flock on the directory, so two processes cleaning the same stale
lock cannot delete each other's fresh one. A folder the lock cannot be written in (read-only
filesystem, a path through a file, permissions, full disk) is one line (common.io.WriteError, exit 74).

The lock is released by `release()`, on leaving the `with` block (exceptions included) and at
interpreter exit (atexit); a process killed hard (SIGKILL, os._exit) leaves a stale lock that the
next run takes over. Multi-process runs: only the process that writes (global rank 0) locks; the
others pass `enabled=False` and get a no-op.

    with RunLock(run_dir, purpose="training", enabled=accelerator.is_main_process, warn=say):
        ...   # everything that writes into run_dir
"""
import atexit
import contextlib
import datetime
import errno
import json
import os
import socket
import time
import uuid

try:
    import fcntl  # POSIX: the flock on the run directory
except ImportError:  # Windows: the lock file alone
    fcntl = None

from common import rundir
from common.errors import UserError
from common.io import ensure_folder, pid_alive, remove_stale_temp, through_file, write_error, write_file

_UNREADABLE_GRACE_S = 10.0  # an unparsable lock younger than this may be mid-creation (O_EXCL fallback)


class RunLockHeld(UserError):
    """Another live process holds the run directory's lock (one-line message naming it)."""


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def _proc_start(pid):
    """Start time of `pid` in clock ticks since boot (Linux /proc), or None where unavailable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return int(stat[stat.rindex(")") + 2:].split()[19])  # field 22; fields after ')' start at 3
    except (OSError, ValueError, IndexError):
        return None


def _describe(holder):
    return (f"pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('since')}"
            + (f", {holder['purpose']}" if holder.get("purpose") else ""))


def process_record():
    """This process as a holder: pid, host, boot id and start time, what `stale_reason` checks (a lock
    file's record; compare_heads --tune's trials name their process this way too)."""
    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(), "boot_id": _boot_id(), "proc_start": _proc_start(pid)}


def stale_reason(holder, host=None):
    """Why the lock described by `holder` is stale (a string), or None if it may be live."""
    host = host or socket.gethostname()
    if holder.get("host") != host:
        return None
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return "it names no valid pid"
    boot = _boot_id()
    if holder.get("boot_id") and boot and holder["boot_id"] != boot:
        return "the host has rebooted since"
    if not pid_alive(pid):
        return f"process {pid} is gone"
    recorded, now = holder.get("proc_start"), _proc_start(pid)
    if recorded is not None and now is not None and recorded != now:
        return f"pid {pid} now belongs to another process"
    return None


def read_lock(run_dir):
    """The holder's record of RUN_DIR/run.lock, None if there is no lock, {} if it is unreadable."""
    path = os.path.join(run_dir, rundir.LOCK)
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}


def held_by_this_process(run_dir):
    """True when RUN_DIR/run.lock names this process (pid, host and process start time)."""
    holder = read_lock(run_dir)
    return bool(holder) and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname() \
        and holder.get("proc_start") == _proc_start(os.getpid())


@contextlib.contextmanager
def _directory_flock(path):
    """Exclusive flock on the directory itself (best effort: some network filesystems refuse it)."""
    fd = None
    if fcntl is not None:
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY)
    if fd is None:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)  # closing releases the flock


class RunLock:
    """Exclusive lock on a run directory (see the module docstring). Re-entrant use is an error."""

    def __init__(self, run_dir, *, purpose="training", enabled=True, warn=print, holder="run",
                 ways_out="use another train.output_dir"):
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, rundir.LOCK)
        self.purpose = purpose
        self.holder, self.ways_out = holder, ways_out  # the refusal's words: 'in use by another <holder>'
        self.enabled = enabled
        self.warn = warn
        self.held = False
        self.record = None

    # -------------------------------------------------------------- acquire / release
    def _new_record(self):
        return {**process_record(),
                "since": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
                "purpose": self.purpose, "token": uuid.uuid4().hex}

    def _try_create(self, record):
        """True when this process created the lock file; False when it already exists."""
        data = json.dumps(record, indent=1).encode()
        private = os.path.join(self.run_dir, f".{rundir.LOCK}.{record['token']}")
        write_file(private, through_file(lambda f: f.write(data)))
        try:
            os.link(private, self.path)
            return True
        except FileExistsError:
            return False
        except OSError as err:  # no hard links here: exclusive create, then write
            if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            return True
        finally:
            try:
                os.remove(private)
            except OSError:
                pass

    def _refusal(self, holder):
        who = _describe(holder) if holder else "an unreadable lock record"
        return RunLockHeld(
            f"{self.run_dir} is in use by another {self.holder} ({who}); wait for it to finish, {self.ways_out}, "
            f"or delete {self.path} if that process no longer exists")

    def _take_over(self, holder, reason):
        """Delete the stale lock `holder` unless someone replaced it meanwhile (under flock)."""
        with _directory_flock(self.run_dir):
            current = read_lock(self.run_dir)
            if current is None:
                return
            if current != holder:
                return  # replaced since we read it: the caller re-examines the new holder
            try:
                os.remove(self.path)
            except FileNotFoundError:
                return
        who = _describe(holder) if holder else "unreadable record"
        self.warn(f"warning: taking over the stale lock {self.path} ({who}): {reason}")

    def acquire(self):
        """Take the lock (see the module docstring); RunLockHeld while another live process holds
        it, WriteError when the folder cannot hold a lock file."""
        if not self.enabled or self.held:
            return self
        try:
            return self._acquire()
        except OSError as err:
            raise self.unwritable(err) from None

    def unwritable(self, err):
        """WriteError for the OSError `err` that keeps the lock file from being made (train.py finds the
        error before torch loads, by looking, and answers with the same line)."""
        return write_error(self.path, err, hint=f"{self.purpose} needs a writable folder: choose another "
                                                "path, or fix its permissions or filesystem")

    def held_elsewhere(self):
        """The RunLockHeld that `acquire` would raise now, found by reading the lock file only (train.py
        asks before torch loads); None when there is no lock, or one `acquire` would take over or wait on."""
        holder = read_lock(self.run_dir)
        if not holder or stale_reason(holder) is not None or held_by_this_process(self.run_dir):
            return None  # (this process's own lock: acquire says so in its own words)
        return self._refusal(holder)

    def _acquire(self):
        ensure_folder(self.run_dir)
        record = self._new_record()
        for _ in range(50):
            if self._try_create(record):
                self.held, self.record = True, record
                atexit.register(self.release)
                return self
            holder = read_lock(self.run_dir)
            if holder is None:
                continue  # released between our attempt and the read: try again
            if not holder:  # unparsable: mid-creation (O_EXCL fallback) or damaged
                try:
                    age = time.time() - os.path.getmtime(self.path)
                except OSError:
                    continue
                if age < _UNREADABLE_GRACE_S:
                    time.sleep(0.2)
                    continue
                self._take_over(holder, "its content is unreadable")
                continue
            if holder.get("pid") == os.getpid() and holder.get("host") == record["host"] \
                    and holder.get("proc_start") == record["proc_start"]:
                raise RunLockHeld(f"{self.run_dir} is already locked by this process ({_describe(holder)}); "
                                  "a run directory can only be used by one run at a time")
            reason = stale_reason(holder)
            if reason is None:
                raise self._refusal(holder)
            self._take_over(holder, reason)
        raise self._refusal(read_lock(self.run_dir))

    def release(self):
        """Remove the lock if this process still holds it (idempotent)."""
        if not self.held:
            return
        self.held = False
        atexit.unregister(self.release)
        current = read_lock(self.run_dir)
        if current and current.get("token") == self.record["token"]:
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False


@contextlib.contextmanager
def writing_into(folder, *, purpose, names=None, subfolders=(), enabled=True, warn=print):
    """Hold FOLDER's lock while writing outputs there, after removing the temporary files that
    killed writers left (common.io.remove_stale_temp: only those of `names` when given, only of
    dead pids), in FOLDER and in its `subfolders`: eval.py's, predict.py's, the export's and the
    feature extraction's outputs. Disabled (`enabled=False`, the other ranks): neither."""
    with RunLock(folder, purpose=purpose, enabled=enabled, warn=warn):
        if enabled:
            for where in [folder, *(os.path.join(folder, s) for s in subfolders)]:
                remove_stale_temp(where, names=names)
        yield
