"""One override dialect (configs/overrides.py) in every command: `key.sub=value`, `--key.sub VALUE`
and `--key.sub=VALUE`, anywhere on the line, parsed by the same function; anything else is one
line naming the command and the dialect."""
import importlib

import pytest

from common.errors import UserError
from configs.overrides import apply_overrides, split_command_line

# each command's parse_args and the least it needs besides the overrides
COMMANDS = {
    "train": ["--config", "c.yaml"],
    "eval": ["--checkpoint", "runs/x"],
    "predict": ["--checkpoint", "runs/x", "--images", "photos", "--output", "p.csv"],
    "export": ["runs/x", "--format", "onnx"],
    "extract_features": ["--checkpoint", "runs/x", "--output", "features/x"],
    "compare_heads": ["--config", "c.yaml"],
}
FORMS = [
    (["optim.lr=0.5", "data.root=a b"], ["optim.lr=0.5", "data.root=a b"]),
    (["--optim.lr", "0.5", "--data.root=a b"], ["optim.lr=0.5", "data.root=a b"]),
    (["--optim.lr=0.5", "data.root=a b"], ["optim.lr=0.5", "data.root=a b"]),
]


def _parse(command, argv):
    return importlib.import_module(command).parse_args(argv)


@pytest.mark.parametrize("form,expected", FORMS)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_takes_the_same_forms(command, form, expected):
    first, last = _parse(command, form + COMMANDS[command]), _parse(command, COMMANDS[command] + form)
    assert first.overrides == last.overrides == expected


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_refuses_the_same_mistakes(command):
    with pytest.raises(UserError, match=f"unexpected argument 'optim.lr': options are listed by python .*{command}"
                                        r".* --help; overrides look like key.sub=value or --key.sub VALUE"):
        _parse(command, COMMANDS[command] + ["optim.lr", "1"])
    with pytest.raises(UserError, match="--optim.lr needs a value"):
        _parse(command, COMMANDS[command] + ["--optim.lr"])


def test_an_options_value_stays_the_options():
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--runs-dir")
    parser.add_argument("--seeds", nargs="+")
    parser.add_argument("--fast", action="store_true")
    options, overrides = split_command_line(parser, ["--runs-dir", "runs/lr=1", "--fast", "a=1", "--seeds", "0",
                                                     "b.c=2", "1"])
    assert options == ["--runs-dir", "runs/lr=1", "--fast", "--seeds", "0", "1"] and overrides == ["a=1", "b.c=2"]


def test_typed_flags_are_set_as_they_are():
    """A typed flag's value is not parsed back from text: a head name 'null' or a root '1e3' stays a string."""
    data = apply_overrides({}, [("head.name", "null"), ("data.root", "1e3"), "optim.lr=0.5"])
    assert data == {"head": {"name": "null"}, "data": {"root": "1e3"}, "optim": {"lr": 0.5}}


@pytest.mark.parametrize("command,flag,typo,meant", [
    ("eval", "--split", "vall", "val"), ("eval", "--calib", "val_half", "val-half"),
    ("predict", "--precision", "bf_16", "bf16"), ("extract_features", "--splits", "trian", "train"),
])
def test_a_choice_flag_typo_is_one_line_with_a_suggestion(command, flag, typo, meant):
    with pytest.raises(UserError, match=f"unknown {flag} '{typo}'; did you mean '{meant}'\\?; valid: "):
        _parse(command, COMMANDS[command] + [flag, typo])
    assert getattr(_parse(command, COMMANDS[command] + [flag, meant]), flag[2:]) in (meant, [meant])
