"""The sha256 a run recorded for a weights file, and the refusal of a file that no longer matches it.

train.py records the sha256 of every file of a checkpoint in its COMPLETE.json (training/checkpoint/
files.py). The weights it exports (RUN_DIR/model.safetensors, model_ema.safetensors) have no record
of their own, but an export ends every epoch, between the epoch's row in epochs.csv and the
checkpoint of the same step, whose copy of the weights is the same bytes: the same state dict
through the same safetensors writer (training/loop.py `end_of_epoch`, training/checkpoint/save.py).
So the record of

- RUN/checkpoints/step_N/NAME (opened as the checkpoint, or as a file) is that checkpoint's marker;
- RUN/NAME is the marker of step_S, S the step of epochs.csv's last row: the last epoch end, whose
  weights the run exported last (a resume drops the rows after the step it resumes from). When that
  checkpoint is not there (a run between its export and the checkpoint, a checkpoint save that
  failed, one train.keep_last pruned after a mid-epoch stop) there is nothing to compare with, and
  nothing is refused; file times are not used (a copy or an edit changes them);
- any other file (a downloaded timm file, a bare .safetensors) has none.

RUN/NAME also matches when it equals any of the run's checkpoint copies of NAME (a run resumed from
an older checkpoint, until it exports again; weights put back from a kept checkpoint). A mismatch is
one UserError line naming both hashes and ACCEPT_FLAG, which uses the file anyway, with a warning.
"""
import csv
import dataclasses
import json
import os
import sys
from typing import Optional

from common import rundir
from common.errors import UserError
from inference.arguments import ACCEPT_FLAG
from training.checkpoint.files import list_checkpoints
from training.logging import EpochCSV

EXPORTED = (rundir.WEIGHTS, rundir.EMA_WEIGHTS)  # what a run exports beside its checkpoints


@dataclasses.dataclass(frozen=True)
class Record:
    sha256: str
    marker: str  # the COMPLETE.json that holds it
    own_checkpoint: bool  # the file is that checkpoint's own (not a run's export of the same weights)


def _marker_hashes(checkpoint):
    """{file name: sha256} of a checkpoint's marker; {} when it has none, or one without checksums."""
    try:
        with open(os.path.join(checkpoint, rundir.MARKER)) as f:
            hashes = json.load(f).get("sha256")
    except (OSError, ValueError, AttributeError):
        return {}
    return hashes if isinstance(hashes, dict) else {}


def _export_record(run_dir, name):
    """The record of a run's exported `name`: its last epoch end's checkpoint (module docstring), or None."""
    try:
        step = int(EpochCSV(run_dir).read()[-1]["step"])
    except (OSError, csv.Error, IndexError, KeyError, TypeError, ValueError):
        return None  # no epochs.csv (or an unreadable one): no epoch end to look for
    checkpoint = os.path.join(run_dir, rundir.CHECKPOINTS, rundir.checkpoint_name(step))
    sha = _marker_hashes(checkpoint).get(name)
    return Record(sha, os.path.join(checkpoint, rundir.MARKER), own_checkpoint=False) if isinstance(sha, str) else None


def recorded_sha256(weights) -> Optional[Record]:
    """The run's record of the weights file `weights` (module docstring), or None."""
    folder, name = os.path.split(os.path.abspath(weights))
    if os.path.isfile(os.path.join(folder, rundir.MARKER)):
        sha = _marker_hashes(folder).get(name)
        return Record(sha, os.path.join(folder, rundir.MARKER), own_checkpoint=True) if isinstance(sha, str) else None
    if name in EXPORTED and os.path.isdir(os.path.join(folder, rundir.CHECKPOINTS)):
        return _export_record(folder, name)
    return None


def _in_any_checkpoint(run_dir, name, sha):
    return any(_marker_hashes(checkpoint).get(name) == sha
               for _, checkpoint in list_checkpoints(os.path.join(run_dir, rundir.CHECKPOINTS)))


def check_weights_record(weights, sha256, accept=False):
    """Refuse (one UserError line) weights whose sha256 differs from the run's record of them;
    with `accept` (ACCEPT_FLAG) warn instead. Weights without a record pass unchecked."""
    record = recorded_sha256(weights)
    if record is None or record.sha256 == sha256:
        return
    folder, name = os.path.split(os.path.abspath(weights))
    if not record.own_checkpoint and _in_any_checkpoint(folder, name, sha256):
        return
    what = f"{weights} has sha256 {sha256}, but {record.marker} records {record.sha256} for it"
    if accept:
        if int(os.environ.get("RANK", "0")) == 0:  # once, not once per launched process
            print(f"warning: {what}; using the changed file as it is ({ACCEPT_FLAG})", file=sys.stderr)
        return
    restore = ("use another of the run's checkpoints" if record.own_checkpoint else
               f"restore it from {os.path.join(os.path.dirname(record.marker), name)}")
    raise UserError(f"{what}: the file changed after training wrote it; {restore}, or pass {ACCEPT_FLAG} "
                    f"to use it as it is")
