"""Train a ResMLP classifier with a swappable output head (softmax / sparsemax / entmax).

    python train.py --config configs/quickstart.yaml [key.sub=value ...] [--resume auto|PATH] [--overwrite]
    accelerate launch --multi_gpu --num_processes 8 train.py --config configs/imagenet/resmlp_s12.yaml
    accelerate launch --num_machines 2 --machine_rank R --main_process_ip HOST ... train.py ...

Accelerate owns devices, distribution (DDP), mixed precision (train.mixed_precision: no | bf16 |
fp16) and gradient accumulation (train.grad_accum). The run directory (train.output_dir) gets
config.yaml, metrics.jsonl, epochs.csv, model.safetensors, model_ema.safetensors, summary.json,
checkpoints/ and TensorBoard logs (see engine/checkpoint.py).

The loop reads top to bottom: `setup` builds the run (accelerator, run dir, data, model, optimizer,
schedule, EMA, resume), `train_step` does one optimizer update, `end_of_epoch` evaluates, exports
the weights and checkpoints, `write_summary` closes the run.

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

Tests inject faults through `train(cfg, hooks=...)`: an object with `on_loss(step, loss) -> loss`
and `after_update(step)` (tests/hooked_train.py); production passes None and only checks for None.
"""
import argparse
import contextlib
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Optional

ROOT = os.path.dirname(os.path.abspath(__file__))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from timm.utils import ModelEmaV3  # noqa: E402
from tqdm import tqdm  # noqa: E402

import configs  # noqa: E402
import data as data_lib  # noqa: E402
from common.errors import UserError  # noqa: E402
from data.samplers import num_train_batches  # noqa: E402
from engine import checkpoint as ck  # noqa: E402
from engine.cli import run_cli  # noqa: E402
from engine.logging import EpochCSV, MetricsLog, console, format_eval, tensorboard_available  # noqa: E402
from engine.optim import build_optimizer, build_scheduler  # noqa: E402
from engine.rng import capture_rng_state, reseed, restore_rng_state  # noqa: E402
from evaluation.evaluate import evaluate  # noqa: E402
from models import create_classifier  # noqa: E402

EXIT_NONFINITE = 3
# Updates at the start of every session (compilation, autotuning, allocator warm-up) that are left
# out of img/s and the progress bar's rate and ETA; their time is reported as warmup_s.
WARMUP_UPDATES = 2
RUN_FILES = ("metrics.jsonl", "epochs.csv", "summary.json", "model.safetensors", "model_ema.safetensors")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Overrides: key.sub=value (value parsed as YAML), e.g. optim.lr=1e-3 head.name=sparsemax",
    )
    parser.add_argument("--config", required=True, help="YAML config (may extend another with base:)")
    parser.add_argument("--resume", default=None, metavar="auto|PATH",
                        help="'auto': latest valid checkpoint of the run directory (fresh start if none); or a checkpoint path")
    parser.add_argument("--overwrite", action="store_true", help="start over in a run directory that has checkpoints")
    args, rest = parser.parse_known_args(argv)
    bad = [r for r in rest if "=" not in r]
    if bad:
        raise UserError(f"unexpected argument '{bad[0]}': overrides look like key.sub=value, options are --config/--resume/--overwrite")
    args.overrides = rest
    return args


def main(argv=None, hooks=None):
    args = parse_args(argv)
    cfg = configs.load_config(args.config, args.overrides)
    return train(cfg, resume=args.resume, overwrite=args.overwrite, hooks=hooks)


def fingerprint(cfg, num_classes):
    """What a checkpoint must share with the config to be resumable."""
    return {
        "model.name": cfg.model.name, "model.norm": cfg.model.norm, "model.img_size": cfg.model.img_size,
        "head.name": cfg.head.name, "head.alpha": cfg.head.alpha, "head.learn_alpha": cfg.head.learn_alpha,
        "num_classes": num_classes,
    }


class NonFiniteLoss(Exception):
    """A non-finite loss under train.nonfinite=stop; the message names the step and the last checkpoint."""


@dataclass
class RunState:
    """The counters a checkpoint saves (trainer_state.json) and a resume restores."""
    step: int = 0  # optimizer updates done
    epoch: int = 0  # epochs done
    batch: int = 0  # micro-batches done in the current epoch
    best_top1: Optional[float] = None
    best_step: Optional[int] = None
    skipped: int = 0  # updates skipped for a non-finite loss
    train_time_s: float = 0.0
    images: int = 0
    warmup_s: float = 0.0  # session warm-up time (see WARMUP_UPDATES), excluded from img/s
    warmup_images: int = 0
    last_eval: dict = field(default_factory=dict)
    last_ckpt: Optional[str] = None  # not saved: where this session's last checkpoint went


@dataclass
class Run:
    """Everything one training run holds; built once by `setup`."""
    cfg: Any
    accelerator: Any
    use_tb: bool
    fingerprint: dict
    global_batch: int
    updates_per_epoch: int
    train_set: Any
    val_loader: Any
    mixup: Any
    label_smoothing: float
    raw_model: Any  # the classifier itself: checkpoints, EMA and the head's loss use it
    model: Any  # what runs forward/backward: raw_model wrapped by Accelerate (DDP)
    forward_loss: Any  # (images, targets) -> fp32 loss: model + head's loss, compiled when train.compile is on
    optimizer: Any
    scheduler: Any
    ema: Any
    metrics: MetricsLog
    epochs_csv: EpochCSV
    state: RunState = field(default_factory=RunState)
    bar: Any = None
    session_t0: float = field(default_factory=time.perf_counter)
    time_base: float = 0.0  # train_time_s of earlier sessions (resume)
    log_t: float = field(default_factory=time.perf_counter)  # throughput window start
    log_images: int = 0
    session_updates: int = 0
    session_images: int = 0  # state.images when this session started
    # On the device, read only at log steps / saves / epoch ends (see the module docstring):
    last_loss: Any = None  # mean loss of the latest update
    epoch_loss: Any = None  # [sum of finite update losses, number of finite updates] this epoch
    first_bad_step: Any = None  # first update with a non-finite loss (NO_BAD_STEP when none)

    @property
    def main_proc(self):
        return self.accelerator.is_main_process

    @property
    def rank(self):
        return self.accelerator.process_index

    @property
    def world(self):
        return self.accelerator.num_processes

    @property
    def run_dir(self):
        return self.cfg.train.output_dir

    def say(self, msg):
        console(msg, self.main_proc)

    def elapsed(self):
        return self.time_base + time.perf_counter() - self.session_t0

    def train_loader(self, epoch, start_batch):
        reseed(self.cfg.train.seed, "loader", epoch, self.rank)
        return data_lib.build_train_loader(self.train_set, self.cfg.data, seed=self.cfg.train.seed, epoch=epoch,
                                           rank=self.rank, world_size=self.world, start_batch=start_batch,
                                           device=self.accelerator.device)


# ============================================================================ the loop
def train(cfg, resume=None, overwrite=False, hooks=None):
    """Run (or resume) the training described by `cfg`; returns the process exit status."""
    run = setup(cfg, resume, overwrite)
    run.model.train()
    try:
        while run.state.epoch < cfg.optim.epochs:
            run_epoch(run, hooks)
    except NonFiniteLoss as stop:
        run.bar.close()
        if run.main_proc:
            print(f"error: {stop}", file=sys.stderr, flush=True)
        run.accelerator.end_training()
        return EXIT_NONFINITE
    run.bar.close()
    if run.main_proc:
        write_summary(run)
    run.accelerator.end_training()
    return 0


def run_epoch(run, hooks=None):
    """The rest of the current epoch (all of it, or from a resumed batch), then its end."""
    state, accum = run.state, run.cfg.train.grad_accum
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
        if state.step % run.cfg.train.save_every == 0 and state.batch // accum < run.updates_per_epoch:
            save_checkpoint(run, epoch, state.batch)  # mid-epoch; the epoch's end saves its own
    end_of_epoch(run, epoch, time.perf_counter() - t0)


def train_step(run, batches, hooks=None):
    """One optimizer update over train.grad_accum micro-batches, with no host read (but under
    train.nonfinite=skip, see the module docstring): the loss and its finiteness stay on the device."""
    cfg, state, accelerator = run.cfg, run.state, run.accelerator
    accum, step = cfg.train.grad_accum, state.step
    run.scheduler.step_update(step)  # lr of this update: warmup + cosine indexed by update
    losses = []
    for micro in range(accum):
        reseed(cfg.train.seed, "step", step, micro, run.rank)
        images, targets = next(batches)
        if run.mixup is not None:
            images, targets = run.mixup(images, targets)
        with accelerator.accumulate(run.model):
            loss = run.forward_loss(images, targets)
            if hooks is not None:
                loss = hooks.on_loss(step, loss)
            losses.append(loss.detach())
            accelerator.backward(loss)  # on every rank, finite or not: DDP's all-reduce needs them all
            if accelerator.sync_gradients:
                loss = torch.stack(losses).mean()
                finite = torch.isfinite(loss)
                if cfg.train.nonfinite == "skip" and not finite_on_every_rank(run, finite):  # the one host read
                    run.optimizer.zero_grad(set_to_none=True)
                    state.skipped += 1
                    if run.main_proc:
                        console(f"warning: non-finite loss at step {step}: update skipped ({state.skipped} so far)")
                else:
                    if cfg.optim.clip_grad:
                        accelerator.clip_grad_norm_(run.model.parameters(), cfg.optim.clip_grad)
                    run.optimizer.step()
                    run.optimizer.zero_grad(set_to_none=True)
                    if run.ema is not None:
                        run.ema.update(run.raw_model, step=step + 1)
    run.last_loss = loss
    run.epoch_loss += torch.stack([torch.where(finite, loss, 0.0).double(), finite.double()])
    run.first_bad_step = torch.where(finite | (run.first_bad_step != NO_BAD_STEP), run.first_bad_step, step)
    state.step += 1
    state.batch += accum
    state.images += run.global_batch


NO_BAD_STEP = -1


def finite_on_every_rank(run, finite):
    """Whether the loss is finite on every rank (all ranks must take the same branch)."""
    ok = finite.float().reshape(1)
    if run.world > 1:
        ok = run.accelerator.reduce(ok, reduction="sum") / run.world
    return bool(ok.item() == 1.0)


def stop_if_nonfinite(run):
    """Under train.nonfinite=stop, raise NonFiniteLoss if any update since the start of the session
    had a non-finite loss on any rank. Reads the device: call at log steps, saves and epoch ends only."""
    if run.cfg.train.nonfinite != "stop":
        return
    bad = run.first_bad_step.reshape(1)
    if run.world > 1:
        bad = run.accelerator.gather(bad)
    bad = [b for b in bad.tolist() if b != NO_BAD_STEP]
    if bad:
        kept = run.state.last_ckpt or "none yet"
        raise NonFiniteLoss(
            f"non-finite loss at step {min(bad)} (found at step {run.state.step}, the next check); training "
            f"stopped and nothing after step {min(bad)} was saved. Last checkpoint: {kept}. Lower optim.lr, "
            f"set optim.clip_grad, or set train.nonfinite=skip")


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
        if run.use_tb:
            run.accelerator.log({"train/loss": row["loss"], "train/lr": lr, "train/img_per_s": ips}, step=step)
        run.bar.set_postfix(loss=f"{row['loss']:.4f}", lr=f"{lr:.2e}", img_s=f"{ips:.0f}", refresh=False)
    run.bar.update(1)


def end_of_epoch(run, epoch, seconds):
    """epochs.csv row and console line (with an eval when due), exported weights, checkpoint."""
    state, epochs = run.state, run.cfg.optim.epochs
    stop_if_nonfinite(run)
    state.epoch, state.batch = epoch + 1, 0
    local_updates = run.epoch_loss[1].item()
    loss_stats = run.epoch_loss
    if run.world > 1:
        loss_stats = run.accelerator.reduce(loss_stats, reduction="sum")
    loss_sum, updates = loss_stats.tolist()
    run.epoch_loss.zero_()
    row = {"epoch": epoch + 1, "step": state.step,
           "train_loss": loss_sum / max(updates, 1.0),
           "lr": run.optimizer.param_groups[0]["lr"],
           "img_per_s": local_updates * run.global_batch / max(seconds, 1e-9),
           "time_s": seconds, "skipped": state.skipped}
    line = (f"epoch {epoch + 1}/{epochs}  step {state.step}  loss {row['train_loss']:.4f}  "
            f"lr {row['lr']:.2e}  {row['img_per_s']:.0f} img/s")
    if (epoch + 1) % run.cfg.train.eval_every == 0 or epoch + 1 == epochs:
        line += evaluate_epoch(run, row)
    run.epochs_csv.write(row)
    run.say(line)
    state.train_time_s = run.elapsed()
    export_weights(run)
    save_checkpoint(run, epoch + 1, 0)


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
        if run.use_tb:
            run.accelerator.log({f"val_{weights}/{k}": v for k, v in m.items() if k != "n"}, step=state.step)
    state.last_eval = evals
    if state.best_top1 is None or evals["raw"]["top1"] > state.best_top1:
        state.best_top1, state.best_step = evals["raw"]["top1"], state.step
    return text


def write_summary(run):
    """Main process: summary.json and the closing console line."""
    state, run_dir = run.state, run.run_dir
    if not os.path.exists(os.path.join(run_dir, "model.safetensors")):
        export_weights(run)
    summary = {
        "final": state.last_eval,
        "train_time_s": state.train_time_s,
        # without the warm-up updates of each session (compilation): the throughput a user plans with
        "img_per_s": (state.images - state.warmup_images) / max(state.train_time_s - state.warmup_s, 1e-9),
        "warmup_s": state.warmup_s,
        "epochs": run.cfg.optim.epochs, "steps": state.step, "skipped_steps": state.skipped,
        "best": {"top1": state.best_top1, "step": state.best_step},
        "global_batch": run.global_batch, "num_processes": run.world,
    }
    ck.write_json(summary, os.path.join(run_dir, "summary.json"))
    raw_top1 = 100 * state.last_eval.get("raw", {}).get("top1", math.nan)
    ema_text = f", {100 * state.last_eval['ema']['top1']:.2f}% (ema)" if "ema" in state.last_eval else ""
    run.say(f"done: {state.step} steps in {state.train_time_s:.1f}s; final val top1 {raw_top1:.2f}% (raw)"
            f"{ema_text}; run dir {run_dir}")


# ============================================================================ checkpoints and weights
def save_checkpoint(run, epoch, batch):
    """Every rank writes its RNG states, the main process the rest; then one atomic rename."""
    accelerator, state = run.accelerator, run.state
    stop_if_nonfinite(run)  # never save the weights of a non-finite update
    root, step = os.path.join(run.run_dir, ck.CHECKPOINT_SUBDIR), state.step
    if run.main_proc:
        ck.begin_save(root, step)
    accelerator.wait_for_everyone()
    ck.write_rank_files(ck.tmp_dir_for(root, step), run.rank, capture_rng_state())
    if run.main_proc:
        trainer_state = asdict(state)
        del trainer_state["last_ckpt"]
        trainer_state.update(epoch=epoch, batch=batch, fingerprint=run.fingerprint, global_batch=run.global_batch,
                             world_size=run.world, config_name=run.cfg.name)
        ck.write_main_files(
            ck.tmp_dir_for(root, step),
            model_state=run.raw_model.state_dict(),
            ema_state=run.ema.module.state_dict() if run.ema is not None else None,
            optimizer_state=run.optimizer.state_dict(),
            scheduler_state=run.scheduler.state_dict(),
            scaler_state=accelerator.scaler.state_dict() if accelerator.scaler is not None else None,
            trainer_state=trainer_state,
        )
    accelerator.wait_for_everyone()
    if run.main_proc:
        state.last_ckpt = ck.commit_save(root, step)
        ck.prune(root, run.cfg.train.keep_last, keep_steps=[state.best_step])
    accelerator.wait_for_everyone()


def export_weights(run):
    if run.main_proc:
        ck.save_weights(run.raw_model.state_dict(), os.path.join(run.run_dir, "model.safetensors"))
        if run.ema is not None:
            ck.save_weights(run.ema.module.state_dict(), os.path.join(run.run_dir, "model_ema.safetensors"))


def restore(run, ckpt):
    """Load weights, EMA, optimizer, schedule, scaler, RNG states and counters from a checkpoint."""
    saved = ck.read_trainer_state(ckpt)
    ck.load_state_dict_strict(run.raw_model, ck.load_weights(os.path.join(ckpt, "model.safetensors")), ckpt)
    if run.ema is not None and os.path.isfile(os.path.join(ckpt, "ema.safetensors")):
        ck.load_state_dict_strict(run.ema.module, ck.load_weights(os.path.join(ckpt, "ema.safetensors")), ckpt)
    run.optimizer.load_state_dict(ck.load_torch(os.path.join(ckpt, "optimizer.pt")))
    run.scheduler.load_state_dict(ck.load_torch(os.path.join(ckpt, "scheduler.pt")))
    scaler_state = ck.load_torch(os.path.join(ckpt, "scaler.pt"))
    if scaler_state is not None and run.accelerator.scaler is not None:
        run.accelerator.scaler.load_state_dict(scaler_state)
    rng_state = ck.load_rng(ckpt, run.rank)
    if rng_state is not None:
        restore_rng_state(rng_state)
    for f in fields(RunState):
        if f.name in saved:
            setattr(run.state, f.name, saved[f.name])
    run.state.last_ckpt = ckpt
    run.metrics.truncate_after(run.state.step)  # rows after the checkpoint are re-logged exactly once
    run.epochs_csv.truncate_after(run.state.step)
    run.say(f"resumed from {ckpt} (step {run.state.step}, epoch {run.state.epoch + 1}, batch {run.state.batch})")


# ============================================================================ setup
def setup(cfg, resume, overwrite):
    """Accelerator, run directory, data, model/optimizer/schedule/EMA, and the resumed state."""
    # A guard, not a measured fix: arithmetic on denormal floats is slow on CPUs, and flushing them
    # to zero costs nothing (a census of one training step per head found none; the sparse-head
    # slowdowns first blamed on them came from other jobs sharing the cores). Deterministic either way.
    torch.set_flush_denormal(True)
    accelerator, use_tb = build_accelerator(cfg)
    world, device, main_proc = accelerator.num_processes, accelerator.device, accelerator.is_main_process
    global_batch = cfg.data.batch_size * world * cfg.train.grad_accum
    num_classes = data_lib.num_classes(cfg.data)
    fp = fingerprint(cfg, num_classes)
    ckpt = prepare_run_dir(cfg, resume, overwrite, accelerator, fp, global_batch)

    with accelerator.main_process_first():  # downloads / dataset caches are written once
        train_set = data_lib.build_dataset(cfg.data, "train")
        val_set = data_lib.build_dataset(cfg.data, "val")
    val_loader = data_lib.build_eval_loader(val_set, cfg.data, rank=accelerator.process_index, world_size=world,
                                            device=device)
    mixup = data_lib.build_mixup(cfg.data, num_classes)
    updates_per_epoch = count_updates_per_epoch(cfg, len(train_set), world)

    reseed(cfg.train.seed, "init")
    raw_model = create_classifier(cfg.model, cfg.head, num_classes)
    optimizer = build_optimizer(raw_model, cfg.optim, global_batch)
    scheduler = build_scheduler(optimizer, cfg.optim, updates_per_epoch)  # stepped by us per update
    model, optimizer = accelerator.prepare(raw_model, optimizer)
    label_smoothing = 0.0 if mixup is not None else cfg.data.label_smoothing
    run = Run(
        cfg=cfg, accelerator=accelerator, use_tb=use_tb, fingerprint=fp, global_batch=global_batch,
        updates_per_epoch=updates_per_epoch, train_set=train_set, val_loader=val_loader, mixup=mixup,
        # Mixup/CutMix already fold label smoothing into their soft targets: never apply it twice.
        label_smoothing=label_smoothing, raw_model=raw_model, model=model,
        forward_loss=build_forward_loss(cfg, model, raw_model.output_head, label_smoothing, device),
        optimizer=optimizer, scheduler=scheduler,
        ema=ModelEmaV3(raw_model, decay=cfg.train.ema_decay) if cfg.train.ema else None,
        metrics=MetricsLog(cfg.train.output_dir, enabled=main_proc),
        epochs_csv=EpochCSV(cfg.train.output_dir, enabled=main_proc),
    )
    if ckpt is not None:
        restore(run, ckpt)
    if use_tb:
        accelerator.init_trackers("tensorboard")
    run.time_base, run.log_images = run.state.train_time_s, run.state.images
    run.session_images = run.state.images
    run.first_bad_step = torch.tensor(NO_BAD_STEP, device=device)
    run.epoch_loss = torch.zeros(2, dtype=torch.float64, device=device)
    run.session_t0 = run.log_t = time.perf_counter()
    run.bar = tqdm(total=cfg.optim.epochs * updates_per_epoch, initial=run.state.step, unit="step",
                   disable=not (main_proc and cfg.train.progress), dynamic_ncols=True, file=sys.stdout)
    return run


def build_forward_loss(cfg, model, head, label_smoothing, device):
    """(images, targets) -> the head's fp32 loss on the model's logits; with train.compile on (auto:
    CUDA only), torch.compile'd as one function, so the head's loss fuses with the model's last layers."""
    def forward_loss(images, targets):
        return head.loss(model(images).float(), targets, label_smoothing=label_smoothing)

    compile_on = cfg.train.compile == "true" or (cfg.train.compile == "auto" and device.type == "cuda")
    return torch.compile(forward_loss) if compile_on else forward_loss


def count_updates_per_epoch(cfg, num_samples, world):
    """Optimizer updates per epoch, from the sampler's arithmetic (no loader is built)."""
    batches = num_train_batches(num_samples, world_size=world, batch_size=cfg.data.batch_size,
                                repeated_aug=cfg.data.repeated_aug, num_repeats=cfg.data.repeated_aug_repeats)
    if batches < cfg.train.grad_accum:
        raise UserError(f"the training split has {num_samples} samples, {batches} batches of data.batch_size="
                        f"{cfg.data.batch_size} per process ({world} process(es)) per epoch, fewer than "
                        f"train.grad_accum={cfg.train.grad_accum}: lower data.batch_size or train.grad_accum")
    return batches // cfg.train.grad_accum


def build_accelerator(cfg):
    if cfg.train.mixed_precision == "fp16" and not torch.cuda.is_available():
        raise UserError("train.mixed_precision=fp16 needs a CUDA GPU; use bf16 (or no) on CPU")
    if cfg.train.sync_debug and not torch.cuda.is_available():
        raise UserError("train.sync_debug=true needs a CUDA GPU (it sets CUDA's sync debug mode); on CPU the "
                        "test suite checks the step for host syncs (tests/test_train_no_sync.py)")
    if cfg.train.sync_debug and cfg.train.nonfinite == "skip":
        raise UserError("train.sync_debug=true cannot be combined with train.nonfinite=skip, which reads one flag "
                        "per update by design; use train.nonfinite=stop")
    use_tb = cfg.train.tensorboard and tensorboard_available()
    # Accelerate only sets up gloo multi-process training on CPU when asked for the CPU explicitly.
    cpu_multi_process = not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1
    accelerator = Accelerator(
        cpu=cpu_multi_process,
        mixed_precision=cfg.train.mixed_precision,
        gradient_accumulation_steps=cfg.train.grad_accum,
        log_with="tensorboard" if use_tb else None,
        project_dir=cfg.train.output_dir,
    )
    return accelerator, use_tb


def prepare_run_dir(cfg, resume, overwrite, accelerator, fp, global_batch):
    """Resolve the checkpoint to resume from and check it fits this config (before anything in the
    run dir is touched); on a fresh start, clear (or refuse to clear) the run dir."""
    run_dir = cfg.train.output_dir
    ckpt = ck.resolve_resume(resume, run_dir, warn=lambda msg: console(msg, accelerator.is_main_process))
    if ckpt is not None:
        saved = ck.read_trainer_state(ckpt)
        ck.check_fingerprint(saved.get("fingerprint", {}), fp, ckpt)
        if saved.get("global_batch") != global_batch:
            raise UserError(f"checkpoint {ckpt} was trained with a global batch of {saved.get('global_batch')}, this "
                            f"launch has {global_batch} (batch_size x processes x grad_accum); keep it equal to resume")
    else:
        existing = ck.list_checkpoints(os.path.join(run_dir, ck.CHECKPOINT_SUBDIR))
        if existing and resume is None and not overwrite:
            raise UserError(f"{run_dir} already holds checkpoints: pass --resume auto to continue that run, "
                            f"--overwrite to start over, or set train.output_dir")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        os.makedirs(run_dir, exist_ok=True)
        if ckpt is None:
            shutil.rmtree(os.path.join(run_dir, ck.CHECKPOINT_SUBDIR), ignore_errors=True)
            for name in RUN_FILES:
                if os.path.exists(os.path.join(run_dir, name)):
                    os.remove(os.path.join(run_dir, name))
        configs.save_config(cfg, os.path.join(run_dir, "config.yaml"))
    accelerator.wait_for_everyone()
    return ckpt


if __name__ == "__main__":
    run_cli(main)
