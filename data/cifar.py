"""CIFAR-10/100 from the official python-pickle layouts (Krizhevsky, 2009).

    ROOT/cifar-10-batches-py/{data_batch_1..5, test_batch}
    ROOT/cifar-100-python/{train, test}

A missing folder is filled from the official archive in ROOT (cifar-10-python.tar.gz /
cifar-100-python.tar.gz) if present, else downloaded with torchvision when `download` is on.
Every failure becomes one UserError line naming the path and the fix. The batch files are pickles,
so they are read with an unpickler that only admits what a numpy array needs.
"""
import contextlib
import io
import os
import pickle
import tarfile

import numpy as np
import torch
import torchvision

from common.errors import UserError

from .arrays import ArrayDataset
from .names import CIFAR

SPECS = CIFAR  # the archives' layout (data/names.py)

# Label index -> name, as in the archives' batches.meta / meta files (label_names, fine_label_names).
CLASS_NAMES = {
    "cifar10": ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
    "cifar100": tuple("""apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus
        butterfly camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup
        dinosaur dolphin elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower
        leopard lion lizard lobster man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid
        otter palm_tree pear pickup_truck pine_tree plain plate poppy porcupine possum rabbit raccoon ray
        road rocket rose sea seal shark shrew skunk skyscraper snail snake spider squirrel streetcar
        sunflower sweet_pepper table tank telephone television tiger tractor train trout tulip turtle
        wardrobe whale willow_tree wolf woman worm""".split()),
}

_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),  # how python 3 writes bytes at protocol 2 (fixtures, re-saved files)
}


class _NumpyOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"unexpected object {module}.{name} in a CIFAR batch file")
        if module == "numpy.core.multiarray":  # numpy 2 moved it; avoid the deprecation shim
            module = "numpy._core.multiarray" if hasattr(np, "_core") else module
        return super().find_class(module, name)


def _one_line(e):
    return " ".join(f"{type(e).__name__}: {e}".split())


def _read_batch(path, label_key):
    if not os.path.isfile(path):
        raise UserError(f"missing CIFAR batch file {path}; re-extract the official archive into "
                        f"{os.path.dirname(os.path.dirname(path))}")
    try:
        with open(path, "rb") as f:
            d = _NumpyOnlyUnpickler(f, encoding="bytes").load()
        images = np.asarray(d[b"data"], dtype=np.uint8)
        labels = np.asarray(d[label_key], dtype=np.int64)
        if images.ndim != 2 or images.shape[1] != 3072 or len(labels) != len(images):
            raise ValueError(f"data has shape {images.shape} for {len(labels)} labels, expected (N, 3072)")
    except UserError:
        raise
    except Exception as e:  # truncated pickle, wrong keys, garbage: name the file
        raise UserError(f"corrupt or truncated CIFAR batch file {path} ({_one_line(e)}); delete it and "
                        "re-extract/re-download the dataset") from None
    return images.reshape(-1, 3, 32, 32), labels


def _ensure_folder(name, root, download):
    spec = SPECS[name]
    folder = os.path.join(root, spec["folder"])
    if os.path.isdir(folder):
        return folder
    archive = os.path.join(root, spec["archive"])
    hint = (f"place {spec['archive']} or its extracted folder {spec['folder']}/ in {os.path.abspath(root)}")
    if os.path.isfile(archive):
        try:
            with tarfile.open(archive, "r:gz") as tar:
                tar.extractall(root, filter="data")
        except Exception as e:
            raise UserError(f"cannot extract {archive} ({_one_line(e)}); {hint}") from None
    elif download:
        os.makedirs(root, exist_ok=True)
        try:  # torchvision prints its progress to stdout; keep that off our single error line
            with contextlib.redirect_stdout(io.StringIO()):
                getattr(torchvision.datasets, spec["tv_class"])(root, train=True, download=True)
        except Exception as e:
            raise UserError(f"{spec['title']} not found in {os.path.abspath(folder)} and the download failed "
                            f"({_one_line(e)}); {hint}") from None
    else:
        raise UserError(f"{spec['title']} not found in {os.path.abspath(folder)}; {hint} "
                        "(or set data.download=true)")
    if not os.path.isdir(folder):
        raise UserError(f"{spec['title']}: expected folder {os.path.abspath(folder)} after extraction; {hint}")
    return folder


def load_cifar(name, root, split, download=True):
    """-> (uint8 tensor (N, 3, 32, 32), int64 labels (N,), num_classes). split: 'train' | 'val'."""
    spec, k = SPECS[name], len(CLASS_NAMES[name])
    folder = _ensure_folder(name, root, download)
    parts = [_read_batch(os.path.join(folder, f), spec["label_key"]) for f in spec[split]]
    images = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    if labels.size and (labels.min() < 0 or labels.max() >= k):
        raise UserError(f"CIFAR labels out of range 0..{k - 1} in {folder}; is this {spec['title']}?")
    return torch.from_numpy(images), torch.from_numpy(labels), k


def class_names(data_cfg, name):
    return list(CLASS_NAMES[name])


def build_split(data_cfg, split, name):
    """Split 'train' or 'val' of CIFAR `name` under data.root (data/registry.py declares both)."""
    images, labels, k = load_cifar(name, data_cfg.root, split, data_cfg.download)
    return ArrayDataset(images, labels, k, name=name)
