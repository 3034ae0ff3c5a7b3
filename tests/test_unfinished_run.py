"""Advice that works on a run that stopped before its first checkpoint (a full disk at its epoch-end save,
injected through common.io's write seam as tests/test_run_safety.py does): the failure's one line says
--resume auto, which then starts the run over in its folder and ends as the uninterrupted run does; a
fresh start says so too; eval.py, predict.py, scripts/export.py and scripts/extract_features.py refuse
its weights in one line, touching nothing; a refused extraction or evaluation leaves no empty output
folder behind (inference/run_status.py, training/run_start.py, common/io.py prepare_output)."""
import errno
import os
import shutil

import pytest
import torch
from PIL import Image

from common import io as common_io
from common import rundir
from file_tree import snapshot
from test_train_helpers import main_inprocess, read_metrics, run_inprocess, tiny_cfg, weights, write_cfg
from training.checkpoint import files as ck

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# one epoch of 8 updates: the first (and only) checkpoint is the epoch end's, after the weights' export
ONE_EPOCH = ("optim.epochs=1", "train.save_every=100")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run = str(tmp_path_factory.mktemp("uninterrupted") / "run")
    assert run_inprocess(tiny_cfg(run, *ONE_EPOCH)) == 0
    return run


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """(run, its config file, train.py's answer): the disk full while the first checkpoint is saved."""
    where = tmp_path_factory.mktemp("stopped")
    run = str(where / "run")
    config = write_cfg(tiny_cfg(run, *ONE_EPOCH), where / "tiny.yaml")
    real_open = common_io._open_for_write

    def full_disk(path):
        if rundir.checkpoint_name(8) in path and path.endswith(rundir.OPTIMIZER):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real_open(path)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(common_io, "_open_for_write", full_disk)
        done = main_inprocess("--config", config)
    return run, config, done


def _copy(run, tmp_path):
    copy = str(tmp_path / "run")
    shutil.copytree(run, copy)
    return copy


def test_a_full_disk_before_the_first_checkpoint_says_resume_auto(stopped):
    run, _, done = stopped
    assert done.returncode == 74 and done.stderr.count("\n") == 1, done.stderr
    assert "No space left on device" in done.stderr and "no earlier checkpoint was touched" in done.stderr
    assert "then resume with --resume auto (with no checkpoint yet, it starts the run over)" in done.stderr
    # what the run left: its weights exported at the epoch end, its logs, no checkpoint, no summary
    assert os.path.isfile(os.path.join(run, rundir.WEIGHTS)) and not os.path.exists(os.path.join(run, rundir.SUMMARY))
    assert ck.list_checkpoints(os.path.join(run, rundir.CHECKPOINTS)) == []


def test_a_fresh_start_there_names_resume_auto_and_touches_nothing(stopped, tmp_path):
    run = _copy(stopped[0], tmp_path)
    before = snapshot(run)
    done = main_inprocess("--config", write_cfg(tiny_cfg(run, *ONE_EPOCH), tmp_path / "tiny.yaml"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "stopped before its first checkpoint" in done.stderr and "pass --resume auto to start it over" in done.stderr
    assert snapshot(run) == before


def test_resume_auto_starts_it_over_and_ends_as_the_uninterrupted_run(stopped, uninterrupted, tmp_path):
    run = _copy(stopped[0], tmp_path)
    done = main_inprocess("--config", write_cfg(tiny_cfg(run, *ONE_EPOCH), tmp_path / "tiny.yaml"), "--resume", "auto")
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stdout.splitlines() if line.startswith("--resume auto:")]
    assert len(said) == 1 and "stopped before its first checkpoint" in said[0] and "starting it over" in said[0]
    assert all(name in said[0] for name in (rundir.WEIGHTS, rundir.METRICS, rundir.EPOCHS))
    assert os.path.isfile(os.path.join(run, rundir.SUMMARY))
    assert [r["step"] for r in read_metrics(run) if r["kind"] == "train"] == list(range(1, 9))  # each step once
    for name in (rundir.WEIGHTS, rundir.EMA_WEIGHTS):
        ours, theirs = weights(run, name), weights(uninterrupted, name)
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def _image(tmp_path):
    path = tmp_path / "img.png"
    Image.new("RGB", (20, 24), (90, 30, 200)).save(path)
    return str(path)


@pytest.mark.parametrize("tool", ["eval", "predict", "export", "extract_features"])
def test_every_tool_refuses_the_unfinished_run_in_one_line(stopped, tmp_path, tool, one_line_error):
    run = _copy(stopped[0], tmp_path)
    out = tmp_path / "new" / "out"  # a folder that does not exist: a refusal must not leave it behind
    args = {"eval": ["--checkpoint", run, "--output", str(out / "eval.json")],
            "predict": ["--checkpoint", run, "--images", _image(tmp_path), "--output", str(out / "p.csv")],
            "export": [run, "--format", "torchscript", "--output", str(out / "m.torchscript.pt")],
            "extract_features": ["--checkpoint", run, "--output", str(out)]}[tool]
    before = snapshot(run)
    line = one_line_error(tool, args)
    assert f"{run} is an unfinished run (no {rundir.SUMMARY}, no checkpoint" in line
    assert f"start it over with python train.py --config {os.path.join(run, rundir.CONFIG)} --resume auto" in line
    assert snapshot(run) == before and not os.path.exists(tmp_path / "new")


def test_a_refused_extraction_of_cut_weights_leaves_no_output_folder(uninterrupted, tmp_path, one_line_error):
    run = _copy(uninterrupted, tmp_path)
    path = os.path.join(run, rundir.WEIGHTS)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    out = tmp_path / "features" / "cut"
    line = one_line_error("extract_features", ["--checkpoint", run, "--output", str(out), "--accept-changed-weights"])
    assert path in line and not os.path.exists(tmp_path / "features")
