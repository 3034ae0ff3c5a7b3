"""The config a trained run or checkpoint is opened with, and what a command line may change of it.

Torch-free: eval.py, predict.py, scripts/export.py and scripts/extract_features.py ask it before torch
loads (inference/arguments.py `check_run_config`), inference/trained_run.py again where it opens the run.

What a run trained is its own record: RUN_DIR/config.yaml for a run directory, the fingerprint in
trainer_state.json for one of its checkpoints. The command line (key.sub=value overrides, --model,
--head, --img-size, --dataset, --data-root, --batch-size) may change how and on what the weights are
used: data.root, data.dataset (the class names are checked against the run's classes.json), the batch
sizes, data.num_workers, train.eval_split, ... It may not change the trained model itself, TRAINED_KEYS:
- the model and head sections (model.*, head.*);
- the input the model takes: data.image_size and the eval transform (data.mean, data.std,
  data.interpolation, data.crop_pct, data.train_crop);
- what training held out of its data (data.calib_fraction, data.tune_fraction) and the features a
  probe trained on (data.features_source_sha256, data.features_settings_sha256).
A change of one is refused in one line naming the trained and the given values. With
--accept-changed-model it is used, with a warning, and eval.py records it in its JSON under
`changed_from_run` ({key: {"trained": ..., "used": ...}}). --config replaces the run's record (the
whole config as given), so nothing is compared then.

An override's mistake names the command line, a mistake in the run's file its line (configs/loader.py).
"""
import copy
import json
import os

import configs
from common import rundir
from common.errors import UserError
from configs.loader import with_overrides
from training.checkpoint.state import read_trainer_state
from training.resume_policy import fingerprint_config, flatten_config

CHANGE_FLAG = "--accept-changed-model"
CHANGED_KEY = "changed_from_run"  # eval.py's JSON: the trained keys used with other values than trained
TRAINED_SECTIONS = ("model", "head")
TRAINED_DATA_KEYS = ("data.image_size", "data.mean", "data.std", "data.interpolation", "data.crop_pct",
                     "data.train_crop", "data.calib_fraction", "data.tune_fraction", "data.features_source_sha256",
                     "data.features_settings_sha256")


def is_trained_key(key):
    """Whether the dotted config key defines the trained model (the module docstring)."""
    return key.split(".", 1)[0] in TRAINED_SECTIONS or key in TRAINED_DATA_KEYS


def is_checkpoint_dir(path):
    """A checkpoint of a run (RUN/checkpoints/step_N) rather than the run directory itself."""
    return os.path.isfile(os.path.join(path, rundir.TRAINER_STATE))


def trained_changes(trained, used):
    """{key: {"trained": value, "used": value}} of the TRAINED_KEYS whose value differs between the two configs."""
    old, new = flatten_config(configs.config_to_dict(trained)), flatten_config(configs.config_to_dict(used))
    return {key: {"trained": old[key], "used": new[key]} for key in sorted(old)
            if is_trained_key(key) and key in new and old[key] != new[key]}


def _settings(changes, side):
    return ", ".join(f"{key}={v if isinstance(v, str) else json.dumps(v)}"
                     for key, v in ((key, change[side]) for key, change in changes.items()))


def changed_model_error(path, changes):
    """The refusal of a command line that changes what `path` trained (TRAINED_KEYS)."""
    them = "it" if len(changes) == 1 else "them"
    return UserError(f"{path} was trained with {_settings(changes, 'trained')}; {_settings(changes, 'used')} on the "
                     f"command line would make it another model than the one trained: drop {them} to use the run "
                     f"as trained, or pass {CHANGE_FLAG} to use {them} anyway (eval.py records {them} in its JSON as "
                     f"{CHANGED_KEY})")


def opened_config(path, *, config=None, flags=(), accept=False, warn=None):
    """(the config the run directory or checkpoint `path` is opened with, the accepted changes of
    TRAINED_KEYS): --config `config` as given, else the run's record with `flags` (overrides: strings
    or typed (key, value) pairs) applied. A change of what the run trained is changed_model_error
    unless `accept`; then `warn(line)` is told. -> (Config, {key: {"trained", "used"}})."""
    if config:
        return configs.load_config(config, flags), {}
    if is_checkpoint_dir(path):
        recorded = fingerprint_config(read_trainer_state(path).config)
        trained = configs.config_from_dict(copy.deepcopy(recorded))
        sources = {}  # the record has no lines: only an override's key has a place to name
        used = configs.config_from_dict(with_overrides(recorded, sources, flags), sources=sources) if flags else trained
    else:
        trained = configs.load_run_config(path)
        used = configs.load_run_config(path, flags) if flags else trained
    changes = trained_changes(trained, used)
    if changes and not accept:
        raise changed_model_error(path, changes)
    if changes and warn is not None:
        warn(f"warning: {path} was trained with {_settings(changes, 'trained')}; using {_settings(changes, 'used')} "
             f"({CHANGE_FLAG}): the results are another model's than the one trained")
    return used, changes
