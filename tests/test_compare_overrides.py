"""compare_heads takes key.sub=value overrides anywhere on the line: after --heads or
--seeds, whose lists used to swallow them ('argument --seeds: invalid int value'), between options,
or first; the value of an option that takes one stays that option's; --help says where they go."""
import pytest

import compare_heads  # scripts/ is on sys.path (tests/conftest.py)
from common.errors import UserError


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


def test_help_says_where_overrides_go(capsys):
    with pytest.raises(SystemExit) as exit_info:
        compare_heads.parse_args(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "anywhere on the line" in out and "--seeds 0 1 optim.epochs=1" in out


def test_margins_are_taken_as_margins_not_overrides():
    """--margin METRIC=DELTA looks like an override; it is the option's value (repeatable), parsed and
    checked before anything is planned."""
    args = compare_heads.parse_args(["--config", "c.yaml", "--margin", "top1=0.5", "optim.epochs=1",
                                     "--margin=ece=1"])
    assert args.margins == {"top1": 0.5, "ece": 1.0} and args.overrides == ["optim.epochs=1"]
    assert compare_heads.parse_args(["--config", "c.yaml"]).margins == {}
    with pytest.raises(UserError, match="unknown metric 'topp1'; did you mean 'top1'"):
        compare_heads.parse_args(["--config", "c.yaml", "--margin", "topp1=0.5"])
