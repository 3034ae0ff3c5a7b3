"""Run lock: one writer per run directory, across real processes; stale locks taken over; released
on exit, on exceptions and at interpreter exit."""
import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from common import rundir
from common.runlock import RunLock, RunLockHeld, read_lock, stale_reason

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A process that waits for a start file (so racers start together), takes the lock, reports,
# and holds it until a release file appears.
HOLDER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {root!r})
    from common.runlock import RunLock, RunLockHeld
    run_dir, go, release, name = sys.argv[1:5]
    open(go + "." + name + ".ready", "w").close()
    while not os.path.exists(go):
        time.sleep(0.001)
    try:
        lock = RunLock(run_dir, purpose=name).acquire()
    except RunLockHeld as err:
        print("refused:", err, flush=True)
        sys.exit(2)
    print("acquired", flush=True)
    while not os.path.exists(release):
        time.sleep(0.01)
""")


def _script(tmp_path):
    path = tmp_path / "holder.py"
    path.write_text(HOLDER.format(root=ROOT))
    return str(path)


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def test_two_processes_racing_for_one_directory(tmp_path):
    script = _script(tmp_path)
    for attempt in range(3):  # several races: exactly one winner each time
        run = str(tmp_path / f"run{attempt}")
        go, release = str(tmp_path / f"go{attempt}"), str(tmp_path / f"release{attempt}")
        procs = [subprocess.Popen([sys.executable, script, run, go, release, f"racer{i}"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=_env()) for i in range(2)]
        deadline = time.time() + 60
        while not all(os.path.exists(f"{go}.racer{i}.ready") for i in range(2)) and time.time() < deadline:
            time.sleep(0.01)  # both interpreters up and polling for the start file
        open(go, "w").close()
        refused = []
        deadline = time.time() + 60
        while not refused and time.time() < deadline:  # the loser exits; the winner waits for `release`
            refused = [p for p in procs if p.poll() is not None]
            time.sleep(0.02)
        assert len(refused) == 1, [p.poll() for p in procs]
        loser = refused[0]
        winner = procs[1 - procs.index(loser)]
        out = loser.stdout.read()
        assert loser.returncode == 2 and out.startswith("refused:") and out.count("\n") == 1, out + loser.stderr.read()
        holder = read_lock(run)
        assert f"pid {winner.pid} on {socket.gethostname()}, since {holder['since']}" in out
        assert holder["pid"] == winner.pid and holder["purpose"] in ("racer0", "racer1")
        open(release, "w").close()
        assert winner.wait(timeout=60) == 0 and winner.stdout.read() == "acquired\n"
        assert not os.path.exists(os.path.join(run, rundir.LOCK))  # released at the winner's exit (atexit)
        assert os.listdir(run) == []  # no private temp files left either


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _write_lock(run, **fields):
    os.makedirs(run, exist_ok=True)
    record = {"pid": 1, "host": socket.gethostname(), "since": "2020-01-01 00:00:00 UTC", "purpose": "training",
              "boot_id": None, "proc_start": None, "token": "old"}
    record.update(fields)
    with open(os.path.join(run, rundir.LOCK), "w") as f:
        json.dump(record, f)
    return record


def test_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(tmp_path):
    run = str(tmp_path / "run")
    dead = _dead_pid()
    _write_lock(run, pid=dead)
    warnings = []
    with RunLock(run, warn=warnings.append) as lock:
        assert lock.held and read_lock(run)["pid"] == os.getpid()
    assert len(warnings) == 1 and f"process {dead} is gone" in warnings[0] and "stale" in warnings[0]
    assert read_lock(run) is None


def test_reused_pid_is_stale_but_a_live_holder_is_not(tmp_path):
    run = str(tmp_path / "run")
    me = os.getpid()
    live = _write_lock(run, pid=os.getppid(), proc_start=None)
    assert stale_reason(live) is None
    with pytest.raises(RunLockHeld) as err:
        RunLock(run).acquire()
    assert f"pid {os.getppid()} on {socket.gethostname()}" in str(err.value) and "\n" not in str(err.value)
    assert read_lock(run)["token"] == "old"  # a refusal leaves the holder's lock alone
    # same pid, other start time: the pid was reused by another process (e.g. a restarted container)
    from common.runlock import _proc_start
    if _proc_start(os.getppid()) is None:
        pytest.skip("no /proc start times here")
    reused = _write_lock(run, pid=os.getppid(), proc_start=_proc_start(os.getppid()) + 1)
    assert "another process" in stale_reason(reused)
    warnings = []
    with RunLock(run, warn=warnings.append):
        assert read_lock(run)["pid"] == me
    assert "another process" in warnings[0]


def test_lock_on_another_host_is_never_taken_over(tmp_path):
    run = str(tmp_path / "run")
    _write_lock(run, pid=_dead_pid(), host="some-other-node")
    with pytest.raises(RunLockHeld) as err:
        RunLock(run).acquire()
    msg = str(err.value)
    assert "some-other-node" in msg and "since 2020-01-01" in msg and os.path.join(run, rundir.LOCK) in msg


def test_released_on_exception_and_disabled_on_other_ranks(tmp_path):
    run = str(tmp_path / "run")
    with pytest.raises(ZeroDivisionError):
        with RunLock(run):
            assert read_lock(run)["pid"] == os.getpid()
            1 / 0
    assert read_lock(run) is None
    with RunLock(run, enabled=False) as lock:  # rank != 0: a no-op
        assert not lock.held and read_lock(run) is None
        with RunLock(run) as main_lock:  # so rank 0 (here: the same process) can hold it
            assert main_lock.held
    with RunLock(run):
        with pytest.raises(RunLockHeld, match="already locked by this process"):
            RunLock(run).acquire()


def test_released_at_exit_after_an_uncaught_exception_in_a_real_process(tmp_path):
    run = str(tmp_path / "run")
    code = (f"import sys; sys.path.insert(0, {ROOT!r}); from common.runlock import RunLock; "
            f"RunLock({run!r}).acquire(); import os; assert os.path.exists({os.path.join(run, rundir.LOCK)!r}); "
            "raise RuntimeError('boom')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.returncode == 1 and "boom" in proc.stderr
    assert not os.path.exists(os.path.join(run, rundir.LOCK))


def test_unreadable_lock_is_waited_for_then_taken_over(tmp_path, monkeypatch):
    run = str(tmp_path / "run")
    os.makedirs(run)
    path = os.path.join(run, rundir.LOCK)
    open(path, "w").write("{half")
    old = time.time() - 3600
    os.utime(path, (old, old))
    warnings = []
    with RunLock(run, warn=warnings.append):
        assert read_lock(run)["pid"] == os.getpid()
    assert "unreadable" in warnings[0]
