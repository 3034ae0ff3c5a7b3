"""Data: the declared datasets (data/registry.py: built-in procedural data, CIFAR-10/100,
ImageNet-style folders, tar shards, cached features); DeiT augmentation via timm (PIL) or NVIDIA
DALI (data.backend); deterministic, resumable, rank-sharded loaders (configured by
configs.schema.DataConfig).

    from data import build_dataset, build_train_loader, build_eval_loader, build_mixup, num_classes
    train_ds = build_dataset(cfg.data, "train")
    for epoch in range(start_epoch, epochs):
        loader = build_train_loader(train_ds, cfg.data, seed=seed, epoch=epoch, rank=rank,
                                    world_size=world, start_batch=resume_batch if epoch == start_epoch else 0,
                                    device=device)
        for x, y in loader: ...

Notes: the loaders never draw from (nor change) the caller's python/numpy/torch RNG states, so
train.py's own RNG checkpointing stays exact. `repeated_aug` applies timm's RepeatAugSampler
semantics at every world size (with one process the 3 views of an image share a batch), keeping
the "union over ranks == 1-process batch" property. ImageFolder skips (skip_corrupt) are counted
in `dataset.skipped` and logged as warnings on the "data" logger.
"""
import importlib

from common.errors import UserError

from .registry import DATASETS, dataset_names, dataset_spec, is_features

# Importing the package imports neither torch nor timm (the config schema reads the registry before
# torch loads); these names load their module on first use (PEP 562).
_EXPORTS = {
    "class_names": "classes", "explain_backend": "dali_loader", "resolve_backend": "dali_loader",
    "build_dataset": "datasets", "calib_indices": "datasets", "num_classes": "datasets", "split_positions": "datasets",
    "FeatureEvalLoader": "feature_loaders", "FeatureTrainLoader": "feature_loaders",
    "EvalLoader": "loaders", "TrainLoader": "loaders",
}


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)

def build_train_loader(dataset, cfg, *, seed, epoch, rank, world_size, start_batch=0, device="cpu"):
    """One epoch of training batches for one rank (TrainLoader, or DaliTrainLoader for data.backend
    dali/auto; FeatureTrainLoader for cached features); the same sample order either way, exact under resume."""
    from .dali_loader import resolve_backend
    from .feature_loaders import FeatureTrainLoader
    from .loaders import TrainLoader

    kind = TrainLoader
    if is_features(cfg):
        kind = FeatureTrainLoader
    elif resolve_backend(cfg, device) == "dali":
        from .dali_loader import DaliTrainLoader as kind
    return kind(dataset, cfg, seed=seed, epoch=epoch, rank=rank, world_size=world_size,
                start_batch=start_batch, device=device)


def build_eval_loader(dataset, cfg, *, rank, world_size, device="cpu"):
    """Deterministic eval batches; rank r gets r::world_size, no padding (EvalLoader or DaliEvalLoader)."""
    from .dali_loader import resolve_backend
    from .feature_loaders import FeatureEvalLoader
    from .loaders import EvalLoader

    kind = EvalLoader
    if is_features(cfg):
        kind = FeatureEvalLoader
    elif resolve_backend(cfg, device) == "dali":
        from .dali_loader import DaliEvalLoader as kind
    return kind(dataset, cfg, rank=rank, world_size=world_size, device=device)


def build_mixup(cfg, num_classes):
    """timm.data.Mixup (Mixup: Zhang et al. 2018; CutMix: Yun et al. 2019) with label smoothing,
    producing soft targets (rows summing to 1), or None when mixup and cutmix are both off
    (label smoothing alone is then applied by the loss). Needs an even batch size."""
    if cfg.mixup <= 0 and cfg.cutmix <= 0:
        return None
    if is_features(cfg):
        from .features import check_feature_config

        check_feature_config(cfg)  # refuses Mixup/CutMix in one line
    if cfg.batch_size % 2:
        raise UserError(f"Mixup/CutMix needs an even data.batch_size, got {cfg.batch_size}")
    from timm.data import Mixup

    return Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, prob=cfg.mixup_prob,
                 switch_prob=cfg.mixup_switch_prob, mode="batch", label_smoothing=cfg.label_smoothing,
                 num_classes=num_classes)


__all__ = ["DATASETS", "dataset_names", "dataset_spec", "is_features", "build_dataset", "num_classes", "class_names",
           "calib_indices", "split_positions", "build_train_loader", "build_eval_loader", "build_mixup", "TrainLoader",
           "EvalLoader",
           "explain_backend", "resolve_backend"]
