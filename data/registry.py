"""The datasets, one declaration each: the single source of what a dataset is.

A `DatasetSpec` holds a dataset's name and one-line doc, the splits it stores, how to read one
(`build`) and its class names (`classes`: the class count is their number, never written
apart), the crop recipe data.train_crop=auto means for it (`train_crop`), whether a split is one uint8
tensor in memory (`in_memory`: the device fast path), whether the DALI path reads it (`dali`:
encoded image files), its out-of-distribution partner (`ood`: what `--ood-dataset auto` means),
whether it reads data.root (`files`: False for generated data), whether it is cached features
rather than images (`features`: no pixels, no transform, its own loaders) and whether its images are
gray (`grayscale`: stored in three equal channels; the eval transform turns any image gray first).

Everything else reads from here: the config schema's data.dataset choices and help
(configs/schema.py, `--help-config`), build_dataset / num_classes (data/datasets.py), class_names
(data/classes.py), the default recipe and the in-memory path (data/transforms.py), DALI
eligibility (data/dali_loader.py), the loaders (data/__init__.py), the OOD default and the OOD
names (evaluation/ood_report.py) and the features path (`is_features`, asked nowhere else).

Adding a dataset: write its module with
    build(data_cfg, split) -> a dataset of (PIL image, label) items with `num_classes`, `__len__`,
        `subset(indices)` and `transform` (an `ArrayDataset`, data/arrays.py, when in_memory);
        `split` is one of its `splits`; the calib split, when not stored, is held out of train;
    class names: a function data_cfg -> [label index -> name];
then add `toy = DeferredModule("data.toy")` and one `register(DatasetSpec(...))` below, naming the
module's functions as `_call(toy, "build_split")` or in a lambda: the declarations are read without
torch (the config loader checks data.dataset before torch loads), so the module is imported when a
split is first read, not here. An out-of-distribution set is declared the same way
and named as another's `ood` (OOD evaluation reads only its val split and ignores its labels, so
its class names may be its partner's, as builtin10_ood's are).
The schema's choices and help, the loaders, DALI, OOD and --help-config follow with no other edit;
tests/test_dataset_registry.py checks exactly that on a copy of the tree.

A declaration must be complete and consistent (checked at registration: ValueError, a programming
error): a new identifier, a doc line, callables, stored splits that include train and val, a
known crop recipe, DALI only for file datasets, features sets neither in memory nor DALI nor gray, and
(checked once all are declared) an OOD partner that is a declared image dataset.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Dict, List, Optional, Tuple

from common.errors import UserError
from common.lazy import DeferredModule

from .names import CIFAR, CROP_RECIPES, FAR_OOD_KINDS, IDX, SPLITS

# The readers, imported on first use: the declarations below are read without torch (the config
# loader checks data.dataset before torch loads).
builtin, cifar, far_ood, features, idx, imagefolder, shards = (
    DeferredModule(f"data.{name}")
    for name in ("builtin", "cifar", "far_ood", "features", "idx", "imagefolder", "shards"))


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    doc: str  # one line for --help-config
    build: Callable  # (data_cfg, split) -> dataset; split in `splits`
    classes: Callable[..., List[str]]  # data_cfg -> class names, label index order
    splits: Tuple[str, ...] = ("train", "val")  # stored splits; calib is held out of train when not stored
    train_crop: str = "pad"  # the crop recipe data.train_crop=auto means for it (data/transforms.py)
    in_memory: bool = False  # each split is one uint8 tensor (ArrayDataset): batch augmentation on the device
    dali: bool = False  # encoded image files the DALI path can decode (data/dali_loader.py)
    ood: Optional[str] = None  # the dataset `--ood-dataset auto` means for this one
    files: bool = True  # reads data.root (False: generated)
    features: bool = False  # cached pre-logit features (data/features.py): no pixels, its own loaders
    grayscale: bool = False  # gray images in three equal channels: eval turns any image gray (data/transforms.py)


DATASETS: Dict[str, DatasetSpec] = {}


def _fail(name, what):
    raise ValueError(f"dataset declaration '{name}' is incomplete: {what}")


def _validate(spec: DatasetSpec) -> None:
    if not (isinstance(spec.name, str) and spec.name.isidentifier()):
        _fail(spec.name, "name must be an identifier")
    if spec.name in DATASETS:
        _fail(spec.name, "declared twice")
    if not (isinstance(spec.doc, str) and spec.doc.strip()):
        _fail(spec.name, "doc (one line for --help-config) is missing")
    if not (callable(spec.build) and callable(spec.classes)):
        _fail(spec.name, "build and classes must be callables")
    if not {"train", "val"} <= set(spec.splits) <= set(SPLITS):
        _fail(spec.name, f"splits must include train and val, within {', '.join(SPLITS)}")
    if spec.train_crop not in CROP_RECIPES:
        _fail(spec.name, f"train_crop must be one of {', '.join(CROP_RECIPES)}")
    for flag in ("in_memory", "dali", "files", "features", "grayscale"):
        if not isinstance(getattr(spec, flag), bool):
            _fail(spec.name, f"flag '{flag}' must be True or False")
    if spec.dali and not spec.files:
        _fail(spec.name, "dali needs image files (files=True)")
    if spec.features and (spec.in_memory or spec.dali or spec.grayscale):
        _fail(spec.name, "a features set has no pixels: in_memory, dali and grayscale must be False")
    if spec.ood is not None and not isinstance(spec.ood, str):
        _fail(spec.name, "ood must be a dataset name or None")


def check_ood_partners() -> None:
    """Every declared OOD partner is a declared image dataset (run once all are declared)."""
    for spec in DATASETS.values():
        if spec.ood is not None and (spec.ood not in DATASETS or DATASETS[spec.ood].features):
            _fail(spec.name, f"its OOD partner '{spec.ood}' must be a declared image dataset")


def register(spec: DatasetSpec) -> DatasetSpec:
    _validate(spec)
    DATASETS[spec.name] = spec
    return spec


def dataset_names(**flags) -> Tuple[str, ...]:
    """Declared names, in declaration order; with flags (e.g. dali=True), those whose spec has them."""
    return tuple(n for n, s in DATASETS.items() if all(getattr(s, k) == v for k, v in flags.items()))


def dataset_spec(name: str) -> DatasetSpec:
    spec = DATASETS.get(name)
    if spec is None:
        raise UserError(f"unknown data.dataset '{name}'; valid: {', '.join(DATASETS)}")
    return spec


def is_features(data_cfg) -> bool:
    """Whether data_cfg reads cached features (a linear head on them) rather than images."""
    return dataset_spec(data_cfg.dataset).features


def describe_datasets() -> str:
    """'name: doc; ...' of every dataset, for the schema's help of data.dataset."""
    return "; ".join(f"{n}: {s.doc}" for n, s in DATASETS.items())


# ------------------------------------------------------------------------------- the declarations
def _call(module, function, **bound):
    """module.function(*args, **bound), looked up at the call: a deferred module loads when a set is read."""
    return lambda *args: getattr(module, function)(*args, **bound)


def _builtin(num_classes, family):
    return dict(build=_call(builtin, "build_split", num_classes=num_classes, family=family),
                classes=lambda data_cfg: builtin.class_names(num_classes), in_memory=True, files=False)


register(DatasetSpec("builtin10", "10 generated shapes (offline, no files)", ood="builtin10_ood",
                     **_builtin(10, "id")))
register(DatasetSpec("builtin100", "10 generated shapes x 10 hues", ood="builtin100_ood", **_builtin(100, "id")))
register(DatasetSpec("builtin10_ood", "builtin10's OOD set: 10 other outlines, same renderer",
                     **_builtin(10, "ood")))
register(DatasetSpec("builtin100_ood", "builtin100's OOD set: the other outlines in 10 hues",
                     **_builtin(100, "ood")))
for _kind in FAR_OOD_KINDS:  # far OOD sets for any dataset and image size (data/far_ood.py)
    register(DatasetSpec(f"{_kind}_ood", f"far OOD: generated {_kind} images (offline, any image size)",
                         _call(far_ood, "build_split", kind=_kind),
                         partial(lambda data_cfg, k: [k], k=_kind),
                         in_memory=True, files=False))
for _name in CIFAR:
    register(DatasetSpec(_name, f"{CIFAR[_name]['title']} (ROOT/{CIFAR[_name]['folder']})",
                         _call(cifar, "build_split", name=_name), _call(cifar, "class_names", name=_name),
                         in_memory=True))
# The MNIST family (data/idx.py). Far OOD partners: clothing (Fashion-MNIST) for the pen strokes of the
# digits and characters, digits (MNIST) for clothing.
for _name, _ood in (("fashion_mnist", "mnist"), ("mnist", "fashion_mnist"), ("kmnist", "fashion_mnist")):
    register(DatasetSpec(_name, f"{IDX[_name]['title']}, 28 px gray (ROOT/{IDX[_name]['folder']}/raw, IDX files)",
                         _call(idx, "build_split", name=_name), _call(idx, "class_names", name=_name),
                         in_memory=True, ood=_ood, grayscale=True))
register(DatasetSpec("imagefolder", "ROOT/train|val/<class>/*",
                     _call(imagefolder, "build_split"),
                     lambda data_cfg: imagefolder.find_classes(data_cfg.root), train_crop="rrc", dali=True))
register(DatasetSpec("shards", "tar shards of scripts/make_shards.py",
                     _call(shards, "build_split"),
                     lambda data_cfg: shards.class_names(data_cfg.root), train_crop="rrc", dali=True))
register(DatasetSpec("features", "cached features of scripts/extract_features.py (a linear head on them)",
                     _call(features, "build_split"),
                     lambda data_cfg: features.class_names(data_cfg.root),
                     splits=SPLITS, features=True))
check_ood_partners()

__all__ = ["DatasetSpec", "DATASETS", "register", "check_ood_partners", "dataset_names", "dataset_spec", "is_features",
           "describe_datasets"]
