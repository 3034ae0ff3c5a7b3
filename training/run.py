"""A training run (`Run`) and how it is built: `setup` makes the accelerator, locks and prepares the
run directory (training/run_start.py), builds data, model, optimizer, schedule and EMA, and restores
a checkpoint when resuming (training/checkpoint/restore.py). training/loop.py runs the loop over it.

`Run` is what the run is made of (config, accelerator, lock, data) plus its parts, each one thing
the loop's functions read or write: the `Learner` (what the updates train and a checkpoint saves),
the counters (`RunState`), the losses left on the device (`DeviceLosses`), this launch's clocks
(`Session`) and where the run reports (`Logs`).

Exact resume: the training loader is NOT passed through `accelerator.prepare` (its re-sharding
replays the wrong samples mid-epoch); `data.build_train_loader` is already deterministic per
(seed, epoch, position) and sharded per rank, and restarts at any batch (`Run.train_loader`).
"""
import functools
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
from common.errors import UserError
from common.runlock import RunLock
from data.samplers import num_train_batches
from models import create_classifier
from training import resume_policy as rp
from training import trackers
from training.checkpoint.restore import restore, resume_logs
from training.checkpoint.state import Counters
from training.distill import build_distiller, teacher_line
from training.feature_probe import build_feature_probe, resolve_features
from training.finetune import load_pretrained_weights, resolve_pretrained
from training.freeze import apply_freeze, freeze_line
from training.launch import launch_lines
from training.logging import EpochCSV, MetricsLog, console, progress_bar
from training.optim import build_optimizer, build_scheduler
from training.rng import reseed
from training.run_sources import check_sources_outside_run
from training.run_start import prepare_run_dir
from training.start_checks import LOCK_PURPOSE
from training.train_step import NO_BAD_STEP


@dataclass
class Learner:
    """What the updates train and a checkpoint saves: the classifier, its optimizer, schedule and EMA,
    and the loss the step minimises."""
    raw_model: Any  # the classifier itself: checkpoints, EMA and the head's loss use it
    model: Any  # what runs forward/backward: raw_model wrapped by Accelerate (DDP)
    forward_loss: Any  # (images, targets) -> fp32 loss: model + head's loss, compiled when train.compile is on
    distiller: Any  # training.distill.Distiller (its teacher) under train.distill, else None
    optimizer: Any
    scheduler: Any  # timm's, stepped per update by the step
    ema: Any  # timm's ModelEmaV3 under train.ema, else None


@dataclass
class RunState(Counters):
    """The run's counters: those a checkpoint saves and a resume restores (training/checkpoint/state.py),
    and this session's checkpoint bookkeeping (not saved)."""
    last_ckpt: Optional[str] = None  # where this session's newest checkpoint went (or the one resumed)
    saved_step: int = -1  # step of this session's newest checkpoint (every rank)
    skipped_at_save: int = 0  # `skipped` when that checkpoint was saved (its loss_finite)


@dataclass
class DeviceLosses:
    """The losses the step leaves on the device, read only at log steps, saves and epoch ends
    (training/train_step.py's docstring)."""
    epoch: Any  # this rank, this session: [sum of its finite update losses, number of them] this epoch
    first_bad_step: Any  # first update with a non-finite loss (NO_BAD_STEP when none)
    last: Any = None  # mean loss of the latest update
    # the epoch's part before this session (from the checkpoint), in world-independent units:
    # [sum over updates of the update's loss (mean over ranks), number of updates]; see training/loop.py
    # epoch_loss_totals
    carried: list = field(default_factory=lambda: [0.0, 0.0])

    @classmethod
    def on(cls, device):
        return cls(epoch=torch.zeros(2, dtype=torch.float64, device=device),
                   first_bad_step=torch.tensor(NO_BAD_STEP, device=device))


@dataclass
class Session:
    """This launch's clocks: its training time, its updates (the first few are warm-up) and the window
    img/s is measured over."""
    time_base: float  # train_time_s of earlier sessions (resume)
    start_images: int  # state.images when this session started
    start: float = field(default_factory=time.perf_counter)
    updates: int = 0
    window_start: float = 0.0  # throughput window: since when, from how many images
    window_images: int = 0

    @classmethod
    def begin(cls, state):
        session = cls(time_base=state.train_time_s, start_images=state.images)
        session.restart_window(session.start, state.images)
        return session

    def elapsed(self):
        """train_time_s: the earlier sessions' and this one's so far."""
        return self.time_base + time.perf_counter() - self.start

    def restart_window(self, now, images):
        self.window_start, self.window_images = now, images

    def images_per_s(self, images):
        """Images per second since the window started (at `images`); the next window starts now."""
        now = time.perf_counter()
        rate = (images - self.window_images) / max(now - self.window_start, 1e-9)
        self.restart_window(now, images)
        return rate


@dataclass
class Logs:
    """Where the run reports (the main process writes, the others' are disabled): metrics.jsonl,
    epochs.csv, the Accelerate trackers and the progress bar."""
    metrics: MetricsLog
    epochs_csv: EpochCSV
    trackers: list  # train.log_with resolved: the Accelerate trackers logged to (training/trackers.py)
    bar: Any = None  # training.logging.ProgressBar, made once the resumed step is known


@dataclass
class Run:
    """One training run, built once by `setup`: what it is made of, then its parts (module docstring)."""
    cfg: Any
    accelerator: Any
    lock: Any  # common.runlock.RunLock (held by the main process)
    fingerprint: dict  # training.resume_policy.resume_fingerprint: the whole resolved config
    global_batch: int
    updates_per_epoch: int
    train_set: Any
    val_loader: Any
    mixup: Any
    learner: Learner
    losses: DeviceLosses
    logs: Logs
    state: RunState = field(default_factory=RunState)
    session: Optional[Session] = None  # begun once the resumed counters are known
    guard: Any = None  # training.preemption.PreemptionGuard (None: no signal handling, e.g. in tests)
    reduce_max: Any = None  # the guard's cross-rank agreement (None with one process)

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

    def train_loader(self, epoch, start_batch):
        reseed(self.cfg.train.seed, "loader", epoch, self.rank)
        return data_lib.build_train_loader(self.train_set, self.cfg.data, seed=self.cfg.train.seed, epoch=epoch,
                                           rank=self.rank, world_size=self.world, start_batch=start_batch,
                                           device=self.accelerator.device)


def setup(cfg, resume, overwrite, accept_changes=False):
    """Accelerator, run directory (locked), data, model/optimizer/schedule/EMA, and the resumed
    state. The main process holds the run lock from here on (`run.lock`; released by training/loop.py's
    `train`, or here when setup fails). Checks before changes: training/run_start.py's docstring."""
    # A guard, not a measured fix: arithmetic on denormal floats is slow on CPUs, and flushing them
    # to zero costs nothing (a census of one training step per head found none; the sparse-head
    # slowdowns first blamed on them came from other jobs sharing the cores). Deterministic either way.
    torch.set_flush_denormal(True)
    check_sources_outside_run(cfg)  # a run never reads from (or could delete) its own directory: before it is touched
    accelerator, tracker_names = build_accelerator(cfg.train)
    main_proc = accelerator.is_main_process
    lock = RunLock(cfg.train.output_dir, purpose=LOCK_PURPOSE, enabled=main_proc,
                   warn=lambda msg: console(msg, main_proc))
    try:
        return build_run(cfg, resume, overwrite, accept_changes, accelerator, tracker_names, lock)
    except BaseException:
        lock.release()
        raise


def build_run(cfg, resume, overwrite, accept_changes, accelerator, tracker_names, lock):
    world, device, main_proc = accelerator.num_processes, accelerator.device, accelerator.is_main_process
    say = functools.partial(console, enabled=main_proc)
    global_batch = cfg.data.batch_size * world * cfg.train.grad_accum
    num_classes = data_lib.num_classes(cfg.data)
    # model.pretrained / train.teacher: their files' sha256 (and the weights' image size) enter the config first
    pretrained = resolve_pretrained(cfg, say)
    features = resolve_features(cfg, say)  # data.dataset=features: its source's model keys
    distiller = build_distiller(cfg, num_classes, accelerator)
    fp = rp.resume_fingerprint(cfg, num_classes=num_classes, global_batch=global_batch)
    ckpt, saved, changes, tracking = prepare_run_dir(cfg, resume, overwrite, accept_changes, accelerator, lock, fp,
                                                     tracker_names)
    backend, backend_why = data_lib.explain_backend(cfg.data, device)
    for line in launch_lines(num_processes=world, device=device, configured_precision=cfg.train.mixed_precision,
                             used_precision=accelerator.mixed_precision, backend=backend, backend_why=backend_why,
                             threads=torch.get_num_threads()):
        say(line)

    with accelerator.main_process_first():  # downloads / dataset caches are written once
        train_set = data_lib.build_dataset(cfg.data, "train")
        val_set = data_lib.build_dataset(cfg.data, cfg.train.eval_split)  # tune: compare_heads --tune's trials
    val_loader = data_lib.build_eval_loader(val_set, cfg.data, rank=accelerator.process_index, world_size=world,
                                            device=device)
    mixup = data_lib.build_mixup(cfg.data, num_classes)
    updates_per_epoch = count_updates_per_epoch(cfg.data, cfg.train.grad_accum, len(train_set), world)

    reseed(cfg.train.seed, "init")
    if features is not None:  # a linear probe on cached features, initialised as the image path's classifier
        raw_model = build_feature_probe(cfg, num_classes, features, say)
    else:
        raw_model = create_classifier(cfg.model, cfg.head, num_classes, img_size=cfg.data.image_size)
    if pretrained is not None:
        load_pretrained_weights(raw_model, pretrained, say)
    apply_freeze(raw_model, cfg.model.freeze)  # model.freeze=backbone: a linear probe
    for line in (freeze_line(raw_model, cfg.model.freeze), distiller and teacher_line(cfg, distiller)):
        if line:
            say(line)
    optimizer = build_optimizer(raw_model, cfg.optim, global_batch)
    fresh_hparams = rp.optimizer_hparams(optimizer)  # this config's settings, before a checkpoint's replace them
    scheduler = build_scheduler(optimizer, cfg.optim, updates_per_epoch)  # stepped by us per update
    model, optimizer = accelerator.prepare(raw_model, optimizer)
    # Mixup/CutMix already fold label smoothing into their soft targets: never apply it twice.
    label_smoothing = 0.0 if mixup is not None else cfg.data.label_smoothing
    learner = Learner(
        raw_model=raw_model, model=model, distiller=distiller, optimizer=optimizer, scheduler=scheduler,
        forward_loss=build_forward_loss(cfg.train.compile, model, raw_model.output_head, label_smoothing, device,
                                        distiller),
        ema=ModelEmaV3(raw_model, decay=cfg.train.ema_decay) if cfg.train.ema else None)
    logs = Logs(metrics=MetricsLog(cfg.train.output_dir, enabled=main_proc),
                epochs_csv=EpochCSV(cfg.train.output_dir, enabled=main_proc), trackers=tracker_names)
    run = Run(cfg=cfg, accelerator=accelerator, lock=lock, fingerprint=fp, global_batch=global_batch,
              updates_per_epoch=updates_per_epoch, train_set=train_set, val_loader=val_loader, mixup=mixup,
              learner=learner, losses=DeviceLosses.on(device), logs=logs)
    if ckpt is not None:
        restore(run, ckpt, saved, changes, fresh_hparams)
    trackers.start(accelerator, tracker_names, cfg, trackers.flat_params(configs.config_to_dict(cfg)),
                   resumed_step=run.state.step if ckpt is not None else None,
                   mlflow_run_id=tracking.get("mlflow_run_id"))
    if ckpt is not None:  # the trackers started: the resume's logs are cut back only now
        resume_logs(run, ckpt, changes)
    run.session = Session.begin(run.state)
    logs.bar = progress_bar(cfg.optim.epochs * updates_per_epoch - run.state.schedule_offset, initial=run.state.step,
                            enabled=main_proc and cfg.train.progress)
    return run


def build_forward_loss(compile_setting, model, head, label_smoothing, device, distiller=None):
    """(images, targets) -> the head's fp32 loss on the model's logits (with train.distill, DeiT's
    distillation loss through the same head: training/distill.py); with train.compile on (auto: CUDA
    only: `compile_setting` is train.compile), torch.compile'd as one function, so the head's loss fuses
    with the model's last layers."""
    def forward_loss(images, targets):
        if distiller is not None:
            return distiller.loss(head, model(images).float(), images, targets, label_smoothing=label_smoothing)
        return head.loss(model(images).float(), targets, label_smoothing=label_smoothing)

    compile_on = compile_setting == "true" or (compile_setting == "auto" and device.type == "cuda")
    return torch.compile(forward_loss) if compile_on else forward_loss


def count_updates_per_epoch(data_cfg, grad_accum, num_samples, world):
    """Optimizer updates per epoch, from the sampler's arithmetic (no loader is built)."""
    batches = num_train_batches(num_samples, world_size=world, batch_size=data_cfg.batch_size,
                                repeated_aug=data_cfg.repeated_aug, num_repeats=data_cfg.repeated_aug_repeats)
    if batches < grad_accum:
        raise UserError(f"the training split has {num_samples} samples, {batches} batches of data.batch_size="
                        f"{data_cfg.batch_size} per process ({world} process(es)) per epoch, fewer than "
                        f"train.grad_accum={grad_accum}: lower data.batch_size or train.grad_accum")
    return batches // grad_accum


def build_accelerator(train_cfg):
    """The Accelerator of the config's train section (train.mixed_precision, train.grad_accum, the
    trackers of train.log_with) and those trackers' names; the settings it cannot run refused in one line."""
    if train_cfg.mixed_precision == "fp16" and not torch.cuda.is_available():
        raise UserError("train.mixed_precision=fp16 needs a CUDA GPU; use bf16 (or no) on CPU")
    if train_cfg.sync_debug and not torch.cuda.is_available():
        raise UserError("train.sync_debug=true needs a CUDA GPU (it sets CUDA's sync debug mode); on CPU the "
                        "test suite checks the step for host syncs (tests/test_train_no_sync.py)")
    if train_cfg.sync_debug and train_cfg.nonfinite == "skip":
        raise UserError("train.sync_debug=true cannot be combined with train.nonfinite=skip, which reads one flag "
                        "per update by design; use train.nonfinite=stop")
    tracker_names = trackers.tracker_names(train_cfg.log_with)  # a missing package: one line, exit 2
    # Accelerate only sets up gloo multi-process training on CPU when asked for the CPU explicitly.
    cpu_multi_process = not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1
    accelerator = Accelerator(
        cpu=cpu_multi_process,
        mixed_precision=train_cfg.mixed_precision,
        gradient_accumulation_steps=train_cfg.grad_accum,
        log_with=tracker_names or None,
        # TensorBoard writes to LOGGING_DIR/<run name>: RUN_DIR/tensorboard/<name>
        project_config=ProjectConfiguration(project_dir=train_cfg.output_dir,
                                            logging_dir=trackers.tensorboard_dir(train_cfg.output_dir)),
    )
    return accelerator, tracker_names
