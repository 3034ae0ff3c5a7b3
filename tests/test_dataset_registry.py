"""The dataset registry (data/registry.py) is the one place a dataset is declared: a declaration is
checked, and everything the data code, the config schema and evaluation know about a dataset they
read from it; a new dataset is its module plus one declaration (checked on a copy of the tree)."""
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

import data
from common.errors import UserError
from configs.schema import CHOICES, DataConfig
from data import registry
from data.arrays import ArrayDataset
from evaluation import ood_report
from project_files import copy_project
from test_idx_datasets import write_idx_set

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TOY_MODULE = '''"""toy: 3 classes of flat grey images, a stand-in dataset for the registry test."""
import torch

from .arrays import ArrayDataset

CLASSES = ("dark", "mid", "light")


def build_split(data_cfg, split):
    n = 24 if split == "train" else 12
    labels = torch.arange(n) % len(CLASSES)
    images = (labels * 100).to(torch.uint8).view(n, 1, 1, 1).expand(n, 3, data_cfg.image_size, data_cfg.image_size)
    return ArrayDataset(images.contiguous(), labels, len(CLASSES), name="toy")
'''
TOY_DECLARATION = ('toy = DeferredModule("data.toy")\n'
                   'register(DatasetSpec("toy", "three grey levels (a test stand-in)", _call(toy, "build_split"), '
                   'lambda data_cfg: list(toy.CLASSES), in_memory=True, files=False, ood="builtin10_ood"))\n')


def _toy_spec(**changes):
    def build(data_cfg, split):
        n = {"train": 24, "val": 12, "calib": 5}[split]
        labels = torch.arange(n) % 3
        return ArrayDataset(torch.full((n, 3, 8, 8), 7, dtype=torch.uint8), labels, 3, name="toy")

    spec = registry.DatasetSpec("toy_inproc", "a throwaway dataset", build, lambda data_cfg: ["a", "b", "c"],
                                in_memory=True, files=False, ood="builtin10_ood")
    return replace(spec, **changes)


@pytest.fixture
def throwaway():
    spec = registry.register(_toy_spec())
    yield spec
    del registry.DATASETS[spec.name]


def test_every_fact_is_read_from_the_declarations():
    specs = registry.DATASETS
    assert CHOICES["data.dataset"] == tuple(specs)
    assert {n for n, s in specs.items() if s.dali} == {"imagefolder", "shards"}
    assert {n: s.ood for n, s in specs.items() if s.ood} == {"builtin10": "builtin10_ood",
                                                              "builtin100": "builtin100_ood",
                                                              "fashion_mnist": "mnist", "mnist": "fashion_mnist",
                                                              "kmnist": "fashion_mnist"}
    assert [n for n, s in specs.items() if s.grayscale] == ["fashion_mnist", "mnist", "kmnist"]
    assert [n for n, s in specs.items() if s.features] == ["features"]
    assert "features" not in ood_report.ood_dataset_names()
    # class counts are the number of names: builtin10/100 and CIFAR-10/100 as the archives have them
    for name, k in (("builtin10", 10), ("builtin100_ood", 100), ("cifar10", 10), ("cifar100", 100),
                    ("fashion_mnist", 10), ("mnist", 10), ("kmnist", 10)):
        assert data.num_classes(DataConfig(dataset=name)) == len(data.class_names(DataConfig(dataset=name))) == k


def test_a_throwaway_declaration_reaches_the_loader_dali_and_ood(throwaway):
    cfg = DataConfig(dataset=throwaway.name, image_size=8, builtin_train_size=24, batch_size=8, calib_fraction=0.25)
    train, calib = data.build_dataset(cfg, "train"), data.build_dataset(cfg, "calib")
    assert (len(train), len(calib), data.num_classes(cfg), data.class_names(cfg)) == (18, 6, 3, ["a", "b", "c"])
    loader = data.build_train_loader(train, cfg, seed=0, epoch=0, rank=0, world_size=1)
    assert loader.uses_memory_path  # declared in_memory: the device batch path
    x, y = next(iter(loader))
    assert x.shape == (8, 3, 8, 8) and y.dtype == torch.int64
    assert data.explain_backend(replace(cfg, backend="auto"))[0] == "pil"
    with pytest.raises(UserError, match="data.backend=dali supports data.dataset imagefolder or shards"):
        data.build_dataset(replace(cfg, backend="dali"), "val")
    assert ood_report.resolve_ood_dataset("auto", throwaway.name) == "builtin10_ood"
    assert throwaway.name in ood_report.ood_dataset_names()


# Each declared file dataset, with the files of its official layout written in tmp_path: (writer, its
# image size). The same contract as the throwaway declaration's above.
FILE_DATASETS = {name: (write_idx_set, 28) for name in ("fashion_mnist", "mnist", "kmnist")}


@pytest.mark.parametrize("name", FILE_DATASETS)
def test_a_declared_file_dataset_meets_the_contract(tmp_path, name):
    """Its stored splits read through the registry, calib and tune held out of train as for every set,
    the device batch path, its classes, DALI refused, and its OOD partner one of --ood-dataset's names."""
    write, size = FILE_DATASETS[name]
    write(str(tmp_path), name, n_train=50, n_test=20)
    spec = registry.dataset_spec(name)
    cfg = DataConfig(dataset=name, root=str(tmp_path), image_size=size, download=False, batch_size=8,
                     calib_fraction=0.2, tune_fraction=0.25)
    sizes = {split: len(data.build_dataset(cfg, split)) for split in ("train", "calib", "tune", "val")}
    assert sizes == {"train": 30, "calib": 10, "tune": 10, "val": 20}
    assert data.num_classes(cfg) == len(data.class_names(cfg)) == 10
    loader = data.build_train_loader(data.build_dataset(cfg, "train"), cfg, seed=0, epoch=0, rank=0, world_size=1)
    assert loader.uses_memory_path == spec.in_memory
    x, y = next(iter(loader))
    assert x.shape == (8, 3, size, size) and y.dtype == torch.int64
    with pytest.raises(UserError, match="data.backend=dali supports data.dataset imagefolder or shards"):
        data.build_dataset(replace(cfg, backend="dali"), "val")
    assert ood_report.resolve_ood_dataset("auto", name) == spec.ood and spec.ood in ood_report.ood_dataset_names()


def test_a_stored_calib_split_is_read_as_stored_not_held_out_of_train():
    spec = registry.register(_toy_spec(name="toy_with_calib", splits=("train", "val", "calib")))
    try:
        cfg = DataConfig(dataset=spec.name, image_size=8)
        assert (len(data.build_dataset(cfg, "calib")), len(data.build_dataset(cfg, "train"))) == (5, 24)
    finally:
        del registry.DATASETS[spec.name]


@pytest.mark.parametrize("changes, what", [
    (dict(name="toy-set"), "identifier"), (dict(name="cifar10"), "declared twice"), (dict(doc=" "), "doc"),
    (dict(build=None), "callables"), (dict(splits=("train",)), "train and val"),
    (dict(train_crop="random"), "train_crop must be one of pad, rrc"), (dict(dali=True), "dali needs image files"),
    (dict(features=True), "no pixels"), (dict(in_memory="yes"), "flag 'in_memory'")])
def test_an_incomplete_declaration_is_refused(changes, what):
    with pytest.raises(ValueError, match=what):
        registry.register(_toy_spec(**changes))
    assert "toy_inproc" not in registry.DATASETS


def test_an_ood_partner_must_be_a_declared_image_dataset(throwaway):
    registry.register(_toy_spec(name="toy_bad_partner", ood="features"))
    try:
        with pytest.raises(ValueError, match="OOD partner 'features'"):
            registry.check_ood_partners()
    finally:
        del registry.DATASETS["toy_bad_partner"]
    with pytest.raises(UserError, match="--ood auto: cifar10 has no built-in OOD set .*--ood imagefolder"):
        ood_report.resolve_ood_dataset("auto", "cifar10", flag="--ood")
    with pytest.raises(UserError, match="unknown --ood-dataset 'features'; valid: auto, builtin10,"):
        ood_report.resolve_ood_dataset("features", "builtin10")
    with pytest.raises(UserError, match="unknown --ood-dataset 'builtin10_od'; did you mean 'builtin10_ood'"):
        ood_report.resolve_ood_dataset("builtin10_od", "builtin10")


def test_a_new_dataset_is_its_module_and_one_declaration(tmp_path):
    """On a copy of the tree: add data/toy.py and one line in data/registry.py, nothing else; then
    `train.py --help-config data.dataset=toy` lists and accepts it, and the loader trains on it."""
    tree = tmp_path / "tree"
    copy_project(tree)  # the tracked files only: never a user's .venv, runs/ or features/
    (tree / "data" / "toy.py").write_text(TOY_MODULE)
    reg = tree / "data" / "registry.py"
    text = reg.read_text()
    text = text.replace("\ncheck_ood_partners()\n", "\n" + TOY_DECLARATION + "check_ood_partners()\n", 1)
    reg.write_text(text)
    def changed(path):
        original = os.path.join(ROOT, path.relative_to(tree))
        return not os.path.isfile(original) or open(original).read() != path.read_text()

    touched = sorted(str(p.relative_to(tree)) for p in tree.rglob("*.py") if changed(p))
    assert touched == ["data/registry.py", "data/toy.py"]
    script = (
        "import sys, io, contextlib, configs, train, data\n"
        "assert 'torch' not in sys.modules, 'the declaration made the config check import torch'\n"
        "from configs.loader import apply_overrides, config_from_dict\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    train.main(['--help-config', 'data.dataset=toy', 'data.image_size=8'])\n"
        "line = [l for l in out.getvalue().splitlines() if l.strip().startswith('dataset:')][0]\n"
        "assert line.strip().startswith('dataset: toy') and '|toy' in line and 'toy: three grey levels' in line, line\n"
        "cfg = config_from_dict(apply_overrides({}, ['data.dataset=toy', 'data.image_size=8', 'data.batch_size=6']))\n"
        "ds = data.build_dataset(cfg.data, 'train')\n"
        "x, y = next(iter(data.build_train_loader(ds, cfg.data, seed=0, epoch=0, rank=0, world_size=1)))\n"
        "assert x.shape == (6, 3, 8, 8) and data.class_names(cfg.data) == ['dark', 'mid', 'light']\n"
        "from evaluation.ood_report import resolve_ood_dataset\n"
        "assert resolve_ood_dataset('auto', 'toy') == 'builtin10_ood'\n"
        "print('ok')\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-c", script], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
