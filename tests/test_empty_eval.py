"""An empty validation split: with data.skip_corrupt=true and every val image undecodable,
train's evaluation and eval.py report null metrics (not top1 0 / loss 0 with n=0) with a warning
line, and the training stops with exit 2 after the epoch's checkpoint unless train.allow_empty_eval."""
import csv
import json
import os

import numpy as np
import pytest
from PIL import Image

from common import rundir
from common.errors import UserError
from test_train_helpers import read_metrics, reset_accelerate_state, run_inprocess, tiny_cfg
from training.checkpoint import files as ck


def _folder(root):
    """2 classes x 16 decodable train images; every val image undecodable."""
    rng = np.random.default_rng(0)
    for c in ("ant", "bee"):
        os.makedirs(os.path.join(root, "train", c))
        os.makedirs(os.path.join(root, "val", c))
        for i in range(16):
            pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(os.path.join(root, "train", c, f"{i}.png"))
        for i in range(3):
            with open(os.path.join(root, "val", c, f"{i}.png"), "wb") as f:
                f.write(b"\x89PNG\r\n\x1a\n not a png")


def _cfg(tmp_path, *extra):
    folder = str(tmp_path / "data")
    if not os.path.isdir(folder):
        _folder(folder)
    return tiny_cfg(str(tmp_path / "run"), "data.dataset=imagefolder", f"data.root={folder}", "data.in_memory=false",
                    "data.skip_corrupt=true", "data.batch_size=8", "optim.epochs=1", "train.ema=false", *extra)


def test_empty_val_split_gives_null_metrics_and_stops_unless_allowed(tmp_path, capsys):
    run = str(tmp_path / "run")
    with pytest.raises(UserError, match="every validation image was skipped.*train.allow_empty_eval=true"):
        run_inprocess(_cfg(tmp_path))
    out = capsys.readouterr().out
    assert "warning: the validation split had no decodable image" in out and "metrics null" in out
    assert "top1 0.00%" not in out
    evals = [r for r in read_metrics(run) if r["kind"] == "eval"]
    assert len(evals) == 1 and evals[0]["n"] == 0
    assert all(evals[0][k] is None for k in ("top1", "top5", "loss", "support_size"))  # null, not 0.0
    with open(os.path.join(run, "epochs.csv")) as f:
        row = next(csv.DictReader(f))
    assert row["raw_n"] == "0" and row["raw_top1"] == "nan" and row["raw_loss"] == "nan"
    assert [s for s, _ in ck.list_checkpoints(os.path.join(run, rundir.CHECKPOINTS))] == [4]  # the epoch is kept
    assert not os.path.exists(os.path.join(run, "summary.json"))

    # asked to continue: no config change to accept, the run finishes with null metrics
    assert run_inprocess(_cfg(tmp_path, "train.allow_empty_eval=true"), resume="auto") == 0
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert summary["final"]["raw"]["n"] == 0 and summary["final"]["raw"]["top1"] is None
    assert summary["best"] == {"top1": None, "step": None}
    assert "final val top1 n/a" in capsys.readouterr().out

    # eval.py on the same split: null metrics, one warning line, the outputs written
    import eval as eval_entry
    from common.cli import run_cli

    reset_accelerate_state()
    output = str(tmp_path / "eval" / "eval.json")
    with pytest.raises(SystemExit) as exc:
        run_cli(eval_entry.main, ["--checkpoint", run, "--quiet", "--output", output])
    assert exc.value.code == 0
    err = capsys.readouterr().err
    assert "warning: every image of the val split (6) was undecodable and skipped" in err and "null" in err
    result = json.load(open(output))
    assert result["n"] == 0 and result["skipped_images"] == 6
    assert result["top1"] is None and result["loss"] is None
