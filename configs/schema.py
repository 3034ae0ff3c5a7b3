"""Typed training configuration: one dataclass per section, and every fact about each key.

Every YAML key maps onto a field here; `configs.loader` rejects unknown keys (suggesting a close
valid one) and wrong types (naming the key and the expected type). A field's metadata holds the rest
of what is known about its key (`setting` writes it):

- help: one line of meaning (`python train.py --help-config` prints it with type, default, range);
- range: a numeric interval checked at load ("[0, 1)": [ ] closed, ( ) open, inf unbounded; a
  tuple's every element; every float must also be finite);
- choices: the closed vocabulary of a str key;
- search: the range compare_heads --tune samples the key from (common/search_space.py), inside `range`;
- resume: what a resume may do with the key (training/resume_policy.py): FREE (changes freely),
  FROZEN (never: another model, dataset, sample order or optimizer), OPTIMIZER (with
  --resume-with-changes, and the lr schedule is rebuilt); absent: changes with
  --resume-with-changes only.

RANGES, CHOICES, SEARCH and RESUME_CLASS below are derived from the metadata; nothing else lists them.

The image size has one key, data.image_size; the model is built at it (models.create_classifier's
img_size), with no copy in the model section.
"""
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, make_dataclass
from typing import Optional, Tuple, Union, get_type_hints

from common.intervals import parse_interval
from common.search_space import parse_search
from data.names import BACKENDS, INTERPOLATIONS, TRAIN_CROPS
from data.registry import dataset_names, describe_datasets
from models.mapping_table import POOL_MAPPINGS
from models.names import MODEL_NAMES, NORMS, POOLS
from models.registry import HEAD_NAMES, HPARAMS

IMAGENET_MEAN = (0.485, 0.456, 0.406)
# Accelerate's tracker names (each needs the package of the same name; training/trackers.py)
TRACKER_NAMES = ("tensorboard", "wandb", "mlflow", "aim", "comet_ml", "clearml", "dvclive")
IMAGENET_STD = (0.229, 0.224, 0.225)

# Keys that no longer exist, with what took their place: the loader's "unknown key" line names it.
REPLACED_KEYS = {"train.tensorboard": "set train.log_with instead (train.tensorboard=true was log_with=auto, "
                                      "false was log_with=none)"}

# resume classes (field metadata "resume"; see the module docstring)
FREE, FROZEN, OPTIMIZER = "free", "frozen", "optimizer"
RESUME_CLASSES = (FREE, FROZEN, OPTIMIZER)


def setting(default=MISSING, help="", *, range=None, choices=None, resume=None, factory=MISSING, **extra):
    """A config field whose metadata holds its meaning and checks (see the module docstring)."""
    meta = {"help": help, **extra}
    if range is not None:
        meta["range"] = range
    if choices is not None:
        meta["choices"] = tuple(choices)
    if resume is not None:
        assert resume in RESUME_CLASSES, resume
        meta["resume"] = resume
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# DataConfig: every data/augmentation choice is a config field.
#
# Defaults suit the built-in dataset and CIFAR (32 px, random crop with padding 4 + flip); the
# ImageNet configs set the DeiT/ResMLP recipe (RandAugment 'rand-m9-mstd0.5-inc1', reprob 0.25,
# mixup 0.8, cutmix 1.0, label smoothing 0.1, repeated augmentation, crop_pct 0.9).
@dataclass
class DataConfig:
    dataset: str = setting("builtin10", f"which dataset (data/registry.py): {describe_datasets()}",
                           choices=dataset_names(), resume=FROZEN)
    root: str = setting("datasets", "where CIFAR/ImageNet/the MNIST family live (cifar-10-batches-py/, train/ "
                        "val/, FashionMNIST/raw/), or the shard folder, or the feature folder (data.dataset=features)",
                        resume=FREE)
    # pil: timm/PIL per-sample transforms (and the in-memory path); dali: NVIDIA DALI decode + DeiT
    # augmentation (the datasets declared dali; GPU when training on one, else CPU threads = num_workers);
    # auto: dali when DALI is installed, the dataset is declared dali and training runs on CUDA.
    backend: str = setting("auto", "decoding/augmentation: pil (timm/PIL), dali (NVIDIA DALI), auto (dali when "
                           f"installed, on CUDA, for {'/'.join(dataset_names(dali=True))}; else pil)",
                           choices=BACKENDS)
    image_size: int = setting(32, "side of the square images the model sees and is built for",
                              range="[1, 4096]", resume=FROZEN)
    batch_size: int = setting(128, "training batch per process", range="[1, 65536]")
    eval_batch_size: int = setting(256, "evaluation batch per process", range="[1, 65536]", resume=FREE)
    num_workers: int = setting(2, "data loader worker processes (DALI: CPU threads)", range="[0, 256]", resume=FREE)
    in_memory: bool = setting(True, f"{'/'.join(dataset_names(in_memory=True))}: whole split as one uint8 "
                              "tensor, batch augmentation on the device")
    download: bool = setting(True, "download CIFAR or the MNIST family when missing", resume=FREE)
    auto_augment: Optional[str] = setting(None, "timm RandAugment spec, e.g. rand-m9-mstd0.5-inc1 (forces the "
                                          "per-sample path); null: none")
    reprob: float = setting(0.0, "random erasing probability (timm RandomErasing, mode pixel)", range="[0, 1]")
    interpolation: str = setting("bicubic", "resize interpolation", choices=INTERPOLATIONS)
    crop_pct: float = setting(0.875, "eval centre-crop ratio: resize to image_size / crop_pct, then crop",
                              range="(0, 1]")
    hflip: float = setting(0.5, "horizontal flip probability", range="[0, 1]")
    mixup: float = setting(0.0, "Mixup alpha (0: off)", range="[0, inf)")
    cutmix: float = setting(0.0, "CutMix alpha (0: off)", range="[0, inf)")
    mixup_prob: float = setting(1.0, "probability of applying Mixup/CutMix to a batch", range="[0, 1]")
    mixup_switch_prob: float = setting(0.5, "probability of CutMix instead of Mixup when both are on",
                                       range="[0, 1]")
    label_smoothing: float = setting(0.0, "label smoothing (folded into Mixup's targets when Mixup is on)",
                                     range="[0, 1]")
    repeated_aug: bool = setting(False, "repeated augmentation sampler (DeiT)", resume=FROZEN)
    skip_corrupt: bool = setting(False, "skip undecodable images (counted) instead of stopping")
    calib_fraction: float = setting(0.0, "fraction of TRAIN held out (deterministically) as the calib split "
                                    "for prediction sets", range="[0, 1)", resume=FROZEN)
    tune_fraction: float = setting(0.0, "fraction of TRAIN (after the calib hold-out) held out (deterministically) "
                                   "as the tune split, what compare_heads --tune selects settings on",
                                   range="[0, 1)", resume=FROZEN)
    builtin_train_size: int = setting(20000, "built-in dataset: training images", range="[1, 10000000]",
                                      resume=FROZEN)
    builtin_val_size: int = setting(2000, "built-in dataset: validation images", range="[1, 10000000]")
    builtin_seed: int = setting(0, "built-in dataset: generator seed", resume=FROZEN)
    # ---- extra fields (all optional) ----
    # "pad": random crop with `crop_padding` (CIFAR style); "rrc": RandomResizedCrop (DeiT);
    # "auto": the recipe the dataset's declaration names (data/registry.py).
    train_crop: str = setting("auto", "training crop: pad (CIFAR style, crop_padding), rrc (RandomResizedCrop), "
                              f"auto (rrc for {'/'.join(dataset_names(train_crop='rrc'))}, else pad)",
                              choices=TRAIN_CROPS)
    crop_padding: int = setting(4, "zero padding before the pad-mode random crop", range="[0, 1024]")
    color_jitter: float = setting(0.0, "timm colour jitter (only without auto_augment; per-sample path)",
                                  range="[0, inf)")
    mean: Tuple[float, float, float] = setting(IMAGENET_MEAN, "normalisation mean (RGB)")
    std: Tuple[float, float, float] = setting(IMAGENET_STD, "normalisation std (RGB)", range="(0, inf)")
    repeated_aug_repeats: int = setting(3, "repeated augmentation: repeats per sample (timm RepeatAugSampler)",
                                        range="[1, 64]", resume=FROZEN)
    cache_dir: Optional[str] = setting(None, "built-in dataset cache; null: $XDG_CACHE_HOME or ~/.cache "
                                       "/resmlp-data", resume=FREE)
    # data.dataset=features: which features (data/features.py), as model.pretrained_sha256 names the weights
    features_source_sha256: Optional[str] = setting(None, "data.dataset=features: sha256 of the weights the "
                                                    "features were extracted from, filled in by train.py; set it "
                                                    "to pin them", resume=FROZEN)
    features_settings_sha256: Optional[str] = setting(None, "data.dataset=features: sha256 of how they were "
                                                      "extracted (views, augment, dataset, the source's config), "
                                                      "filled in by train.py; set it to pin them", resume=FROZEN)


@dataclass
class ModelConfig:
    name: str = setting("resmlp_tiny", "the ResMLP variant (models/resmlp.py VARIANTS)", choices=MODEL_NAMES,
                        resume=FROZEN)
    norm: str = setting("affine", "block normalisation: affine (the paper), layernorm (baseline), batchnorm",
                        choices=NORMS, resume=FROZEN)
    drop_path: float = setting(0.0, "stochastic depth rate, uniform over blocks as in the paper", range="[0, 1)")
    init_values: Optional[float] = setting(None, "LayerScale init; null: by depth (0.1 / 1e-5 / 1e-6)",
                                           range="(0, inf)", resume=FROZEN)
    # Start from pretrained weights (training/finetune.py): the classifier is re-initialised when the
    # class count or the classifier kind differs; the weights' image size is kept (data.image_size
    # follows it: the token-mixing layers fix the patch count).
    pretrained: Optional[str] = setting(None, "start from these weights: a run or checkpoint directory, or a "
                                        "weights file in this project's, timm's or the FB/DeiT format "
                                        "(.safetensors, .pth/.pt/.bin); null: from scratch", resume=FROZEN)
    pretrained_sha256: Optional[str] = setting(None, "sha256 of model.pretrained, filled in by train.py; set it "
                                               "to pin the file", resume=FROZEN)
    freeze: str = setting("none", "none, or backbone: a linear probe (only the classifier and a learned alpha "
                          "train)", choices=("none", "backbone"), resume=FROZEN)
    # Pooling of the final patch tokens (models/hopfield_pool.py): avg (the paper) | hopfield, one
    # Hopfield retrieval step with a learned query; pool_mapping and pool_beta are hopfield's only.
    pool: str = setting("avg", "pooling of the final patch tokens: avg (the paper) or hopfield (one Hopfield "
                        "retrieval step with a learned query)", choices=POOLS, resume=FROZEN)
    pool_mapping: str = setting("softmax", "hopfield pooling only: the mapping over patches", choices=POOL_MAPPINGS,
                                resume=FROZEN)
    pool_beta: Optional[float] = setting(None, "hopfield pooling only: inverse temperature; null: 1/sqrt(dim)",
                                         range="[0, inf)")
    pool_k: Optional[int] = setting(None, "pool_mapping=ksubset only (required there): the patches a k-subset "
                                    "retrieval pools, 1..number of patches", range="[1, inf)", resume=FROZEN)


# Head settings that fix what the checkpoint holds: a learned alpha is a parameter of the model.
_FROZEN_HEAD_SETTINGS = ("learn_alpha",)


def _head_config_fields():
    """The head section: head.name, then every head's hyperparameters as declared in
    models/registry.py (type, default, meaning and range text; the checks are the registry's, so the
    range text is `range_doc`, shown by --help-config, not a RANGES entry)."""
    out = [("name", str, setting("softmax", "the output head (models/registry.py)", choices=HEAD_NAMES,
                                 resume=FROZEN))]
    for hp in HPARAMS.values():
        resume = FROZEN if hp.name in _FROZEN_HEAD_SETTINGS else None
        out.append((hp.name, hp.type, setting(hp.default, hp.doc, resume=resume, range_doc=hp.range)))
    return out


# HeadConfig: generated from the head registry, so a new head's settings need no edit here.
HeadConfig = make_dataclass("HeadConfig", _head_config_fields())
HeadConfig.__module__ = __name__


@dataclass
class OptimConfig:
    name: str = setting("lamb", "optimizer (timm.optim.create_optimizer_v2)", choices=("lamb", "adamw", "sgd"),
                        resume=FROZEN)
    # Linear scaling rule (Goyal et al. 2017): the lr actually used is
    # lr * global_batch / lr_base_batch, global_batch = batch_size * processes * grad_accum.
    lr: float = setting(5e-3, "peak learning rate at a global batch of lr_base_batch (scaled linearly)",
                        range="(0, inf)", search="log [1e-4, 0.1]", resume=OPTIMIZER)
    lr_base_batch: int = setting(2048, "global batch at which lr applies unscaled", range="[1, 1048576]",
                                 resume=OPTIMIZER)
    weight_decay: float = setting(0.2, "weight decay (not on biases, Affine/norm parameters, LayerScale, alpha)",
                                  range="[0, inf)", search="log [1e-4, 1]", resume=OPTIMIZER)
    betas: Tuple[float, float] = setting((0.9, 0.999), "Adam/LAMB betas", range="[0, 1)", resume=OPTIMIZER)
    momentum: float = setting(0.9, "sgd only: momentum", range="[0, 1)", resume=OPTIMIZER)
    clip_grad: Optional[float] = setting(None, "max global gradient norm; null: no clipping", range="(0, inf)")
    epochs: int = setting(400, "training epochs (the cosine schedule's length)", range="[1, 100000]",
                          resume=OPTIMIZER)
    warmup_epochs: float = setting(5, "linear warmup from warmup_lr, in epochs", range="[0, inf)",
                                   resume=OPTIMIZER)
    min_lr: float = setting(1e-5, "learning rate at the end of the cosine schedule", range="[0, inf)",
                            resume=OPTIMIZER)
    warmup_lr: float = setting(1e-6, "learning rate at the start of the warmup", range="[0, inf)",
                               resume=OPTIMIZER)
    layer_decay: Optional[float] = setting(None, "layer-wise lr decay (BEiT; timm create_optimizer_v2): the "
                                           "classifier and last block at lr, each block below times this; "
                                           "null: off", range="(0, 1]", resume=FROZEN)


@dataclass
class TrainConfig:
    seed: int = setting(0, "seed of initialisation, sample order and augmentation", resume=FROZEN)
    mixed_precision: str = setting("no", "autocast precision (fp16: CUDA only)", choices=("no", "bf16", "fp16"))
    grad_accum: int = setting(1, "micro-batches per optimizer update", range="[1, 65536]")
    eval_every: int = setting(1, "evaluate every N epochs (and after the last one)", range="[1, inf)", resume=FREE)
    eval_split: str = setting("val", "the split the per-epoch evaluations use: val, or tune (data.tune_fraction's "
                              "hold-out of train; compare_heads --tune's trials select on it)", choices=("val", "tune"))
    pause_after: Optional[int] = setting(None, "stop after this many epochs with the epoch's checkpoint and exit 0, "
                                         "without a summary (--resume auto continues); null: train every epoch",
                                         range="[1, inf)", resume=FREE)
    log_every: int = setting(10, "log every N optimizer updates", range="[1, inf)", resume=FREE)
    save_every: int = setting(500, "checkpoint every N optimizer updates (and at each epoch end)",
                              range="[1, inf)", resume=FREE)
    keep_last: int = setting(2, "checkpoints kept besides the best one", range="[1, inf)", resume=FREE)
    output_dir: str = setting("runs/{name}", "the run directory; {name} is replaced by the config's name",
                              resume=FREE)
    ema: bool = setting(True, "keep an exponential moving average of the weights (model_ema.safetensors)")
    ema_decay: float = setting(0.99996, "EMA decay per update", range="[0, 1)")
    nonfinite: str = setting("stop", "a non-finite loss: stop (exit 3) or skip the update",
                             choices=("stop", "skip"), resume=FREE)
    # nonfinite=skip only: stop (exit 3, as `stop` does) once more than this fraction of the last 100
    # updates were skipped (0.1: an 11th skip within 100 updates); 1 never stops.
    max_skipped_fraction: float = setting(0.1, "nonfinite=skip: stop once more than this fraction of the last "
                                          "100 updates were skipped (1: never)", range="[0, 1]", resume=FREE)
    # torch.compile the forward together with the loss: auto = on for CUDA, off for CPU | true | false
    compile: str = setting("auto", "torch.compile the forward and loss (auto: on CUDA)",
                           choices=("auto", "true", "false"), resume=FREE)
    # CUDA only: torch.cuda.set_sync_debug_mode("error") around every update that is not a log step
    # (after the warm-up updates), so a host sync in the training step fails loudly.
    sync_debug: bool = setting(False, "CUDA only: fail on any host sync inside a training step")
    # Experiment trackers through Accelerate (training/trackers.py).
    log_with: Union[str, Tuple[str, ...]] = setting(
        "auto", "experiment trackers through Accelerate: auto (TensorBoard when installed), none, a tracker, "
        "or a list of them", choices=("auto", "none") + TRACKER_NAMES, resume=FREE)
    progress: bool = setting(True, "tqdm progress bar on the main process, when stdout is a terminal", resume=FREE)
    allow_empty_eval: bool = setting(False, "go on when an evaluation found no image (every val image undecodable "
                                     "under data.skip_corrupt); false: stop with exit 2 after that epoch's "
                                     "checkpoint", resume=FREE)
    # Knowledge distillation through the one classifier, as DeiT's DistillationLoss (training/distill.py;
    # ResMLP has no distillation token).
    distill: str = setting("none", "distillation: none, hard (the teacher's argmax is the target) or soft (its "
                           "distribution at distill_tau, scaled by tau^2), through the head's own loss",
                           choices=("none", "soft", "hard"))
    teacher: Optional[str] = setting(None, "the teacher: a run directory, a weights file (the student's "
                                     "architecture) or a timm model name (with train.teacher_weights)")
    teacher_weights: Optional[str] = setting(None, "with a timm model name as train.teacher: its weights file")
    teacher_sha256: Optional[str] = setting(None, "sha256 of the teacher's weights, filled in by train.py; set "
                                            "it to pin the file")
    distill_alpha: float = setting(0.5, "weight of the teacher's term: (1 - a) * label loss + a * teacher loss",
                                   range="[0, 1]")
    distill_tau: float = setting(1.0, "soft distillation temperature", range="(0, inf)")


@dataclass
class Config:
    name: str = setting("run", "the config's name (default: the file name); fills train.output_dir's {name}",
                        resume=FREE)
    model: ModelConfig = field(default_factory=ModelConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


# ----------------------------------------------------------------------------- derived tables
def schema_fields(cls=Config, prefix=""):
    """{dotted key: (dataclasses.Field, type)} of every config key, in declaration order."""
    out = {}
    hints = get_type_hints(cls)
    for f in fields(cls):
        if is_dataclass(hints[f.name]):
            out.update(schema_fields(hints[f.name], prefix + f.name + "."))
        else:
            out[prefix + f.name] = (f, hints[f.name])
    return out


def section_names(cls=Config):
    """The sections (nested dataclasses) of the config: model, head, data, optim, train."""
    hints = get_type_hints(cls)
    return tuple(f.name for f in fields(cls) if is_dataclass(hints[f.name]))


def _metadata_table(name):
    return {key: f.metadata[name] for key, (f, _) in schema_fields().items() if name in f.metadata}


# Numeric intervals checked at load time, e.g. {"optim.lr": "(0, inf)"} (common/intervals.py reads
# them; a text that is no interval fails here, at import).
RANGES = _metadata_table("range")
for _interval in RANGES.values():
    parse_interval(_interval)
# compare_heads --tune's search ranges of schema keys (common/search_space.py), e.g. {"optim.lr": "log [1e-4, 0.1]"};
# the heads' own are declared in models/registry.py.
SEARCH = _metadata_table("search")
for _key, _search in SEARCH.items():  # a search range inside the key's own range
    _ends = parse_search(_search)
    if _ends.low not in parse_interval(RANGES[_key]) or _ends.high not in parse_interval(RANGES[_key]):
        raise ValueError(f"{_key}: search range {_search!r} reaches outside its range {RANGES[_key]!r}")
# Closed vocabularies checked at load time, e.g. {"model.norm": NORMS}.
CHOICES = _metadata_table("choices")
# What a resume may do with each key: FREE, FROZEN, OPTIMIZER, or None (with --resume-with-changes).
RESUME_CLASS = {key: f.metadata.get("resume") for key, (f, _) in schema_fields().items()}
