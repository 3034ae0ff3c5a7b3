"""Typed training configuration: one dataclass per section.

Every YAML key maps onto a field here; `configs.loader` rejects unknown keys (suggesting the
closest valid one) and wrong types (naming the key and the expected type).
"""
from dataclasses import dataclass, field, make_dataclass
from typing import Optional, Tuple

from models.registry import HEAD_NAMES, HPARAMS
from models.resmlp import NORMS

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# DataConfig: every data/augmentation choice is a config field.
#
# Defaults suit the built-in dataset and CIFAR (32 px, random crop with padding 4 + flip); the
# ImageNet configs set the DeiT/ResMLP recipe (RandAugment 'rand-m9-mstd0.5-inc1', reprob 0.25,
# mixup 0.8, cutmix 1.0, label smoothing 0.1, repeated augmentation, crop_pct 0.9).
@dataclass
class DataConfig:
    dataset: str = "builtin10"  # any data.names.DATASET_NAMES entry
    root: str = "datasets"  # where CIFAR/ImageNet live (cifar-10-batches-py/, train/ val/), or the shard folder
    # pil: timm/PIL per-sample transforms (and the in-memory path); dali: NVIDIA DALI decode + DeiT
    # augmentation (imagefolder/shards; GPU when training on one, else CPU threads = num_workers);
    # auto: dali when DALI is installed, the dataset is imagefolder/shards and training runs on CUDA.
    backend: str = "pil"
    image_size: int = 32
    batch_size: int = 128  # per process
    eval_batch_size: int = 256  # per process
    num_workers: int = 2
    in_memory: bool = True  # CIFAR/builtin: whole split as one uint8 tensor, batch aug on device
    download: bool = True
    auto_augment: Optional[str] = None  # e.g. "rand-m9-mstd0.5-inc1" (forces the per-sample path)
    reprob: float = 0.0  # random erasing probability (timm RandomErasing, mode "pixel")
    interpolation: str = "bicubic"
    crop_pct: float = 0.875
    hflip: float = 0.5
    mixup: float = 0.0
    cutmix: float = 0.0
    mixup_prob: float = 1.0
    mixup_switch_prob: float = 0.5
    label_smoothing: float = 0.0
    repeated_aug: bool = False
    skip_corrupt: bool = False
    calib_fraction: float = 0.0  # fraction of TRAIN held out (deterministically) as "calib" split
    builtin_train_size: int = 20000
    builtin_val_size: int = 2000
    builtin_seed: int = 0
    # ---- extra fields (all optional) ----
    # "pad": random crop with `crop_padding` (CIFAR style); "rrc": RandomResizedCrop (DeiT);
    # "auto": pad for builtin*/cifar*, rrc for imagefolder.
    train_crop: str = "auto"
    crop_padding: int = 4
    color_jitter: float = 0.0  # timm colour jitter (only used when auto_augment is None; per-sample path)
    mean: Tuple[float, float, float] = IMAGENET_MEAN
    std: Tuple[float, float, float] = IMAGENET_STD
    repeated_aug_repeats: int = 3  # timm RepeatAugSampler num_repeats
    cache_dir: Optional[str] = None  # built-in dataset cache; None -> $XDG_CACHE_HOME or ~/.cache /resmlp-data


@dataclass
class ModelConfig:
    name: str = "resmlp_tiny"  # any models.resmlp.MODEL_NAMES entry
    norm: str = "affine"  # models.resmlp.NORMS: affine (the paper) | layernorm (baseline) | batchnorm
    drop_path: float = 0.0  # stochastic depth rate, uniform over blocks as in the paper
    init_values: Optional[float] = None  # LayerScale init; None -> depth rule (0.1 / 1e-5 / 1e-6)
    img_size: int = 32


def _head_config_fields():
    """The head section: head.name, then every head's hyperparameters as declared in
    models/registry.py (type, default; doc and range text in the field metadata: the checks are the registry's)."""
    fields = [("name", str, field(default="softmax", metadata={"doc": "any models.heads.HEAD_NAMES entry"}))]
    for hp in HPARAMS.values():
        fields.append((hp.name, hp.type, field(default=hp.default, metadata={"doc": hp.doc, "range_doc": hp.range})))
    return fields


# HeadConfig: generated from the head registry, so a new head's settings need no edit here.
HeadConfig = make_dataclass("HeadConfig", _head_config_fields())
HeadConfig.__module__ = __name__


@dataclass
class OptimConfig:
    name: str = "lamb"  # lamb | adamw | sgd (timm.optim.create_optimizer_v2)
    # Linear scaling rule (Goyal et al. 2017): the lr actually used is
    # lr * global_batch / lr_base_batch, global_batch = batch_size * processes * grad_accum.
    lr: float = 5e-3
    lr_base_batch: int = 2048
    weight_decay: float = 0.2  # not applied to biases, Affine/norm params, LayerScale, alpha (1-D)
    betas: Tuple[float, float] = (0.9, 0.999)
    momentum: float = 0.9  # sgd only
    clip_grad: Optional[float] = None  # max global grad norm; None = no clipping
    epochs: int = 400
    warmup_epochs: float = 5
    min_lr: float = 1e-5
    warmup_lr: float = 1e-6


@dataclass
class TrainConfig:
    seed: int = 0
    mixed_precision: str = "no"  # no | bf16 | fp16
    grad_accum: int = 1  # micro-batches per optimizer update
    eval_every: int = 1  # epochs (and always after the last one)
    log_every: int = 10  # optimizer updates
    save_every: int = 500  # optimizer updates (and always at each epoch end)
    keep_last: int = 2  # checkpoints kept besides the best one
    output_dir: str = "runs/{name}"  # "{name}" is replaced by the config name
    ema: bool = True
    ema_decay: float = 0.99996
    nonfinite: str = "stop"  # stop | skip
    # nonfinite=skip only: stop (exit 3, as `stop` does) once more than this fraction of the last 100
    # updates were skipped (0.1: an 11th skip within 100 updates); 1 never stops.
    max_skipped_fraction: float = 0.1
    # torch.compile the forward together with the loss: auto = on for CUDA, off for CPU | true | false
    compile: str = "auto"
    # CUDA only: torch.cuda.set_sync_debug_mode("error") around every update that is not a log step
    # (after the warm-up updates), so a host sync in the training step fails loudly.
    sync_debug: bool = False
    tensorboard: bool = True  # TensorBoard through Accelerate's trackers, when installed
    progress: bool = True  # tqdm bar on the main process


@dataclass
class Config:
    name: str = "run"
    model: ModelConfig = field(default_factory=ModelConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


# Numeric ranges checked at load time (every float must also be finite); a tuple's every element.
# Intervals in the usual notation: [ ] closed, ( ) open; "inf" is unbounded.
RANGES = {
    "data.image_size": "[1, inf)", "data.batch_size": "[1, inf)", "data.eval_batch_size": "[1, inf)",
    "data.num_workers": "[0, inf)", "data.reprob": "[0, 1]", "data.crop_pct": "(0, 1]", "data.hflip": "[0, 1]",
    "data.mixup": "[0, inf)", "data.cutmix": "[0, inf)", "data.mixup_prob": "[0, 1]",
    "data.mixup_switch_prob": "[0, 1]", "data.label_smoothing": "[0, 1]", "data.calib_fraction": "[0, 1)",
    "data.builtin_train_size": "[1, inf)", "data.builtin_val_size": "[1, inf)", "data.crop_padding": "[0, inf)",
    "data.color_jitter": "[0, inf)", "data.std": "(0, inf)", "data.repeated_aug_repeats": "[1, inf)",
    "model.drop_path": "[0, 1)", "model.init_values": "(0, inf)", "model.img_size": "[1, inf)",
    "optim.lr": "(0, inf)", "optim.lr_base_batch": "[1, inf)", "optim.weight_decay": "[0, inf)",
    "optim.betas": "[0, 1)", "optim.momentum": "[0, 1)", "optim.clip_grad": "(0, inf)", "optim.epochs": "[1, inf)",
    "optim.warmup_epochs": "[0, inf)", "optim.min_lr": "[0, inf)", "optim.warmup_lr": "[0, inf)",
    "train.grad_accum": "[1, inf)", "train.eval_every": "[1, inf)", "train.log_every": "[1, inf)",
    "train.save_every": "[1, inf)", "train.keep_last": "[1, inf)", "train.ema_decay": "[0, 1)",
    "train.max_skipped_fraction": "[0, 1]",
}

# Closed vocabularies checked at load time (the model/head/dataset names are checked by their
# owners' builders, which list the valid names).
CHOICES = {
    "model.norm": NORMS,
    "head.name": HEAD_NAMES,
    "optim.name": ("lamb", "adamw", "sgd"),
    "train.mixed_precision": ("no", "bf16", "fp16"),
    "train.nonfinite": ("stop", "skip"),
    "train.compile": ("auto", "true", "false"),
}
