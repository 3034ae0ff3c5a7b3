"""A --jobs slot's worker process (a comparison starts one per slot, `python scripts/compare_worker.py`,
through comparison/worker_slots.WorkerSlot): it runs the slot's train.py and eval.py mains one after another.

Each request on stdin is {"cmd": [...], "log": PATH}; the step's output goes to its log file (both
file descriptors, so C-level output too) and {"status": N} comes back on stdout. With "log": null
(one-job comparisons, whose steps print on the terminal) the step writes to the worker's stderr and
to the descriptor given as `--stdout-fd N`: the launcher's own stdout, as a `python train.py` child
would. A run trained by a
worker is bit-identical to the same run trained by `python train.py` (tests/test_compare_worker.py).

Signals: the worker is a child of compare_heads' ChildProcesses, so it gets the launcher's signals;
while train.py's main runs, its own handlers save a checkpoint and it returns 143 / 130 / 138 (as
the process would exit); between steps the signal ends the worker with the same code.
"""
import contextlib
import gc
import json
import os
import sys
import traceback

from comparison.worker_slots import BUG_EXIT, STDOUT_FD, InProcess, ends_worker


def _redirect(fd_from, fd_to):
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        if stream is not None:
            stream.flush()
    os.dup2(fd_from, fd_to)


@contextlib.contextmanager
def _output(path):
    """The step's output: appended to the log at `path` (sys.stdout/stderr and file descriptors 1 and 2,
    so C-level output too), or, with no path, where the worker's descriptors 1 and 2 point."""
    if path is None:
        yield
        return
    with open(path, "a", buffering=1) as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        _redirect(log.fileno(), 1)  # C-level output (torch's warnings, a crash dump) too
        _redirect(log.fileno(), 2)
        yield


def serve(requests, replies):
    """Run each request {"cmd": [...], "log": PATH} with its output appended to PATH; write
    {"status": N} for it. Returns at the end of `requests` or after a step that ended the worker."""
    runner = InProcess()
    for line in requests:
        request = json.loads(line)
        saved = [os.dup(1), os.dup(2)]
        with _output(request["log"]):
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


def main(argv=None):
    # The request and reply pipes get private descriptors; fds 0 and 1 are pointed away from them so
    # nothing a step prints or reads can corrupt the protocol: fd 1 becomes --stdout-fd (the launcher's
    # stdout) when given, else stderr.
    argv = sys.argv[1:] if argv is None else argv
    stdout_fd = int(argv[argv.index(STDOUT_FD) + 1]) if STDOUT_FD in argv else 2
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(stdout_fd, 1)
    if stdout_fd != 2:
        os.close(stdout_fd)
    serve(requests, replies)
    return 0
