"""A checkpoint's trainer state (CHECKPOINT/trainer_state.json): one typed record, written and read here.

`TrainerState` is the training loop's saved counters (`Counters`, which training/run.py's RunState
extends with what is not saved) plus what the checkpoint says about the launch that wrote it
(training/checkpoint/save.py writes it, restore.py applies it on resume):

- `config`: the resume fingerprint (training/resume_policy.py `resume_fingerprint`): the whole resolved
  config as dotted keys, with `run.num_classes` and `run.global_batch`;
- `world_size`, `updates_per_epoch`, and the position in the epoch in optimizer updates
  (`updates_in_epoch`, world-independent) with the epoch's partial loss (`epoch_partial`: the sum
  over its updates of each update's loss, mean over ranks, and the number of updates);
- `loss_finite`: False when an update was skipped for a non-finite loss since the previous checkpoint
  (pruning then keeps an older checkpoint saved with finite losses).

The file carries `version` (VERSION). A file of another version, without one (written before the
format had a version) or missing a field is refused in one line: resuming it would misread it.
"""
import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Optional

from common import rundir
from common.errors import UserError

VERSION = 1


@dataclass
class Counters:
    """The training counters a checkpoint saves and a resume restores."""
    step: int = 0  # optimizer updates done
    epoch: int = 0  # epochs done
    batch: int = 0  # micro-batches done in the current epoch
    best_top1: Optional[float] = None
    best_step: Optional[int] = None
    skipped: int = 0  # updates skipped for a non-finite loss
    recent_skips: list = field(default_factory=list)  # steps skipped within the last SKIP_WINDOW updates
    train_time_s: float = 0.0
    images: int = 0
    warmup_s: float = 0.0  # session warm-up time (training/loop.py WARMUP_UPDATES), excluded from img/s
    warmup_images: int = 0
    last_eval: dict = field(default_factory=dict)
    # the lr schedule is indexed at step + schedule_offset: a resume with a changed global batch
    # (--resume-with-changes) maps the run's position to the new number of updates per epoch
    schedule_offset: int = 0
    epoch_note: str = ""  # config changes applied during the current epoch (its epochs.csv row notes them)

    def counters(self) -> dict:
        """The saved counters by name (a subclass's own fields left out)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(Counters)}


@dataclass
class TrainerState(Counters):
    """What trainer_state.json holds (module docstring)."""
    config: dict = field(default_factory=dict)  # the resume fingerprint
    world_size: int = 1
    updates_in_epoch: int = 0
    updates_per_epoch: int = 0
    epoch_partial: dict = field(default_factory=lambda: {"loss_sum": 0.0, "updates": 0})
    loss_finite: bool = True
    version: int = VERSION

    @property
    def global_batch(self) -> int:
        """The global batch the checkpoint trained with (samples per optimizer update)."""
        return int(self.config["run.global_batch"])

    def partial_epoch(self):
        """[loss sum over the epoch's updates so far, number of those updates] (world-independent)."""
        return [float(self.epoch_partial["loss_sum"]), float(self.epoch_partial["updates"])]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


FIELDS = frozenset(f.name for f in dataclasses.fields(TrainerState))


def from_dict(record, path) -> TrainerState:
    """The TrainerState of a trainer_state.json's content; UserError naming `path` when it is not one."""
    where = f"checkpoint {path}: {rundir.TRAINER_STATE}"
    if not isinstance(record, dict):
        raise UserError(f"{where} is not a JSON object; the checkpoint is damaged: resume from another one")
    version = record.get("version")
    if version != VERSION:
        found = "has no format version (written by an older train.py)" if version is None else \
            f"is format version {version!r}"
        raise UserError(f"{where} {found}; this train.py reads version {VERSION}: resume it with the code that "
                        f"wrote it, or start a new run (its weights still evaluate: --checkpoint WEIGHTS --config CFG)")
    missing, unknown = sorted(FIELDS - set(record)), sorted(set(record) - FIELDS)
    if missing or unknown:
        what = "; ".join(part for part in (missing and f"missing {', '.join(missing)}",
                                           unknown and f"unknown {', '.join(unknown)}") if part)
        raise UserError(f"{where} is not a version-{VERSION} trainer state ({what}); resume from another checkpoint")
    return TrainerState(**record)


def read_trainer_state(path) -> TrainerState:
    """The trainer state of checkpoint directory `path`; one-line UserError when unreadable or not version VERSION."""
    try:
        with open(os.path.join(path, rundir.TRAINER_STATE)) as f:
            record = json.load(f)
    except (OSError, ValueError) as err:
        raise UserError(f"checkpoint {path}: cannot read {rundir.TRAINER_STATE} ({err})") from None
    return from_dict(record, path)


def read_quietly(path) -> Optional[TrainerState]:
    """The trainer state of `path`, or None when it cannot be read as one (pruning and fallbacks
    only ask; the checkpoint's own validation reports what is wrong)."""
    try:
        return read_trainer_state(path)
    except UserError:
        return None
