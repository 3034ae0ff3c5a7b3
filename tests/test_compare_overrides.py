"""compare_heads takes key.sub=value overrides anywhere on the line: after --heads or
--seeds, whose lists used to swallow them ('argument --seeds: invalid int value'), between options,
or first; the value of an option that takes one stays that option's; --help says where they go."""
import os
import subprocess
import sys

import pytest

from common.errors import UserError
from test_compare import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import compare_heads  # noqa: E402


@pytest.mark.parametrize("argv", [
    ["--config", "c.yaml", "--heads", "softmax", "sparsemax", "--seeds", "0", "1", "optim.epochs=1", "data.mixup=0.0"],
    ["--config", "c.yaml", "--heads", "softmax", "sparsemax", "optim.epochs=1", "--seeds", "0", "1", "data.mixup=0.0"],
    ["optim.epochs=1", "--heads", "softmax", "data.mixup=0.0", "sparsemax", "--config", "c.yaml", "--seeds", "0", "1"],
])
def test_overrides_anywhere(argv):
    args = compare_heads.parse_args(argv)
    assert args.heads == ["softmax", "sparsemax"] and args.seeds == [0, 1] and args.config == "c.yaml"
    assert args.overrides == ["optim.epochs=1", "data.mixup=0.0"]  # in the order given


def test_an_option_value_that_looks_like_an_override_stays_the_options():
    args = compare_heads.parse_args(["--config", "c.yaml", "--runs-dir", "runs/lr=1", "--launcher", "X=1 python",
                                     "train.seed=3"])
    assert args.runs_dir == "runs/lr=1" and args.launcher == "X=1 python" and args.overrides == ["train.seed=3"]


def test_anything_else_is_refused_in_one_line():
    with pytest.raises(UserError, match="unexpected argument 'optim.epochs'.*key.sub=value"):
        compare_heads.parse_args(["--config", "c.yaml", "optim.epochs", "1"])
    with pytest.raises(UserError, match="unexpected argument '--no-such-option'"):
        compare_heads.parse_args(["--config", "c.yaml", "--no-such-option"])


def test_help_says_where_overrides_go():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "compare_heads.py"), "--help"],
                         capture_output=True, text=True, timeout=60).stdout
    assert "anywhere on the line" in out and "--seeds 0 1 optim.epochs=1" in out
