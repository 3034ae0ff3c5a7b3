"""train.py never loses or mixes a run, on tiny in-process runs and real processes:
the run lock against a concurrent run (and its --overwrite), refusals of a destructive fresh start,
resume with a changed config (refused, or applied for real with --resume-with-changes), fallback
from a corrupt checkpoint, a full disk during a save, the nonfinite=skip budget with pruning that
keeps a finite checkpoint, and eval.py's class-name check and skipped-image count."""
import errno
import json
import math
import os
import shutil
import subprocess

import pytest
import torch
import yaml

from common import io as common_io
from common import rundir
from common.errors import UserError
from configs import load_config, load_run_config
from test_train_helpers import (
    ROOT,
    gated_train_cmd,
    read_metrics,
    reset_accelerate_state,
    run_inprocess,
    subprocess_env,
    tiny_cfg,
    train_cmd,
    wait_for_file,
    weights,
    write_cfg,
)
from training import resume_policy as rp
from training.checkpoint import files as ck
from training.checkpoint.state import read_trainer_state

# one epoch of 8 updates; checkpoints at steps 3, 6 and 8 (the epoch end), all kept
FINISHED = ["optim.epochs=1", "train.save_every=3", "train.keep_last=3"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished one-epoch run; tests work on copies (`_copy`)."""
    run = str(tmp_path_factory.mktemp("finished") / "run")
    assert run_inprocess(tiny_cfg(run, *FINISHED)) == 0
    assert [s for s, _ in ck.list_checkpoints(os.path.join(run, rundir.CHECKPOINTS))] == [3, 6, 8]
    return run


def _copy(run, tmp_path, name="run"):
    dst = str(tmp_path / name)
    shutil.copytree(run, dst)
    return dst


def _cli(capsys, cfg, *args, tmp_path, hooks=None):
    """train.py's command line in this process -> (exit status, stdout, stderr)."""
    import train
    from common.cli import run_cli

    reset_accelerate_state()
    capsys.readouterr()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as run_inprocess: the same numerics as the fixture's run
    try:
        with pytest.raises(SystemExit) as exc:
            run_cli(train.main, ["--config", write_cfg(cfg, tmp_path / "cli.yaml"), *args], hooks=hooks)
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def _snapshot(run):
    """{relative path: bytes} of every file of a run directory."""
    found = {}
    for folder, _, files in os.walk(run):
        for name in files:
            path = os.path.join(folder, name)
            found[os.path.relpath(path, run)] = open(path, "rb").read()
    return found


# ----------------------------------------------------------------------------- fresh start
def test_fresh_start_in_a_run_dir_is_refused_and_overwrite_lists_what_it_deletes(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path)
    shutil.rmtree(os.path.join(run, rundir.CHECKPOINTS))  # a finished run whose checkpoints are gone
    before = _snapshot(run)
    cfg = tiny_cfg(run, *FINISHED)
    code, _, err = _cli(capsys, cfg, tmp_path=tmp_path)
    assert code == 2 and err.count("\n") == 1 and "already holds a run" in err
    assert all(n in err for n in ("model.safetensors", "metrics.jsonl", "summary.json", "--resume auto", "--overwrite"))
    code, _, err = _cli(capsys, cfg, "--resume", "auto", tmp_path=tmp_path)
    assert code == 2 and err.count("\n") == 1 and "no complete checkpoint" in err and "--overwrite" in err
    code, _, err = _cli(capsys, cfg, "--resume", "auto", "--overwrite", tmp_path=tmp_path)
    assert code == 2 and "contradict" in err
    assert _snapshot(run) == before  # refusals touch nothing (and leave no lock behind)

    code, out, _ = _cli(capsys, cfg, "--overwrite", tmp_path=tmp_path)
    assert code == 0
    deleted = next(line for line in out.splitlines() if line.startswith("--overwrite: deleting"))
    assert all(n in deleted for n in ("model.safetensors", "model_ema.safetensors", "summary.json", "metrics.jsonl",
                                      "epochs.csv"))
    assert [r["step"] for r in read_metrics(run) if r["kind"] == "train"] == list(range(1, 9))  # a new run, once

    empty = str(tmp_path / "empty")
    os.makedirs(empty)
    assert _cli(capsys, tiny_cfg(empty, *FINISHED), "--resume", "auto", tmp_path=tmp_path)[0] == 0  # nothing to lose


# ----------------------------------------------------------------------------- resume with changes
def _cosine_lr(t, base, total, warmup, min_lr=1e-5, warmup_lr=1e-6):
    """Warmup + cosine of update t (timm CosineLRScheduler, warmup_prefix), written out by hand."""
    if t < warmup:
        return warmup_lr + t * (base - warmup_lr) / warmup
    return min_lr + 0.5 * (base - min_lr) * (1 + math.cos(math.pi * (t - warmup) / (total - warmup)))


def test_changed_lr_is_refused_then_applied_for_real_with_the_flag(finished, tmp_path):
    run = _copy(finished, tmp_path)
    changed = tiny_cfg(run, *FINISHED, "optim.epochs=2", "optim.lr=2e-2", "train.keep_last=1")  # keep_last: allowed
    with pytest.raises(UserError) as err:
        run_inprocess(changed, resume="auto")
    msg = str(err.value)
    assert "\n" not in msg and "optim.lr=0.005 -> 0.02" in msg and "optim.epochs=1 -> 2" in msg
    assert rp.RESUME_FLAG in msg and "keep_last" not in msg and "step_000000008" in msg
    assert load_run_config(run).optim.lr == 5e-3  # refused: config.yaml untouched

    assert run_inprocess(changed, resume="auto", accept_changes=True) == 0
    rows = read_metrics(run)
    train_rows = {r["step"]: r for r in rows if r["kind"] == "train"}
    assert sorted(train_rows) == list(range(1, 17))
    # row `step` logs the lr of update step-1; global batch 32 = lr_base_batch: no scaling; warmup 0.5 epoch
    for step in range(9, 17):
        new = _cosine_lr(step - 1, 2e-2, total=16, warmup=4)
        assert train_rows[step]["lr"] == pytest.approx(new, rel=1e-9), step
        assert train_rows[step]["lr"] > 3e-4  # the old schedule had ended: min_lr (1e-5) from update 8 on
    for step in range(1, 9):  # the first epoch is the original run's
        assert train_rows[step]["lr"] == pytest.approx(_cosine_lr(step - 1, 5e-3, total=8, warmup=4), rel=1e-9)
    change = [r for r in rows if r["kind"] == "config_change"]
    assert len(change) == 1 and change[0]["step"] == 8
    assert change[0]["changes"]["optim.lr"] == {"old": 5e-3, "new": 2e-2}
    with open(os.path.join(run, rundir.CONFIG_HISTORY)) as f:  # beside config.yaml
        history = yaml.safe_load(f)
    assert len(history) == 1 and history[0]["changes"]["optim.epochs"] == {"old": 1, "new": 2}
    assert history[0]["step"] == 8 and history[0]["flag"] == rp.RESUME_FLAG
    assert load_run_config(run).optim.lr == 2e-2
    # config.yaml stays a valid --config for train.py and eval.py after --resume-with-changes
    assert load_config(os.path.join(run, "config.yaml")) == load_run_config(run) == changed
    assert json.load(open(os.path.join(run, "summary.json")))["steps"] == 16


def test_resume_on_other_class_names_is_refused(finished, tmp_path):
    run = _copy(finished, tmp_path)
    names = json.load(open(os.path.join(run, "classes.json")))["classes"]
    assert len(names) == 10  # written by the run
    with open(os.path.join(run, "classes.json"), "w") as f:
        json.dump({"classes": names[::-1]}, f)  # as if data.root (free to move) now held other folders
    with pytest.raises(UserError, match="classes differ"):
        run_inprocess(tiny_cfg(run, *FINISHED), resume="auto")


# ----------------------------------------------------------------------------- checkpoint integrity
def test_corrupt_newest_checkpoint_falls_back_and_none_valid_names_resume_path(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path)
    newest = os.path.join(run, rundir.CHECKPOINTS, rundir.checkpoint_name(8))
    path = os.path.join(newest, "optimizer.pt")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2: len(data) // 2 + 16] = bytes(16)  # same size, flipped bytes: only the checksum sees it
    open(path, "wb").write(bytes(data))
    code, out, _ = _cli(capsys, tiny_cfg(run, *FINISHED), "--resume", "auto", tmp_path=tmp_path)
    assert code == 0
    assert "skipping" in out and "step_000000008" in out and "sha256" in out
    assert f"resumed from {os.path.join(run, rundir.CHECKPOINTS, rundir.checkpoint_name(6))}" in out
    for name in ("model.safetensors", "model_ema.safetensors"):  # steps 7-8 redone: the same weights
        a, b = weights(run, name), weights(finished, name)
        assert all(torch.equal(a[k], b[k]) for k in a)

    for _, ckpt in ck.list_checkpoints(os.path.join(run, rundir.CHECKPOINTS)):
        with open(os.path.join(ckpt, rundir.TRAINER_STATE), "r+b") as f:
            f.write(b"#")  # damages every checkpoint
    code, _, err = _cli(capsys, tiny_cfg(run, *FINISHED), "--resume", "auto", tmp_path=tmp_path)
    assert code == 2 and err.count("\n") == 1 and "--resume PATH" in err and "is valid" in err


def test_disk_full_during_a_save_is_one_line_exit_74_and_keeps_the_previous_checkpoint(tmp_path, capsys, monkeypatch):
    run = str(tmp_path / "run")
    cfg = tiny_cfg(run, "optim.epochs=2", "train.save_every=5")  # checkpoints at 5, 8, then 10 fails
    real_open = common_io._open_for_write

    def full_disk(path):
        if rundir.checkpoint_name(10) in path and path.endswith("optimizer.pt"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real_open(path)

    monkeypatch.setattr(common_io, "_open_for_write", full_disk)
    code, _, err = _cli(capsys, cfg, tmp_path=tmp_path)
    assert code == ck.EXIT_WRITE_FAILED == 74
    assert err.count("\n") == 1 and "optimizer.pt" in err and "No space left" in err and "free" in err
    assert "step_000000008 is intact" in err
    root = os.path.join(run, rundir.CHECKPOINTS)
    assert [s for s, _ in ck.list_checkpoints(root)] == [5, 8] and \
        ck.validation_error(os.path.join(root, rundir.checkpoint_name(8))) is None
    assert not [n for n in os.listdir(root) if n.startswith(".tmp")] and \
        not os.path.exists(os.path.join(run, "run.lock"))
    monkeypatch.undo()

    # leftovers of a killed save are removed at the next start (under the lock), which then finishes
    open(os.path.join(run, "model.safetensors.tmp4194305"), "wb").write(b"partial")  # a pid above 2^22: no live process
    os.makedirs(os.path.join(root, ".tmp-" + rundir.checkpoint_name(9)))
    code, out, _ = _cli(capsys, cfg, "--resume", "auto", tmp_path=tmp_path)
    assert code == 0 and "removed 2 temporary file(s)" in out
    assert not os.path.exists(os.path.join(run, "model.safetensors.tmp4194305"))
    assert [r["step"] for r in read_metrics(run) if r["kind"] == "train"] == list(range(1, 17))


# ----------------------------------------------------------------------------- nonfinite=skip budget
class NanFrom:
    """Fault hooks: every loss from update `first` on is NaN (a hopeless lr, reproducibly)."""

    def __init__(self, first):
        self.first = first

    def on_loss(self, step, loss):
        return loss * float("nan") if step >= self.first else loss

    def after_update(self, step):
        pass


def test_skip_budget_stops_with_exit_3_and_pruning_keeps_a_finite_checkpoint(tmp_path, capsys):
    run = str(tmp_path / "run")
    cfg = tiny_cfg(run, "optim.epochs=3", "train.save_every=5", "train.keep_last=1", "train.nonfinite=skip",
                   "train.eval_every=10")  # no eval before the end: no 'best' checkpoint kept besides
    # updates 6, 7, ... skipped; the 11th skip in 100 updates (update 16) exceeds 0.1 x 100
    code, _, err = _cli(capsys, cfg, tmp_path=tmp_path, hooks=NanFrom(6))
    assert code == 3
    assert "11 of the last 100 updates" in err and "max_skipped_fraction=0.1" in err and "step 16" in err
    root = os.path.join(run, rundir.CHECKPOINTS)
    kept = dict(ck.list_checkpoints(root))
    assert sorted(kept) == [5, 16]  # keep_last=1 keeps the newest; pruning keeps the last finite one
    assert read_trainer_state(kept[5]).loss_finite is True
    assert read_trainer_state(kept[16]).loss_finite is False
    assert f"Newest verified checkpoint with a finite loss: {kept[5]}" in err
    assert not os.path.exists(os.path.join(run, "summary.json"))
    rows = [r for r in read_metrics(run) if r["kind"] == "train"]
    assert [r["skipped"] for r in rows][-1] == 10 and rows[-1]["step"] == 16  # update 16 was never logged


# ----------------------------------------------------------------------------- run lock (real processes)
def test_second_run_on_the_same_directory_is_refused_and_the_first_finishes_intact(tmp_path):
    run, gate = str(tmp_path / "run"), str(tmp_path / "gate")
    cfg_path = write_cfg(tiny_cfg(run, "optim.epochs=1"), tmp_path / "c.yaml")
    first = subprocess.Popen(gated_train_cmd(cfg_path, 3, gate), cwd=ROOT, env=subprocess_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for_file(gate + ".waiting", first), first.stderr.read()[-2000:]  # paused mid-epoch, locked
        # the second one even asks to delete the run: the lock comes first
        second = subprocess.run(train_cmd(cfg_path, "--overwrite", "train.seed=1"), cwd=ROOT, env=subprocess_env(),
                                capture_output=True, text=True, timeout=180)
    finally:
        open(gate, "w").close()
    out, err = first.communicate(timeout=240)
    assert second.returncode == 2, second.stderr[-2000:]
    line = second.stderr.strip()
    assert "\n" not in line and "in use by another run" in line and f"pid {first.pid} " in line and "training" in line
    assert first.returncode == 0, err[-2000:]
    assert [r["step"] for r in read_metrics(run) if r["kind"] == "train"] == list(range(1, 9))  # each step once
    assert load_run_config(run).train.seed == 0 and os.path.isfile(os.path.join(run, "summary.json"))
    assert not os.path.exists(os.path.join(run, "run.lock"))


# ----------------------------------------------------------------------------- eval.py
def _image_folder(root, classes):
    from PIL import Image

    for split in ("train", "val"):
        for i, name in enumerate(classes):
            os.makedirs(os.path.join(root, split, name))
            Image.new("RGB", (16, 16), (20 * i, 0, 0)).save(os.path.join(root, split, name, "0.png"))


def test_eval_checks_class_names_and_reports_skipped_images(finished, tmp_path, capsys):
    import eval as eval_entry
    from common.cli import run_cli

    def evaluate(*args):
        reset_accelerate_state()
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            run_cli(eval_entry.main, ["--checkpoint", finished, "--quiet", "--calib", "none",
                                      "data.dataset=imagefolder", f"data.root={folder}", "data.in_memory=false", *args])
        out = capsys.readouterr()
        return exc.value.code, out.err

    folder = str(tmp_path / "folders")
    _image_folder(folder, [f"class{i}" for i in range(10)])  # ten classes, as the run, named otherwise
    code, err = evaluate()
    assert code == 2 and err.count("\n") == 1 and "--allow-class-mismatch" in err and "10 label(s)" in err
    output = str(tmp_path / "out" / "eval.json")
    open(os.path.join(folder, "val", "class3", "1_bad.png"), "wb").write(b"\x89PNG\r\n\x1a\n not a png")
    code, err = evaluate("--allow-class-mismatch", "data.skip_corrupt=true", "--output", output)
    assert code == 0 and "class names differ" in err and "1 undecodable image(s) skipped" in err
    result = json.load(open(output))
    assert result["skipped_images"] == 1 and result["n"] == 10
    assert not os.path.exists(os.path.join(os.path.dirname(output), "run.lock"))  # released after the writes
