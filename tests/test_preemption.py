"""Preemption: real signals to real subprocesses running a small training-like loop with the guard:
the first signal saves and exits with the documented code, a second one exits at once; copies of
one signal are not a second one; ranks agree through one collective."""
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from training.preemption import EXIT_CODES, EXIT_FORCED, PreemptionGuard

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# step loop: progress file per step; on stop: "saving" marker, a save taking SAVE_S seconds, the
# checkpoint file (written only once the save is complete), then the guard's exit code.
LOOP = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, {root!r})
    from training.preemption import PreemptionGuard, gloo_reduce_max
    out = sys.argv[1]
    save_s, debounce_s, sync_every, linger_s = (float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]),
                                                float(sys.argv[5]))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    reduce_max = None
    if world > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=world)
        reduce_max = gloo_reduce_max()
    guard = PreemptionGuard(sync_every=sync_every, debounce_s=debounce_s).install()
    step = 0
    while step < 100000:
        time.sleep(0.02)  # one "training step"
        step += 1
        with open(os.path.join(out, f"progress{{rank}}"), "w") as f:
            f.write(str(step))
        if guard.should_stop(step, reduce_max):
            open(os.path.join(out, f"saving{{rank}}"), "w").close()
            time.sleep(save_s)
            with open(os.path.join(out, f"ckpt{{rank}}.json"), "w") as f:
                json.dump({{"step": step, "signal": guard.signum}}, f)
            guard.mark_saved()
            time.sleep(linger_s)  # teardown after the save (a later signal must not lose it)
            sys.exit(guard.exit_code)
    sys.exit(0)
""")


def _start(tmp_path, save_s=0.0, debounce_s=2.0, sync_every=1, linger_s=0.0, env=None, name="loop"):
    script = tmp_path / "loop.py"
    script.write_text(LOOP.format(root=ROOT))
    out = tmp_path / name
    out.mkdir(exist_ok=True)
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(env or {}))
    proc = subprocess.Popen([sys.executable, str(script), str(out), str(save_s), str(debounce_s), str(sync_every),
                             str(linger_s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)
    return proc, str(out)


def _wait_for(path, proc=None, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path):
            return True
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.01)
    return False


def _progress(out, rank=0):
    try:
        return int(open(os.path.join(out, f"progress{rank}")).read() or 0)
    except (OSError, ValueError):
        return 0


def _wait_steps(proc, out, n, rank=0):
    deadline = time.time() + 60
    while _progress(out, rank) < n and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    assert _progress(out, rank) >= n, proc.stderr.read() if proc.poll() is not None else "no progress"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1], ids=lambda s: s.name)
def test_first_signal_saves_then_exits_with_its_code(tmp_path, sig):
    proc, out = _start(tmp_path)
    _wait_steps(proc, out, 3)
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == EXIT_CODES[sig] == 128 + sig
    ckpt = json.load(open(os.path.join(out, "ckpt0.json")))
    assert ckpt["signal"] == sig and ckpt["step"] >= 3
    assert _progress(out) == ckpt["step"]  # stopped at the step it saved, no further step
    err = proc.stderr.read()
    assert err.count("\n") == 1 and f"{sig.name} received: saving a checkpoint" in err


def test_second_signal_exits_at_once_without_saving(tmp_path):
    proc, out = _start(tmp_path, save_s=120, debounce_s=0.2)  # a save that would take two minutes
    _wait_steps(proc, out, 2)
    proc.send_signal(signal.SIGTERM)
    assert _wait_for(os.path.join(out, "saving0"), proc)
    time.sleep(0.4)  # past the debounce window: a genuine second request
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == EXIT_FORCED == 137
    assert not os.path.exists(os.path.join(out, "ckpt0.json"))
    assert "exiting at once without saving" in proc.stderr.read()


def test_copies_of_one_signal_are_not_a_second_request(tmp_path):
    """The scheduler signals every process and the launcher forwards its copy: both arrive at once."""
    proc, out = _start(tmp_path, save_s=0.5, debounce_s=30)
    _wait_steps(proc, out, 2)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)
    assert _wait_for(os.path.join(out, "saving0"), proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    assert os.path.exists(os.path.join(out, "ckpt0.json"))


def test_signal_after_the_save_exits_gracefully(tmp_path):
    proc, out = _start(tmp_path, debounce_s=0.1, linger_s=120)
    _wait_steps(proc, out, 2)
    proc.send_signal(signal.SIGUSR1)
    assert _wait_for(os.path.join(out, "ckpt0.json"), proc)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == EXIT_CODES[signal.SIGUSR1]  # not 137: the checkpoint is complete


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ranks_agree_through_one_collective_and_stop_at_the_same_step(tmp_path):
    """Only rank 1 is signalled; both ranks stop at the same sync step and save."""
    port = str(_free_port())
    procs = []
    for rank in range(2):
        env = {"WORLD_SIZE": "2", "RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(_start(tmp_path, sync_every=4, env=env, name="ranks"))
    (p0, out), (p1, _) = procs
    _wait_steps(p1, out, 5, rank=1)
    p1.send_signal(signal.SIGUSR1)
    assert p1.wait(timeout=60) == 138
    assert p0.wait(timeout=60) == 143  # signalled by agreement: stops like a SIGTERM
    c0 = json.load(open(os.path.join(out, "ckpt0.json")))
    c1 = json.load(open(os.path.join(out, "ckpt1.json")))
    assert c0["step"] == c1["step"] and c0["step"] % 4 == 0 and c0["step"] > 5


def test_should_stop_uses_no_collective_alone_and_one_per_sync_step_otherwise():
    calls = []

    def reduce_max(flag):
        calls.append(flag)
        return flag

    before = signal.getsignal(signal.SIGUSR1)
    with PreemptionGuard(sync_every=5) as guard:
        assert not guard.should_stop(1) and guard.exit_code == 0
        assert [guard.should_stop(s, reduce_max) for s in range(1, 11)] == [False] * 10
        assert calls == [0, 0]  # only at steps 5 and 10
        os.kill(os.getpid(), signal.SIGUSR1)  # handled in this (main) thread before kill returns
        assert guard.requested and guard.signum == signal.SIGUSR1
        assert [guard.should_stop(s, reduce_max) for s in range(11, 16)] == [False] * 4 + [True]
        assert calls == [0, 0, 1] and guard.exit_code == 138
    with PreemptionGuard(sync_every=5) as guard:  # an epoch end off the sync cadence: forced agreement
        guard.requested = True
        assert not guard.should_stop(7, reduce_max) and guard.should_stop(7, reduce_max, force_sync=True)
        assert calls[-1] == 1 and len(calls) == 4
    assert signal.getsignal(signal.SIGUSR1) == before  # uninstalled: the previous handler is back


def test_forked_children_ignore_the_signal():
    """DataLoader workers forked after install() inherit the handler; it must not act in them."""
    with PreemptionGuard() as guard:
        pid = os.fork()
        if pid == 0:  # child
            os.kill(os.getpid(), signal.SIGTERM)
            os._exit(3 if guard.requested else 0)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        assert not guard.requested
