"""Config system: every shipped config loads; base inheritance; overrides; one-line errors."""
import glob
import os

import pytest

import configs
from common.errors import UserError
from configs import load_config, load_run_config, save_config

CONFIG_DIR = configs.CONFIG_DIR
ALL_CONFIGS = sorted(glob.glob(os.path.join(CONFIG_DIR, "**", "*.yaml"), recursive=True))


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return str(path)


def test_shipped_configs_are_all_there():
    names = {os.path.relpath(p, CONFIG_DIR) for p in ALL_CONFIGS}
    for required in ["base.yaml", "quickstart.yaml", "cifar10.yaml", "cifar100.yaml",
                     "imagenet/resmlp_s12.yaml", "imagenet/resmlp_s24.yaml", "imagenet/resmlp_s36.yaml",
                     "imagenet/resmlp_b24.yaml", "imagenet/resmlp_s12_layernorm.yaml"]:
        assert required in names


@pytest.mark.parametrize("path", ALL_CONFIGS, ids=lambda p: os.path.relpath(p, CONFIG_DIR))
@pytest.mark.parametrize("head", ["softmax", "sparsemax", "entmax15", "entmax_bisect"])
def test_every_config_loads_with_every_head(path, head):
    cfg = load_config(path, [f"head.name={head}"])
    assert cfg.head.name == head
    assert "{name}" not in cfg.train.output_dir


def test_imagenet_recipe_matches_paper():
    cfg = load_config(os.path.join(CONFIG_DIR, "imagenet", "resmlp_s24.yaml"))
    assert cfg.model.name == "resmlp_s24" and cfg.model.norm == "affine"
    o, d = cfg.optim, cfg.data
    assert (o.name, o.lr, o.lr_base_batch, o.weight_decay, o.epochs, o.warmup_epochs) == \
        ("lamb", 5e-3, 2048, 0.2, 400, 5)
    assert (d.mixup, d.cutmix, d.reprob, d.label_smoothing, d.repeated_aug) == (0.8, 1.0, 0.25, 0.1, True)
    assert d.auto_augment == "rand-m9-mstd0.5-inc1" and cfg.model.drop_path == 0.05
    ln = load_config(os.path.join(CONFIG_DIR, "imagenet", "resmlp_s24_layernorm.yaml"))
    assert ln.model.norm == "layernorm" and ln.model.name == "resmlp_s24" and ln.optim == cfg.optim


def test_base_inheritance_is_chained_and_relative(tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    _write(tmp_path / "root.yaml", "optim: {lr: 0.1, epochs: 7}\ntrain: {seed: 3}\n")
    _write(sub / "mid.yaml", "base: ../root.yaml\noptim: {lr: 0.2}\nhead: {name: sparsemax}\n")
    leaf = _write(sub / "leaf.yaml", "base: mid.yaml\ntrain: {seed: 5}\n")
    cfg = load_config(leaf)
    assert cfg.optim.lr == 0.2 and cfg.optim.epochs == 7  # merged key by key, child wins
    assert cfg.train.seed == 5 and cfg.head.name == "sparsemax"
    assert cfg.name == "leaf" and cfg.train.output_dir == "runs/leaf"


def test_base_cycle_is_an_error(tmp_path):
    _write(tmp_path / "a.yaml", "base: b.yaml\n")
    _write(tmp_path / "b.yaml", "base: a.yaml\n")
    with pytest.raises(UserError, match="cycle"):
        load_config(str(tmp_path / "a.yaml"))


def test_overrides_are_yaml_scalars(tmp_path):
    path = _write(tmp_path / "c.yaml", "optim: {lr: 0.1}\n")
    cfg = load_config(path, ["optim.lr=1e-3", "train.ema=false", "model.init_values=null",
                             "optim.betas=[0.8, 0.9]", "data.auto_augment=rand-m9-mstd0.5-inc1", "name=x"])
    assert cfg.optim.lr == 1e-3 and isinstance(cfg.optim.lr, float)  # '1e-3' is a str to PyYAML
    assert cfg.train.ema is False and cfg.model.init_values is None
    assert cfg.optim.betas == (0.8, 0.9) and cfg.data.auto_augment == "rand-m9-mstd0.5-inc1"
    assert cfg.train.output_dir == "runs/x"


def test_mixed_precision_no_is_a_string_not_a_yaml11_boolean(tmp_path):
    # YAML 1.1 reads `no` as False; Accelerate spells "no mixed precision" exactly `no`.
    path = _write(tmp_path / "c.yaml", "train: {mixed_precision: no}\n")
    assert load_config(path, []).train.mixed_precision == "no"
    assert load_config(path, ["train.mixed_precision=bf16", "train.mixed_precision=no"]).train.mixed_precision == "no"
    assert load_config(path, ["train.ema=False", "train.log_with=none"]).train.ema is False
    with pytest.raises(UserError, match="train.ema"):
        load_config(path, ["train.ema=no"])  # a str where a bool is expected: named, not guessed


@pytest.mark.parametrize("override,suggestion", [
    ("optim.lrr=1", "optim.lr"),
    ("train.ema_decy=0.9", "train.ema_decay"),
    ("data.batchsize=8", "data.batch_size"),
    ("head.nme=sparsemax", "head.name"),
])
def test_unknown_key_suggests_closest(tmp_path, override, suggestion):
    path = _write(tmp_path / "c.yaml", "{}\n")
    with pytest.raises(UserError) as err:
        load_config(path, [override])
    msg = str(err.value)
    assert "\n" not in msg and "unknown config key" in msg and f"did you mean '{suggestion}'" in msg


@pytest.mark.parametrize("override,suggestion", [
    ("head.name=sparsemx", "'sparsemax'"),
    ("data.dataset=cifar01", "'cifar10'"),
    ("optim.name=adamww", "'adamw'"),
    ("head.name=banana", None),  # nothing close: no guess
])
def test_value_typo_suggests_the_closest_choice_as_key_typos_do(tmp_path, override, suggestion):
    path = _write(tmp_path / "c.yaml", "{}\n")
    with pytest.raises(UserError) as err:
        load_config(path, [override])
    msg = str(err.value)
    assert "\n" not in msg and "must be one of" in msg
    assert (f"did you mean {suggestion}?" in msg) if suggestion else "did you mean" not in msg


def test_unknown_key_in_yaml_file(tmp_path):
    path = _write(tmp_path / "c.yaml", "modle:\n  name: resmlp_tiny\n")
    with pytest.raises(UserError, match="did you mean 'model"):
        load_config(path)


@pytest.mark.parametrize("override,key,expected", [
    ("optim.lr=fast", "optim.lr", "float"),
    ("data.batch_size=1.5", "data.batch_size", "int"),
    ("train.ema=3", "train.ema", "bool"),
    ("optim.betas=0.9", "optim.betas", "list of float"),
    ("model.init_values=abc", "model.init_values", "float or null"),
])
def test_wrong_type_names_key_and_type(tmp_path, override, key, expected):
    path = _write(tmp_path / "c.yaml", "{}\n")
    with pytest.raises(UserError) as err:
        load_config(path, [override])
    msg = str(err.value)
    assert f"'{key}'" in msg and f"expects {expected}" in msg and "\n" not in msg


def test_bad_choice_lists_valid_values(tmp_path):
    path = _write(tmp_path / "c.yaml", "head: {name: softmaks}\n")
    with pytest.raises(UserError, match="sparsemax"):
        load_config(path)


def test_malformed_yaml_reports_line(tmp_path):
    path = _write(tmp_path / "c.yaml", "model:\n  name: resmlp_tiny\noptim:\n  lr: [0.1\n  epochs: 3\n")
    with pytest.raises(UserError) as err:
        load_config(path)
    assert "malformed YAML" in str(err.value) and "c.yaml:" in str(err.value)
    line = int(str(err.value).split("c.yaml:")[1].split(":")[0])
    assert 4 <= line <= 6


def test_missing_file_and_bad_override():
    with pytest.raises(UserError, match="not found"):
        load_config("/nonexistent/x.yaml")
    with pytest.raises(UserError, match="key.sub=value"):
        configs.parse_override("optim.lr")


def test_save_and_load_run_config_roundtrip(tmp_path):
    cfg = load_config(os.path.join(CONFIG_DIR, "quickstart.yaml"), ["head.name=entmax_bisect", "head.learn_alpha=true"])
    save_config(cfg, str(tmp_path / "config.yaml"))
    again = load_run_config(str(tmp_path))
    assert again == cfg
    with pytest.raises(UserError, match="config.yaml"):
        load_run_config(str(tmp_path / "nope"))


def test_train_cli_prints_one_line_and_exits_2(tmp_path):
    # in-process, as the command line runs main; a real train.py process's stderr is checked whole by
    # test_config_files.py::test_duplicate_key_is_one_line_from_a_real_train_process
    from test_train_helpers import main_inprocess

    proc = main_inprocess("--config", os.path.join(CONFIG_DIR, "quickstart.yaml"), "optim.lrr=1")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: unknown config key 'optim.lrr' on the command line; did you mean 'optim.lr'?"


@pytest.mark.parametrize("override", ["optim.lr=nan", "optim.lr=.inf", "optim.lr=inf", "optim.warmup_lr=-.inf",
                                      "data.mean=[.nan, 0.5, 0.5]", "model.init_values=nan"])
def test_non_finite_numbers_are_refused(tmp_path, override):
    with pytest.raises(UserError) as err:
        load_config(_write(tmp_path / "c.yaml", "{}\n"), [override])
    msg = str(err.value)
    assert f"'{override.split('=')[0]}'" in msg and "finite" in msg and "\n" not in msg


@pytest.mark.parametrize("override,expected", [
    ("optim.lr=0", "> 0"), ("optim.lr=-1e-3", "> 0"), ("optim.weight_decay=-0.1", ">= 0"),
    ("optim.warmup_epochs=-1", ">= 0"), ("optim.epochs=0", "in [1, 100000]"), ("data.batch_size=0", "in [1, 65536]"),
    ("data.eval_batch_size=-4", "in [1, 65536]"), ("data.image_size=99999999999999999999", "in [1, 4096]"),
    ("optim.epochs=100001", "in [1, 100000]"), ("data.reprob=1.5", "in [0, 1]"), ("data.mixup_prob=-0.1", "in [0, 1]"),
    ("data.label_smoothing=1.1", "in [0, 1]"), ("data.calib_fraction=1.0", "in [0, 1)"),
    ("train.ema_decay=1.0", "in [0, 1)"), ("model.drop_path=1", "in [0, 1)"), ("optim.clip_grad=0", "> 0"),
    ("optim.betas=[0.9, 1.0]", "in [0, 1) (each)"), ("data.std=[0.2, 0.0, 0.2]", "> 0 (each)"),
    ("train.keep_last=0", ">= 1"), ("data.num_workers=-1", "in [0, 256]"),
])
def test_out_of_range_numbers_are_refused(tmp_path, override, expected):
    key, value = override.split("=")
    with pytest.raises(UserError) as err:
        load_config(_write(tmp_path / "c.yaml", "{}\n"), [override])
    msg = str(err.value)
    assert msg.startswith(f"config key '{key}' must be {expected}, got ") and "\n" not in msg
    # the edges of each interval that are inside it load
    edge = {"optim.lr": "1e-9", "optim.weight_decay": "0", "optim.warmup_epochs": "0", "data.calib_fraction": "0.99",
            "train.ema_decay": "0", "data.reprob": "1", "data.label_smoothing": "1"}
    if key in edge:
        load_config(_write(tmp_path / "c.yaml", "{}\n"), [f"{key}={edge[key]}"])


# 9 levels of 9 aliases each: ~400 bytes that a YAML loader expanding aliases would turn into 9**9
# strings, here in a position (optim.lr) whose type check would print the whole value.
ALIAS_BOMB = "".join(f"{k}: &{k} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['lol'] * 9)}]\n"
                     for p, k in zip([None] + list("abcdefgh"), "abcdefghi")) + "optim: {lr: *i}\n"


def test_yaml_aliases_are_refused_before_expansion(tmp_path):
    assert 350 < len(ALIAS_BOMB) < 600
    with pytest.raises(UserError) as err:
        load_config(_write(tmp_path / "bomb.yaml", ALIAS_BOMB))
    msg = str(err.value)
    assert "alias" in msg and "bomb.yaml:2" in msg and "\n" not in msg and len(msg) < 300
    # an alias inside an override value: never expanded, the value is quoted cut short
    override = "optim.lr=[&a [lol, lol, lol, lol], [*a, *a, *a, *a], [*a, *a, *a, *a, *a, *a, *a, *a, *a]]"
    with pytest.raises(UserError) as err:
        load_config(_write(tmp_path / "c.yaml", "{}\n"), [override])
    assert "'optim.lr' expects float" in str(err.value) and len(str(err.value)) < 200


def test_long_values_are_cut_short_in_errors(tmp_path):
    huge = "[" + ", ".join(["1"] * 5000) + "]"
    for override in (f"optim.lr={huge}", f"train.mixed_precision={'x' * 5000}"):
        with pytest.raises(UserError) as err:
            load_config(_write(tmp_path / "c.yaml", "{}\n"), [override])
        msg = str(err.value)
        assert "optim.lr" in msg or "train.mixed_precision" in msg
        assert "..." in msg and len(msg) < 250 and "\n" not in msg


def test_override_into_a_value_is_refused(tmp_path):
    path = _write(tmp_path / "c.yaml", "optim: 3\n")
    with pytest.raises(UserError) as err:
        load_config(path, ["optim.epochs=1"])
    assert "'optim' is 3 in the config, not a section" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UserError, match="'optim' must be a mapping"):
        load_config(path)
    with pytest.raises(UserError, match="'optim.lr' is 0.1"):
        load_config(_write(tmp_path / "d.yaml", "optim: {lr: 0.1}\n"), ["optim.lr.x=1"])
    # a missing or empty section is created by the override
    assert load_config(_write(tmp_path / "e.yaml", "optim:\n"), ["optim.epochs=2"]).optim.epochs == 2
