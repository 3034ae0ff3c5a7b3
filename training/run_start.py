"""How a training run starts in its run directory (training/run.py's `setup` calls `prepare_run_dir`).

Check before you touch: every input, destination, store and dependency of a run is checked before its first
destructive or costly step. A check that fails is one line (UserError: `error: ...`, exit 2) and leaves the run
directory as it was: nothing is deleted, written or truncated (config.yaml, metrics.jsonl, epochs.csv, the
trackers' runs) and nothing is trained until every check has passed. So the checks come first (the tracker
packages are imported when the Accelerator is built; steps 1-5 below), then the changes (steps 6-7; a resume's
truncation of its logs once the trackers have started: training/run.py). A new check goes before the changes,
a new change after every check.

The main process decides, under the run lock (common/runlock.py), before anything in the
directory changes:
1. lock RUN_DIR (a second run gets one line naming the holder) and remove the temporary files of
   killed saves (training.checkpoint.files.clean_stale_temp: safe only under the lock);
2. `--resume auto|PATH` -> the checkpoint, invalid ones skipped with a warning naming each (sha256
   in COMPLETE.json); none valid: one line naming --resume PATH;
3. resuming: the checkpoint's whole config against this one (training/resume_policy.py): a change
   outside RESUME_ALLOWLIST is refused in one line unless --resume-with-changes, which records it
   in the run's config history (config_history.yaml); the run's classes.json must match the
   dataset's class names;
4. starting fresh: a directory holding a run (training.start_checks.run_artefacts: weights, logs,
   summary, checkpoints) is refused in one line naming what is there and the two ways on
   (`--resume auto`, `--overwrite`); `--resume auto` without a complete checkpoint refuses the
   same way unless the directory holds no run, or one that stopped before its first checkpoint and never
   finished (no summary.json: training.start_checks.stopped_before_first_checkpoint): nothing of it can be
   resumed, so it starts over there, saying so, and step 6 deletes what that run left as --overwrite does;
5. the trackers' stores opened (training.trackers.check_stores: an MLflow store it cannot use is one line);
6. `--overwrite` (or that start over) lists what it deletes, checks that all of it can be deleted (else
   one line, nothing deleted) and deletes it, symlinks themselves and never their targets (common/removal.py);
7. write config.yaml (a plain config, valid for --config), its history when resuming, and classes.json.
train.py asks the checks that need neither torch nor the data (the flags, the destination, a live lock,
a run already there: training/start_checks.py, the same words) before torch loads; they are asked again
here, where they decide. The other ranks receive the decision (one broadcast) or, after a refusal, exit
with the same code without printing it again. The checkpoint's trainer_state.json is read once, here, and travels with
the decision to `restore`, and the trackers' (the MLflow run a resume goes on in) to `trackers.start`.
"""
import os
import sys

from accelerate.utils import broadcast_object_list

from common import rundir
from common.errors import UserError
from common.removal import remove_all
from data.classes import class_mismatch, class_names, load_class_names, save_class_names
from training import resume_policy as rp
from training import trackers
from training.checkpoint import files as ck
from training.checkpoint.state import read_trainer_state
from training.logging import console
from training.start_checks import check_flags, holds_a_run, run_artefacts, stopped_before_first_checkpoint

# What --overwrite deletes besides the run artefacts: the TensorBoard logs and config history of the old run.
OVERWRITE_EXTRA = (rundir.TENSORBOARD, rundir.CONFIG_HISTORY)


def prepare_run_dir(cfg, resume, overwrite, accept_changes, accelerator, lock, fp, tracker_names=()):
    """The main process locks the run directory, decides how the run starts (`decide_start`) and
    writes config.yaml and classes.json; the other ranks receive its decision (or its refusal, and
    exit with the same code, silently). -> (checkpoint to resume from or None, its trainer state
    (None with no checkpoint), accepted changes, the trackers' start (training.trackers.check_stores))."""
    decision = {"ckpt": None, "saved": None, "changes": [], "trackers": {}, "error": None}
    if accelerator.is_main_process:
        try:
            decision["ckpt"], decision["saved"], decision["changes"], decision["trackers"] = decide_start(
                cfg, resume, overwrite, accept_changes, lock, fp, tracker_names)
        except UserError as err:
            if accelerator.num_processes == 1:
                raise
            decision["error"] = getattr(err, "exit_code", 2)
            print(f"error: {err}", file=sys.stderr, flush=True)
    if accelerator.num_processes > 1:
        decision = broadcast_object_list([decision])[0]
        if decision["error"] is not None:
            raise SystemExit(decision["error"])
    return decision["ckpt"], decision["saved"], decision["changes"], decision["trackers"]


def decide_start(cfg, resume, overwrite, accept_changes, lock, fp, tracker_names=()):
    """Main process, under the run lock: clean what killed saves left, resolve the checkpoint (invalid
    ones skipped with a warning), refuse config changes or a destructive fresh start, open the trackers'
    stores, and on a fresh start with --overwrite delete the old run (listing it). Nothing in the directory
    is changed before every check has passed (the module docstring). -> (checkpoint or None, its
    TrainerState or None, changes, the trackers' start)."""
    run_dir = cfg.train.output_dir
    say = console
    check_flags(resume, overwrite, run_dir)
    lock.acquire()
    ck.clean_stale_temp(run_dir, warn=say)
    ckpt = ck.resolve_resume(resume, run_dir, warn=say)
    changes, history, saved = [], None, None
    names = class_names(cfg.data)
    if ckpt is not None:
        saved = read_trainer_state(ckpt)
        if saved.global_batch != fp["run.global_batch"] and not accept_changes:
            raise UserError(f"checkpoint {ckpt} was trained with a global batch of {saved.global_batch}, this "
                            f"launch has {fp['run.global_batch']} (batch_size x processes x grad_accum); keep it equal "
                            f"to resume, or pass {rp.RESUME_FLAG} to go on with the new one (lr and schedule "
                            f"follow it)")
        rp.updates_in_epoch(saved, fp["run.global_batch"])  # a changed global batch must restart at a whole update
        changes = rp.check_resume_changes(saved.config, fp, checkpoint=ckpt,
                                          accept_changes=accept_changes)
        if changes:
            history = rp.history_entry(changes, step=saved.step, checkpoint=ckpt)
        if os.path.isfile(os.path.join(run_dir, rundir.CLASSES)):  # data.root may move, the classes may not
            diff = class_mismatch(load_class_names(run_dir), names)
            if diff:
                raise UserError(f"the dataset's classes differ from the ones {run_dir} was trained on ({diff}); resume "
                                f"on the same classes, or start a new run in another train.output_dir")
    else:
        present = run_artefacts(run_dir)
        # --resume auto on a run that never saved a checkpoint nor finished: nothing to resume, it starts over
        start_over = bool(present) and resume == "auto" and stopped_before_first_checkpoint(run_dir, present)
        if present and not (overwrite or start_over):
            raise holds_a_run(run_dir, present, resume)
    tracking = trackers.check_stores(tracker_names, cfg, resuming=ckpt is not None, say=say)  # the last check
    if ckpt is None:
        extra = [n for n in OVERWRITE_EXTRA if (overwrite or start_over) and os.path.lexists(os.path.join(run_dir, n))]
        if start_over:
            delete_old_run(run_dir, present + extra, say, why="--resume auto",
                           reason=f"{run_dir} stopped before its first checkpoint and never finished (no "
                                  f"{rundir.SUMMARY}), so nothing can be resumed: starting it over, ")
        else:
            delete_old_run(run_dir, present + extra, say)
    rp.save_config_with_history(os.path.join(run_dir, rundir.CONFIG), cfg, history, keep_history=ckpt is not None)
    save_class_names(run_dir, names)
    return ckpt, saved, changes, tracking


def delete_old_run(run_dir, names, say, why="--overwrite", reason=""):
    """`why` (--overwrite, or --resume auto starting a run over, for `reason`): list, then delete `names` of
    run_dir, all or nothing, links never followed."""
    if names:
        remove_all([os.path.join(run_dir, n) for n in names], why=f"{why} in {run_dir}",
                   before=lambda: say(f"{why}: {reason}deleting {', '.join(names)} in {run_dir}"))
