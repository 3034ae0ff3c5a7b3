"""DataConfig: every data/augmentation choice is a config field (contract in /work/contracts.md).

Defaults suit the built-in dataset and CIFAR (32 px, random crop with padding 4 + flip); the
ImageNet configs set the DeiT/ResMLP recipe (RandAugment 'rand-m9-mstd0.5-inc1', reprob 0.25,
mixup 0.8, cutmix 1.0, label smoothing 0.1, repeated augmentation, crop_pct 0.9).
"""
from dataclasses import dataclass
from typing import Optional, Tuple

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class DataConfig:
    dataset: str = "builtin10"  # builtin10 | builtin100 | cifar10 | cifar100 | imagefolder | shards
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


DATASET_NAMES = ("builtin10", "builtin100", "cifar10", "cifar100", "imagefolder", "shards")
BACKENDS = ("pil", "dali", "auto")
SPLITS = ("train", "val", "calib")
