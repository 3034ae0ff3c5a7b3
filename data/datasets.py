"""build_dataset / num_classes: dispatch on DataConfig.dataset, the calibration and tuning hold-outs, validation."""
import numpy as np
import torch
from PIL import Image

from common.errors import UserError
from common.seeding import mix_seed

from . import builtin, cifar, features, imagefolder, shards
from .names import DATASET_NAMES, SPLITS
from .transforms import build_eval_transform, build_train_transform

# builtin*_ood: other outlines through the same renderer, the out-of-distribution set of builtin10/100.
_BUILTIN_CLASSES = {"builtin10": 10, "builtin100": 100, "builtin10_ood": 10, "builtin100_ood": 100}


class ArrayDataset:
    """A split held as one uint8 tensor (N, 3, H, W) + int64 labels: the in-memory fast path uses
    `images`/`labels` directly; indexing gives (transform(PIL image), label) like any dataset."""

    in_memory_capable = True

    def __init__(self, images, labels, num_classes, transform=None, name=""):
        self.images = images
        self.labels = labels
        self.num_classes = num_classes
        self.transform = transform
        self.name = name
        self.native_size = images.shape[-1]

    def __len__(self):
        return len(self.labels)

    def subset(self, indices):
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        return ArrayDataset(self.images[idx], self.labels[idx], self.num_classes, self.transform, self.name)

    def load(self, i, replace_corrupt=True):
        """-> (PIL image, label, []) (same signature as ImageFolderDataset.load; nothing is corrupt here)."""
        return Image.fromarray(self.images[i].permute(1, 2, 0).numpy()), int(self.labels[i]), []

    def __getitem__(self, i):
        img, label, _ = self.load(i)
        return (self.transform(img) if self.transform is not None else img), label


def _check(cfg, split):
    """What the config loader cannot know: the split asked for and what it needs. The keys' own
    choices and ranges were checked when the config was loaded (configs/schema.py)."""
    if split not in SPLITS:
        raise UserError(f"unknown split '{split}'; valid: {', '.join(SPLITS)}")
    if split == "calib" and cfg.calib_fraction <= 0:
        raise UserError("the calib split needs data.calib_fraction > 0 (e.g. data.calib_fraction=0.1)")
    if cfg.backend == "dali":
        from .dali_loader import check_dali_config

        check_dali_config(cfg)


def num_classes(cfg):
    """Number of classes of cfg.dataset (scans ROOT/train for imagefolder)."""
    if cfg.dataset in _BUILTIN_CLASSES:
        return _BUILTIN_CLASSES[cfg.dataset]
    if cfg.dataset in cifar.SPECS:
        return cifar.SPECS[cfg.dataset]["num_classes"]
    if cfg.dataset == "imagefolder":
        return len(imagefolder.find_classes(cfg.root))
    if cfg.dataset == "shards":
        return shards.num_classes(cfg.root)
    if cfg.dataset == "features":
        return features.num_classes(cfg.root)
    raise UserError(f"unknown data.dataset '{cfg.dataset}'; valid: {', '.join(DATASET_NAMES)}")


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


def _raw_split(cfg, split):
    if cfg.dataset in _BUILTIN_CLASSES:
        n = cfg.builtin_train_size if split == "train" else cfg.builtin_val_size
        images, labels = builtin.load_split(_BUILTIN_CLASSES[cfg.dataset], split, n, cfg.image_size,
                                            cfg.builtin_seed, cfg.cache_dir,
                                            family="ood" if cfg.dataset.endswith("_ood") else "id")
        return ArrayDataset(images, labels, _BUILTIN_CLASSES[cfg.dataset], name=cfg.dataset)
    if cfg.dataset in cifar.SPECS:
        images, labels, k = cifar.load_cifar(cfg.dataset, cfg.root, split, cfg.download)
        return ArrayDataset(images, labels, k, name=cfg.dataset)
    if cfg.dataset == "shards":
        return shards.ShardDataset.from_root(cfg.root, split, skip_corrupt=cfg.skip_corrupt)
    if cfg.dataset == "imagefolder":
        samples, classes = imagefolder.scan_split(cfg.root, split)
        return imagefolder.ImageFolderDataset(samples, classes, skip_corrupt=cfg.skip_corrupt)
    raise UserError(f"unknown data.dataset '{cfg.dataset}'; valid: {', '.join(DATASET_NAMES)}")


def build_dataset(cfg, split):
    """split 'train' | 'val' | 'calib' | 'tune' -> dataset with `num_classes`, items (tensor, label).

    'calib' is a deterministic `calib_fraction` of the train split, 'tune' a deterministic
    `tune_fraction` of what is left (split_positions); both are excluded from 'train' and carry
    the eval transform. 'train' carries the train transform.
    """
    if split == "tune" and cfg.tune_fraction <= 0:
        raise UserError("the tune split needs data.tune_fraction > 0 (e.g. data.tune_fraction=0.1)")
    if features.is_features(cfg):  # cached features: splits extracted as they are (calib held out already)
        return features.build_split(cfg, split, lambda n: split_positions(n, 0.0, cfg.tune_fraction))
    _check(cfg, split)
    ds = _raw_split(cfg, "val" if split == "val" else "train")
    if split != "val" and (cfg.calib_fraction > 0 or cfg.tune_fraction > 0):
        ds = ds.subset(split_positions(len(ds), cfg.calib_fraction, cfg.tune_fraction)[split])
    native = getattr(ds, "native_size", None)
    ds.transform = build_train_transform(cfg, native) if split == "train" else build_eval_transform(cfg, native)
    if len(ds) == 0:
        raise UserError(f"the {split} split of {cfg.dataset} is empty")
    return ds
