"""inference/trained_run.py: a run directory, one of its checkpoints and a weights file, each opened with
raw and EMA weights, give the config, weights, classes, eval transform and model they hold. The run is
written by hand (tiny model, no training): what is checked is which file and config each path means."""
import json
import os

import pytest
import torch
from PIL import Image

import configs
import data
from common import rundir
from common.errors import UserError
from common.weights import save_safetensors
from configs.loader import save_config
from data.classes import save_class_names
from inference.trained_run import CHECKPOINT, FILE, RUN, open_run

CLASSES = [f"c{i}" for i in range(10)]
BASE = ["model.name=resmlp_tiny", "data.image_size=16", "head.name=sparsemax"]


def _weights(model, scale):
    """The model's state dict with every float tensor set to `scale` (tells the files apart)."""
    return {k: torch.full_like(v, scale) if v.is_floating_point() else v for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """RUN/ with config.yaml, classes.json, raw (0.1) and EMA (0.2) weights, a summary.json (a finished run), and
    a checkpoint whose trainer state records an earlier config (optim.lr 5e-3) with its own raw (0.3) and EMA
    (0.4) weights."""
    import models
    from training.checkpoint import files as ck
    from training.checkpoint.state import TrainerState
    from training.resume_policy import resume_fingerprint

    root = tmp_path_factory.mktemp("trained") / "run"
    ckpt = root / rundir.CHECKPOINTS / rundir.checkpoint_name(3)
    os.makedirs(root)
    cfg = configs.config_from_dict({}, default_name="run")
    cfg = configs.config_from_dict(configs.loader.apply_overrides(configs.loader.config_to_dict(cfg), BASE))
    save_config(cfg, str(root / rundir.CONFIG))
    save_class_names(str(root), CLASSES)
    (root / rundir.SUMMARY).write_text("{}")
    model = models.create_classifier(cfg.model, cfg.head, len(CLASSES), img_size=cfg.data.image_size)
    for name, scale in ((rundir.WEIGHTS, 0.1), (rundir.EMA_WEIGHTS, 0.2)):
        save_safetensors(_weights(model, scale), str(root / name))
    earlier = configs.config_from_dict(configs.loader.apply_overrides(configs.loader.config_to_dict(cfg),
                                                                      ["optim.lr=5e-3"]))
    fp = resume_fingerprint(earlier, num_classes=len(CLASSES), global_batch=earlier.data.batch_size)
    tmp = ck.begin_save(str(ckpt.parent), 3)
    ck.write_main_files(tmp, model_state=_weights(model, 0.3), ema_state=_weights(model, 0.4), optimizer_state=None,
                        scheduler_state=None, scaler_state=None, trainer_state=TrainerState(step=3, batch=3, config=fp))
    ck.commit_save(str(ckpt.parent), 3)
    return str(root)


def _first_value(model):
    return float(next(v for v in model.state_dict().values() if v.is_floating_point()).flatten()[0])


@pytest.mark.parametrize("ema", [False, True])
def test_run_directory(run_dir, ema):
    run = open_run(run_dir, ema=ema)
    assert run.source == RUN and run.run_dir == run_dir and run.weights_kind == ("ema" if ema else "raw")
    assert run.weights == os.path.join(run_dir, rundir.EMA_WEIGHTS if ema else rundir.WEIGHTS)
    assert run.cfg.head.name == "sparsemax" and run.cfg.data.image_size == 16
    assert run.classes() == CLASSES
    assert tuple(run.eval_transform()(Image.new("RGB", (40, 7))).shape) == (3, 16, 16)  # any size
    model = run.build_model()
    assert not model.training and model.num_classes == 10
    assert _first_value(model) == pytest.approx(0.2 if ema else 0.1)


@pytest.mark.parametrize("ema", [False, True])
def test_checkpoint_directory(run_dir, ema):
    ckpt = os.path.join(run_dir, rundir.CHECKPOINTS, rundir.checkpoint_name(3))
    run = open_run(ckpt, ema=ema)
    assert run.source == CHECKPOINT and run.run_dir == os.path.abspath(run_dir)
    assert run.weights == os.path.join(ckpt, rundir.EMA_WEIGHTS if ema else rundir.WEIGHTS)
    assert run.cfg.optim.lr == 5e-3  # the config that trained this checkpoint, not the run's later one
    assert run.classes() == CLASSES  # the run's classes.json
    assert _first_value(run.build_model()) == pytest.approx(0.4 if ema else 0.3)


def test_weights_file(run_dir, tmp_path):
    weights = os.path.join(run_dir, rundir.EMA_WEIGHTS)
    with pytest.raises(UserError, match="say what to build with --config CFG.yaml or --model NAME"):
        open_run(weights)
    with pytest.raises(UserError, match="for a weights file, pass that file itself"):
        open_run(weights, ema=True, model="resmlp_tiny")
    run = open_run(weights, model="resmlp_tiny", head="sparsemax", img_size=16, overrides=["data.dataset=builtin10"])
    assert run.source == FILE and run.run_dir is None and run.weights == weights and run.weights_kind == "file"
    assert run.cfg.name == "model_ema" and run.cfg.head.name == "sparsemax"
    assert run.classes() == list(data.class_names(run.cfg.data))  # the dataset's: a weights file has no run
    assert _first_value(run.build_model()) == pytest.approx(0.2)
    # the variant's own image size unless --img-size says otherwise: resmlp_tiny's is 32, these are 16 px
    with pytest.raises(UserError, match="trained at 16 px .* set data.image_size=16"):
        open_run(weights, model="resmlp_tiny").build_model()
    # --config instead of --model
    by_config = open_run(weights, config=os.path.join(run_dir, rundir.CONFIG))
    assert by_config.cfg.head.name == "sparsemax" and _first_value(by_config.build_model()) == pytest.approx(0.2)


def test_missing_paths_and_weights_are_one_line(run_dir, tmp_path):
    with pytest.raises(UserError, match="checkpoint not found"):
        open_run(str(tmp_path / "nothing"))
    bare = tmp_path / "noema"
    bare.mkdir()
    for name in (rundir.CONFIG, rundir.WEIGHTS):
        (bare / name).write_bytes(open(os.path.join(run_dir, name), "rb").read())
    with pytest.raises(UserError, match="has no model_ema.safetensors .*drop --ema"):
        open_run(str(bare), ema=True)


def test_the_flags_are_one_group_every_command_adds():
    """eval.py, predict.py, export.py and extract_features.py take the same flags for what to open."""
    import argparse

    from configs.overrides import parse_command_line
    from inference.arguments import add_run_arguments
    from inference.trained_run import open_from_args

    p = argparse.ArgumentParser()
    add_run_arguments(p, data_flags=True)
    args = parse_command_line(p, ["--checkpoint", "w", "--model", "m", "--batch-size", "7", "a.b=1", "--c.d", "2"],
                              tool="python x.py")
    assert (args.checkpoint, args.model, args.batch_size, args.overrides) == ("w", "m", 7, ["a.b=1", "c.d=2"])
    with pytest.raises(UserError, match="unexpected argument '--frobnicate': options are listed by python x.py --help"):
        parse_command_line(p, ["--checkpoint", "w", "--frobnicate"], tool="python x.py")
    assert callable(open_from_args)
    assert json.loads(json.dumps(vars(args)))  # plain values only
