"""build_dataset / num_classes: a split of the declared dataset (data/registry.py), with the
calibration hold-out and its transform; what the registry reads, the split asked for is checked here."""
import numpy as np
import torch

from common.errors import UserError
from common.seeding import mix_seed

from .arrays import ArrayDataset
from .names import SPLITS
from .registry import dataset_spec
from .transforms import build_eval_transform, build_train_transform


def _check(cfg, split):
    """What the config loader cannot know: the split asked for and what it needs. The keys' own
    choices and ranges were checked when the config was loaded (configs/schema.py)."""
    if split not in SPLITS:
        raise UserError(f"unknown split '{split}'; valid: {', '.join(SPLITS)}")
    if split == "calib" and cfg.calib_fraction <= 0 and "calib" not in dataset_spec(cfg.dataset).splits:
        raise UserError("the calib split needs data.calib_fraction > 0 (e.g. data.calib_fraction=0.1)")
    if cfg.backend == "dali":
        from .dali_loader import check_dali_config

        check_dali_config(cfg)


def num_classes(cfg):
    """Number of classes of cfg.dataset: the number of its class names (scans ROOT/train for imagefolder)."""
    return len(dataset_spec(cfg.dataset).classes(cfg))


def calib_indices(n, fraction):
    """The held-out calibration indices of a train split of size n: a fixed function of (n, fraction),
    independent of the training seed, so train and eval agree on it."""
    k = int(round(n * fraction))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(mix_seed(0xCA11B, n))).numpy()
    return np.sort(perm[:k])


def build_dataset(cfg, split):
    """split 'train' | 'val' | 'calib' -> dataset with `num_classes`, items (tensor, label).

    A split the dataset stores (its declaration's `splits`) is read as stored. A calib split it does
    not store is a deterministic `calib_fraction` of the train split (then excluded from 'train');
    it carries the eval transform, 'train' the train transform. Cached features are read as
    extracted (their builder checks their settings; no pixels, no transform).
    """
    spec = dataset_spec(cfg.dataset)
    if spec.features:
        return spec.build(cfg, split)
    _check(cfg, split)
    stored = split if split in spec.splits else "train"
    ds = spec.build(cfg, stored)
    if spec.in_memory and not isinstance(ds, ArrayDataset):
        raise ValueError(f"dataset '{spec.name}' is declared in_memory but its build gave a {type(ds).__name__}")
    if stored == "train" and "calib" not in spec.splits and cfg.calib_fraction > 0:
        held = calib_indices(len(ds), cfg.calib_fraction)
        keep = held if split == "calib" else np.setdiff1d(np.arange(len(ds)), held)
        ds = ds.subset(keep)
    native = getattr(ds, "native_size", None)
    ds.transform = build_train_transform(cfg, native) if split == "train" else build_eval_transform(cfg, native)
    if len(ds) == 0:
        raise UserError(f"the {split} split of {cfg.dataset} is empty")
    return ds
