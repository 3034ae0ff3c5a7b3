"""train.py / eval.py mains run in a Python process that is already started (scripts/compare_heads.py).

Why: a Python start that imports torch, timm and Accelerate costs ~7 s of CPU (measured: 6.3 s of
imports on a 2-core EPYC), and a comparison pays it twice per run (train.py, then eval.py). The quick
start's 9 runs of ~100 s each spent ~1/7 of their CPU time importing. So:

- `InProcess`: one entry point's main in this process, as engine/cli.py's run_cli would call it (a
  UserError is its one line and exit 2), after resetting Accelerate's process-wide state.
  compare_heads --features (one job, no launcher) runs everything this way.
- `WorkerSlot`: a --jobs slot's worker, one Python process (`python scripts/compare_worker.py`) that
  runs the slot's train.py and eval.py steps, run after run: one start per slot instead of two per
  run. Each step's output goes to its log file (both file descriptors, so C-level output too), its
  exit status comes back as a JSON line. A step that raised anything but a UserError (a bug: its
  traceback is in the log) or was interrupted ends the worker; the slot's next step starts a new one.
  A run trained by a worker is bit-identical to the same run trained by `python train.py`
  (tests/test_compare_worker.py).

Signals: the worker is a child of compare_heads' ChildProcesses, so it gets the launcher's signals;
while train.py's main runs, its own handlers save a checkpoint and it returns 143 / 130 / 138 (as
the process would exit); between steps the signal ends the worker with the same code.
"""
import contextlib
import gc
import importlib
import json
import os
import subprocess
import sys
import traceback

import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

from common.errors import UserError
from engine.children import exit_status

ENTRY_POINTS = {"train.py": "train", "eval.py": "eval"}  # what a worker runs: a command's script -> module
BUG_EXIT = 1  # a step raised something other than a UserError: the worker stops after it


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
        from accelerate.state import AcceleratorState, GradientState

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


# ------------------------------------------------------------------------------------ the launcher's side
def can_run(cmd):
    """A command a worker can run: this interpreter on one of ENTRY_POINTS (no --launcher prefix)."""
    return len(cmd) >= 2 and cmd[0] == sys.executable and os.path.basename(cmd[1]) in ENTRY_POINTS


class WorkerSlot:
    """One --jobs slot's worker process, started at the slot's first step with the slot's environment
    (its OMP_NUM_THREADS / CUDA_VISIBLE_DEVICES); `run(cmd, log)` -> the step's exit status."""

    def __init__(self, children, env):
        self.children, self.env = children, env
        self.proc = None

    def _start(self):
        self.proc = self.children.start([sys.executable, os.path.abspath(__file__)], env=self.env, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def run(self, cmd, log):
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


# --------------------------------------------------------------------------------------- the worker's side
def _redirect(fd_from, fd_to):
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        if stream is not None:
            stream.flush()
    os.dup2(fd_from, fd_to)


def serve(requests, replies):
    """Run each request {"cmd": [...], "log": PATH} with its output appended to PATH; write
    {"status": N} for it. Returns at the end of `requests` or after a step that ended the worker."""
    runner = InProcess()
    for line in requests:
        request = json.loads(line)
        saved = [os.dup(1), os.dup(2)]
        with open(request["log"], "a", buffering=1) as log, \
                contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            _redirect(log.fileno(), 1)  # C-level output (torch's warnings, a crash dump) too
            _redirect(log.fileno(), 2)
            try:
                status = runner.run(request["cmd"])
            except KeyboardInterrupt:  # SIGINT outside train.py's handlers (eval.py, start-up)
                print("interrupted", file=sys.stderr, flush=True)
                status = 130
            except BaseException:  # a bug: its traceback goes to the run's log, then the worker stops
                traceback.print_exc()
                status = BUG_EXIT
            finally:
                _redirect(saved[0], 1)
                _redirect(saved[1], 2)
                for fd in saved:
                    os.close(fd)
        replies.write(json.dumps({"status": status}) + "\n")
        replies.flush()
        if ends_worker(status):
            return
        _forget_the_step()


def _forget_the_step():
    """Before the next step: the step's model, optimizer and data go, and so do its torch.compile
    graphs (dynamo keeps them per code object, and past its recompile limit a later run in the same
    worker would silently run eager)."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()
    gc.collect()


def main():
    # The request and reply pipes get private descriptors; fds 0 and 1 are pointed away from them so
    # nothing a step prints or reads can corrupt the protocol.
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    serve(requests, replies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
