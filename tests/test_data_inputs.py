"""Data inputs: 16-bit PNGs scaled (not clipped) to 8 bits, undecodable eval images dropped (not
duplicated) and counted, class names of every dataset and their check against a run's."""
import os
import struct
import zlib
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

import data
from common.errors import UserError
from configs.schema import DataConfig
from data import builtin, cifar
from data.classes import ALLOW_FLAG, check_class_names, class_mismatch, class_names, load_class_names, save_class_names
from data.imagefolder import ImageFolderDataset, to_rgb


def write_png16(path, values, color_type):
    """A 16-bit PNG written by hand (PNG spec: IHDR, one zlib IDAT with filter 0 rows, IEND), so the
    fixture does not depend on the library under test. color_type 0 = gray (H, W), 2 = RGB (H, W, 3)."""
    arr = np.asarray(values, dtype=">u2")
    h, w = arr.shape[:2]
    raw = b"".join(b"\x00" + arr[y].tobytes() for y in range(h))

    def chunk(kind, payload):
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    header = struct.pack(">IIBBBBB", w, h, 16, color_type, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw))
                + chunk(b"IEND", b""))


RAMP = np.linspace(0, 65535, 16 * 16).round().astype(np.uint16).reshape(16, 16)  # the whole 16-bit range


def _load_one(path):
    ds = ImageFolderDataset([(path, 0)], ["c"])
    img, label, skipped = ds.load(0)
    return np.asarray(img), skipped


@pytest.mark.parametrize("writer", ["by_hand", "pillow"])
def test_16bit_grayscale_png_is_scaled_not_clipped(tmp_path, writer):
    path = str(tmp_path / "g16.png")
    if writer == "by_hand":
        write_png16(path, RAMP, color_type=0)
    else:
        Image.fromarray(RAMP).save(path)
    assert Image.open(path).mode in ("I;16", "I;16B", "I")  # what the loader meets
    rgb, _ = _load_one(path)
    assert rgb.dtype == np.uint8 and rgb.shape == (16, 16, 3)
    assert (rgb == 255).mean() < 0.01  # PIL's convert("RGB") made ~99.6% of these pixels white
    expected = RAMP.astype(np.float64) / 257.0
    for c in range(3):
        assert np.abs(rgb[..., c] - expected).max() <= 0.5 + 1e-9  # round(v / 257)
    assert rgb[0, 0, 0] == 0 and rgb[-1, -1, 0] == 255


def test_16bit_rgb_png_and_integer_modes(tmp_path):
    path = str(tmp_path / "rgb16.png")
    write_png16(path, np.stack([RAMP, RAMP[::-1], RAMP.T], axis=-1), color_type=2)
    rgb, _ = _load_one(path)
    for c, plane in enumerate((RAMP, RAMP[::-1], RAMP.T)):
        assert np.abs(rgb[..., c] - plane / 257.0).max() < 1.0
    # mode "I" (32-bit ints holding 16-bit values, as older Pillow opens 16-bit PNGs)
    as_i = Image.fromarray(RAMP.astype(np.int32))
    assert as_i.mode == "I"
    assert np.abs(np.asarray(to_rgb(as_i))[..., 1] - RAMP / 257.0).max() <= 0.5 + 1e-9
    with pytest.raises(UserError) as err:
        to_rgb(Image.fromarray(np.full((2, 2), 70000, np.int32)), "big.tif")
    assert "big.tif" in str(err.value) and "\n" not in str(err.value)
    # 8-bit images are untouched
    eight = np.arange(48, dtype=np.uint8).reshape(4, 4, 3)
    assert np.array_equal(np.asarray(to_rgb(Image.fromarray(eight))), eight)


def _folder(root, n_per_class=4, corrupt=(), classes=("ant", "bee", "cat")):
    """val/ with n_per_class decodable PNGs per class (+ corrupt files named in `corrupt` as (class, name))."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in classes:
            d = os.path.join(root, split, c)
            os.makedirs(d, exist_ok=True)
            for i in range(n_per_class):
                Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(os.path.join(d, f"{i}.png"))
    for c, name in corrupt:
        with open(os.path.join(root, "val", c, name), "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n definitely not a png")


def _cfg(root, **kw):
    kw.setdefault("num_workers", 0)
    return DataConfig(dataset="imagefolder", root=str(root), image_size=16, batch_size=4, eval_batch_size=5,
                      skip_corrupt=True, **kw)


@pytest.mark.parametrize("workers", [0, 2])
def test_eval_skips_undecodable_images_without_duplicating(tmp_path, workers):
    # "1_bad.png" sorts between 1.png and 2.png: the old code evaluated 2.png twice in its place
    _folder(str(tmp_path), corrupt=[("bee", "1_bad.png")])
    cfg = _cfg(tmp_path, num_workers=workers)
    ds = data.build_dataset(cfg, "val")
    assert len(ds) == 13
    loader = data.build_eval_loader(ds, cfg, rank=0, world_size=1)
    images, labels = [], []
    for x, y in loader:
        images.append(x)
        labels.extend(y.tolist())
    assert len(labels) == 12 and Counter(labels) == {0: 4, 1: 4, 2: 4}  # n = decodable images
    flat = torch.cat(images).flatten(1)
    assert len({tuple(v.tolist()) for v in flat}) == 12  # no image evaluated twice
    assert loader.skipped == 1 and ds.skipped == 1


def test_eval_batch_of_only_undecodable_images_is_dropped_and_train_still_replaces(tmp_path):
    _folder(str(tmp_path), n_per_class=1, classes=("ant",),
            corrupt=[("ant", f"z{i}.png") for i in range(6)])  # batch 2 (5 per batch) is all corrupt
    cfg = _cfg(tmp_path)
    ds = data.build_dataset(cfg, "val")
    loader = data.build_eval_loader(ds, cfg, rank=0, world_size=1)
    batches = [y.tolist() for _, y in loader]
    assert batches == [[0]] and loader.skipped == 6
    # training keeps fixed batch shapes: a corrupt sample is replaced by the next decodable one
    train_ds = data.build_dataset(cfg, "val")
    train_loader = data.build_train_loader(train_ds, cfg, seed=0, epoch=0, rank=0, world_size=1)
    shapes = [x.shape[0] for x, _ in train_loader]
    assert shapes and all(s == cfg.batch_size for s in shapes)


# ----------------------------------------------------------------------------- class names
def test_class_names_of_every_dataset(tmp_path):
    assert class_names(DataConfig(dataset="builtin10")) == list(builtin.SHAPES)
    names100 = class_names(DataConfig(dataset="builtin100"))
    assert len(set(names100)) == 100 and names100[37] == f"{builtin.SHAPES[7]}_hue3"
    assert class_names(DataConfig(dataset="cifar10"))[:3] == ["airplane", "automobile", "bird"]
    c100 = class_names(DataConfig(dataset="cifar100"))
    assert len(c100) == len(set(c100)) == 100 and c100 == sorted(c100)  # the meta file's order is alphabetical
    assert c100[:2] == ["apple", "aquarium_fish"] and c100[-1] == "worm"
    assert all(len(class_names(DataConfig(dataset=n))) == data.num_classes(DataConfig(dataset=n))
               for n in ("builtin10", "builtin100", "cifar10", "cifar100"))
    _folder(str(tmp_path), n_per_class=1, classes=("zebra", "ant", "moth"))
    cfg = _cfg(tmp_path)
    assert class_names(cfg) == ["ant", "moth", "zebra"] == data.build_dataset(cfg, "val").class_names
    assert data.class_names is class_names


def test_class_names_stored_and_checked(tmp_path):
    run = str(tmp_path)
    assert load_class_names(run) is None
    save_class_names(run, ["ant", "bee", "cat"])
    stored = load_class_names(run)
    assert stored == ["ant", "bee", "cat"]
    assert check_class_names(stored, ["ant", "bee", "cat"], run_dir=run) is True
    # same count, other folders: the silent relabelling the check exists for
    with pytest.raises(UserError) as err:
        check_class_names(stored, ["ant", "cat", "dog"], run_dir=run)
    msg = str(err.value)
    assert "\n" not in msg and ALLOW_FLAG in msg and run in msg
    assert "label 1: 'bee' (run) vs 'cat' (data)" in msg and "2 label(s)" in msg
    warnings = []
    assert check_class_names(stored, ["ant", "cat", "dog"], allow_mismatch=True, warn=warnings.append) is False
    assert ALLOW_FLAG in warnings[0]
    assert check_class_names(None, ["x"], warn=warnings.append) is False and "no class names" in warnings[-1]
    assert "3 classes in the run, 2 in the data" in class_mismatch(stored, ["ant", "bee"])
    with open(os.path.join(run, "classes.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(UserError, match="classes.json is unreadable"):
        load_class_names(run)


def test_cifar_names_are_the_archives_counts():
    # the class count is the number of names (data/registry.py); CIFAR-10/100 name 10/100 distinct labels
    for name, k in (("cifar10", 10), ("cifar100", 100)):
        assert len(set(cifar.CLASS_NAMES[name])) == len(cifar.CLASS_NAMES[name]) == k
