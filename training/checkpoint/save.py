"""Saving a training run: a checkpoint (`save_checkpoint`) and the exported weights (`export_weights`).

The files and their format are training/checkpoint/files.py's, the trainer state's record
training/checkpoint/state.py's; resuming is training/checkpoint/restore.py. The loop hands a save
the values it needs (the epoch's loss totals, after checking the run for a non-finite loss) and
never has it reach back into the loop.

Every rank takes part in a save (its RNG states; the agreement on failure), the main process writes
the rest. A write failure on ANY rank (CheckpointWriteError: disk full, ...) raises the same
one-line error on every rank (exit 74), so none waits in a collective for one that gave up; the
previous checkpoints stay intact.
"""
import os

from accelerate.utils import gather_object

from common import rundir
from training.checkpoint import files as ck
from training.checkpoint.state import TrainerState
from training.rng import capture_rng_state


def on_every_rank(world, action):
    """Run `action` here; if it fails to write on ANY of the `world` ranks, every rank raises that
    one-line error. One gather of a small object per call with several processes (saves only)."""
    error = None
    try:
        action()
    except ck.CheckpointWriteError as err:
        error = str(err)
    if world > 1:
        error = next((e for e in gather_object([error]) if e), None)
    if error:
        raise ck.CheckpointWriteError(error)


def save_checkpoint(run, epoch, batch, loss_totals):
    """Checkpoint the run at its current step, at position (`epoch`, `batch`): every rank writes its RNG
    states, the main process the rest; then one atomic rename, and pruning. `loss_totals`: the epoch's
    partial [loss sum, updates] in world-independent units (training/loop.py's `epoch_loss_totals`), so
    epochs.csv stays exact after a mid-epoch resume on any number of processes. The caller has checked
    the run for a non-finite loss (training.train_step.stop_if_nonfinite): a save never holds the weights
    of one. A write failure on any rank removes the temporary directory and raises CheckpointWriteError
    on every rank; the previous checkpoints are untouched."""
    accelerator, state, learner = run.accelerator, run.state, run.learner
    root, step = os.path.join(run.run_dir, rundir.CHECKPOINTS), state.step
    tmp = ck.tmp_dir_for(root, step)
    loss_sum, updates = loss_totals

    def write_files():
        ck.write_rank_files(tmp, run.rank, capture_rng_state())
        if run.main_proc:
            trainer_state = TrainerState(
                **{**state.counters(), "epoch": epoch, "batch": batch},
                config=run.fingerprint,  # the whole config once (its name is config["name"])
                world_size=run.world, updates_in_epoch=batch // run.cfg.train.grad_accum,
                updates_per_epoch=run.updates_per_epoch, epoch_partial={"loss_sum": loss_sum, "updates": updates},
                # False when an update was skipped for a non-finite loss since the previous checkpoint:
                # pruning then keeps an older checkpoint saved with finite losses
                loss_finite=state.skipped == state.skipped_at_save)
            ck.write_main_files(
                tmp,
                model_state=learner.raw_model.state_dict(),
                ema_state=learner.ema.module.state_dict() if learner.ema is not None else None,
                optimizer_state=learner.optimizer.state_dict(),
                scheduler_state=learner.scheduler.state_dict(),
                scaler_state=accelerator.scaler.state_dict() if accelerator.scaler is not None else None,
                trainer_state=trainer_state,
            )

    def commit():
        if run.main_proc:
            state.last_ckpt = ck.commit_save(root, step)
            ck.prune(root, run.cfg.train.keep_last, keep_steps=[state.best_step], protect_last_finite=True,
                     warn=run.say)

    try:
        on_every_rank(run.world, lambda: run.main_proc and ck.begin_save(root, step))
        on_every_rank(run.world, write_files)
        on_every_rank(run.world, commit)
    except ck.CheckpointWriteError:
        if run.main_proc:
            ck.abort_save(tmp)
        raise
    state.saved_step, state.skipped_at_save = step, state.skipped


def export_weights(run):
    """Every rank: the main process writes the weights; a write failure raises on every rank."""
    on_every_rank(run.world, lambda: run.main_proc and write_weights(run))


def write_weights(run):
    """Main process: model.safetensors (and model_ema.safetensors), atomically."""
    learner = run.learner
    ck.save_weights(learner.raw_model.state_dict(), os.path.join(run.run_dir, rundir.WEIGHTS))
    if learner.ema is not None:
        ck.save_weights(learner.ema.module.state_dict(), os.path.join(run.run_dir, rundir.EMA_WEIGHTS))
