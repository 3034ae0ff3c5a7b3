"""A --jobs slot's worker runs train.py / eval.py mains one after another: comparison/worker.py (the process
scripts/compare_worker.py) and its launcher side, comparison/worker_slots.py.

- A run trained and evaluated by a worker, after another run in the same process, is bit-identical
  (weights, per-example evaluation records) to the same run by fresh `python train.py` / `eval.py`.
- A user error is its one line in the step's log and the worker goes on; a bug (any other exception)
  leaves its traceback in the log and ends the worker; a worker that died makes its step fail with the
  death's exit status and the slot's next step starts a new one.
- A SIGTERM to compare_heads --jobs 2 reaches both workers mid-training: each run saves and stops,
  compare_heads exits 143, and the same command resumes both to the end.
"""
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from common import rundir
from common.children import ChildProcesses
from comparison import worker, worker_slots
from comparison.worker_slots import WorkerSlot, can_run
from test_compare import TINY_CONFIG, tiny_run_dir
from test_train_helpers import ROOT, subprocess_env
from training.checkpoint import files as ck

TRAIN, EVAL = os.path.join(ROOT, "train.py"), os.path.join(ROOT, "eval.py")


def _train(config, run_dir, head, seed):
    return [sys.executable, TRAIN, "--config", str(config), f"head.name={head}", f"train.seed={seed}",
            f"train.output_dir={run_dir}"]


def _eval(run_dir):
    """eval.py as compare_heads runs it (tests/test_compare.py's tiny comparison: the built-in OOD set)."""
    return [sys.executable, EVAL, "--checkpoint", str(run_dir), "--output", os.path.join(run_dir, "eval.json"),
            "--quiet", "--ood-dataset", "auto"]


def _assert_same_tensors(a, b):
    ta, tb = load_file(str(a)), load_file(str(b))
    assert ta.keys() == tb.keys() and ta
    for key in ta:
        assert torch.equal(ta[key], tb[key]), f"{key} differs between {a} and {b}"


def test_a_worker_runs_steps_as_fresh_processes_would(tmp_path):
    """The worker's second run against the same run of the tiny comparison, which compare_heads trained
    and evaluated with fresh train.py / eval.py processes."""
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_CONFIG)
    first, second, fresh = tmp_path / "softmax-s1", tmp_path / "sparsemax-s0", tiny_run_dir("sparsemax")
    log = tmp_path / "worker.log"
    with ChildProcesses() as children:
        slot = WorkerSlot(children, subprocess_env())
        # the first run only leaves its state in the process: one epoch of it is enough
        assert slot.run(_train(config, first, "softmax", 1) + ["optim.epochs=1"], str(log)) == 0
        pid = slot.proc.pid
        missing = tmp_path / "missing"
        assert slot.run(_eval(missing), str(log)) == 2  # a user error: its line in the log, the worker goes on
        assert slot.run(_train(config, second, "sparsemax", 0), str(log)) == 0
        assert slot.run(_eval(second), str(log)) == 0
        assert slot.proc.pid == pid  # one process served every step
        slot.close()
        assert slot.proc is None
    text = log.read_text()
    assert "error: " in text and str(missing) in text and "Traceback" not in text
    assert text.count("done: ") == 2  # both trainings' output went to the step's log

    for name in ("model.safetensors", "model_ema.safetensors", "eval.examples.safetensors"):
        _assert_same_tensors(second / name, os.path.join(fresh, name))
    assert json.loads((second / "summary.json").read_text())["final"] == \
        json.loads(open(os.path.join(fresh, "summary.json")).read())["final"]
    ours, theirs = (json.loads(open(os.path.join(run, "eval.json")).read()) for run in (second, fresh))
    for key in ("top1", "loss"):
        assert ours[key] == theirs[key], key
    assert ours["ood"]["scores"] == theirs["ood"]["scores"]


def test_a_dead_worker_fails_its_step_and_the_next_step_gets_a_new_one(tmp_path):
    run = tmp_path / "run"  # a copy of the session's tiny trained run: the last step evaluates it
    shutil.copytree(tiny_run_dir("softmax"), run)
    os.remove(run / "eval.json")
    log = str(tmp_path / "worker.log")
    with ChildProcesses() as children:
        slot = WorkerSlot(children, subprocess_env())
        assert slot.run(_eval(tmp_path / "missing"), log) == 2  # the slot's worker, alive (a quick user error)
        first = slot.proc.pid
        slot.proc.kill()
        slot.proc.wait()
        assert slot.run(_eval(run), log) == 137  # 128 + SIGKILL, as a shell reports it
        assert slot.proc is None and not os.path.exists(run / "eval.json")
        assert slot.run(_eval(run), log) == 0  # a new worker
        assert slot.proc.pid != first and os.path.isfile(run / "eval.json")
        slot.close()


def test_a_bug_ends_the_worker_with_its_traceback_in_the_log(tmp_path, monkeypatch):
    (tmp_path / "buggy_entry.py").write_text("def main(argv):\n    raise RuntimeError('boom ' + argv[0])\n")
    (tmp_path / "fine_entry.py").write_text("def main(argv):\n    print('fine', argv[0])\n    return 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(worker_slots.ENTRY_POINTS, "buggy.py", "buggy_entry")
    monkeypatch.setitem(worker_slots.ENTRY_POINTS, "fine.py", "fine_entry")
    log = tmp_path / "step.log"
    requests = io.StringIO("".join(json.dumps({"cmd": [sys.executable, name, arg], "log": str(log)}) + "\n"
                                   for name, arg in (("fine.py", "a"), ("buggy.py", "b"), ("fine.py", "c"))))
    replies = io.StringIO()
    worker.serve(requests, replies)
    assert [json.loads(line)["status"] for line in replies.getvalue().splitlines()] == [0, worker_slots.BUG_EXIT]
    text = log.read_text()
    assert "fine a" in text and "RuntimeError: boom b" in text and "fine c" not in text  # it stopped after the bug


@pytest.mark.parametrize("cmd, ok", [
    ([sys.executable, TRAIN, "--config", "c.yaml"], True),
    ([sys.executable, EVAL, "--checkpoint", "r"], True),
    (["accelerate", "launch", TRAIN], False),  # a --launcher prefix: a process of its own
    ([sys.executable, "other.py"], False),
])
def test_only_plain_entry_point_commands_go_to_a_worker(cmd, ok):
    assert can_run(cmd) is ok


def _workers_of(pid):
    """PIDs of the compare_worker.py processes whose parent is `pid` (`ps -ww`: unlimited width, else
    ps cuts command lines at $COLUMNS)."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,ppid=,args="], capture_output=True, text=True, check=True).stdout
    rows = (line.split(None, 2) for line in out.splitlines())
    return [int(p) for p, parent, args in rows if int(parent) == pid and "compare_worker.py" in args]


@pytest.mark.skipif(shutil.which("ps") is None, reason="finds the workers with ps")
def test_sigterm_reaches_the_workers_mid_training_and_both_save(tmp_path):
    """compare_heads --jobs 2 (workers): SIGTERM to the launcher only; both trainings save and stop, it
    exits 143 with no process left. (The rerun that resumes, through a worker too: test_launcher_signals.py.)"""
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_CONFIG)
    runs = tmp_path / "runs"
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "compare_heads.py"), "--config", str(config),
           "--heads", "softmax", "--seeds", "0", "1", "--jobs", "2", "--ood-dataset", "none",
           "--runs-dir", str(runs), "--report-dir", str(tmp_path / "report"), "--no-mlflow",
           "optim.epochs=12", "train.eval_every=100", "data.builtin_val_size=40"]  # 36 updates each
    proc = subprocess.Popen(cmd, cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    metrics = [runs / f"softmax-s{s}" / "metrics.jsonl" for s in (0, 1)]
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not all(
            m.exists() and '"kind": "train"' in m.read_text() for m in metrics):
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()[1][-3000:]  # both are training
    workers = _workers_of(proc.pid)
    assert len(workers) == 2  # one per slot, not a train.py process per step
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 143, out[-2000:] + err[-3000:]
    assert "SIGTERM received: forwarded to 2 child process(es)" in err
    for s in (0, 1):
        run = runs / f"softmax-s{s}"
        assert "SIGTERM: stopped after step" in (run / "compare.log").read_text()
        assert ck.list_checkpoints(str(run / rundir.CHECKPOINTS)) and not (run / "summary.json").exists()
    for pid in workers:  # compare_heads waited for its workers: none outlives it
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
