"""Why a directory given as a run has no exported weights: one line for each case a user meets.

- not a run directory at all (no config.yaml, no weights, logs or checkpoints of train.py);
- a run still training (its run.lock names a live process) that has not exported weights yet:
  wait for its first epoch to end, or evaluate one of its checkpoints;
- a run that stopped before exporting weights: resume it, or evaluate a checkpoint.

And why the weights a run directory holds are not used (`check_finished`): train.py trained there
(its logs or checkpoints are there: TRAINING_TRACES) but stopped before the end (no summary.json, no
live training holds its lock: a failed save, a kill, train.pause_after), so they are not the trained
model; resume it (with no checkpoint yet, --resume auto starts it over), or give one of its
checkpoints. A run still training is used as it stands; a folder holding only a run's config,
classes and weights (a trained model copied elsewhere) is used as it is.
"""
import os

from common import rundir
from common.errors import UserError
from common.runlock import read_lock, stale_reason
from training.checkpoint.files import list_checkpoints, run_artefacts
from training.start_checks import LOCK_PURPOSE

# What train.py writes in a run directory while it trains (summary.json closes a finished run).
TRAINING_TRACES = (rundir.METRICS, rundir.EPOCHS, rundir.CHECKPOINTS)


def live_lock_holder(run_dir):
    """The lock record of a live process holding RUN_DIR/run.lock, or None (no lock, or a stale one)."""
    holder = read_lock(run_dir)
    if not holder or stale_reason(holder) is not None:
        return None
    return holder


def _checkpoint_hint(run_dir):
    found = list_checkpoints(os.path.join(run_dir, rundir.CHECKPOINTS))
    if not found:
        return None
    newest = found[-1][1]
    return (f"--checkpoint {os.path.join(newest, rundir.WEIGHTS)} "
            f"--config {os.path.join(run_dir, rundir.CONFIG)}")


def missing_weights_error(run_dir, weights_name, tool="python eval.py"):
    """The UserError for a `--checkpoint RUN_DIR` that has no `weights_name`."""
    if not os.path.isfile(os.path.join(run_dir, rundir.CONFIG)) and not run_artefacts(run_dir):
        return UserError(f"{run_dir} is not a train.py run directory (no {rundir.CONFIG}, {weights_name} or "
                         f"{rundir.CHECKPOINTS}/); give a run directory (train.output_dir) or a weights file")
    hint = _checkpoint_hint(run_dir)
    holder = live_lock_holder(run_dir)
    if holder is not None:
        way_out = (f"or give a checkpoint: {tool} {hint}" if hint
                   else "it has saved no checkpoint yet either")
        return UserError(f"{run_dir} is still training ({rundir.LOCK}: pid {holder.get('pid')} on "
                         f"{holder.get('host')}, since {holder.get('since')}) and has not exported "
                         f"{weights_name} yet: wait for its first epoch to end, {way_out}")
    config = os.path.join(run_dir, rundir.CONFIG)
    way_out = f"; or evaluate its newest checkpoint: {tool} {hint}" if hint else ""
    return UserError(f"{run_dir} has no {weights_name}: the run stopped before exporting weights; resume it "
                     f"with python train.py --config {config} --resume auto{way_out}")


def check_finished(run_dir, weights_name):
    """Refuse (UserError) the exported `weights_name` of a run directory whose training stopped before
    the end (its TRAINING_TRACES without summary.json) and that no live training holds (the module docstring)."""
    if os.path.isfile(os.path.join(run_dir, rundir.SUMMARY)) or \
            not any(os.path.lexists(os.path.join(run_dir, name)) for name in TRAINING_TRACES):
        return
    holder = live_lock_holder(run_dir)
    if holder is not None and holder.get("purpose") == LOCK_PURPOSE:
        return  # still training: its newest export
    config = os.path.join(run_dir, rundir.CONFIG)
    found = list_checkpoints(os.path.join(run_dir, rundir.CHECKPOINTS))
    if not found:
        raise UserError(f"{run_dir} is an unfinished run (no {rundir.SUMMARY}, no checkpoint: its training stopped "
                        f"before the first one), so its {weights_name} is no trained model; start it over with "
                        f"python train.py --config {config} --resume auto")
    raise UserError(f"{run_dir} is an unfinished run (no {rundir.SUMMARY}: its training stopped before the end), so "
                    f"its {weights_name} is no trained model; resume it with python train.py --config {config} "
                    f"--resume auto, or give one of its checkpoints: --checkpoint {found[-1][1]}")
