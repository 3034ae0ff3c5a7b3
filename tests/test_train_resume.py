"""Exact resume: a run SIGKILLed mid-epoch and resumed ends bit-identical to the uninterrupted run
(augmentation, Mixup/CutMix and drop path on); a kill during a checkpoint save leaves the previous
checkpoint valid and `--resume auto` skips the partial one. A SIGTERM mid-epoch saves a checkpoint
at the next update boundary and exits 143; the resumed run is bit-identical too. epochs.csv is
exact after a mid-epoch resume (the epoch's partial loss sums travel in the checkpoint)."""
import csv
import json
import os
import signal
import subprocess
import time

import pytest
import torch

from common import rundir
from test_train_helpers import (
    ROOT,
    gated_train_cmd,
    hooked_train_cmd,
    main_inprocess,
    read_metrics,
    run_inprocess,
    subprocess_env,
    tiny_cfg,
    wait_for_file,
    weights,
    write_cfg,
)
from training.checkpoint import files as ck
from training.checkpoint.state import read_trainer_state

# 3 epochs x 8 updates; checkpoints every 5 updates (mid-epoch) and at epoch ends.
RECIPE = ["optim.epochs=3", "data.mixup=0.8", "data.cutmix=1.0", "data.label_smoothing=0.1", "model.drop_path=0.1",
          "train.save_every=5", "train.ema_decay=0.9", "data.reprob=0.25"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run (in this process: the interrupted runs are the real processes)."""
    tmp = tmp_path_factory.mktemp("ref")
    assert run_inprocess(tiny_cfg(str(tmp / "run"), *RECIPE)) == 0
    return str(tmp / "run")


def _assert_same_run(run, ref):
    for name in ("model.safetensors", "model_ema.safetensors"):
        a, b = weights(run, name), weights(ref, name)
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), f"{name}:{k} differs after resume"
    rows = read_metrics(run)
    steps = [r["step"] for r in rows if r["kind"] == "train"]
    assert steps == list(range(1, 25))  # no duplicated or missing step
    evals = [(r["step"], r["weights"], r["top1"], r["loss"]) for r in rows if r["kind"] == "eval"]
    ref_evals = [(r["step"], r["weights"], r["top1"], r["loss"]) for r in read_metrics(ref) if r["kind"] == "eval"]
    assert evals == ref_evals
    ref_losses = [r["loss"] for r in read_metrics(ref) if r["kind"] == "train"]
    assert [r["loss"] for r in rows if r["kind"] == "train"] == ref_losses
    # epochs.csv: the epoch interrupted mid-way averages ALL its updates (one process: exactly)
    exact = ("epoch", "step", "train_loss", "lr", "skipped", "raw_top1", "raw_loss", "ema_top1", "ema_loss")
    assert [{k: r[k] for k in exact} for r in _epochs(run)] == [{k: r[k] for k in exact} for r in _epochs(ref)]


def _epochs(run):
    with open(os.path.join(run, "epochs.csv")) as f:
        return list(csv.DictReader(f))


def test_sigkill_mid_epoch_and_mid_save_then_resume_is_bit_identical(tmp_path, reference):
    run = str(tmp_path / "run")
    cfg_path = write_cfg(tiny_cfg(run, *RECIPE), tmp_path / "c.yaml")
    root = os.path.join(run, "checkpoints")

    # 1. SIGKILL from outside once the log shows a step past the first checkpoint (step 5), inside
    #    epoch 1 (8 steps); the steps are slowed down by a sleep (numerics untouched) so it lands mid-run.
    proc = subprocess.Popen(hooked_train_cmd(cfg_path, "--step-delay-s", "0.3"), cwd=ROOT, env=subprocess_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics = os.path.join(run, "metrics.jsonl")
    deadline = time.time() + 180
    killed_at = None
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(metrics):
            steps = [json.loads(line)["step"] for line in open(metrics) if line.strip().endswith("}")]
            if steps and max(steps) >= 7:
                proc.send_signal(signal.SIGKILL)
                killed_at = max(steps)
                break
        time.sleep(0.05)
    proc.wait(timeout=60)
    assert killed_at is not None and proc.returncode == -signal.SIGKILL, proc.stderr.read()[-2000:]
    assert not os.path.exists(os.path.join(run, "summary.json"))
    latest = ck.find_latest(run)
    assert latest.endswith(rundir.checkpoint_name(5)) and read_trainer_state(latest).batch == 5  # mid-epoch

    # 2. resume, and die in the middle of writing the step-10 checkpoint (after its weights, before its marker)
    died = subprocess.run(hooked_train_cmd(cfg_path, "--kill-during-save", "10", "--resume", "auto"), cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=240)
    assert died.returncode == -signal.SIGKILL, died.stderr[-2000:]
    assert "resumed from" in died.stdout
    partial = os.path.join(root, ".tmp-" + rundir.checkpoint_name(10))
    assert os.path.isfile(os.path.join(partial, "model.safetensors")) and \
        not os.path.exists(os.path.join(partial, rundir.MARKER))
    assert [s for s, _ in ck.list_checkpoints(root)] == [5, 8]
    assert ck.validation_error(os.path.join(root, rundir.checkpoint_name(8))) is None
    # a half-written step directory (e.g. copied by hand) must be skipped by --resume auto as well
    bogus = os.path.join(root, rundir.checkpoint_name(9))
    os.makedirs(bogus)
    open(os.path.join(bogus, "model.safetensors"), "wb").write(b"\0" * 10)
    assert ck.find_latest(run, warn=lambda m: None).endswith(rundir.checkpoint_name(8))

    # 3. resume again: ends bit-identical to the uninterrupted run, logs every step exactly once
    resumed = main_inprocess("--config", cfg_path, "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "skipping" in resumed.stdout and "resumed from" in resumed.stdout and \
        rundir.checkpoint_name(8) in resumed.stdout
    _assert_same_run(run, reference)
    assert not os.path.exists(partial)  # the stale temp dir was cleaned by a later save
    assert not os.path.exists(bogus)  # and the incomplete step directory by the pruning


def test_sigterm_mid_epoch_saves_exits_143_and_resume_is_bit_identical(tmp_path, reference):
    run, gate = str(tmp_path / "run"), str(tmp_path / "gate")
    cfg_path = write_cfg(tiny_cfg(run, *RECIPE), tmp_path / "c.yaml")
    # paused after update 3 of epoch 1 (no checkpoint due there: save_every=5), then SIGTERM
    proc = subprocess.Popen(gated_train_cmd(cfg_path, 3, gate), cwd=ROOT, env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for_file(gate + ".waiting", proc), proc.stderr.read()[-2000:]
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)  # handled while paused
    finally:
        open(gate, "w").close()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert "SIGTERM received" in err and "SIGTERM: stopped after step 3" in out and "--resume auto" in out
    root = os.path.join(run, "checkpoints")
    assert [s for s, _ in ck.list_checkpoints(root)] == [3]
    stop = os.path.join(root, rundir.checkpoint_name(3))
    assert ck.validation_error(stop) is None and read_trainer_state(stop).batch == 3
    assert not os.path.exists(os.path.join(run, "summary.json")) and not os.path.exists(os.path.join(run, "run.lock"))

    resumed = main_inprocess("--config", cfg_path, "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from {stop}" in resumed.stdout
    _assert_same_run(run, reference)
