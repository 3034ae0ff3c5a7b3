"""Tar shards (data/shards.py, scripts/make_shards.py) on the PIL path: round trip, order, errors."""
import collections
import hashlib
import os

import numpy as np
import pytest
import torch
from PIL import Image

import data
from common.errors import UserError
from configs.schema import DataConfig
from data import shards

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_folder(root, n_train=14, n_val=6, classes=3, seed=0):
    """Small ImageFolder tree with mixed sizes and modes (RGB, grayscale, CMYK JPEGs, one PNG)."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("val", n_val)):
        for i in range(n):
            d = os.path.join(root, split, f"class_{i % classes}")
            os.makedirs(d, exist_ok=True)
            h, w = int(rng.integers(24, 70)), int(rng.integers(24, 70))
            im = Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8))
            ext = ".png" if i == 4 else ".jpg"
            if i % 5 == 1:
                im = im.convert("L")
            elif i % 5 == 2:
                im = im.convert("CMYK")
            im.save(os.path.join(d, f"img{i:03d}{ext}"))
    return root


def pixel_key(img):
    return hashlib.sha1(np.asarray(img.convert("RGB")).tobytes()).hexdigest()


@pytest.fixture(scope="module")
def folder_and_shards(tmp_path_factory):
    base = tmp_path_factory.mktemp("shards")
    folder = write_folder(str(base / "folder"))
    out = str(base / "shards")
    index = shards.write_shards(folder, out, max_count=4, log=lambda *_: None)
    return folder, out, index


@pytest.mark.parametrize("split", ["train", "val"])
def test_round_trip_same_images_labels_and_order(folder_and_shards, split):
    folder, out, index = folder_and_shards
    cfg_f = DataConfig(dataset="imagefolder", root=folder, image_size=32)
    cfg_s = DataConfig(dataset="shards", root=out, image_size=32)
    ds_f, ds_s = data.build_dataset(cfg_f, split), data.build_dataset(cfg_s, split)
    assert ds_s.classes == ds_f.classes == index["classes"]
    assert data.num_classes(cfg_s) == data.num_classes(cfg_f) == 3
    pairs_f = [(pixel_key(ds_f.load(i)[0]), ds_f.load(i)[1]) for i in range(len(ds_f))]
    pairs_s = [(pixel_key(ds_s.load(i)[0]), ds_s.load(i)[1]) for i in range(len(ds_s))]
    assert collections.Counter(pairs_s) == collections.Counter(pairs_f)  # the multiset the issue asks for
    assert pairs_s == pairs_f  # and the order, so both formats give the same batches
    # byte-identical payloads, several shards (max_count=4)
    assert all(ds_s.read_bytes(i) == open(ds_f.samples[i][0], "rb").read() for i in range(len(ds_s)))
    assert len(index["splits"][split]) == -(-len(ds_f) // 4)


def test_pil_loader_batches_identical_on_folder_and_shards(folder_and_shards):
    folder, out, _ = folder_and_shards
    common = dict(image_size=32, batch_size=4, num_workers=0, auto_augment="rand-m9-mstd0.5-inc1", reprob=0.25)
    cfg_f = DataConfig(dataset="imagefolder", root=folder, **common)
    cfg_s = DataConfig(dataset="shards", root=out, **common)
    ds_f, ds_s = data.build_dataset(cfg_f, "train"), data.build_dataset(cfg_s, "train")
    for rank in (0, 1):
        got_f = list(data.build_train_loader(ds_f, cfg_f, seed=3, epoch=1, rank=rank, world_size=2))
        got_s = list(data.build_train_loader(ds_s, cfg_s, seed=3, epoch=1, rank=rank, world_size=2))
        assert len(got_f) == len(got_s) > 0
        for (xf, yf), (xs, ys) in zip(got_f, got_s):
            assert torch.equal(yf, ys) and torch.equal(xf, xs)


def test_tar_headers_are_read_when_the_sidecar_is_missing(folder_and_shards, tmp_path):
    folder, out, index = folder_and_shards
    import shutil

    copy = str(tmp_path / "noidx")
    shutil.copytree(out, copy)
    for name in os.listdir(copy):
        if name.endswith(".idx"):
            os.remove(os.path.join(copy, name))
    a = shards.ShardDataset.from_root(out, "train")
    b = shards.ShardDataset.from_root(copy, "train")
    assert [s[1] for s in a.samples] == [s[1] for s in b.samples]
    assert [loc[1:] for loc in a.locations] == [loc[1:] for loc in b.locations]
    assert all(a.read_bytes(i) == b.read_bytes(i) for i in range(len(a)))


def test_missing_index_and_split_are_one_line_errors(folder_and_shards, tmp_path):
    _, out, _ = folder_and_shards
    with pytest.raises(UserError) as e:
        data.build_dataset(DataConfig(dataset="shards", root=str(tmp_path)), "train")
    assert "\n" not in str(e.value) and "make_shards.py" in str(e.value)
    shards.write_shards(write_folder(str(tmp_path / "f"), n_val=0), str(tmp_path / "s"), log=lambda *_: None)
    with pytest.raises(UserError) as e:
        data.build_dataset(DataConfig(dataset="shards", root=str(tmp_path / "s")), "val")
    assert "\n" not in str(e.value) and "'val'" in str(e.value)


def test_corrupt_member_same_message_and_skip_as_folder(tmp_path):
    folder = write_folder(str(tmp_path / "folder"), n_train=9, n_val=3)
    bad = os.path.join(folder, "train", "class_0", "img003.jpg")
    with open(bad, "wb") as f:
        f.write(b"definitely not a jpeg")
    shards.write_shards(folder, str(tmp_path / "s"), log=lambda *_: None)
    cfg_f = DataConfig(dataset="imagefolder", root=folder, image_size=32, batch_size=3, num_workers=0)
    cfg_s = DataConfig(dataset="shards", root=str(tmp_path / "s"), image_size=32, batch_size=3, num_workers=0)
    msgs = []
    for cfg in (cfg_f, cfg_s):
        ds = data.build_dataset(cfg, "train")
        with pytest.raises(UserError) as e:
            list(data.build_train_loader(ds, cfg, seed=0, epoch=0, rank=0, world_size=1))
        msgs.append(str(e.value))
    assert "\n" not in msgs[1] and "(UnidentifiedImageError)" in msgs[1] and "data.skip_corrupt=true" in msgs[1]
    assert msgs[1].split(" (")[1:] == msgs[0].split(" (")[1:]  # same text after the file name
    labels = []
    for cfg in (cfg_f, cfg_s):
        cfg.skip_corrupt = True
        ds = data.build_dataset(cfg, "train")
        labels.append([y.tolist() for _, y in data.build_train_loader(ds, cfg, seed=0, epoch=0, rank=0, world_size=1)])
        assert ds.skipped == 1
    assert labels[0] == labels[1]


def _make_shards_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_shards", os.path.join(ROOT, "scripts", "make_shards.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_shards_cli(tmp_path, capsys):
    """The script's main() in-process (a subprocess would spend seconds importing torch and timm)."""
    script = _make_shards_script()
    folder = write_folder(str(tmp_path / "folder"), n_train=7, n_val=3)
    out = tmp_path / "out"
    assert script.main([folder, str(out), "--max-count", "3"]) == 0
    assert sorted(p.name for p in out.glob("*.tar")) == ["train-000000.tar", "train-000001.tar", "train-000002.tar",
                                                          "val-000000.tar"]
    assert "train: 7 images in 3 shard(s)" in capsys.readouterr().out
    for argv in ([str(tmp_path / "nope"), str(tmp_path / "o2")], [folder, str(tmp_path / "o3"), "--max-count", "0"]):
        with pytest.raises(UserError) as e:
            script.main(argv)
        assert "\n" not in str(e.value)
