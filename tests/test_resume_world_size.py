"""Resume across world sizes: a run stopped by SIGTERM mid-epoch on N processes and resumed
on M (`accelerate launch --multi_gpu`, gloo on CPU) with the same global batch continues exactly:
every update is logged once, and epochs.csv's epoch loss is the mean of the epoch's logged update
losses (metrics.jsonl) to 1e-6 relative. Before the fix, the checkpoint's partial sums were counted
per rank of the old world and the resumed epoch weighted the two parts differently (~1e-4 off)."""
import csv
import os
import signal
import subprocess
import sys
import time

from common import rundir
from test_train_helpers import ROOT, main_inprocess, read_metrics, subprocess_env, tiny_cfg, write_cfg
from training.checkpoint import files as ck
from training.checkpoint.state import read_trainer_state

UPDATES = 8  # per epoch: 128 samples at a global batch of 16
COMMON = ["optim.epochs=2", "data.builtin_train_size=128", "data.builtin_val_size=32", "train.ema=false",
          "optim.lr=2e-2"]  # a loss that moves within the epoch: a wrongly weighted mean shows
HOOKED = os.path.join(ROOT, "tests", "hooked_train.py")
FLAG = "--resume-with-changes"  # data.batch_size differs between the world sizes (the global batch does not)


def _launch(script, world):
    if world == 1:
        return [sys.executable, script]
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(world),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
            script]


def _config(tmp_path, run, world, *extra):
    cfg = tiny_cfg(run, *COMMON, f"data.batch_size={16 // world}", *extra)  # global batch 16 on any world size
    return write_cfg(cfg, tmp_path / f"world{world}.yaml")


def _stop_mid_epoch(tmp_path, run, world, stop_after, *args, extra=()):
    """Start (or resume, `args`) on `world` processes, SIGTERM every process of the launch after
    update `stop_after` (as a scheduler does); -> (the launch's exit status, stdout, stderr)."""
    gate = str(tmp_path / f"gate{stop_after}")
    cmd = _launch(HOOKED, world) + ["--pause-after-step", str(stop_after), "--gate", gate,
                                    "--config", _config(tmp_path, run, world, *extra), *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert _wait_for_lines(gate + ".waiting", world, proc), proc.communicate()[1][-3000:]  # every rank waits
        os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(0.2)  # handled while paused
    finally:
        open(gate, "w").close()
    out, err = proc.communicate(timeout=240)
    return proc.returncode, out, err


def _wait_for_lines(path, count, proc, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(path) and len(open(path).read().split()) >= count:
            return True
        time.sleep(0.05)
    return False


def _checkpoint_state(run, step):
    root = os.path.join(run, rundir.CHECKPOINTS)
    assert step in [s for s, _ in ck.list_checkpoints(root)]
    return read_trainer_state(os.path.join(root, rundir.checkpoint_name(step)))


def test_resume_on_another_world_size_keeps_epochs_csv_exact(tmp_path):
    """1 process for updates 1-3, 2 processes for 4-11 (SIGTERM mid-epoch 2), 1 process for 12-16:
    epoch 1 is the 1 -> 2 case, epoch 2 the 2 -> 1 case."""
    run = str(tmp_path / "run")
    status, out, err = _stop_mid_epoch(tmp_path, run, 1, 3)
    assert status == 143 and "SIGTERM received" in err, (out[-2000:], err[-3000:])
    saved = _checkpoint_state(run, 3)
    assert saved.world_size == 1 and saved.updates_in_epoch == 3 and saved.epoch_partial["updates"] == 3

    status, out, err = _stop_mid_epoch(tmp_path, run, 2, UPDATES + 3, "--resume", "auto", FLAG)
    assert status != 0 and "resumed from" in out and "SIGTERM received" in err, (out[-2000:], err[-3000:])
    saved = _checkpoint_state(run, UPDATES + 3)
    assert saved.world_size == 2 and saved.updates_in_epoch == 3
    assert saved.epoch_partial["updates"] == 3  # per update, not per rank

    resumed = main_inprocess("--config", _config(tmp_path, run, 1), "--resume", "auto", FLAG)  # no signal: in-process
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    train_rows = [r for r in read_metrics(run) if r["kind"] == "train"]
    assert [r["step"] for r in train_rows] == list(range(1, 2 * UPDATES + 1))  # each update logged once
    with open(os.path.join(run, "epochs.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [UPDATES, 2 * UPDATES]
    for epoch, (row, case) in enumerate(zip(rows, ("1 -> 2", "2 -> 1"))):
        losses = [r["loss"] for r in train_rows[epoch * UPDATES:(epoch + 1) * UPDATES]]
        logged_mean, epoch_loss = sum(losses) / UPDATES, float(row["train_loss"])
        print(f"world {case}: epochs.csv {epoch_loss!r}, mean of logged updates {logged_mean!r}, "
              f"relative difference {abs(epoch_loss - logged_mean) / logged_mean:.2e}")
        assert abs(epoch_loss - logged_mean) <= 1e-6 * logged_mean, case
        # the accepted change and the new number of processes are noted in the epoch's row
        assert "data.batch_size" in row["changes"] and f"processes {case}" in row["changes"]


def test_changed_global_batch_needs_the_flag_then_follows_the_schedule_and_is_noted(tmp_path):
    """Global batch 16 -> 32 at update 4 of 8 (64 samples = 2 updates of 32): refused without the flag;
    with it the epoch goes on at its update 2 of 4, the lr is the new schedule's at that point and
    the epoch's row notes the change."""
    import torch

    from configs import load_config
    from training.optim import build_scheduler, scaled_lr

    run = str(tmp_path / "run")
    status, out, err = _stop_mid_epoch(tmp_path, run, 1, 4, extra=["optim.epochs=1"])
    assert status == 143, err[-3000:]
    big = write_cfg(tiny_cfg(run, *COMMON, "data.batch_size=32"), tmp_path / "big.yaml")
    refused = main_inprocess("--config", big, "--resume", "auto")  # no signal from here on: in-process
    assert refused.returncode == 2 and "global batch of 16" in refused.stderr and \
        "--resume-with-changes" in refused.stderr
    resumed = main_inprocess("--config", big, "--resume", "auto", "--resume-with-changes")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    train_rows = [r for r in read_metrics(run) if r["kind"] == "train"]
    assert [r["step"] for r in train_rows] == list(range(1, 11))  # 4 + 2 updates of epoch 1, then 4 of epoch 2
    with open(os.path.join(run, "epochs.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [6, 10]
    first = [r["loss"] for r in train_rows[:6]]
    assert abs(float(rows[0]["train_loss"]) - sum(first) / 6) <= 1e-6 * sum(first) / 6
    assert "run.global_batch=16 -> 32" in rows[0]["changes"] and not rows[1]["changes"]
    # the lr of update 10 (logged in row 10) is the 32-batch schedule's at its update 8 of 8 (index 7)
    cfg = load_config(big)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=scaled_lr(cfg.optim, 32))
    sched = build_scheduler(opt, cfg.optim, updates_per_epoch=4)
    sched.step_update(7)
    assert abs(train_rows[-1]["lr"] - opt.param_groups[0]["lr"]) <= 1e-9 * opt.param_groups[0]["lr"]
