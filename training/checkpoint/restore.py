"""Resuming a training run: a checkpoint's state loaded into the run `setup` built (`restore`), then the run's
logs cut back to it (`resume_logs`), once the trackers have started (training/run.py: checks before changes).

The checkpoint was chosen and its trainer state read once by training/run_start.py; the files are
training/checkpoint/files.py's, the saving side training/checkpoint/save.py. The position in the
epoch travels in optimizer updates (world-independent), so a checkpoint of N processes resumes
exactly on M, with another grad_accum, or (--resume-with-changes) another global batch.
"""
import os

from common import rundir
from common.weights import load_into, read_safetensors
from training import resume_policy as rp
from training.checkpoint import files as ck
from training.rng import restore_rng_state


def restore(run, ckpt, saved, changes=(), fresh_hparams=None):
    """Load weights, EMA, optimizer, schedule, scaler, RNG states, counters and the epoch's partial
    loss sums from a checkpoint (`saved`: its trainer state); then apply accepted config changes
    (--resume-with-changes: `fresh_hparams` are this config's optimizer settings). Writes no file:
    `resume_logs` does, after every check of the start."""
    learner, state = run.learner, run.state
    source = f"checkpoint {ckpt}"
    load_into(learner.raw_model, read_safetensors(os.path.join(ckpt, rundir.WEIGHTS)), source)
    if learner.ema is not None:
        ema_path = os.path.join(ckpt, rundir.EMA_WEIGHTS)
        if os.path.isfile(ema_path):
            load_into(learner.ema.module, read_safetensors(ema_path), source)
        else:  # EMA switched on by an accepted change: it starts from the resumed weights
            learner.ema.set(learner.raw_model)
    learner.optimizer.load_state_dict(ck.load_torch(os.path.join(ckpt, rundir.OPTIMIZER)))
    learner.scheduler.load_state_dict(ck.load_torch(os.path.join(ckpt, rundir.SCHEDULER)))
    scaler_state = ck.load_torch(os.path.join(ckpt, rundir.SCALER))
    if scaler_state is not None and run.accelerator.scaler is not None:
        run.accelerator.scaler.load_state_dict(scaler_state)
    rng_state = ck.load_rng(ckpt, run.rank)
    if rng_state is not None:
        restore_rng_state(rng_state)
    for name, value in saved.counters().items():
        setattr(state, name, value)
    state.last_ckpt = ckpt
    state.skipped_at_save = state.skipped
    run.losses.carried = saved.partial_epoch()  # on every rank: the totals add it once
    new_epoch_length = restore_epoch_position(run, saved, changes)
    if rp.schedule_affected(changes) or new_epoch_length:
        learner.scheduler = rp.rebuild_schedule(learner.optimizer, fresh_hparams, run.cfg.optim,
                                                run.updates_per_epoch, state.step + state.schedule_offset)


def resume_logs(run, ckpt, changes=()):
    """The run's logs cut back to the restored checkpoint's step (the rows after it are logged again, exactly
    once) and the accepted config changes recorded in metrics.jsonl: the resume's first writes."""
    state = run.state
    run.logs.metrics.truncate_after(state.step)
    run.logs.epochs_csv.truncate_after(state.step)
    run.say(f"resumed from {ckpt} (step {state.step}, epoch {state.epoch + 1}, batch {state.batch})")
    if changes:
        run.logs.metrics.write(**rp.change_record(changes, step=state.step, checkpoint=ckpt))
        run.say(f"applying config changes from step {state.step} ({rp.RESUME_FLAG}): {rp.format_changes(changes)}")


def restore_epoch_position(run, saved, changes):
    """Where the resumed epoch goes on, counted in updates (world-independent): the micro-batch index of
    this launch's grad_accum, and the schedule offset that puts the lr where this launch's updates per
    epoch have it (0 unless the global batch, hence the updates per epoch, changed). Changes and
    another number of processes are noted in the epoch's epochs.csv row.
    -> True when the updates per epoch differ from the checkpoint's (the schedule must be rebuilt)."""
    state = run.state
    done = rp.updates_in_epoch(saved, run.global_batch)
    state.batch = done * run.cfg.train.grad_accum
    state.schedule_offset = state.epoch * run.updates_per_epoch + done - state.step
    notes = [rp.format_changes(changes)] if changes else []
    if saved.world_size != run.world:
        notes.append(f"processes {saved.world_size} -> {run.world}")
    if notes:
        note = f"from step {state.step}: {', '.join(notes)}"
        state.epoch_note = f"{state.epoch_note}; {note}" if state.epoch_note else note
    return saved.updates_per_epoch != run.updates_per_epoch
