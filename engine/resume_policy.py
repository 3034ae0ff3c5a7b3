"""What a resume may change: the whole resolved config is the checkpoint's fingerprint.

A checkpoint stores its run's resolved config as a flat dict of dotted keys (`flatten_config`)
plus two derived values, `run.num_classes` and `run.global_batch` (`resume_fingerprint`). On
resume, `check_resume_changes` compares it with the current config, key by key:

- RESUME_ALLOWLIST: may change freely (where the run writes, how often it logs, evaluates and
  saves, how many checkpoints it keeps, how many loader workers or which eval batch size it uses,
  where the dataset lives, torch.compile, the non-finite policy). None of them changes what is
  trained.
- FROZEN_KEYS: never (the checkpoint would mean something else: another model, head parameter set,
  dataset/split, sampler order or optimizer type). Refused with one line; start a new run.
- every other key (optim.lr, optim.epochs, weight decay, warmup, augmentation, EMA, precision, ...):
  refused with one line listing each change as `key=old -> new` and naming
  `--resume-with-changes`; with that flag the changes are returned so the caller applies them for
  real: `rebuild_schedule` re-creates the warmup+cosine schedule for the new optim settings,
  evaluated at the current update (so a new lr or epoch count takes effect from this step on),
  `change_record` is the metrics.jsonl row and `save_config_with_history` appends the change to
  config.yaml's `history` list.

Keys present on only one side (added to the schema after the checkpoint was written) are not
compared: the checkpoint cannot say what it used. Checkpoints written before this fingerprint
(trainer_state has only the short `fingerprint` dict) are compared on what they recorded.
"""
import datetime
import os
from collections import namedtuple
from collections.abc import Mapping, Sequence

import yaml

from common.errors import UserError
from common.io import atomic_write_text

# Keys that may differ between the checkpoint and the resuming config without any flag.
RESUME_ALLOWLIST = frozenset({
    "name",                 # the config's name (train.output_dir is already resolved)
    "train.output_dir",     # the run directory may move
    "train.log_every", "train.eval_every", "train.save_every", "train.keep_last",
    "train.progress", "train.tensorboard",
    "train.compile",        # how the same model is executed
    "train.nonfinite",      # what to do if the loss turns non-finite (the error message suggests changing it)
    "train.max_skipped_fraction",  # when train.nonfinite=skip gives up
    "data.num_workers",     # the loaders give the same batches with any worker count
    "data.eval_batch_size",  # evaluation sums are exact at any chunking
    "data.root", "data.download", "data.cache_dir",  # where the data lives, not what it is
})

# Keys a checkpoint cannot be resumed with a different value of, flag or not.
FROZEN_KEYS = frozenset({
    "model.name", "model.norm", "model.img_size", "model.init_values",
    "model.pretrained", "model.pretrained_sha256",  # the weights the run started from
    "model.freeze",         # which parameters the optimizer state holds
    "head.name", "head.learn_alpha",
    "data.dataset", "data.image_size", "data.builtin_train_size", "data.builtin_seed", "data.calib_fraction",
    "data.repeated_aug", "data.repeated_aug_repeats",
    "train.seed",           # the per-epoch sample order: a mid-epoch resume would repeat/skip samples
    "optim.name",           # the optimizer state belongs to one optimizer type
    "run.num_classes", "run.global_batch",
})

# optim keys whose change needs the lr schedule rebuilt / the optimizer's groups updated
OPTIM_KEYS = frozenset({"optim.lr", "optim.lr_base_batch", "optim.epochs", "optim.warmup_epochs", "optim.min_lr",
                        "optim.warmup_lr", "optim.weight_decay", "optim.betas", "optim.momentum"})

RESUME_FLAG = "--resume-with-changes"
_MISSING = object()

Change = namedtuple("Change", "key old new")


def flatten_config(nested, prefix=""):
    """{'optim': {'lr': 1e-3}} -> {'optim.lr': 1e-3}; sequences become lists (as after a JSON round
    trip). Any mapping works."""
    flat = {}
    for key, value in nested.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, full + "."))
        else:
            flat[full] = _plain(value)
    return flat


def _plain(value):
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


def resume_fingerprint(cfg_dict, *, num_classes, global_batch):
    """What a checkpoint stores (trainer_state["config"]) and a resume is compared against."""
    flat = flatten_config(cfg_dict)
    flat["run.num_classes"] = int(num_classes)
    flat["run.global_batch"] = int(global_batch)
    return flat


def saved_fingerprint(trainer_state):
    """The fingerprint recorded in a checkpoint's trainer_state (legacy short form mapped)."""
    if isinstance(trainer_state.get("config"), dict):
        return dict(trainer_state["config"])
    legacy = dict(trainer_state.get("fingerprint", {}))
    if "num_classes" in legacy:
        legacy["run.num_classes"] = legacy.pop("num_classes")
    if trainer_state.get("global_batch") is not None:
        legacy["run.global_batch"] = trainer_state["global_batch"]
    return legacy


def config_changes(saved, current, allowlist=RESUME_ALLOWLIST):
    """[Change(key, old, new)] for keys in both fingerprints whose values differ, allowlist excluded."""
    changes = []
    for key in sorted(set(saved) & set(current)):
        if key in allowlist:
            continue
        if _plain(saved[key]) != _plain(current[key]):
            changes.append(Change(key, saved[key], current[key]))
    return changes


def format_changes(changes):
    return ", ".join(f"{c.key}={c.old!r} -> {c.new!r}" for c in changes)


def check_resume_changes(saved, current, *, checkpoint, accept_changes=False, allowlist=RESUME_ALLOWLIST):
    """Compare fingerprints; returns the accepted changes (empty when none).

    Raises UserError (one line) if a FROZEN key changed, or if other keys changed and
    `accept_changes` (the --resume-with-changes flag) is off."""
    changes = config_changes(saved, current, allowlist)
    frozen = [c for c in changes if c.key in FROZEN_KEYS]
    if frozen:
        raise UserError(
            f"checkpoint {checkpoint} cannot be resumed with {format_changes(frozen)} (a checkpoint of another "
            f"model, head, dataset, sample order or optimizer); resume with the saved values or start a new run "
            f"in another train.output_dir")
    if changes and not accept_changes:
        raise UserError(
            f"the config differs from the one checkpoint {checkpoint} was trained with: {format_changes(changes)}; "
            f"resume with the saved values, or pass {RESUME_FLAG} to apply these changes from the checkpoint's step on")
    return changes


def schedule_affected(changes):
    """True when an accepted change needs `rebuild_schedule` (lr, epochs, warmup, decay, betas...)."""
    return any(c.key in OPTIM_KEYS for c in changes)


# ----------------------------------------------------------------------------- applying optim changes
def optimizer_hparams(optimizer):
    """Snapshot of each param group's hyperparameters (everything but the params). Take it right
    after building the optimizer from the CURRENT config, before loading the checkpoint's state."""
    return [{k: _copy(v) for k, v in group.items() if k != "params"} for group in optimizer.param_groups]


def _copy(value):
    return tuple(value) if isinstance(value, (list, tuple)) else value


def rebuild_schedule(optimizer, fresh_hparams, optim_cfg, updates_per_epoch, step):
    """Apply the current config's optimizer settings to an optimizer whose state was just loaded
    from a checkpoint, and return a new timm CosineLRScheduler for them, set for update `step`.

    `optimizer.load_state_dict` restores the checkpoint's lr/initial_lr/weight_decay/betas in
    every param group and the scheduler's state restores its old base lr and length; so a changed
    optim.lr or optim.epochs would be silently ignored. Here every group gets back the fresh
    hyperparameters (same group layout: weight-decayed and not), `initial_lr` = the new scaled lr,
    and the warmup+cosine schedule is rebuilt for the new epochs and evaluated at `step`: the run
    continues on the schedule it would have followed had it used the new settings from the start.
    Do NOT load the checkpoint's scheduler state afterwards. The optimizer's moment estimates are
    kept."""
    from engine.optim import build_scheduler

    groups = optimizer.param_groups
    if len(groups) != len(fresh_hparams):
        raise UserError(
            f"the optimizer has {len(groups)} parameter groups but the new settings give {len(fresh_hparams)} "
            "(optim.weight_decay changed between zero and non-zero); keep it on the same side of zero to resume")
    for group, fresh in zip(groups, fresh_hparams):
        for key, value in fresh.items():
            if key != "initial_lr":
                group[key] = value
        group["initial_lr"] = fresh.get("initial_lr", fresh["lr"])
    scheduler = build_scheduler(optimizer, optim_cfg, updates_per_epoch)
    scheduler.step_update(step)
    return scheduler


# ----------------------------------------------------------------------------- recording changes
def _jsonable(value):
    return list(value) if isinstance(value, tuple) else value


def change_record(changes, *, step, checkpoint):
    """The metrics.jsonl row recording accepted changes: MetricsLog.write(**change_record(...))."""
    return {"kind": "config_change", "step": int(step), "checkpoint": checkpoint,
            "changes": {c.key: {"old": _jsonable(c.old), "new": _jsonable(c.new)} for c in changes}}


def history_entry(changes, *, step, checkpoint):
    """One entry of config.yaml's `history` list."""
    return {"step": int(step), "checkpoint": checkpoint,
            "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "flag": RESUME_FLAG,
            "changes": {c.key: {"old": _jsonable(c.old), "new": _jsonable(c.new)} for c in changes}}


def read_config_history(path):
    """The `history` list of a run's config.yaml ([] when absent or unreadable)."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return []
    history = data.get("history") if isinstance(data, dict) else None
    return list(history) if isinstance(history, list) else []


def save_config_with_history(path, cfg_dict, entry=None, keep_history=True):
    """Write the resolved config (a plain nested dict, e.g. configs.config_to_dict(cfg)) to `path`
    atomically, with a `history` list: the one already in `path` (when `keep_history`, i.e. on a
    resume) plus `entry` (a `history_entry`, when changes were accepted). Without any history the
    file is exactly the plain config. Readers of config.yaml must ignore the `history` key."""
    history = read_config_history(path) if keep_history and os.path.isfile(path) else []
    if entry is not None:
        history.append(entry)
    data = dict(cfg_dict)
    data.pop("history", None)
    if history:
        data["history"] = history
    atomic_write_text(path, yaml.safe_dump(data, sort_keys=False))
