"""Config files can't lie, the schema is the one source of every key's facts,
and the help a user gets:

- an empty or non-mapping file, bytes that are not UTF-8, a key given twice at any depth: one
  line naming the file (and the byte offset or both lines), from the loader and through train.py
  and eval.py (exit 2);
- unknown keys: a suggestion only when one is close, the YAML file and line named;
- `train.py --help-config`: every key with type, default, range or choices and meaning, itself a
  valid config; with --config, that config resolved;
- one image-size key (data.image_size; the model section has no copy of it);
- a run's config.yaml (after --resume-with-changes too) is a valid --config for train.py and
  eval.py, and eval.py takes one of the run's checkpoint directories.
"""
import json
import os
import subprocess
import sys

import pytest
import yaml

import configs
from common import rundir
from common.errors import UserError
from configs import config_from_dict, load_config, load_run_config
from configs.loader import suggest_key
from configs.schema import CHOICES, RANGES, schema_fields
from test_train_helpers import ROOT, reset_accelerate_state, run_inprocess, subprocess_env, tiny_cfg


def _write(path, data):
    with open(path, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    return str(path)


def _load_error(path, *overrides):
    with pytest.raises(UserError) as err:
        load_config(str(path), list(overrides))
    msg = str(err.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def _cli(capsys, main, argv):
    """An entry point's command line in this process -> (exit status, stderr)."""
    from common.cli import run_cli

    reset_accelerate_state()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        run_cli(main, argv)
    return exc.value.code, capsys.readouterr().err


def _train_main():
    import train

    return train.main


def _eval_main():
    import eval as eval_entry

    return eval_entry.main


# ----------------------------------------------------------------------------- files that lie
@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n"])
def test_empty_config_file_is_refused(tmp_path, text):
    path = _write(tmp_path / "c.yaml", text)
    msg = _load_error(path)
    assert msg.startswith(f"{path} is empty") and "{}" in msg
    assert load_config(_write(tmp_path / "d.yaml", "{}\n")) == config_from_dict({}, default_name="d")


@pytest.mark.parametrize("text,kind", [("- optim\n- head\n", "list"), ("3\n", "int"), ("just words\n", "str")])
def test_non_mapping_config_file_is_refused(tmp_path, text, kind):
    path = _write(tmp_path / "c.yaml", text)
    assert "a config must be a mapping of sections" in _load_error(path) and kind in _load_error(path)


def test_empty_base_file_is_refused_too(tmp_path):
    _write(tmp_path / "base.yaml", "")
    assert "base.yaml is empty" in _load_error(_write(tmp_path / "c.yaml", "base: base.yaml\noptim: {lr: 0.1}\n"))


def test_non_utf8_file_is_refused_naming_the_byte(tmp_path):
    latin1 = "optim:\n  lr: 0.1  # café\n".encode("latin-1")
    offset = latin1.index(b"\xe9")
    path = _write(tmp_path / "c.yaml", latin1)
    msg = _load_error(path)
    assert msg.startswith(f"{path} is not UTF-8") and f"byte {offset}" in msg and "UTF-8" in msg
    assert load_config(_write(tmp_path / "ok.yaml", latin1.decode("latin-1").encode("utf-8"))).optim.lr == 0.1


@pytest.mark.parametrize("text,key,lines", [
    ("optim: {lr: 1.0e-4, weight_decay: 0.05, lr: 5.0e-2}\n", "optim.lr", (1, 1)),
    ("optim:\n  lr: 1.0e-4\n  weight_decay: 0.05\n  lr: 5.0e-2\n", "optim.lr", (2, 4)),
    ("optim:\n  lr: 1.0e-4\nhead: {name: sparsemax}\noptim:\n  epochs: 3\n", "optim", (1, 4)),
    ("name: a\nname: b\n", "name", (1, 2)),
    ("data:\n  mean: [0.5, 0.5, 0.5]\n  std: {a: 1, a: 2}\n", "data.std.a", (3, 3)),
])
def test_duplicate_keys_are_refused_naming_key_and_lines(tmp_path, text, key, lines):
    path = _write(tmp_path / "c.yaml", text)
    msg = _load_error(path)
    assert msg == f"{path}: key '{key}' is given twice (lines {lines[0]} and {lines[1]}); keep one"


def test_same_name_in_other_sections_and_in_a_base_is_no_duplicate(tmp_path):
    _write(tmp_path / "base.yaml", "optim: {lr: 0.1, epochs: 3}\n")
    cfg = load_config(_write(tmp_path / "c.yaml", "base: base.yaml\nmodel: {name: resmlp_tiny}\n"
                                                  "head: {name: sparsemax}\noptim: {lr: 0.2}\n"))
    assert (cfg.model.name, cfg.head.name, cfg.optim.lr, cfg.optim.epochs) == ("resmlp_tiny", "sparsemax", 0.2, 3)
    # safe_load semantics otherwise: YAML 1.2 booleans, a str stays a str, null is None
    cfg = load_config(_write(tmp_path / "d.yaml", "train: {mixed_precision: no, ema: false}\n"
                                                  "model: {init_values: null}\n"))
    assert cfg.train.mixed_precision == "no" and cfg.train.ema is False and cfg.model.init_values is None


def test_empty_or_non_utf8_run_config_is_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _write(run / "config.yaml", "")
    with pytest.raises(UserError, match="config.yaml is empty"):
        load_run_config(str(run))
    _write(run / "config.yaml", b"name: r\xff\n")
    with pytest.raises(UserError, match=r"config.yaml is not UTF-8 text \(byte 7"):
        load_run_config(str(run))
    _write(run / "config.yaml", "[1, 2]\n")
    with pytest.raises(UserError, match="must be a mapping"):
        load_run_config(str(run))


BAD_FILES = {"empty": ("", "is empty"), "latin1": ("optim: {lr: 0.1}  # \xe9\n".encode("latin-1"), "is not UTF-8"),
             "duplicate": ("optim: {lr: 1.0e-4, lr: 5.0e-2}\n", "key 'optim.lr' is given twice (lines 1 and 1)")}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_files_are_one_line_through_train_and_eval(tmp_path, capsys, name):
    text, expected = BAD_FILES[name]
    path = _write(tmp_path / "c.yaml", text)
    for main, argv in ((_train_main(), ["--config", path]),
                       (_eval_main(), ["--checkpoint", _write(tmp_path / "w.safetensors", b""), "--config", path])):
        code, err = _cli(capsys, main, argv)
        assert code == 2 and err.count("\n") == 1 and err.startswith(f"error: {path}") and expected in err, err
    # and an empty run config.yaml: eval.py no longer evaluates the defaults
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    _write(run / "model.safetensors", b"")
    _write(run / "config.yaml", text)
    code, err = _cli(capsys, _eval_main(), ["--checkpoint", str(run)])
    assert code == 2 and err.count("\n") == 1 and "config.yaml" in err and expected in err, err


def test_duplicate_key_is_one_line_from_a_real_train_process(tmp_path):
    path = _write(tmp_path / "c.yaml", "optim:\n  lr: 1.0e-4\n  weight_decay: 0.05\n  lr: 5.0e-2\n")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--config", path], cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == f"error: {path}: key 'optim.lr' is given twice (lines 2 and 4); keep one\n"


# ----------------------------------------------------------------------------- unknown keys
@pytest.mark.parametrize("key", ["learning_rate", "model.weights", "model.frozen_layers", "train.kd_weight",
                                 "train.resume", "head.temperature"])
def test_no_suggestion_when_nothing_is_close(tmp_path, key):
    msg = _load_error(_write(tmp_path / "c.yaml", "{}\n"), f"{key}=1")
    assert f"unknown config key '{key}'" in msg and "did you mean" not in msg and "valid keys here" in msg
    assert suggest_key(key) is None


@pytest.mark.parametrize("key,suggestion", [
    ("optim.lrr", "optim.lr"), ("lr", "optim.lr"), ("train.epochs", "optim.epochs"), ("data.lr", "optim.lr"),
    ("modle", "model"), ("data.img_size", "data.image_size"), ("data.workers", "data.num_workers"),
    ("optim.weightdecay", "optim.weight_decay"), ("head.nme", "head.name"),
    # keys that once had wrong suggestions (model.name, model.norm, train.compile) now exist
    ("model.pretraind", "model.pretrained"), ("model.freez", "model.freeze"), ("train.distil", "train.distill"),
])
def test_close_keys_are_suggested_by_whole_name_or_last_part(key, suggestion):
    assert suggest_key(key) == suggestion


def test_unknown_yaml_key_names_file_and_line(tmp_path):
    path = _write(tmp_path / "c.yaml", "model:\n  name: resmlp_tiny\nlearning_rate: 0.1\n")
    msg = _load_error(path)
    assert msg.startswith(f"unknown config key 'learning_rate' at {path}:3;") and "did you mean" not in msg
    path = _write(tmp_path / "d.yaml", "optim:\n  epochs: 3\n  lrr: 0.1\n")
    assert _load_error(path) == f"unknown config key 'optim.lrr' at {path}:3; did you mean 'optim.lr'?"
    # in a base file: that file and its line
    _write(tmp_path / "base.yaml", "data:\n  batchsize: 8\n")
    msg = _load_error(_write(tmp_path / "e.yaml", "base: base.yaml\noptim: {lr: 0.1}\n"))
    assert f"'data.batchsize' at {tmp_path / 'base.yaml'}:2;" in msg and "did you mean 'data.batch_size'" in msg
    # a wrong type names the place too; an override is no file's
    assert f"({path}:2)" in _load_error(_write(tmp_path / "d.yaml", "optim:\n  lr: fast\n"))
    assert " at " not in _load_error(path, "optim.lrr=1")


def test_suggestions_come_from_the_schema(monkeypatch):
    """A key added to the schema (model.pretrained, ...) is suggested as soon as it exists."""
    import configs.loader as loader

    fields = dict(schema_fields())
    fields["model.pretrained"] = fields["model.name"]
    monkeypatch.setattr(loader, "schema_fields", lambda: fields)
    assert suggest_key("model.pretrain") == "model.pretrained" and suggest_key("pretrained") == "model.pretrained"


# ----------------------------------------------------------------------------- --help-config
def test_help_config_lists_every_key_and_is_itself_a_config(tmp_path, capsys):
    assert _train_main()(["--help-config"]) == 0
    text = capsys.readouterr().out
    for key, (f, tp) in schema_fields().items():
        leaf = key.rsplit(".", 1)[-1]
        line = next(li for li in text.splitlines() if li.strip().startswith(f"{leaf}:") and
                    (li.startswith("  ") == ("." in key)) and (f.metadata.get("help", "") in li))
        assert " # " in line, key
        if key in RANGES:
            assert ("in " + RANGES[key] in line) or (">" in line), key
        if key in CHOICES:
            assert "one of " + "|".join(CHOICES[key]) in line, key
        if not key.startswith("head.") or key in ("head.name", "head.learn_alpha"):
            assert f.metadata.get("help"), f"{key} has no help in configs/schema.py"
    assert "lr: 0.005  # float, > 0; peak learning rate" in text
    assert "img_size" not in text  # one image-size key, data.image_size
    # the text is a valid config: the defaults
    saved = _write(tmp_path / "help.yaml", text)
    assert load_config(saved, ["name=run"]) == config_from_dict({})


def test_help_config_with_a_config_prints_it_resolved(tmp_path, capsys):
    quick = os.path.join(configs.CONFIG_DIR, "quickstart.yaml")
    assert _train_main()(["--help-config", "--config", quick, "optim.lr=0.02"]) == 0
    text = capsys.readouterr().out
    assert quick in text.splitlines()[0]
    assert "  lr: 0.02  # float, > 0, default 0.005;" in text and "  batch_size: 128  # int, in [1, 65536];" in text
    assert load_config(_write(tmp_path / "resolved.yaml", text)) == load_config(quick, ["optim.lr=0.02"])
    code, err = _cli(capsys, _train_main(), ["--help-config", "--config", quick, "optim.lrr=1"])
    assert code == 2 and "did you mean 'optim.lr'" in err


def test_compare_heads_help_lists_the_head_names(capsys, monkeypatch):
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import compare_heads
    from models.heads import HEAD_NAMES

    monkeypatch.setenv("COLUMNS", "400")  # argparse wraps to the terminal width
    with pytest.raises(SystemExit) as exc:
        compare_heads.parse_args(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "models.heads.HEAD_NAMES" not in out and " ".join(HEAD_NAMES) in out


# ----------------------------------------------------------------------------- the schema as the one source
def test_tables_are_derived_from_the_field_metadata():
    fields = schema_fields()
    assert RANGES == {k: f.metadata["range"] for k, (f, _) in fields.items() if "range" in f.metadata}
    assert CHOICES == {k: f.metadata["choices"] for k, (f, _) in fields.items() if "choices" in f.metadata}
    assert {"optim.lr", "data.calib_fraction", "train.ema_decay"} <= set(RANGES)
    assert {"model.name", "model.norm", "head.name", "data.dataset", "data.backend", "train.compile"} <= set(CHOICES)


def test_one_image_size_key(tmp_path):
    cfg = load_config(_write(tmp_path / "a.yaml", "data: {image_size: 16}\n"))
    assert cfg.data.image_size == 16 and not hasattr(cfg.model, "img_size")
    assert "img_size" not in configs.config_to_dict(cfg)["model"] and "model.img_size" not in schema_fields()
    msg = _load_error(_write(tmp_path / "b.yaml", "model: {img_size: 24}\n"))
    assert "unknown config key 'model.img_size'" in msg and "data.image_size" in msg


def test_history_is_no_config_key(tmp_path):
    """The change history lives beside config.yaml (config_history.yaml): a `history` key is unknown."""
    assert "unknown config key 'history'" in _load_error(_write(tmp_path / "h.yaml", "history: 3\n"))


# ----------------------------------------------------------------------------- a run's own files
@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """A tiny run of one epoch, resumed with --resume-with-changes for a second one."""
    run = str(tmp_path_factory.mktemp("resumed") / "run")
    keep = "train.keep_last=10"  # every checkpoint: steps 5, 8 (the first epoch's end), 10, 15, 16
    assert run_inprocess(tiny_cfg(run, "optim.epochs=1", keep)) == 0
    assert run_inprocess(tiny_cfg(run, "optim.epochs=2", "optim.lr=2e-2", keep), resume="auto",
                         accept_changes=True) == 0
    return run


def test_a_runs_config_yaml_after_resume_with_changes_is_a_valid_config(resumed_run, capsys):
    path = os.path.join(resumed_run, "config.yaml")
    assert "history" not in yaml.safe_load(open(path))
    history = yaml.safe_load(open(os.path.join(resumed_run, rundir.CONFIG_HISTORY)))
    assert [h["changes"] for h in history] == [{"optim.epochs": {"old": 1, "new": 2},
                                                "optim.lr": {"old": 5e-3, "new": 2e-2}}]
    assert load_config(path) == load_run_config(resumed_run) == tiny_cfg(resumed_run, "optim.epochs=2",
                                                                          "optim.lr=2e-2", "train.keep_last=10")
    # train.py --config RUN/config.yaml --resume auto: the checkpoint's config, no change to refuse
    code, err = _cli(capsys, _train_main(), ["--config", path, "--resume", "auto"])
    assert code == 0, err
    assert len(yaml.safe_load(open(os.path.join(resumed_run, rundir.CONFIG_HISTORY)))) == 1  # nothing new
    # eval.py --config RUN/config.yaml on the run's exported weights
    weights = os.path.join(resumed_run, "model.safetensors")
    code, err = _cli(capsys, _eval_main(), ["--checkpoint", weights, "--config", path, "--quiet", "--calib", "none"])
    assert code == 0, err


def test_eval_takes_a_checkpoint_directory_of_a_run(resumed_run, tmp_path, capsys):
    from inference.trained_run import CHECKPOINT, open_run
    from training.checkpoint import files as ck

    root = os.path.join(resumed_run, rundir.CHECKPOINTS)
    steps = [s for s, _ in ck.list_checkpoints(root)]
    first = os.path.join(root, rundir.checkpoint_name(min(steps)))
    last = os.path.join(root, rundir.checkpoint_name(max(steps)))
    run = open_run(last)
    cfg, weights, kind = run.cfg, run.weights, run.weights_kind
    assert weights == os.path.join(last, rundir.WEIGHTS) and kind == "raw" and run.source == CHECKPOINT
    assert run.run_dir == os.path.abspath(resumed_run)
    assert cfg == load_run_config(resumed_run)  # the last checkpoint was trained with the run's final config
    run = open_run(last, ema=True)
    cfg, weights, kind = run.cfg, run.weights, run.weights_kind
    assert weights == os.path.join(last, rundir.EMA_WEIGHTS) and kind == "ema"
    # the final checkpoint holds the exported weights: both evaluations agree exactly
    out_run, out_ckpt = str(tmp_path / "run.json"), str(tmp_path / "ckpt.json")
    for target, out in ((resumed_run, out_run), (last, out_ckpt)):
        code, err = _cli(capsys, _eval_main(), ["--checkpoint", target, "--quiet", "--calib", "none", "--output", out])
        assert code == 0, err
    a, b = json.load(open(out_run)), json.load(open(out_ckpt))
    assert a["n"] == b["n"] == 100 and a["top1"] == b["top1"] and a["loss"] == b["loss"]
    # an earlier checkpoint is evaluated with the config that trained it (its fingerprint), not the
    # run's later one: the first epoch ran at optim.lr 5e-3 for one epoch
    assert steps == [5, 8, 10, 15, 16]
    cfg = open_run(first).cfg
    assert (cfg.optim.lr, cfg.optim.epochs) == (5e-3, 1)


