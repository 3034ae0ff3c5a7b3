"""Signals pass through the launchers: a real SIGTERM to scripts/compare_heads.py reaches
its train.py child, which saves and stops; compare_heads exits with the child's code (143), no
child is left (checked with `ps`), the run lock is released and the same command then resumes
and finishes. A second signal kills the children at once (--jobs 2). common.children's own rules
(exit status of a death by signal, nothing started after a signal, time limits) are checked on
small shell children."""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from common import rundir
from common.children import EXIT_TIMEOUT, ChildProcesses, StoppedBySignal
from test_compare import TINY_CONFIG
from test_train_helpers import ROOT, subprocess_env, wait_for_file
from training.checkpoint import files as ck

SCRIPT = os.path.join(ROOT, "scripts", "compare_heads.py")
HOOKED = os.path.join(ROOT, "tests", "hooked_train.py")
needs_ps = pytest.mark.skipif(shutil.which("ps") is None, reason="checks for orphans with ps")
PAUSE_AFTER = 2  # the training child waits after update 2 (of 3) until the gate file exists


def _compare_cmd(tmp_path, *extra):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_CONFIG)
    return [sys.executable, SCRIPT, "--config", str(config), "--heads", "softmax", "--ood-dataset", "none",
            "--no-mlflow", "--runs-dir", str(tmp_path / "runs"), "--report-dir", str(tmp_path / "report"), *extra,
            "optim.epochs=1", "data.builtin_val_size=40"]  # 3 updates, a small eval: overrides after the options


def _gated_launcher(gate):
    return ["--launcher", f"{sys.executable} {HOOKED} --pause-after-step {PAUSE_AFTER} --gate {gate}"]


def _processes_mentioning(text):
    """Command lines of live processes that mention `text` (`ps`, zombies excluded; -ww: whole command
    lines, which ps otherwise cuts at $COLUMNS, before a run directory is named)."""
    out = subprocess.run(["ps", "-ww", "-eo", "stat=,args="], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if text in line and not line.lstrip().startswith("Z")]


def _wait_for_lines(path, count, proc, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(path) and len(open(path).read().split()) >= count:
            return True
        time.sleep(0.1)
    return False


def _wait_gone(text, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline and _processes_mentioning(text):
        time.sleep(0.1)
    return _processes_mentioning(text)


@needs_ps
def test_sigterm_to_compare_heads_stops_its_training_cleanly_and_the_rerun_resumes(tmp_path):
    gate = str(tmp_path / "gate")
    run = str(tmp_path / "runs" / "softmax-s0")
    proc = subprocess.Popen(_compare_cmd(tmp_path, *_gated_launcher(gate)), cwd=ROOT, env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for_file(gate + ".waiting", proc), proc.communicate()[1][-3000:]
        os.kill(proc.pid, signal.SIGTERM)  # the launcher only, as `kill PID` or `timeout` does
        time.sleep(0.3)  # forwarded while the child waits at the gate
    finally:
        open(gate, "w").close()
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 143, out[-2000:] + err[-3000:]
    assert "SIGTERM received: forwarded to 1 child process(es)" in err
    assert f"SIGTERM: stopped after step {PAUSE_AFTER}" in out  # train.py saved and said so
    assert "SIGTERM: training" in err and "rerun the same command" in err
    assert _wait_gone(run) == []  # no train.py child outlives compare_heads
    assert not os.path.exists(os.path.join(run, "run.lock"))
    assert [s for s, _ in ck.list_checkpoints(os.path.join(run, rundir.CHECKPOINTS))] == [PAUSE_AFTER]

    # the rerun, without the gated launcher: its steps run on the comparison's worker (comparison/execution.py)
    again = subprocess.run(_compare_cmd(tmp_path), cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                           timeout=400)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert "resumed from" in again.stdout and os.path.isfile(os.path.join(run, "summary.json"))
    assert os.path.isfile(tmp_path / "report" / "report.md")


@needs_ps
def test_a_second_signal_kills_every_child_of_parallel_jobs(tmp_path):
    gate = str(tmp_path / "gate")  # never opened: both trainings wait until killed
    proc = subprocess.Popen(_compare_cmd(tmp_path, "--seeds", "0", "1", "--jobs", "2", *_gated_launcher(gate)),
                            cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = str(tmp_path / "runs")
    try:
        assert _wait_for_lines(gate + ".waiting", 2, proc), proc.communicate()[1][-3000:]  # both at the gate
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(2.5)  # past the debounce: the next one is a second request
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "SIGTERM received: forwarded to 2 child process(es)" in err, err[-3000:]
    assert "SIGTERM again: killing 2 child process(es)" in err
    assert proc.returncode == 128 + signal.SIGKILL, err[-3000:]  # the killed children's code
    assert _wait_gone(runs) == []


# ----------------------------------------------------------------------------- common.children itself
def test_exit_status_time_limit_and_nothing_started_after_a_signal():
    before = signal.getsignal(signal.SIGUSR1)
    with ChildProcesses() as children:
        assert children.run(["sh", "-c", "exit 3"]) == 3
        assert children.run(["sh", "-c", "kill -TERM $$"]) == 128 + signal.SIGTERM
        start = time.perf_counter()
        assert children.run(["sleep", "30"], timeout=0.5) == EXIT_TIMEOUT
        assert time.perf_counter() - start < 10
        os.kill(os.getpid(), signal.SIGUSR1)  # handled: no child running, none is started afterwards
        assert children.stopped and children.exit_code == 128 + signal.SIGUSR1
        with pytest.raises(StoppedBySignal) as err:
            children.run(["sh", "-c", "exit 0"])
        assert err.value.exit_code == 138 and "SIGUSR1" in str(err.value)
    assert signal.getsignal(signal.SIGUSR1) == before  # handlers restored
