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

from .registry import DATASETS, dataset_names, dataset_spec, is_features

# Importing the package imports neither torch nor timm (the config schema reads the registry before
# torch loads); these names load their module on first use (PEP 562).
_EXPORTS = {
    "class_names": "classes", "explain_backend": "dali_loader", "resolve_backend": "dali_loader",
    "build_dataset": "datasets", "calib_indices": "datasets", "num_classes": "datasets", "split_positions": "datasets",
    "FeatureEvalLoader": "feature_loaders", "FeatureTrainLoader": "feature_loaders",
    "EvalLoader": "loaders", "TrainLoader": "loaders",
    "build_train_loader": "batches", "build_eval_loader": "batches", "build_mixup": "batches",
}


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = ["DATASETS", "dataset_names", "dataset_spec", "is_features", "build_dataset", "num_classes", "class_names",
           "calib_indices", "split_positions", "build_train_loader", "build_eval_loader", "build_mixup", "TrainLoader",
           "EvalLoader",
           "explain_backend", "resolve_backend"]
