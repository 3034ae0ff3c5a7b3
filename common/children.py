"""Child processes that get their launcher's signals: every script that starts train.py or eval.py
(scripts/compare_heads.py, scripts/bench_gpu.py, ...) runs them through `ChildProcesses`.

    with ChildProcesses() as children:           # main thread: installs the handlers
        status = children.run(cmd)               # any thread (compare_heads --jobs N runs several)
        proc = children.start(cmd, stdin=PIPE)   # a long-lived child (compare_heads' job workers)

- The first SIGTERM / SIGINT / SIGUSR1 is forwarded to every running child (train.py then saves a
  checkpoint at the next update boundary and exits 143 / 130 / 138, see training/preemption.py), and
  the launcher waits for them: `run` returns the child's status, and `stopped` tells the caller
  not to start anything else (`check_stopped` raises `StoppedBySignal`, exit = the child's code).
- A second signal (2 s or more after the first: copies of one signal are not a second request)
  SIGKILLs every child's process group at once.
- No child outlives the launcher: each child starts in its own process group (so a terminal's
  Ctrl-C reaches it once, through the launcher, and its own children, e.g. `accelerate launch`'s
  workers, can be killed with it), and leaving the `with` block (an exception included) SIGKILLs
  the group of any child still running. Only a SIGKILL of the launcher itself cannot be passed on.
"""
import os
import signal
import subprocess
import sys
import threading
import time

from common.errors import UserError
from common.signal_handlers import DEBOUNCE_S, HANDLED_SIGNALS, SignalHandlers

FORWARDED_SIGNALS = HANDLED_SIGNALS  # what train.py saves on (training/preemption.py)
EXIT_TIMEOUT = 124  # a child stopped because its time limit ran out (the `timeout` command's code)


class StoppedBySignal(UserError):
    """The launcher was signalled: its children saved and stopped; exit with their code."""

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


def exit_status(returncode):
    """Popen's returncode as a shell reports it: a death by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class ChildProcesses(SignalHandlers):
    """Runs children that receive the launcher's signals (see the module docstring)."""

    def __init__(self, signals=FORWARDED_SIGNALS, debounce_s=DEBOUNCE_S, stream=None):
        self.signals, self.debounce_s = tuple(signals), float(debounce_s)
        self.stream = stream
        self.signum = None  # the first signal received
        self._first_at = None
        self._killed = False
        self._children = set()  # running Popen objects (read by the handler without a lock: see _snapshot)
        self._lock = threading.Lock()
        self._previous = {}

    # -------------------------------------------------------------- running
    @property
    def stopped(self):
        """True once a signal arrived: start nothing more."""
        return self.signum is not None

    @property
    def exit_code(self):
        return 0 if self.signum is None else 128 + self.signum

    def run(self, cmd, timeout=None, **popen_kwargs):
        """Run `cmd` to its end (or `timeout` seconds: then its group is SIGKILLed and the status is
        EXIT_TIMEOUT); -> its exit status (128 + N after a death by signal N). Refuses to start once
        the launcher was signalled."""
        proc = self.start(cmd, **popen_kwargs)
        try:
            try:
                return exit_status(proc.wait(timeout=timeout))
            except subprocess.TimeoutExpired:
                self._kill_group(proc)
                proc.wait()
                return EXIT_TIMEOUT
        finally:
            self.forget(proc)

    def start(self, cmd, **popen_kwargs):
        """Start `cmd` as a child that gets the launcher's signals and is killed on leaving the `with`
        block; -> its Popen (the caller waits for it, then calls `forget`). Refuses to start once the
        launcher was signalled."""
        self.check_stopped("nothing more is started")
        proc = subprocess.Popen(cmd, start_new_session=True, **popen_kwargs)
        with self._lock:
            self._children.add(proc)
        if self.signum is not None:  # the signal came while it started: it gets it too
            self._send(proc, self.signum)
        return proc

    def forget(self, proc):
        """`proc` has ended: no more signals go to it."""
        with self._lock:
            self._children.discard(proc)

    def check_stopped(self, what="stopped", status=0):
        """Raise StoppedBySignal when a signal arrived: exit with `status` (the stopped child's, e.g.
        143 after train.py saved), or 128 + the signal when the child gave none."""
        if self.signum is not None:
            name = signal.Signals(self.signum).name
            raise StoppedBySignal(f"{name}: {what}; rerun the same command to continue (finished work is kept, "
                                  f"interrupted training resumes from its checkpoint)", status or self.exit_code)

    # -------------------------------------------------------------- signals
    def _say(self, text):
        try:  # os.write, not print: a handler may interrupt a print in progress
            os.write((self.stream or sys.stderr).fileno(), (text + "\n").encode())
        except (OSError, ValueError, AttributeError):
            pass

    def _snapshot(self):
        return list(self._children)  # one C-level copy under the GIL: safe inside a handler

    def _send(self, proc, signum):
        try:
            os.kill(proc.pid, signum)
        except ProcessLookupError:
            pass

    def _kill_group(self, proc):
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the child and everything it started
        except (ProcessLookupError, PermissionError):
            pass

    def kill_all(self):
        """SIGKILL the process group of every running child."""
        for proc in self._snapshot():
            if proc.poll() is None:
                self._kill_group(proc)

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.signum is not None:
            if time.monotonic() - self._first_at < self.debounce_s or self._killed:
                return
            self._say(f"{name} again: killing {len(self._snapshot())} child process(es) at once")
            self._killed = True
            self.kill_all()
            return
        self.signum, self._first_at = signum, time.monotonic()
        children = self._snapshot()
        for proc in children:
            self._send(proc, signum)
        self._say(f"{name} received: forwarded to {len(children)} child process(es); waiting for them to save "
                  f"and stop (send it again to kill them at once)")

    def __exit__(self, *exc):
        try:
            self.kill_all()  # normally none is left; after an error none may outlive the launcher
            for proc in self._snapshot():
                proc.wait()
        finally:
            self.uninstall()
        return False
