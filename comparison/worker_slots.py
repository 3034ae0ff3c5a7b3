"""Running train.py / eval.py mains in a Python process that is already started: the launcher's side
of scripts/compare_heads.py's job workers (the worker process itself: comparison/worker.py).

Why: a Python start that imports torch, timm and Accelerate costs ~7 s of CPU, and a comparison
would pay it twice per run (train.py, then eval.py).

- `InProcess`: one entry point's main in this process, as common/cli.py's run_cli would call it (a
  UserError is its one line and exit 2), after resetting Accelerate's process-wide state.
  compare_heads --features (one job, no launcher) runs everything this way, and so does a worker.
- `WorkerSlot`: a --jobs slot's worker, one Python process (`python scripts/compare_worker.py`) that
  runs the slot's train.py and eval.py steps, run after run: one start per slot instead of two per
  run. Its exit status comes back as a JSON line. A step that raised anything but a UserError (a
  bug: its traceback is in the log) or was interrupted ends the worker (`ends_worker`, the one rule
  both sides read); the slot's next step starts a new one.

The entry points are imported by name when a step runs, never at import: this module stays below
them in the import graph (tests/test_layering.py).
"""
import importlib
import json
import os
import subprocess
import sys

from accelerate.state import AcceleratorState, GradientState

from common.children import exit_status
from common.errors import UserError
from comparison.paths import WORKER_SCRIPT

ENTRY_POINTS = {"train.py": "train", "eval.py": "eval"}  # what a worker runs: a command's script -> module
BUG_EXIT = 1  # a step raised something other than a UserError: the worker stops after it
STDOUT_FD = "--stdout-fd"  # the worker's flag: the descriptor its steps' stdout goes to (comparison/worker.py)


def ends_worker(status):
    """A step's status after which its worker stops (both sides read this rule): a bug, or a signal
    (train.py saved and returned 128 + N, or eval.py was interrupted)."""
    return status == BUG_EXIT or status >= 128


class _NoLauncher:
    stopped = False

    def check_stopped(self, *args):
        pass


class InProcess:
    """Runs `[python, PATH/train.py|eval.py, args...]` as a call of that entry point's main here.
    Signals: train.py's own handlers stop the run with a checkpoint while it trains; the launcher's
    (`children`) stop the comparison between runs."""

    def __init__(self, children=None):
        self.children = children or _NoLauncher()

    @property
    def stopped(self):
        return self.children.stopped

    def check_stopped(self, *args):
        return self.children.check_stopped(*args)

    def run(self, cmd, **_):
        self.check_stopped("nothing more is started")
        module = importlib.import_module(ENTRY_POINTS[os.path.basename(cmd[1])])
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        try:
            return int(module.main(cmd[2:]) or 0)
        except UserError as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            return getattr(err, "exit_code", 2)
        except SystemExit as err:
            return err.code if isinstance(err.code, int) else 1
        finally:
            sys.stdout.flush()


def can_run(cmd):
    """A command a worker can run: this interpreter on one of ENTRY_POINTS (no --launcher prefix)."""
    return len(cmd) >= 2 and cmd[0] == sys.executable and os.path.basename(cmd[1]) in ENTRY_POINTS


class WorkerSlot:
    """One --jobs slot's worker process, started at the slot's first step with the slot's environment
    (its OMP_NUM_THREADS / CUDA_VISIBLE_DEVICES); `run(cmd, log)` -> the step's exit status. A step
    with no log prints where this process prints (its stdout and stderr), as a child process would."""

    def __init__(self, children, env):
        self.children, self.env = children, env
        self.proc = None

    def _start(self):
        stdout = os.dup(1)  # this process's stdout, for the steps that print on the terminal
        try:
            self.proc = self.children.start([sys.executable, WORKER_SCRIPT, STDOUT_FD, str(stdout)], env=self.env,
                                            text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            pass_fds=(stdout,))
        finally:
            os.close(stdout)

    def run(self, cmd, log=None):
        if self.proc is None:
            self._start()
        try:
            self.proc.stdin.write(json.dumps({"cmd": list(cmd), "log": log}) + "\n")
            self.proc.stdin.flush()
            reply = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            reply = ""
        if not reply:  # the worker ended (a signal, a bug, killed): its exit status is the step's
            return self._ended()
        status = int(json.loads(reply)["status"])
        if ends_worker(status):
            self._ended()  # the worker stops after such a step; the next step starts a new one
        return status

    def _ended(self):
        proc, self.proc = self.proc, None
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        status = exit_status(proc.wait())
        self.children.forget(proc)
        return status

    def close(self):
        if self.proc is not None:
            self._ended()
