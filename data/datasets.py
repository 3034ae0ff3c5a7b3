"""build_dataset / num_classes: a split of the declared dataset (data/registry.py), with the
calibration and tuning hold-outs and its transform; what the registry reads, the split asked for is checked here."""
import numpy as np
import torch

from common.errors import UserError
from common.seeding import mix_seed

from .arrays import ArrayDataset
from .dali_loader import check_dali_config
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
    if split == "tune" and cfg.tune_fraction <= 0:
        raise UserError("the tune split needs data.tune_fraction > 0 (e.g. data.tune_fraction=0.1)")
    if cfg.backend == "dali":
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


def tune_indices(n, fraction):
    """The tune split's positions among the n training examples left after the calib hold-out: a
    fixed function of (n, fraction) like calib_indices, with its own stream, so every head, seed
    and trial holds out the same examples."""
    k = int(round(n * fraction))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(mix_seed(0x7E5E, n))).numpy()
    return np.sort(perm[:k])


def split_positions(n, calib_fraction, tune_fraction):
    """{'train', 'calib', 'tune'}: disjoint sorted positions in a train split of n examples whose union
    is all of them. calib is held out first (calib_indices), tune from the rest (tune_indices)."""
    everything = np.arange(n)
    calib = calib_indices(n, calib_fraction) if calib_fraction > 0 else everything[:0]
    rest = np.setdiff1d(everything, calib)
    tune = rest[tune_indices(len(rest), tune_fraction)] if tune_fraction > 0 else everything[:0]
    return {"train": np.setdiff1d(rest, tune), "calib": calib, "tune": tune}


def build_dataset(cfg, split):
    """split 'train' | 'val' | 'calib' | 'tune' -> dataset with `num_classes`, items (tensor, label).

    A split the dataset stores (its declaration's `splits`) is read as stored. A calib split it does
    not store is a deterministic `calib_fraction` of the train split, 'tune' a deterministic
    `tune_fraction` of what train has left (split_positions); both are then excluded from 'train'
    and carry the eval transform, 'train' the train transform. Cached features are read as
    extracted (their builder checks their settings; no pixels, no transform), with tune held out
    of their train split here.
    """
    spec = dataset_spec(cfg.dataset)
    if spec.features:
        if split == "tune" or (split == "train" and cfg.tune_fraction > 0):
            _check(cfg, split)
            whole = spec.build(cfg, "train")
            return _nonempty(whole.subset(split_positions(len(whole), 0.0, cfg.tune_fraction)[split]), cfg, split)
        return spec.build(cfg, split)
    _check(cfg, split)
    stored = split if split in spec.splits and split != "tune" else "train"
    ds = spec.build(cfg, stored)
    if spec.in_memory and not isinstance(ds, ArrayDataset):
        raise ValueError(f"dataset '{spec.name}' is declared in_memory but its build gave a {type(ds).__name__}")
    calib_fraction = 0.0 if "calib" in spec.splits else cfg.calib_fraction  # a stored calib is not carved
    if stored == "train" and (calib_fraction > 0 or cfg.tune_fraction > 0):
        ds = ds.subset(split_positions(len(ds), calib_fraction, cfg.tune_fraction)[split])
    native = getattr(ds, "native_size", None)
    ds.transform = build_train_transform(cfg, native) if split == "train" else build_eval_transform(cfg, native)
    return _nonempty(ds, cfg, split)


def _nonempty(ds, cfg, split):
    if len(ds) == 0:
        raise UserError(f"the {split} split of {cfg.dataset} is empty")
    return ds
