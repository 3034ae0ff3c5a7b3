"""A training run's state (`Run`) and how it is built: `setup` makes the accelerator, locks and
prepares the run directory (training/run_start.py), builds data, model, optimizer, schedule and EMA,
and `restore`s a checkpoint's state when resuming. train.py runs the loop over what it returns.

Exact resume: the training loader is NOT passed through `accelerator.prepare` (its re-sharding
replays the wrong samples mid-epoch); `data.build_train_loader` is already deterministic per
(seed, epoch, position) and sharded per rank, and restarts at any batch (`Run.train_loader`).
"""
import os
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration
from timm.utils import ModelEmaV3

import configs
import data as data_lib
from common import rundir
from common.errors import UserError
from common.weights import load_into, read_safetensors
from data.samplers import num_train_batches
from training.checkpoint import files as ck
from training import resume_policy as rp
from training import trackers
from training.distill import build_distiller, teacher_line
from training.feature_probe import build_feature_probe, resolve_features
from training.finetune import load_pretrained_weights, resolve_pretrained
from training.freeze import apply_freeze, freeze_line
from training.launch import launch_lines
from training.logging import EpochCSV, MetricsLog, console, progress_bar
from training.optim import build_optimizer, build_scheduler
from training.rng import reseed, restore_rng_state
from training.run_sources import check_sources_outside_run
from training.run_start import prepare_run_dir
from common.runlock import RunLock
from training.train_step import NO_BAD_STEP
from training.checkpoint.state import Counters
from models import create_classifier


@dataclass
class RunState(Counters):
    """The run's counters: those a checkpoint saves and a resume restores (training/checkpoint/state.py),
    and where this session's last checkpoint went (not saved)."""
    last_ckpt: Optional[str] = None


@dataclass
class Run:
    """Everything one training run holds; built once by `setup`."""
    cfg: Any
    accelerator: Any
    trackers: list  # train.log_with resolved: the Accelerate trackers logged to (training/trackers.py)
    fingerprint: dict  # training.resume_policy.resume_fingerprint: the whole resolved config
    global_batch: int
    updates_per_epoch: int
    train_set: Any
    val_loader: Any
    mixup: Any
    label_smoothing: float
    raw_model: Any  # the classifier itself: checkpoints, EMA and the head's loss use it
    model: Any  # what runs forward/backward: raw_model wrapped by Accelerate (DDP)
    forward_loss: Any  # (images, targets) -> fp32 loss: model + head's loss, compiled when train.compile is on
    distiller: Any  # training.distill.Distiller (its teacher) under train.distill, else None
    optimizer: Any
    scheduler: Any
    ema: Any
    metrics: MetricsLog
    epochs_csv: EpochCSV
    state: RunState = field(default_factory=RunState)
    lock: Any = None  # common.runlock.RunLock (held by the main process)
    guard: Any = None  # training.preemption.PreemptionGuard (None: no signal handling, e.g. in tests)
    reduce_max: Any = None  # the guard's cross-rank agreement (None with one process)
    saved_step: int = -1  # step of this session's newest checkpoint (every rank)
    skipped_at_save: int = 0  # state.skipped when that checkpoint was saved (its loss_finite)
    bar: Any = None
    session_t0: float = field(default_factory=time.perf_counter)
    time_base: float = 0.0  # train_time_s of earlier sessions (resume)
    log_t: float = field(default_factory=time.perf_counter)  # throughput window start
    log_images: int = 0
    session_updates: int = 0
    session_images: int = 0  # state.images when this session started
    # On the device, read only at log steps / saves / epoch ends (training/train_step.py's docstring):
    last_loss: Any = None  # mean loss of the latest update
    epoch_loss: Any = None  # this rank, this session: [sum of its finite update losses, number of them] this epoch
    # the epoch's part before this session (from the checkpoint), in world-independent units:
    # [sum over updates of the update's loss (mean over ranks), number of updates]; see epoch_loss_totals
    epoch_loss_carried: list = field(default_factory=lambda: [0.0, 0.0])
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


def setup(cfg, resume, overwrite, accept_changes=False):
    """Accelerator, run directory (locked), data, model/optimizer/schedule/EMA, and the resumed
    state. The main process holds the run lock from here on (`run.lock`; released by train.py's
    `train`, or here when setup fails)."""
    # A guard, not a measured fix: arithmetic on denormal floats is slow on CPUs, and flushing them
    # to zero costs nothing (a census of one training step per head found none; the sparse-head
    # slowdowns first blamed on them came from other jobs sharing the cores). Deterministic either way.
    torch.set_flush_denormal(True)
    check_sources_outside_run(cfg)  # a run never reads from (or could delete) its own directory: before it is touched
    accelerator, tracker_names = build_accelerator(cfg)
    main_proc = accelerator.is_main_process
    lock = RunLock(cfg.train.output_dir, purpose="training", enabled=main_proc,
                   warn=lambda msg: console(msg, main_proc))
    try:
        return build_run(cfg, resume, overwrite, accept_changes, accelerator, tracker_names, lock)
    except BaseException:
        lock.release()
        raise


def build_run(cfg, resume, overwrite, accept_changes, accelerator, tracker_names, lock):
    world, device, main_proc = accelerator.num_processes, accelerator.device, accelerator.is_main_process
    global_batch = cfg.data.batch_size * world * cfg.train.grad_accum
    num_classes = data_lib.num_classes(cfg.data)
    # model.pretrained / train.teacher: their files' sha256 (and the weights' image size) enter the config first
    pretrained = resolve_pretrained(cfg, lambda msg: console(msg, main_proc))
    features = resolve_features(cfg, lambda msg: console(msg, main_proc))  # data.dataset=features: its source's model keys
    distiller = build_distiller(cfg, num_classes, accelerator)
    fp = rp.resume_fingerprint(cfg, num_classes=num_classes, global_batch=global_batch)
    ckpt, saved, changes = prepare_run_dir(cfg, resume, overwrite, accept_changes, accelerator, lock, fp)
    backend, backend_why = data_lib.explain_backend(cfg.data, device)
    for line in launch_lines(num_processes=world, device=device, configured_precision=cfg.train.mixed_precision,
                             used_precision=accelerator.mixed_precision, backend=backend, backend_why=backend_why,
                             threads=torch.get_num_threads()):
        console(line, main_proc)

    with accelerator.main_process_first():  # downloads / dataset caches are written once
        train_set = data_lib.build_dataset(cfg.data, "train")
        val_set = data_lib.build_dataset(cfg.data, cfg.train.eval_split)  # tune: compare_heads --tune's trials
    val_loader = data_lib.build_eval_loader(val_set, cfg.data, rank=accelerator.process_index, world_size=world,
                                            device=device)
    mixup = data_lib.build_mixup(cfg.data, num_classes)
    updates_per_epoch = count_updates_per_epoch(cfg, len(train_set), world)

    reseed(cfg.train.seed, "init")
    if features is not None:  # a linear probe on cached features, initialised as the image path's classifier
        raw_model = build_feature_probe(cfg, num_classes, features, lambda msg: console(msg, main_proc))
    else:
        raw_model = create_classifier(cfg.model, cfg.head, num_classes, img_size=cfg.data.image_size)
    if pretrained is not None:
        load_pretrained_weights(raw_model, pretrained, lambda msg: console(msg, main_proc))
    apply_freeze(raw_model, cfg.model.freeze)  # model.freeze=backbone: a linear probe
    for line in (freeze_line(raw_model, cfg.model.freeze), distiller and teacher_line(cfg, distiller)):
        if line:
            console(line, main_proc)
    optimizer = build_optimizer(raw_model, cfg.optim, global_batch)
    fresh_hparams = rp.optimizer_hparams(optimizer)  # this config's settings, before a checkpoint's replace them
    scheduler = build_scheduler(optimizer, cfg.optim, updates_per_epoch)  # stepped by us per update
    model, optimizer = accelerator.prepare(raw_model, optimizer)
    label_smoothing = 0.0 if mixup is not None else cfg.data.label_smoothing
    run = Run(
        cfg=cfg, accelerator=accelerator, trackers=tracker_names, fingerprint=fp, global_batch=global_batch,
        updates_per_epoch=updates_per_epoch, train_set=train_set, val_loader=val_loader, mixup=mixup,
        # Mixup/CutMix already fold label smoothing into their soft targets: never apply it twice.
        label_smoothing=label_smoothing, raw_model=raw_model, model=model,
        forward_loss=build_forward_loss(cfg, model, raw_model.output_head, label_smoothing, device, distiller),
        distiller=distiller,
        optimizer=optimizer, scheduler=scheduler,
        ema=ModelEmaV3(raw_model, decay=cfg.train.ema_decay) if cfg.train.ema else None,
        metrics=MetricsLog(cfg.train.output_dir, enabled=main_proc),
        epochs_csv=EpochCSV(cfg.train.output_dir, enabled=main_proc),
        lock=lock,
    )
    run.first_bad_step = torch.tensor(NO_BAD_STEP, device=device)
    run.epoch_loss = torch.zeros(2, dtype=torch.float64, device=device)
    if ckpt is not None:
        restore(run, ckpt, saved, changes, fresh_hparams)
    trackers.start(accelerator, tracker_names, cfg, trackers.flat_params(configs.config_to_dict(cfg)),
                   resuming=ckpt is not None)
    run.time_base, run.log_images = run.state.train_time_s, run.state.images
    run.session_images = run.state.images
    run.session_t0 = run.log_t = time.perf_counter()
    run.bar = progress_bar(cfg.optim.epochs * updates_per_epoch - run.state.schedule_offset, initial=run.state.step,
                           enabled=main_proc and cfg.train.progress)
    return run


def build_forward_loss(cfg, model, head, label_smoothing, device, distiller=None):
    """(images, targets) -> the head's fp32 loss on the model's logits (with train.distill, DeiT's
    distillation loss through the same head: training/distill.py); with train.compile on (auto: CUDA
    only), torch.compile'd as one function, so the head's loss fuses with the model's last layers."""
    def forward_loss(images, targets):
        if distiller is not None:
            return distiller.loss(head, model(images).float(), images, targets, label_smoothing=label_smoothing)
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
    tracker_names = trackers.tracker_names(cfg.train.log_with)  # a missing package: one line, exit 2
    # Accelerate only sets up gloo multi-process training on CPU when asked for the CPU explicitly.
    cpu_multi_process = not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1
    accelerator = Accelerator(
        cpu=cpu_multi_process,
        mixed_precision=cfg.train.mixed_precision,
        gradient_accumulation_steps=cfg.train.grad_accum,
        log_with=tracker_names or None,
        # TensorBoard writes to LOGGING_DIR/<run name>: RUN_DIR/tensorboard/<name>
        project_config=ProjectConfiguration(project_dir=cfg.train.output_dir,
                                            logging_dir=trackers.tensorboard_dir(cfg.train.output_dir)),
    )
    return accelerator, tracker_names


def restore(run, ckpt, saved, changes=(), fresh_hparams=None):
    """Load weights, EMA, optimizer, schedule, scaler, RNG states, counters and the epoch's partial
    loss sums from a checkpoint (`saved`: its trainer state, read once by training/run_start.py); then
    apply accepted config changes (--resume-with-changes)."""
    source = f"checkpoint {ckpt}"
    load_into(run.raw_model, read_safetensors(os.path.join(ckpt, rundir.WEIGHTS)), source)
    if run.ema is not None:
        ema_path = os.path.join(ckpt, rundir.EMA_WEIGHTS)
        if os.path.isfile(ema_path):
            load_into(run.ema.module, read_safetensors(ema_path), source)
        else:  # EMA switched on by an accepted change: it starts from the resumed weights
            run.ema.set(run.raw_model)
    run.optimizer.load_state_dict(ck.load_torch(os.path.join(ckpt, rundir.OPTIMIZER)))
    run.scheduler.load_state_dict(ck.load_torch(os.path.join(ckpt, rundir.SCHEDULER)))
    scaler_state = ck.load_torch(os.path.join(ckpt, rundir.SCALER))
    if scaler_state is not None and run.accelerator.scaler is not None:
        run.accelerator.scaler.load_state_dict(scaler_state)
    rng_state = ck.load_rng(ckpt, run.rank)
    if rng_state is not None:
        restore_rng_state(rng_state)
    for name, value in saved.counters().items():
        setattr(run.state, name, value)
    run.state.last_ckpt = ckpt
    run.skipped_at_save = run.state.skipped
    run.epoch_loss_carried = saved.partial_epoch()  # on every rank: the totals add it once
    new_epoch_length = restore_epoch_position(run, saved, changes)
    run.metrics.truncate_after(run.state.step)  # rows after the checkpoint are re-logged exactly once
    run.epochs_csv.truncate_after(run.state.step)
    if rp.schedule_affected(changes) or new_epoch_length:
        run.scheduler = rp.rebuild_schedule(run.optimizer, fresh_hparams, run.cfg.optim, run.updates_per_epoch,
                                            run.state.step + run.state.schedule_offset)
    run.say(f"resumed from {ckpt} (step {run.state.step}, epoch {run.state.epoch + 1}, batch {run.state.batch})")
    if changes:
        run.metrics.write(**rp.change_record(changes, step=run.state.step, checkpoint=ckpt))
        run.say(f"applying config changes from step {run.state.step} ({rp.RESUME_FLAG}): {rp.format_changes(changes)}")


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
