"""What a resume may change: the whole resolved config is the checkpoint's fingerprint.

A checkpoint stores its run's resolved config as a flat dict of dotted keys (`flatten_config`)
plus two derived values, `run.num_classes` and `run.global_batch` (`resume_fingerprint`). On
resume, `check_resume_changes` compares it with the current config, key by key. What each key may
do is its resume class in the schema's field metadata (configs/schema.py); the tables here are
derived from it:

- RESUME_ALLOWLIST (class FREE): may change freely (where the run writes, how often it logs, evaluates and
  saves, how many checkpoints it keeps, how many loader workers or which eval batch size it uses,
  where the dataset lives, torch.compile, the non-finite policy). None of them changes what is
  trained.
- FROZEN_KEYS (class FROZEN, and the two derived values): never (the checkpoint would mean something
  else: another model, head parameter set, dataset/split, sampler order or optimizer type). Refused
  with one line; start a new run.
- every other key (optim.lr, optim.epochs, weight decay, warmup, augmentation, EMA, precision, ...):
  refused with one line listing each change as `key=old -> new` and naming
  `--resume-with-changes`; with that flag the changes are returned so the caller applies them for
  real: `rebuild_schedule` re-creates the warmup+cosine schedule for the new optim settings
  (OPTIM_KEYS, class OPTIMIZER), evaluated at the current update (so a new lr or epoch count takes
  effect from this step on), `change_record` is the metrics.jsonl row and
  `save_config_with_history` writes config.yaml (always a plain, valid `--config` file) and appends
  the change to its history, RUN_DIR/config_history.yaml (rundir.CONFIG_HISTORY).

Keys present on only one side (added to the schema after the checkpoint was written) are not
compared: the checkpoint cannot say what it used. The fingerprint is TrainerState.config
(training/checkpoint/state.py).
"""
import datetime
import os
from collections import namedtuple
from collections.abc import Mapping, Sequence

import yaml

from common import rundir
from common.errors import UserError
from common.io import atomic_write_text
from configs.loader import config_to_dict, read_yaml_file
from configs.schema import FREE, FROZEN, OPTIMIZER, RESUME_CLASS

# Values a checkpoint derives from the config and the launch (resume_fingerprint), not config keys.
DERIVED_KEYS = ("run.num_classes", "run.global_batch")


def keys_of_class(resume_class):
    return frozenset(key for key, c in RESUME_CLASS.items() if c == resume_class)


# Keys that may differ between the checkpoint and the resuming config without any flag.
RESUME_ALLOWLIST = keys_of_class(FREE)
# Keys a checkpoint cannot be resumed with a different value of, flag or not.
FROZEN_KEYS = keys_of_class(FROZEN) | frozenset({"run.num_classes"})
# optim keys whose change needs the lr schedule rebuilt / the optimizer's groups updated; the lr
# follows the global batch, and so do the updates per epoch
OPTIM_KEYS = keys_of_class(OPTIMIZER) | frozenset({"run.global_batch"})

# Beside config.yaml: the changes accepted on resume (--resume-with-changes), a YAML list.

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


def resume_fingerprint(cfg, *, num_classes, global_batch):
    """What a checkpoint stores (trainer_state["config"]) and a resume is compared against. `cfg`:
    a Config, or its nested dict."""
    flat = flatten_config(cfg if isinstance(cfg, Mapping) else config_to_dict(cfg))
    flat["run.num_classes"] = int(num_classes)
    flat["run.global_batch"] = int(global_batch)
    return flat


def fingerprint_config(flat):
    """The nested config dict a fingerprint was flattened from (its derived values left out), e.g.
    to evaluate a checkpoint with exactly the settings that trained it."""
    nested = {}
    for key, value in flat.items():
        if key in DERIVED_KEYS:
            continue
        *sections, leaf = key.split(".")
        node = nested
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return nested


def config_changes(saved, current, allowlist=RESUME_ALLOWLIST):
    """[Change(key, old, new)] for keys in both fingerprints whose values differ, allowlist excluded."""
    changes = []
    for key in sorted(set(saved) & set(current)):
        if key in allowlist:
            continue
        if _plain(saved[key]) != _plain(current[key]):
            changes.append(Change(key, saved[key], current[key]))
    return changes


def updates_in_epoch(saved, global_batch):
    """Optimizer updates of the checkpoint's epoch done (`saved`: its TrainerState), counted in updates
    of `global_batch` samples (the resuming launch's): the same number when the global batch is
    unchanged, whatever the number of processes or grad_accum; UserError when a changed global batch
    does not divide the samples done."""
    done, old_batch = saved.updates_in_epoch, saved.global_batch
    samples = done * old_batch
    if samples % global_batch:
        raise UserError(
            f"the checkpoint stopped {samples} samples into its epoch ({done} updates of a global batch of "
            f"{old_batch}), which is no whole number of updates of the new global batch {global_batch}; resume from "
            f"an epoch-end checkpoint (--resume PATH) or with a global batch that divides {samples}")
    return samples // global_batch


def format_changes(changes):
    return ", ".join(f"{c.key}={c.old!r} -> {c.new!r}" for c in changes)


# The sha256 keys of what a run reads from outside itself (filled in by training/run.py's setup): a change means the
# file (or feature folder) changed under the same path since the run started, said so in those words.
SOURCE_HASH_KEYS = {
    "model.pretrained_sha256": "the file at model.pretrained changed",
    "train.teacher_sha256": "the file at train.teacher changed",
    "data.features_source_sha256": "the features at data.root were re-extracted from other weights",
    "data.features_settings_sha256": "the features at data.root were re-extracted with other settings",
}


def _short(sha):
    return f"{sha[:12]}…" if isinstance(sha, str) else repr(sha)


def describe_source_changes(changes):
    """'the file at model.pretrained changed since this run started (sha256 18cd… → 1766…)', one
    clause per changed SOURCE_HASH_KEYS key of `changes`; '' when none changed."""
    return "; ".join(f"{SOURCE_HASH_KEYS[c.key]} since this run started (sha256 {_short(c.old)} → {_short(c.new)})"
                     for c in changes if c.key in SOURCE_HASH_KEYS)


def check_resume_changes(saved, current, *, checkpoint, accept_changes=False, allowlist=RESUME_ALLOWLIST):
    """Compare fingerprints; returns the accepted changes (empty when none).

    Raises UserError (one line) if a FROZEN key changed, or if other keys changed and
    `accept_changes` (the --resume-with-changes flag) is off."""
    changes = config_changes(saved, current, allowlist)
    frozen = [c for c in changes if c.key in FROZEN_KEYS]
    sources = describe_source_changes(changes)
    if sources and (frozen or not accept_changes):
        others = [c for c in changes if c.key not in SOURCE_HASH_KEYS]
        also = f"; other changes: {format_changes(others)}" if others else ""
        how = ("restore it to resume, or start a new run in another train.output_dir" if frozen else
               f"restore it to resume, or pass {RESUME_FLAG} to go on with the new one")
        raise UserError(f"checkpoint {checkpoint} cannot be resumed: {sources}{also}; {how}")
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
    # heavy: timm (seconds); train.py reads this module for its config check, before torch loads
    from training.optim import build_scheduler

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
    """One entry of the run's config history (rundir.CONFIG_HISTORY)."""
    return {"step": int(step), "checkpoint": checkpoint,
            "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "flag": RESUME_FLAG,
            "changes": {c.key: {"old": _jsonable(c.old), "new": _jsonable(c.new)} for c in changes}}


def history_path(config_path):
    """The history file beside a run's config.yaml."""
    return os.path.join(os.path.dirname(os.path.abspath(config_path)), rundir.CONFIG_HISTORY)


def read_config_history(config_path):
    """The change history of the run whose config.yaml is `config_path` (its history file beside it);
    [] when there is none. A file that is not UTF-8, malformed or has duplicate keys is a one-line
    UserError."""
    path = history_path(config_path)
    if os.path.isfile(path):
        history, _ = read_yaml_file(path, "config history")
        if history is not None and not isinstance(history, list):
            raise UserError(f"{path} must be a list of changes, got {type(history).__name__}; restore it or "
                            f"delete it (the history is a record, not a setting)")
        return list(history or [])
    return []


def save_config_with_history(path, cfg, entry=None, keep_history=True):
    """Write the resolved config (a Config, or its plain nested dict) to `path` atomically as a plain
    config (a valid `--config` file), and its history beside it (rundir.CONFIG_HISTORY): the history
    already recorded (when `keep_history`, i.e. on a resume) plus `entry` (a `history_entry`, when
    changes were accepted). Without `keep_history` (a fresh start) an old history file is removed:
    it belonged to the run this one replaces."""
    history = read_config_history(path) if keep_history else []
    if entry is not None:
        history.append(entry)
    hist = history_path(path)
    if history:
        atomic_write_text(hist, yaml.safe_dump(history, sort_keys=False))
    elif os.path.isfile(hist):
        os.remove(hist)
    data = dict(cfg if isinstance(cfg, Mapping) else config_to_dict(cfg))
    atomic_write_text(path, yaml.safe_dump(data, sort_keys=False))
