"""Blame on the true source, and the trained model kept, when eval.py, predict.py, scripts/export.py and
scripts/extract_features.py open a run with a command line that changes its config
(inference/run_config.py, configs/loader.py): an override's mistake names the command line, a mistake
in the run's config.yaml its line; a change of the model, head, input size, eval transform or held-out
splits is refused in one line (nothing written) unless --accept-changed-model, which eval.py records in
its JSON; how and on what the run is evaluated (data.root, batch sizes, workers, the dataset, the eval
split) changes freely. The run is the tiny comparison's softmax run (tests/test_compare.py)."""
import json
import os
import shutil

import pytest
from PIL import Image

from common import rundir
from file_tree import snapshot
from inference.run_config import CHANGE_FLAG, CHANGED_KEY, opened_config
from test_compare import tiny_run_dir
from test_train_helpers import reset_accelerate_state
from training.checkpoint import files as ck

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _copy(tmp_path):
    run = str(tmp_path / "run")
    shutil.copytree(tiny_run_dir("softmax"), run)
    return run


def _args(tool, target, tmp_path, *extra):
    """The tool's command line on `target` with its outputs under tmp_path/new (which must stay absent)."""
    out = tmp_path / "new"
    image = tmp_path / "img.png"
    if tool == "predict":
        Image.new("RGB", (20, 24), (90, 30, 200)).save(image)
    return {"eval": ["--checkpoint", target, "--output", str(out / "eval.json")],
            "predict": ["--checkpoint", target, "--images", str(image), "--output", str(out / "p.csv")],
            "export": [target, "--format", "torchscript", "--output", str(out / "m.torchscript.pt")],
            "extract_features": ["--checkpoint", target, "--output", str(out)]}[tool] + list(extra)


TOOLS = ["eval", "predict", "export", "extract_features"]


@pytest.mark.parametrize("tool", TOOLS)
def test_an_overrides_mistake_names_the_command_line_not_the_runs_file(tool, tmp_path, one_line_error):
    run = _copy(tmp_path)
    before = snapshot(run)
    line = one_line_error(tool, _args(tool, run, tmp_path, "data.image_size=abc"))
    assert line == "error: config key 'data.image_size' expects int, got 'abc' (str) on the command line"
    assert snapshot(run) == before and not os.path.exists(tmp_path / "new")


def test_a_mistake_in_the_runs_file_names_its_line(tmp_path, one_line_error):
    run = _copy(tmp_path)
    config = os.path.join(run, rundir.CONFIG)
    lines = open(config).read().splitlines()
    number = next(i for i, text in enumerate(lines, 1) if text.strip().startswith("image_size:"))
    lines[number - 1] = lines[number - 1].split(":")[0] + ": abc"
    open(config, "w").write("\n".join(lines) + "\n")
    line = one_line_error("eval", ["--checkpoint", run])
    assert line == f"error: config key 'data.image_size' expects int, got 'abc' (str) ({config}:{number})"


CHANGES = [  # (tool, what the command line gives, the trained value it changes)
    ("eval", ["head.name=sparsemax"], "head.name=softmax"),
    ("eval", ["--head", "entmax15"], "head.name=softmax"),
    ("predict", ["data.image_size=16"], "data.image_size=32"),
    ("export", ["model.norm=layernorm"], "model.norm=affine"),
    ("extract_features", ["data.mean=[0.5, 0.5, 0.5]"], "data.mean=[0.485, 0.456, 0.406]"),
    ("eval", ["data.calib_fraction=0.5"], "data.calib_fraction=0.25"),
]


@pytest.mark.parametrize("tool, given, trained", CHANGES, ids=[f"{t}-{g[-1]}" for t, g, _ in CHANGES])
def test_changing_what_the_run_trained_is_refused_and_touches_nothing(tool, given, trained, tmp_path, one_line_error):
    run = _copy(tmp_path)
    before = snapshot(run)
    line = one_line_error(tool, _args(tool, run, tmp_path, *given))
    assert line.startswith(f"error: {run} was trained with {trained}; ") and CHANGE_FLAG in line
    assert "another model than the one trained" in line and CHANGED_KEY in line
    assert snapshot(run) == before and not os.path.exists(tmp_path / "new")


def test_a_checkpoint_of_the_run_is_guarded_the_same(tmp_path, one_line_error):
    run = _copy(tmp_path)
    checkpoint = ck.list_checkpoints(os.path.join(run, rundir.CHECKPOINTS))[-1][1]
    before = snapshot(run)
    line = one_line_error("eval", ["--checkpoint", checkpoint, "head.name=sparsemax"])
    assert line.startswith(f"error: {checkpoint} was trained with head.name=softmax; head.name=sparsemax on the "
                           f"command line") and CHANGE_FLAG in line
    line = one_line_error("eval", ["--checkpoint", checkpoint, "data.image_size=abc"])
    assert line.endswith("got 'abc' (str) on the command line")
    assert snapshot(run) == before


def test_how_and_on_what_the_run_is_evaluated_changes_freely():
    run = tiny_run_dir("softmax")
    flags = ["data.root=elsewhere", "data.eval_batch_size=7", "data.num_workers=0", "train.eval_split=tune",
             ("data.dataset", "builtin100"), "data.builtin_val_size=50", "train.log_with=none"]
    cfg, changes = opened_config(run, flags=flags)
    assert changes == {}
    assert (cfg.data.root, cfg.data.eval_batch_size, cfg.data.dataset) == ("elsewhere", 7, "builtin100")


def test_the_flag_uses_the_change_and_eval_json_records_it(tmp_path, capsys):
    import eval as eval_entry

    run = _copy(tmp_path)
    out = str(tmp_path / "eval.json")
    reset_accelerate_state()
    capsys.readouterr()
    assert eval_entry.main(["--checkpoint", run, "head.name=sparsemax", CHANGE_FLAG, "--output", out, "--quiet",
                            "--calib", "none"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert any(f"{run} was trained with head.name=softmax; using head.name=sparsemax ({CHANGE_FLAG})" in line
               for line in warned), warned
    result = json.load(open(out))
    assert result["head"] == "sparsemax" and result[CHANGED_KEY] == {"head.name": {"trained": "softmax",
                                                                                   "used": "sparsemax"}}
    assert CHANGED_KEY not in json.load(open(os.path.join(tiny_run_dir("softmax"), rundir.EVAL_RESULT)))
