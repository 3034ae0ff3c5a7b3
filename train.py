"""Train a ResMLP classifier with a swappable output head (softmax / sparsemax / entmax).

    python train.py --config configs/quickstart.yaml [key.sub=value ...] [--resume auto|PATH] [--overwrite]
    python train.py --help-config [--config FILE] [key.sub=value ...]   # every config key, or FILE resolved
    accelerate launch --multi_gpu --num_processes 8 train.py --config configs/imagenet/resmlp_s12.yaml
    accelerate launch --num_machines 2 --machine_rank R --main_process_ip HOST ... train.py ...

Accelerate owns devices, distribution (DDP), mixed precision (train.mixed_precision: no | bf16 |
fp16) and gradient accumulation (train.grad_accum). The run directory (train.output_dir) gets
config.yaml, metrics.jsonl, epochs.csv, model.safetensors, model_ema.safetensors, summary.json,
checkpoints/ and TensorBoard logs (see training/checkpoint/files.py).

The loop reads top to bottom: `setup` builds the run (training/run.py: accelerator, run
dir, data, model, optimizer, schedule, EMA, resume), `train_step` does one optimizer update
(training/train_step.py), `end_of_epoch` evaluates, exports the weights and checkpoints,
`write_summary` closes the run.

Exact resume: the training loader is NOT passed through `accelerator.prepare` (its re-sharding
replays the wrong samples mid-epoch); `data.build_train_loader` is already deterministic per
(seed, epoch, position) and sharded per rank, and restarts at any batch. Every random draw of a
step (drop path, Mixup/CutMix, ...) comes from RNGs reseeded from (seed, step, micro-batch, rank),
so a run killed at any step and resumed from its last checkpoint ends bit-identical (CPU).

GPU-first: between log steps the loop never waits on the device. The step's loss, the epoch's
loss sum and the first non-finite step stay on the device and are read at log steps, checkpoint
saves and epoch ends only; under train.nonfinite=stop the run can therefore go on for up to
min(train.log_every, train.save_every) - 1 updates past a non-finite loss before it stops, naming
the first bad update and never saving its weights. train.nonfinite=skip must decide before each
optimizer step, so it reads one flag per update (one device sync per update: a documented cost).
train.compile compiles the forward together with the head's loss (auto: on for CUDA).

Run safety (the run directory is never lost or mixed):
- Run lock: the main process holds RUN_DIR/run.lock (common/runlock.py) from before the first
  look at the directory to the end; a second run gets one line naming the holder. Leftover temp
  files of killed saves are removed under the lock at start.
- Fresh start: a directory that holds a run (weights, logs, summary, checkpoints) is refused
  unless --overwrite (which lists what it deletes); `--resume auto` without a complete checkpoint
  refuses too, unless the directory holds no run.
- Resume: the checkpoint stores the whole resolved config; any change outside
  training.resume_policy.RESUME_ALLOWLIST is refused in one line, or applied for real with
  --resume-with-changes (a new lr/epochs rebuilds the schedule from the current update; the change
  is recorded in metrics.jsonl and in config_history.yaml beside config.yaml). Invalid checkpoints are skipped
  with a warning (sha256 in COMPLETE.json). The epoch's partial loss sums travel in the
  checkpoint in world-independent units (per update, not per rank; the position in updates), so
  epochs.csv is exact after a mid-epoch resume, on another number of processes too.
- Preemption (training/preemption.py): SIGTERM / SIGINT / SIGUSR1 stop the run at the next agreed
  update boundary with a complete checkpoint, exit 143 / 130 / 138; a second signal exits at once
  (137). One process: the flag is a Python bool read after each update. Several: the ranks agree
  every train.log_every updates (and after each epoch end) through one all-reduce on a CPU gloo
  group, never a device read.
- A failed write (disk full, ...) is one line and exit 74 on every rank; the previous checkpoint
  stays intact. train.nonfinite=skip gives up (exit 3) once more than train.max_skipped_fraction
  of the last SKIP_WINDOW updates were skipped; pruning keeps the newest checkpoint saved with
  finite losses.

Exit codes: 0 done; 2 a refused input or start (one line); 3 non-finite loss; 74 a write failed;
130 / 138 / 143 stopped by SIGINT / SIGUSR1 / SIGTERM after saving; 137 a second signal.

Tests inject faults through `train(cfg, hooks=...)`: an object with `on_loss(step, loss) -> loss`
and `after_update(step)` (tests/hooked_train.py); production passes None and only checks for None.
"""
import argparse
import contextlib
import math
import os
import signal
import sys
import threading
import time

from common.startup import say_loading  # (standard library only)

say_loading("train.py")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from accelerate.utils import gather_object  # noqa: E402

import configs  # noqa: E402
import data as data_lib  # noqa: E402
from common import rundir  # noqa: E402
from common.errors import EXIT_NONFINITE, UserError  # noqa: E402
from common.io import write_json  # noqa: E402
from configs.overrides import parse_command_line  # noqa: E402
from training.checkpoint import files as ck  # noqa: E402
from training import resume_policy as rp  # noqa: E402
from common.cli import run_cli  # noqa: E402
from training.finetune import summary_fields  # noqa: E402
from training.logging import format_eval  # noqa: E402
from training.preemption import PreemptionGuard, gloo_reduce_max  # noqa: E402
from training.rng import capture_rng_state  # noqa: E402
from training.train_step import NonFiniteLoss, stop_if_nonfinite, train_step  # noqa: E402
from training.checkpoint.state import TrainerState  # noqa: E402
from training.run import setup  # noqa: E402
from evaluation.evaluate import evaluate  # noqa: E402

# Updates at the start of every session (compilation, autotuning, allocator warm-up) that are left
# out of img/s and the progress bar's rate and ETA; their time is reported as warmup_s.
WARMUP_UPDATES = 2


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Overrides: key.sub=value or --key.sub VALUE (value parsed as YAML), e.g. optim.lr=1e-3 "
               "head.name=sparsemax; "
               "python train.py --help-config lists every key",
    )
    parser.add_argument("--config", help="YAML config (may extend another with base:); a run's config.yaml works")
    parser.add_argument("--help-config", action="store_true",
                        help="print every config key with its type, default, range or choices and meaning (with "
                             "--config: that config resolved) and exit")
    parser.add_argument("--resume", default=None, metavar="auto|PATH",
                        help="'auto': newest valid checkpoint of the run directory (a fresh start only when the "
                             "directory holds no run); or a checkpoint path")
    parser.add_argument(rp.RESUME_FLAG, dest="resume_with_changes", action="store_true",
                        help="resume although the config differs from the checkpoint's (outside the keys that may "
                             "change freely); the changes apply from the checkpoint's step and are recorded")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over in a run directory that holds a run, deleting it (lists what it deletes)")
    args = parse_command_line(parser, argv, tool="python train.py")
    if args.config is None and not args.help_config:
        parser.error("the following arguments are required: --config")
    return args


def main(argv=None, hooks=None):
    args = parse_args(argv)
    if args.help_config:
        print(configs.config_help(args.config, args.overrides))
        return 0
    cfg = configs.load_config(args.config, args.overrides)
    return train(cfg, resume=args.resume, overwrite=args.overwrite, hooks=hooks,
                 accept_changes=args.resume_with_changes)


# ============================================================================ the loop
def train(cfg, resume=None, overwrite=False, hooks=None, accept_changes=False):
    """Run (or resume) the training described by `cfg`; returns the process exit status (see the
    module docstring). `accept_changes`: --resume-with-changes."""
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
            run.bar.close()
            run.accelerator.end_training()
            run.lock.release()
    finally:
        guard.uninstall()


def run_training(run, hooks=None):
    """The epochs left; -> exit status."""
    run.model.train()
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


def run_epoch(run, hooks=None):
    """The rest of the current epoch (all of it, or from a resumed batch), then its end.
    -> True when a signal stopped the run (a checkpoint of the stop step is saved)."""
    state, accum, epochs = run.state, run.cfg.train.grad_accum, run.cfg.optim.epochs
    epoch = state.epoch
    batches = iter(run.train_loader(epoch, state.batch))
    t0 = time.perf_counter()
    for _ in range(state.batch // accum, run.updates_per_epoch):
        with sync_debug(run):
            train_step(run, batches, hooks)
        if hooks is not None:
            hooks.after_update(state.step)
        end_warmup(run)
        log_step(run)
        state.train_time_s = run.elapsed()
        if state.batch // accum == run.updates_per_epoch:
            break  # the epoch's end saves its own checkpoint (and is where a signal is checked next)
        if state.step % run.cfg.train.save_every == 0:
            save_checkpoint(run, epoch, state.batch)
        if signalled(run):
            if run.saved_step != state.step:
                save_checkpoint(run, epoch, state.batch)
            run.guard.mark_saved()  # from here a further signal exits gracefully: the checkpoint is complete
            return True
    end_of_epoch(run, epoch, time.perf_counter() - t0)
    # after an epoch end every rank is here at the same step: agree now whatever the step (force_sync)
    return state.epoch < epochs and signalled(run, force_sync=True)


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


def preemption_reduce_max(accelerator):
    """None with one process; else a max-reduction of the stop flag over a CPU gloo group (a new
    one next to NCCL), so agreeing never waits for the device."""
    if accelerator.num_processes == 1:
        return None
    group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    return gloo_reduce_max(group)


def end_warmup(run):
    """After WARMUP_UPDATES updates of this session, restart the img/s window and the bar's rate clock."""
    run.session_updates += 1
    if run.session_updates != WARMUP_UPDATES:
        return
    run.accelerator.wait_for_everyone()
    if run.accelerator.device.type == "cuda":
        torch.cuda.synchronize()
    now = time.perf_counter()
    run.state.warmup_s += now - run.session_t0
    run.state.warmup_images += run.state.images - run.session_images
    run.log_t, run.log_images = now, run.state.images
    n = run.bar.n
    run.bar.reset(total=run.bar.total)  # tqdm's rate and ETA then count from here
    run.bar.initial = run.bar.n = run.bar.last_print_n = n


@contextlib.contextmanager
def sync_debug(run):
    """train.sync_debug: CUDA's sync debug mode set to "error" around one update (after warm-up)."""
    on = run.cfg.train.sync_debug and run.session_updates >= WARMUP_UPDATES
    if on:
        torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        if on:
            torch.cuda.set_sync_debug_mode("default")


def log_step(run):
    """Every train.log_every updates: a metrics.jsonl row (loss averaged over ranks), TensorBoard, the bar."""
    state, step = run.state, run.state.step
    if step % run.cfg.train.log_every == 0:
        stop_if_nonfinite(run)
        lr = run.optimizer.param_groups[0]["lr"]
        loss_t = run.last_loss.float().reshape(1)
        if run.world > 1:
            loss_t = run.accelerator.reduce(loss_t, reduction="mean")
        now = time.perf_counter()
        ips = (state.images - run.log_images) / max(now - run.log_t, 1e-9)
        run.log_t, run.log_images = now, state.images
        row = {"kind": "train", "step": step, "epoch": state.epoch + 1,
               "loss": loss_t.item(), "lr": lr, "img_per_s": ips, "skipped": state.skipped}
        run.metrics.write(**row)
        if run.trackers:
            run.accelerator.log({"train/loss": row["loss"], "train/lr": lr, "train/img_per_s": ips}, step=step)
        run.bar.set_postfix(loss=f"{row['loss']:.4f}", lr=f"{lr:.2e}", img_s=f"{ips:.0f}", refresh=False)
    run.bar.update(1)


def end_of_epoch(run, epoch, seconds):
    """epochs.csv row and console line (with an eval when due), exported weights, checkpoint."""
    state, epochs = run.state, run.cfg.optim.epochs
    stop_if_nonfinite(run)
    state.epoch, state.batch = epoch + 1, 0
    local_updates = run.epoch_loss[1].item()  # this session's part of the epoch: what `seconds` timed
    loss_sum, updates = epoch_loss_totals(run)
    run.epoch_loss.zero_()
    run.epoch_loss_carried = [0.0, 0.0]
    row = {"epoch": epoch + 1, "step": state.step,
           "train_loss": loss_sum / max(updates, 1.0),
           "lr": run.optimizer.param_groups[0]["lr"],
           "img_per_s": local_updates * run.global_batch / max(seconds, 1e-9),
           "time_s": seconds, "skipped": state.skipped}
    if state.epoch_note:
        row["changes"], state.epoch_note = state.epoch_note, ""
    line = (f"epoch {epoch + 1}/{epochs}  step {state.step}  loss {row['train_loss']:.4f}  "
            f"lr {row['lr']:.2e}  {row['img_per_s']:.0f} img/s")
    alphas = learned_alphas(run)  # head.learn_alpha: where it has moved to
    if alphas:
        row.update({f"{weights}_alpha": a for weights, a in alphas.items()})
        line += f"  α {alphas['raw']:.4f}" + (f" (ema {alphas['ema']:.4f})" if "ema" in alphas else "")
    evaluated = (epoch + 1) % run.cfg.train.eval_every == 0 or epoch + 1 == epochs
    if evaluated:
        line += evaluate_epoch(run, row)
    run.epochs_csv.write(row)
    run.say(line)
    state.train_time_s = run.elapsed()
    export_weights(run)
    save_checkpoint(run, epoch + 1, 0)
    if evaluated:
        stop_if_empty_eval(run)


def learned_alphas(run):
    """{"raw": α, "ema": α} of a head that learns α (the EMA weights average it too); {} otherwise."""
    models = {"raw": run.raw_model, **({"ema": run.ema.module} if run.ema is not None else {})}
    out = {weights: m.output_head.learned_alpha() for weights, m in models.items()}
    return {} if out["raw"] is None else out


def stop_if_empty_eval(run):
    """An evaluation that found no image (every val image skipped under data.skip_corrupt) stops the
    run, after its epoch's checkpoint, unless train.allow_empty_eval (identical on every rank: n is
    the total over ranks)."""
    if run.state.last_eval["raw"]["n"] or run.cfg.train.allow_empty_eval:
        return
    if not run.main_proc:
        raise SystemExit(2)  # the main process says why
    raise UserError(f"every validation image was skipped as undecodable (data.skip_corrupt): the evaluation at step "
                    f"{run.state.step} had no image; fix or replace the val files (later evaluations and eval.py use them) "
                    f"and continue with --resume auto, or set train.allow_empty_eval=true to train without validation")


def epoch_loss_totals(run):
    """The current epoch's [sum over its finite updates of the update's loss (the mean over ranks, as
    metrics.jsonl logs it), number of those updates]: world-independent units, so a checkpoint of N
    processes resumes exactly on M. One all-reduce with several processes (saves and epoch ends only)."""
    session = run.epoch_loss
    if run.world > 1:
        session = run.accelerator.reduce(session, reduction="sum")
    session = (session / run.world).tolist()  # every rank counted each update once: / world = once per update
    return [carried + now for carried, now in zip(run.epoch_loss_carried, session)]


def evaluate_epoch(run, row):
    """Evaluate the raw (and EMA) weights on the val split (float32, as eval.py: evaluation/evaluate.py);
    log them, track the best; -> console text."""
    state, text = run.state, ""
    evals = {"raw": evaluate(run.raw_model, run.val_loader, run.accelerator).totals}
    if run.ema is not None:
        evals["ema"] = evaluate(run.ema.module, run.val_loader, run.accelerator).totals
    for weights, m in evals.items():
        run.metrics.write(kind="eval", step=state.step, epoch=state.epoch, weights=weights, **m)
        row.update({f"{weights}_{k}": v for k, v in m.items()})
        text += f"  | {weights}: {format_eval(m)}"
        if run.trackers:
            run.accelerator.log({f"val_{weights}/{k}": v for k, v in m.items() if k != "n"}, step=state.step)
    state.last_eval = evals
    if not evals["raw"]["n"]:
        run.say(f"warning: the validation split had no decodable image at step {state.step} (every one skipped, "
                f"data.skip_corrupt): its metrics are null")
    elif state.best_top1 is None or evals["raw"]["top1"] > state.best_top1:
        state.best_top1, state.best_step = evals["raw"]["top1"], state.step
    return text


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
    if learned_alphas(run):
        summary["learned_alpha"] = learned_alphas(run)
    write_json(summary, os.path.join(run_dir, rundir.SUMMARY))
    raw_top1 = _percent(state.last_eval.get("raw", {}).get("top1", math.nan))
    ema_text = f", {_percent(state.last_eval['ema']['top1'])} (ema)" if "ema" in state.last_eval else ""
    run.say(f"done: {state.step} steps in {state.train_time_s:.1f}s; final val top1 {raw_top1} (raw)"
            f"{ema_text}; run dir {run_dir}")


def _percent(fraction):
    return "n/a" if fraction is None or math.isnan(fraction) else f"{100 * fraction:.2f}%"


# ============================================================================ checkpoints and weights
def on_every_rank(run, action):
    """Run `action` here; if it fails to write on ANY rank (CheckpointWriteError: disk full, ...),
    every rank raises that one-line error (exit 74), so none waits in a collective for one that gave
    up. One gather of a small object per call with several processes (saves only)."""
    error = None
    try:
        action()
    except ck.CheckpointWriteError as err:
        error = str(err)
    if run.world > 1:
        error = next((e for e in gather_object([error]) if e), None)
    if error:
        raise ck.CheckpointWriteError(error)


def save_checkpoint(run, epoch, batch):
    """Every rank writes its RNG states, the main process the rest; then one atomic rename. A write
    failure on any rank removes the temporary directory and raises CheckpointWriteError on every
    rank; the previous checkpoints are untouched."""
    accelerator, state = run.accelerator, run.state
    stop_if_nonfinite(run)  # never save the weights of a non-finite update
    root, step = os.path.join(run.run_dir, rundir.CHECKPOINTS), state.step
    tmp = ck.tmp_dir_for(root, step)
    # the epoch's partial loss sums, per update (not per rank): epochs.csv stays exact after a
    # mid-epoch resume on any number of processes
    loss_sum, updates = epoch_loss_totals(run)

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
                loss_finite=state.skipped == run.skipped_at_save)
            ck.write_main_files(
                tmp,
                model_state=run.raw_model.state_dict(),
                ema_state=run.ema.module.state_dict() if run.ema is not None else None,
                optimizer_state=run.optimizer.state_dict(),
                scheduler_state=run.scheduler.state_dict(),
                scaler_state=accelerator.scaler.state_dict() if accelerator.scaler is not None else None,
                trainer_state=trainer_state,
            )

    def commit():
        if run.main_proc:
            state.last_ckpt = ck.commit_save(root, step)
            ck.prune(root, run.cfg.train.keep_last, keep_steps=[state.best_step], protect_last_finite=True,
                     warn=run.say)

    try:
        on_every_rank(run, lambda: run.main_proc and ck.begin_save(root, step))
        on_every_rank(run, write_files)
        on_every_rank(run, commit)
    except ck.CheckpointWriteError:
        if run.main_proc:
            ck.abort_save(tmp)
        raise
    run.saved_step, run.skipped_at_save = step, state.skipped


def export_weights(run):
    """Every rank: the main process writes the weights; a write failure raises on every rank."""
    on_every_rank(run, lambda: run.main_proc and write_weights(run))


def write_weights(run):
    """Main process: model.safetensors (and model_ema.safetensors), atomically."""
    ck.save_weights(run.raw_model.state_dict(), os.path.join(run.run_dir, rundir.WEIGHTS))
    if run.ema is not None:
        ck.save_weights(run.ema.module.state_dict(), os.path.join(run.run_dir, rundir.EMA_WEIGHTS))


if __name__ == "__main__":
    run_cli(main)
