"""Open a trained thing: a train.py run directory, one of its checkpoints, or a weights file.

Every command that reads trained weights (eval.py, predict.py, scripts/export.py,
scripts/extract_features.py, the benchmarks) opens them here, so they agree on what a path means:

- RUN_DIR: its resolved config (config.yaml, or --config instead), model.safetensors or, with
  ema=True, model_ema.safetensors, and its classes.json;
- RUN_DIR/checkpoints/step_N: its weights (model_ema.safetensors with ema=True) and the config that
  trained them (the fingerprint in its trainer_state.json), the run's classes.json;
- a weights file (.safetensors/.pth: this project's, timm's or the original FB/DeiT format): the
  config comes from `config=` or from `model=` (with `head=`, `img_size=`; the variant's own image
  size by default), the classes from the configured dataset.

`open_run(path, config=, model=, head=, img_size=, ema=, overrides=, accept_changed_weights=,
accept_changed_model=)` -> TrainedRun: the resolved config (inference/run_config.py: a run's or
checkpoint's own, whose trained model the command line may not change unless accept_changed_model;
the changes then in `changed_from_run`), the weights file and kind (raw | ema | file), the classes, the
evaluation transform (the one builder of data/transforms.py, the transform eval.py's data pipeline
applies) and the built model. The weights are read once, hashed, and checked against the sha256 the
run recorded for them (inference/weights_record.py; --accept-changed-weights uses a changed file
anyway); a class list whose length is not the weights' class count is one line naming the list.
A run directory is opened once its training finished (summary.json) or while it trains: the weights
of one that stopped before the end are refused in one line naming the command that goes on
(inference/run_status.py).
`add_run_arguments` (inference/arguments.py, torch-free) is the one argparse group of those flags,
`open_from_args` its reader, the overrides every command takes are configs/overrides.py's dialect.
A path that cannot be opened is one UserError line naming the cause and the fix.
"""
import dataclasses
import os
import sys
from typing import List, Optional

from PIL import Image

import configs
import data
import models
from common import rundir
from common.errors import UserError
from common.weights import load_into, read_weights_bytes, state_dict_from_bytes
from configs.loader import config_to_dict
from configs.overrides import apply_overrides
from data.classes import load_class_names
from data.transforms import build_eval_transform, eval_transform
from inference.arguments import check_run_path, data_overrides, flag_overrides
from inference.run_config import is_checkpoint_dir, opened_config
from inference.run_status import check_finished, missing_weights_error
from inference.weights_record import check_weights_record
from models.convert import convert_state_dict
from models.pretrained import CLASSIFIER_PREFIX, renamed_state_dict, weights_patch_grid
from models.resmlp import VARIANTS
from training.feature_probe import build_eval_probe

# what was opened
RUN, CHECKPOINT, FILE = "run", "checkpoint", "file"
DEFAULT_IMG_SIZE = 224  # a weights file's image size for a model name that is not one of VARIANTS
CLASS_COUNT_FIX = "give the class names the model was trained with"  # a class list of another length


@dataclasses.dataclass
class TrainedRun:
    path: str  # as given
    source: str  # RUN | CHECKPOINT | FILE
    cfg: "configs.Config"
    weights: str  # the weights file
    weights_kind: str  # raw | ema | file
    weights_sha256: Optional[str] = None  # of the bytes build_model loaded (None before it ran)
    accept_changed_weights: bool = False  # use weights that differ from the run's record of them (a warning)
    # the trained model's keys used with other values than the run trained (--accept-changed-model):
    # {key: {"trained": value, "used": value}} (inference/run_config.py)
    changed_from_run: dict = dataclasses.field(default_factory=dict)

    @property
    def run_dir(self) -> Optional[str]:
        """The run directory (a checkpoint's run), None for a weights file."""
        return None if self.source == FILE else run_dir_of(self.path)

    def run_classes(self) -> Optional[List[str]]:
        """The class names the run trained on (classes.json), None for a weights file or an old run."""
        return load_class_names(self.run_dir) if self.run_dir is not None else None

    def classes(self) -> List[str]:
        """The run's class names, else the configured dataset's."""
        names = self.run_classes()
        return names if names is not None else list(data.class_names(self.cfg.data))

    def eval_transform(self, native_size=None):
        """The evaluation transform of the run's data config as torchvision runs it (files of any size
        when native_size is None; data/transforms.py eval_transform describes it), checked to give the
        model's input size."""
        transform = build_eval_transform(self.cfg.data, native_size)
        size = self.cfg.data.image_size
        probe = transform(Image.new("RGB", (37, 53)))  # an odd, non-square size
        if tuple(probe.shape) != (3, size, size):
            raise UserError(f"the eval transform (data.train_crop={self.cfg.data.train_crop}) gives "
                            f"{tuple(probe.shape)} images, the model takes (3, {size}, {size})")
        return transform

    def read_weights(self):
        """(state dict, sha256) of the weights file, read once. The sha256 is of the very bytes loaded
        (`weights_sha256`): what eval.py ties its conformal thresholds and feature memory to, and
        predict.py checks them against, even when the file is replaced meanwhile (a run still training
        exports new weights every epoch). It is checked against the run's record before the bytes are
        parsed, so a damaged file is named as changed since training wrote it."""
        data, self.weights_sha256 = read_weights_bytes(self.weights)
        check_weights_record(self.weights, self.weights_sha256, accept=self.accept_changed_weights)
        return state_dict_from_bytes(data, self.weights), self.weights_sha256

    def build_model(self, num_classes=None, classes_from=None, fix=CLASS_COUNT_FIX):
        """The model in eval mode with the weights loaded (`read_weights`). num_classes: len(classes())
        by default; `classes_from` names the list it is the length of (default: the run's classes.json,
        else data.dataset) and `fix` the way out, for the one line a count other than the weights' gives."""
        state_dict, _ = self.read_weights()
        trained = classifier_classes(state_dict)
        run_names = self.run_classes()
        own_list = os.path.join(self.run_dir, rundir.CLASSES) if run_names is not None else None
        if trained is not None and run_names is not None and len(run_names) != trained:
            # the run's own list must fit its weights, whichever list this command uses
            raise UserError(f"{own_list} lists {len(run_names)} classes but the weights {self.weights} classify "
                            f"{trained}; restore the {rundir.CLASSES} train.py wrote, or delete it to skip the "
                            f"class check")
        num_classes = len(self.classes()) if num_classes is None else num_classes
        if trained is not None and num_classes != trained:
            source = classes_from or own_list or f"data.dataset={self.cfg.data.dataset}"
            raise UserError(f"{source} lists {num_classes} classes but the weights {self.weights} classify "
                            f"{trained}; {fix}")
        return model_from_state_dict(self.cfg, state_dict, self.weights, num_classes)


def classifier_classes(state_dict):
    """The class count of the weights' classifier (head.weight in any supported format), None without one."""
    classifier = renamed_state_dict(state_dict).get(f"{CLASSIFIER_PREFIX}weight")
    return int(classifier[1].shape[0]) if classifier is not None and classifier[1].dim() == 2 else None


# ------------------------------------------------------------------------------------------ opening
def open_run(path, *, config=None, model=None, head=None, img_size=None, ema=False, overrides=(),
             accept_changed_weights=False, accept_changed_model=False) -> TrainedRun:
    """Open a run directory, a checkpoint directory or a weights file (module docstring).
    `overrides`: `key.sub=value` strings applied after model/head/img_size."""
    run = _open(path, config, model, head, img_size, ema, overrides, accept_changed_model)
    run.accept_changed_weights = accept_changed_weights
    return run


def _warn(line):
    print(line, file=sys.stderr)


def _open(path, config, model, head, img_size, ema, overrides, accept_changed_model=False):
    """Which of the three `path` is, and its TrainedRun (open_run's arguments, its weights flag aside)."""
    check_run_path(path)
    flags = flag_overrides(model, head, img_size) + list(overrides)
    if is_checkpoint_dir(path):
        return _open_checkpoint_dir(path, config, ema, flags, accept_changed_model)
    if os.path.isdir(path):
        name = rundir.EMA_WEIGHTS if ema else rundir.WEIGHTS
        weights = os.path.join(path, name)
        if not os.path.isfile(weights):
            if ema and os.path.isfile(os.path.join(path, rundir.WEIGHTS)):
                raise UserError(f"{path} has no {rundir.EMA_WEIGHTS} (trained with train.ema=false?); drop --ema")
            raise missing_weights_error(path, name)
        check_finished(path, name)
        cfg, changed = opened_config(path, config=config, flags=flags, accept=accept_changed_model, warn=_warn)
        return TrainedRun(path, RUN, cfg, weights, "ema" if ema else "raw", changed_from_run=changed)
    if ema:
        raise UserError(f"--ema selects {rundir.EMA_WEIGHTS} inside a run directory; "
                        "for a weights file, pass that file itself")
    if config:
        return TrainedRun(path, FILE, configs.load_config(config, flags), path, "file")
    if not model:
        raise UserError(f"{path} is a weights file: say what to build with --config CFG.yaml "
                        f"or --model NAME (e.g. --model resmlp_s12 --dataset imagefolder --data-root DIR)")
    if not img_size:  # the variant's own size
        img_size = VARIANTS.get(model, {}).get("img_size", DEFAULT_IMG_SIZE)
        flags = flag_overrides(model, head, img_size) + list(overrides)
    name = os.path.splitext(os.path.basename(path))[0]
    cfg = configs.config_from_dict({}, default_name=name)
    cfg = configs.config_from_dict(apply_overrides(config_to_dict(cfg), flags), default_name=cfg.name)
    return TrainedRun(path, FILE, cfg, path, "file")


def _open_checkpoint_dir(path, config, ema, flags, accept_changed_model=False):
    """RUN/checkpoints/step_N: its weights, with the config that trained it (the fingerprint in its
    trainer state)."""
    weights = os.path.join(path, rundir.EMA_WEIGHTS if ema else rundir.WEIGHTS)
    if not os.path.isfile(weights):
        why = " (trained with train.ema=false?); drop --ema" if ema else ""
        raise UserError(f"checkpoint {path} has no {rundir.EMA_WEIGHTS if ema else rundir.WEIGHTS}{why}")
    cfg, changed = opened_config(path, config=config, flags=flags, accept=accept_changed_model, warn=_warn)
    return TrainedRun(path, CHECKPOINT, cfg, weights, "ema" if ema else "raw", changed_from_run=changed)


def run_dir_of(path):
    """The run directory of a path: itself, or the run a checkpoint directory belongs to."""
    return os.path.dirname(os.path.dirname(os.path.abspath(path))) if is_checkpoint_dir(path) else path


def model_from_state_dict(cfg, state_dict, weights, num_classes):
    """The classifier `cfg` describes with `state_dict` (read from the file `weights`: this project's,
    timm's or FB's format) loaded, in eval mode; a linear probe for data.dataset=features. UserError
    naming a mismatch."""
    if data.is_features(cfg.data):  # a linear probe on cached features
        model = build_eval_probe(cfg, num_classes)
        load_into(model, state_dict, weights)
        return model.eval()
    grid = weights_patch_grid(state_dict)
    if grid is not None and grid[0] != cfg.data.image_size and grid[1] == VARIANTS[cfg.model.name]["patch_size"]:
        # the token-mixing layers fix the patch count: name the size, not the first mismatched tensor
        raise UserError(f"{weights} was trained at {grid[0]} px ({grid[2]}x{grid[2]} patches) but the config has "
                        f"data.image_size={cfg.data.image_size}: set data.image_size={grid[0]}")
    model = models.create_classifier(cfg.model, cfg.head, num_classes, img_size=cfg.data.image_size)
    # UserError naming the first mismatched key
    load_into(model, convert_state_dict(state_dict, model), weights)
    # timm reads a model's data config from pretrained_cfg: the run's eval transform, not the variant's
    model.pretrained_cfg = model.default_cfg = {**model.pretrained_cfg, **eval_transform(cfg.data).timm_config()}
    return model.eval()


# ------------------------------------------------------------------------------------------ the flags
def open_from_args(args) -> TrainedRun:
    """open_run from add_run_arguments' flags, with --dataset/--data-root/--batch-size and the
    collected overrides when the command has them."""
    return open_run(args.checkpoint, config=args.config, model=args.model, head=args.head, img_size=args.img_size,
                    ema=args.ema, overrides=data_overrides(args) + list(getattr(args, "overrides", [])),
                    accept_changed_weights=getattr(args, "accept_changed_weights", False),
                    accept_changed_model=getattr(args, "accept_changed_model", False))
