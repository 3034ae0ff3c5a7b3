"""The training loop: `train` runs (or resumes) the training of a config, epoch after epoch.

It reads top to bottom: `train` sets up the run (training/run.py) under the preemption guard,
`run_training` goes through the epochs left, `run_epoch` through the updates of one (`train_step`,
training/train_step.py), logging every train.log_every updates (`log_step`) and checkpointing every
train.save_every (`checkpoint`: training/checkpoint/save.py); `end_of_epoch` evaluates, exports the
weights and checkpoints; `write_summary` closes the run. What it guarantees (exact resume, GPU-first,
signals, exit codes) is train.py's docstring.

GPU-first: the device is read at log steps, saves and epoch ends only (`stop_if_nonfinite`, the
logged loss, `epoch_loss_totals`); between them an update never waits for it.
"""
import contextlib
import math
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

import data as data_lib
from common import rundir
from common.errors import EXIT_NONFINITE, UserError
from common.io import write_json
from evaluation.evaluate import evaluate
from training.checkpoint.save import export_weights, save_checkpoint, write_weights
from training.finetune import summary_fields
from training.logging import format_eval, format_throughput
from training.preemption import PreemptionGuard, gloo_reduce_max
from training.run import setup
from training.trackers import epoch_metrics
from training.train_step import NonFiniteLoss, stop_if_nonfinite, train_step

# Updates at the start of every session (compilation, autotuning, allocator warm-up) that are left
# out of img/s and the progress bar's rate and ETA; their time is reported as warmup_s.
WARMUP_UPDATES = 2


def train(cfg, resume=None, overwrite=False, hooks=None, accept_changes=False):
    """Run (or resume) the training described by `cfg`; returns the process exit status (see train.py's
    docstring). `accept_changes`: --resume-with-changes. `hooks` (tests only, None in production): an
    object with `on_loss(step, loss) -> loss` and `after_update(step)` (tests/hooked_train.py)."""
    # Signals are handled from the start (a SIGTERM during setup stops at the first update boundary);
    # Python installs handlers from the main thread only.
    guard = PreemptionGuard(sync_every=cfg.train.log_every)
    if threading.current_thread() is threading.main_thread():
        guard.install()
    try:
        run = setup(cfg, resume, overwrite, accept_changes)
        try:
            run.guard, run.reduce_max = guard, preemption_reduce_max(run.accelerator)
            return run_training(run, hooks)
        finally:
            run.logs.bar.close()
            run.accelerator.end_training()
            run.lock.release()
    finally:
        guard.uninstall()


def preemption_reduce_max(accelerator):
    """None with one process; else a max-reduction of the stop flag over a CPU gloo group (a new
    one next to NCCL), so agreeing never waits for the device."""
    if accelerator.num_processes == 1:
        return None
    group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    return gloo_reduce_max(group)


def run_training(run, hooks=None):
    """The epochs left; -> exit status."""
    run.learner.model.train()
    try:
        while run.state.epoch < run.cfg.optim.epochs:
            if paused(run):
                return 0
            if run_epoch(run, hooks):
                return stopped_by_signal(run)
    except NonFiniteLoss as stop:
        if run.main_proc:
            print(f"error: {stop}", file=sys.stderr, flush=True)
        return EXIT_NONFINITE
    if run.main_proc:
        write_summary(run)
    return 0


def paused(run):
    """train.pause_after=E: the run stops after epoch E, whose end saved a checkpoint, with no summary;
    --resume auto continues it (compare_heads --tune trains a trial that way, E = each evaluation)."""
    pause = run.cfg.train.pause_after
    if pause is None or run.state.epoch < pause:
        return False
    run.say(f"paused after epoch {run.state.epoch} of {run.cfg.optim.epochs} (train.pause_after={pause}); "
            f"--resume auto continues")
    return True


# ============================================================================ one epoch
def run_epoch(run, hooks=None):
    """The rest of the current epoch (all of it, or from a resumed batch), then its end.
    -> True when a signal stopped the run (a checkpoint of the stop step is saved)."""
    state, accum, epochs = run.state, run.cfg.train.grad_accum, run.cfg.optim.epochs
    epoch = state.epoch
    batches = iter(run.train_loader(epoch, state.batch))
    t0 = time.perf_counter()
    for _ in range(state.batch // accum, run.updates_per_epoch):
        with sync_debug(run.cfg.train.sync_debug, run.session):
            train_step(run, batches, hooks)
        if hooks is not None:
            hooks.after_update(state.step)
        end_warmup(run)
        log_step(run)
        state.train_time_s = run.session.elapsed()
        if state.batch // accum == run.updates_per_epoch:
            break  # the epoch's end saves its own checkpoint (and is where a signal is checked next)
        if state.step % run.cfg.train.save_every == 0:
            checkpoint(run, epoch, state.batch)
        if signalled(run):
            if state.saved_step != state.step:
                checkpoint(run, epoch, state.batch)
            run.guard.mark_saved()  # from here a further signal exits gracefully: the checkpoint is complete
            return True
    end_of_epoch(run, epoch, time.perf_counter() - t0)
    # after an epoch end every rank is here at the same step: agree now whatever the step (force_sync)
    return state.epoch < epochs and signalled(run, force_sync=True)


@contextlib.contextmanager
def sync_debug(enabled, session):
    """train.sync_debug (`enabled`): CUDA's sync debug mode set to "error" around one update (after warm-up)."""
    on = enabled and session.updates >= WARMUP_UPDATES
    if on:
        torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        if on:
            torch.cuda.set_sync_debug_mode("default")


def end_warmup(run):
    """After WARMUP_UPDATES updates of this session, restart the img/s window and the bar's rate clock."""
    session, state = run.session, run.state
    session.updates += 1
    if session.updates != WARMUP_UPDATES:
        return
    run.accelerator.wait_for_everyone()
    if run.accelerator.device.type == "cuda":
        torch.cuda.synchronize()
    now = time.perf_counter()
    state.warmup_s += now - session.start
    state.warmup_images += state.images - session.start_images
    session.restart_window(now, state.images)
    run.logs.bar.restart_clock()


def log_step(run):
    """Every train.log_every updates: a metrics.jsonl row (loss averaged over ranks), TensorBoard, the bar."""
    state, step, logs = run.state, run.state.step, run.logs
    if step % run.cfg.train.log_every == 0:
        stop_if_nonfinite(run)
        lr = run.learner.optimizer.param_groups[0]["lr"]
        loss_t = run.losses.last.float().reshape(1)
        if run.world > 1:
            loss_t = run.accelerator.reduce(loss_t, reduction="mean")
        ips = run.session.images_per_s(state.images)
        row = {"kind": "train", "step": step, "epoch": state.epoch + 1,
               "loss": loss_t.item(), "lr": lr, "img_per_s": ips, "skipped": state.skipped}
        logs.metrics.write(**row)
        if logs.trackers:
            run.accelerator.log({"train/loss": row["loss"], "train/lr": lr, "train/img_per_s": ips}, step=step)
        logs.bar.set_postfix(loss=f"{row['loss']:.4f}", lr=f"{lr:.2e}", speed=format_throughput(ips), refresh=False)
    logs.bar.update(1)


def signalled(run, force_sync=False):
    """Whether every rank agrees to stop for a signal after this update (a Python bool with one
    process; one CPU all-reduce every train.log_every updates with several, see training/preemption.py)."""
    return run.guard is not None and run.guard.should_stop(run.state.step, run.reduce_max, force_sync=force_sync)


def stopped_by_signal(run):
    """After the stop checkpoint: later signals exit gracefully; one line; -> the signal's exit code."""
    run.guard.mark_saved()
    name = signal.Signals(run.guard.signum).name if run.guard.signum else "signal"
    where = run.state.last_ckpt or f"step {run.state.step}"
    run.say(f"{name}: stopped after step {run.state.step} with a complete checkpoint ({where}); continue with "
            f"--resume auto (exit {run.guard.exit_code})")
    return run.guard.exit_code


# ============================================================================ checkpoints
def checkpoint(run, epoch, batch):
    """Save a checkpoint at (`epoch`, `batch`), never of a non-finite update (reads the device)."""
    stop_if_nonfinite(run)
    save_checkpoint(run, epoch, batch, epoch_loss_totals(run))


def epoch_loss_totals(run):
    """The current epoch's [sum over its finite updates of the update's loss (the mean over ranks, as
    metrics.jsonl logs it), number of those updates]: world-independent units, so a checkpoint of N
    processes resumes exactly on M. One all-reduce with several processes (saves and epoch ends only)."""
    session = run.losses.epoch
    if run.world > 1:
        session = run.accelerator.reduce(session, reduction="sum")
    session = (session / run.world).tolist()  # every rank counted each update once: / world = once per update
    return [carried + now for carried, now in zip(run.losses.carried, session)]


# ============================================================================ the end of an epoch
def end_of_epoch(run, epoch, seconds):
    """epochs.csv row and console line (with an eval when due), exported weights, checkpoint."""
    state, losses, epochs = run.state, run.losses, run.cfg.optim.epochs
    stop_if_nonfinite(run)
    state.epoch, state.batch = epoch + 1, 0
    local_updates = losses.epoch[1].item()  # this session's part of the epoch: what `seconds` timed
    loss_sum, updates = epoch_loss_totals(run)
    losses.epoch.zero_()
    losses.carried = [0.0, 0.0]
    row = {"epoch": epoch + 1, "step": state.step,
           "train_loss": loss_sum / max(updates, 1.0),
           "lr": run.learner.optimizer.param_groups[0]["lr"],
           "img_per_s": local_updates * run.global_batch / max(seconds, 1e-9),
           "time_s": seconds, "skipped": state.skipped}
    if state.epoch_note:
        row["changes"], state.epoch_note = state.epoch_note, ""
    line = (f"epoch {epoch + 1}/{epochs}  step {state.step}  loss {row['train_loss']:.4f}  "
            f"lr {row['lr']:.2e}  {format_throughput(row['img_per_s'])}")
    alphas = learned_alphas(run.learner)  # head.learn_alpha: where it has moved to
    if alphas:
        row.update({f"{weights}_alpha": a for weights, a in alphas.items()})
        line += f"  α {alphas['raw']:.4f}" + (f" (ema {alphas['ema']:.4f})" if "ema" in alphas else "")
    if run.logs.trackers:  # the epoch's curve, the TensorBoard HParams tab's train loss (training/trackers.py)
        run.accelerator.log(epoch_metrics(row), step=state.step)
    evaluated = (epoch + 1) % run.cfg.train.eval_every == 0 or epoch + 1 == epochs
    if evaluated:
        line += evaluate_epoch(run, row)
    run.logs.epochs_csv.write(row)
    run.say(line)
    state.train_time_s = run.session.elapsed()
    export_weights(run)
    checkpoint(run, epoch + 1, 0)
    if evaluated:
        stop_if_empty_eval(run)


def learned_alphas(learner):
    """{"raw": α, "ema": α} of a head that learns α (the EMA weights average it too); {} otherwise."""
    models = {"raw": learner.raw_model, **({"ema": learner.ema.module} if learner.ema is not None else {})}
    out = {weights: m.output_head.learned_alpha() for weights, m in models.items()}
    return {} if out["raw"] is None else out


def evaluate_epoch(run, row):
    """Evaluate the raw (and EMA) weights on the val split (float32, as eval.py: evaluation/evaluate.py);
    log them, track the best; -> console text."""
    state, learner, logs, text = run.state, run.learner, run.logs, ""
    evals = {"raw": evaluate(learner.raw_model, run.val_loader, run.accelerator).totals}
    if learner.ema is not None:
        evals["ema"] = evaluate(learner.ema.module, run.val_loader, run.accelerator).totals
    for weights, m in evals.items():
        logs.metrics.write(kind="eval", step=state.step, epoch=state.epoch, weights=weights, **m)
        row.update({f"{weights}_{k}": v for k, v in m.items()})
        text += f"  | {weights}: {format_eval(m)}"
        if logs.trackers:
            run.accelerator.log({f"val_{weights}/{k}": v for k, v in m.items() if k != "n"}, step=state.step)
    state.last_eval = evals
    if not evals["raw"]["n"]:
        run.say(f"warning: the validation split had no decodable image at step {state.step} (every one skipped, "
                f"data.skip_corrupt): its metrics are null")
    elif state.best_top1 is None or evals["raw"]["top1"] > state.best_top1:
        state.best_top1, state.best_step = evals["raw"]["top1"], state.step
    return text


def stop_if_empty_eval(run):
    """An evaluation that found no image (every val image skipped under data.skip_corrupt) stops the
    run, after its epoch's checkpoint, unless train.allow_empty_eval (identical on every rank: n is
    the total over ranks)."""
    if run.state.last_eval["raw"]["n"] or run.cfg.train.allow_empty_eval:
        return
    if not run.main_proc:
        raise SystemExit(2)  # the main process says why
    raise UserError(f"every validation image was skipped as undecodable (data.skip_corrupt): the evaluation at step "
                    f"{run.state.step} had no image; fix or replace the val files (later evaluations and eval.py "
                    f"use them) and continue with --resume auto, or set train.allow_empty_eval=true to train "
                    f"without validation")


# ============================================================================ the end of the run
def write_summary(run):
    """Main process: summary.json and the closing console line."""
    state, run_dir = run.state, run.run_dir
    if not os.path.exists(os.path.join(run_dir, rundir.WEIGHTS)):
        write_weights(run)
    summary = {
        "final": state.last_eval,
        "train_time_s": state.train_time_s,
        # without the warm-up updates of each session (compilation): the throughput a user plans with
        "img_per_s": (state.images - state.warmup_images) / max(state.train_time_s - state.warmup_s, 1e-9),
        "warmup_s": state.warmup_s,
        "epochs": run.cfg.optim.epochs, "steps": state.step, "skipped_steps": state.skipped,
        "best": {"top1": state.best_top1, "step": state.best_step},
        "global_batch": run.global_batch, "num_processes": run.world,
        "precision": run.accelerator.mixed_precision,
        "data_backend": data_lib.explain_backend(run.cfg.data, run.accelerator.device)[0],
        **summary_fields(run.cfg),  # model.pretrained and train.teacher: path and sha256
    }
    if learned_alphas(run.learner):
        summary["learned_alpha"] = learned_alphas(run.learner)
    write_json(summary, os.path.join(run_dir, rundir.SUMMARY))
    raw_top1 = _percent(state.last_eval.get("raw", {}).get("top1", math.nan))
    ema_text = f", {_percent(state.last_eval['ema']['top1'])} (ema)" if "ema" in state.last_eval else ""
    run.say(f"done: {state.step} steps in {state.train_time_s:.1f}s; final val top1 {raw_top1} (raw)"
            f"{ema_text}; run dir {run_dir}")


def _percent(fraction):
    return "n/a" if fraction is None or math.isnan(fraction) else f"{100 * fraction:.2f}%"
