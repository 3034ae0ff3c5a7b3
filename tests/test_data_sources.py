"""Dataset sources: CIFAR pickles, ImageFolder, built-in dataset (generated fixtures, no network)."""
import hashlib
import os
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

import data
from common.errors import UserError
from configs.schema import DataConfig


def write_cifar(root, name, n_train=120, n_test=40, seed=0):
    """Write a tiny CIFAR-10/100 in the official python-pickle layout (protocol 2, bytes keys)."""
    rng = np.random.default_rng(seed)
    if name == "cifar10":
        folder, files, key, k = "cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], b"labels", 10
        test_files = ["test_batch"]
    else:
        folder, files, key, k = "cifar-100-python", ["train"], b"fine_labels", 100
        test_files = ["test"]
    os.makedirs(os.path.join(root, folder), exist_ok=True)
    expected = {}
    for split, names, n in (("train", files, n_train), ("val", test_files, n_test)):
        imgs, labels = [], []
        for f in names:
            m = n // len(names)
            x = rng.integers(0, 256, size=(m, 3072), dtype=np.uint8)
            y = [int(v) for v in rng.integers(0, k, size=m)]
            d = {b"batch_label": b"x", b"data": x, key: y, b"filenames": [b"f.png"] * m}
            if name == "cifar100":
                d[b"coarse_labels"] = [v // 5 for v in y]
            with open(os.path.join(root, folder, f), "wb") as fh:
                pickle.dump(d, fh, protocol=2)
            imgs.append(x)
            labels.extend(y)
        expected[split] = (np.concatenate(imgs).reshape(-1, 3, 32, 32), np.array(labels))
    return os.path.join(root, folder), expected


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_pickles_read_through_real_loader(tmp_path, name):
    _, expected = write_cifar(str(tmp_path), name)
    cfg = DataConfig(dataset=name, root=str(tmp_path), download=False)
    for split in ("train", "val"):
        ds = data.build_dataset(cfg, split)
        assert ds.num_classes == (10 if name == "cifar10" else 100) == data.num_classes(cfg)
        assert np.array_equal(ds.images.numpy(), expected[split][0])
        assert np.array_equal(ds.labels.numpy(), expected[split][1])
        x, y = ds[3]  # PIL path item: HWC pixels of the CHW row
        assert x.shape == (3, 32, 32) and y == expected[split][1][3]


def test_cifar_missing_files_one_line_message(tmp_path):
    cfg = DataConfig(dataset="cifar10", root=str(tmp_path / "nowhere"), download=False)
    with pytest.raises(UserError) as e:
        data.build_dataset(cfg, "train")
    msg = str(e.value)
    assert "\n" not in msg and "cifar-10-python.tar.gz" in msg and "cifar-10-batches-py" in msg
    assert str(tmp_path / "nowhere") in msg


def test_cifar_download_failure_is_one_line(tmp_path, monkeypatch):
    import torchvision

    def boom(*a, **k):
        raise OSError("network unreachable\nsecond line")

    monkeypatch.setattr(torchvision.datasets, "CIFAR100", boom)
    cfg = DataConfig(dataset="cifar100", root=str(tmp_path), download=True)
    with pytest.raises(UserError) as e:
        data.build_dataset(cfg, "train")
    assert "\n" not in str(e.value) and "cifar-100-python.tar.gz" in str(e.value) and \
        "network unreachable" in str(e.value)


def test_cifar_corrupt_batch_names_file(tmp_path):
    folder, _ = write_cifar(str(tmp_path), "cifar10")
    bad = os.path.join(folder, "data_batch_3")
    with open(bad, "rb") as f:
        blob = f.read()
    with open(bad, "wb") as f:
        f.write(blob[: len(blob) // 2])  # truncated
    cfg = DataConfig(dataset="cifar10", root=str(tmp_path), download=False)
    with pytest.raises(UserError) as e:
        data.build_dataset(cfg, "train")
    assert bad in str(e.value) and "\n" not in str(e.value)
    data.build_dataset(cfg, "val")  # the other split is still fine


def test_cifar_archive_is_extracted(tmp_path):
    import tarfile

    src = tmp_path / "src"
    write_cifar(str(src), "cifar10")
    with tarfile.open(tmp_path / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(src / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    ds = data.build_dataset(DataConfig(dataset="cifar10", root=str(tmp_path), download=False), "val")
    assert len(ds) == 40


def make_imagefolder(root, corrupt=False, empty_class=False, extra_val_class=False, size=40):
    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("val", 3)):
        for c in ("cat", "ant", "dog"):
            d = os.path.join(root, split, c)
            os.makedirs(d, exist_ok=True)
            for i in range(n):
                arr = rng.integers(0, 256, size=(size, size + 8, 3), dtype=np.uint8)
                ext = ".png" if i % 2 else ".JPEG"
                Image.fromarray(arr).save(os.path.join(d, f"{i}{ext}"))
    if corrupt:
        with open(os.path.join(root, "train", "dog", "bad.jpg"), "wb") as f:
            f.write(b"\xff\xd8\xff\xe0 definitely not a jpeg")
    if empty_class:
        os.makedirs(os.path.join(root, "train", "emu"))
    if extra_val_class:
        d = os.path.join(root, "val", "yak")
        os.makedirs(d)
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(os.path.join(d, "0.png"))


def _folder_cfg(root, **kw):
    kw.setdefault("num_workers", 0)
    return DataConfig(dataset="imagefolder", root=str(root), image_size=32, batch_size=4, eval_batch_size=5, **kw)


def test_imagefolder_classes_sorted_and_shared(tmp_path):
    make_imagefolder(str(tmp_path))
    cfg = _folder_cfg(tmp_path)
    tr, va = data.build_dataset(cfg, "train"), data.build_dataset(cfg, "val")
    assert tr.classes == va.classes == ["ant", "cat", "dog"] and data.num_classes(cfg) == 3
    assert len(tr) == 18 and len(va) == 9
    assert sorted(set(tr.labels)) == [0, 1, 2]
    x, y = va[0]
    assert x.shape == (3, 32, 32) and y == 0
    xb, yb = next(iter(data.build_train_loader(tr, cfg, seed=0, epoch=0, rank=0, world_size=1)))
    assert xb.shape == (4, 3, 32, 32) and xb.dtype == torch.float32


@pytest.mark.parametrize("kind,needle", [("empty_class", "emu"), ("extra_val_class", "yak")])
def test_imagefolder_layout_errors(tmp_path, kind, needle):
    make_imagefolder(str(tmp_path), **{kind: True})
    with pytest.raises(UserError) as e:
        data.build_dataset(_folder_cfg(tmp_path), "val" if kind == "extra_val_class" else "train")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_imagefolder_missing_split(tmp_path):
    make_imagefolder(str(tmp_path))
    os.rename(tmp_path / "val", tmp_path / "validation")
    with pytest.raises(UserError, match="no 'val' folder"):
        data.build_dataset(_folder_cfg(tmp_path), "val")


@pytest.mark.parametrize("workers", [0, 2])
def test_imagefolder_corrupt_file_error_or_skip(tmp_path, workers):
    make_imagefolder(str(tmp_path), corrupt=True)
    bad = os.path.join(str(tmp_path), "train", "dog", "bad.jpg")
    cfg = _folder_cfg(tmp_path, num_workers=workers)
    ds = data.build_dataset(cfg, "train")
    assert len(ds) == 19
    with pytest.raises(UserError) as e:
        for _ in data.build_eval_loader(ds, cfg, rank=0, world_size=1):
            pass
    assert bad in str(e.value) and "\n" not in str(e.value)

    cfg = _folder_cfg(tmp_path, num_workers=workers, skip_corrupt=True)
    ds = data.build_dataset(cfg, "train")
    n = sum(len(y) for _, y in data.build_eval_loader(ds, cfg, rank=0, world_size=1))
    assert n == 18 and ds.skipped == 1 and bad in ds.skipped_files  # eval drops it (not replaced), counted once


@pytest.fixture
def one_thread():
    """Generation is many small elementwise ops: with other test processes on the 2 cores, one
    thread is several times faster than two fighting for them."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_builtin_deterministic_disjoint_balanced(tmp_path, one_thread):
    cfg = DataConfig(dataset="builtin10", builtin_train_size=600, builtin_val_size=200, cache_dir=str(tmp_path))
    from data import builtin

    a = builtin.generate(10, 600, 32, 0, 1)
    b = builtin.generate(10, 600, 32, 0, 1)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    c = builtin.generate(10, 100, 32, 1, 1)
    assert not torch.equal(a[0][:100], c[0])
    tr, va = data.build_dataset(cfg, "train"), data.build_dataset(cfg, "val")
    assert torch.equal(tr.images, a[0])  # cached path returns the same bytes
    assert tr.images.dtype == torch.uint8 and tr.images.shape == (600, 3, 32, 32)
    assert torch.bincount(tr.labels, minlength=10).tolist() == [60] * 10
    assert torch.bincount(va.labels, minlength=10).tolist() == [20] * 10
    digest = lambda t: {hashlib.sha1(x.numpy().tobytes()).hexdigest() for x in t}  # noqa: E731
    assert not digest(tr.images) & digest(va.images)
    assert len(digest(tr.images)) == 600
    assert any(f.endswith(".npz") for f in os.listdir(tmp_path))  # disk cache written
    # the 100-class variant, other image size
    cfg100 = DataConfig(dataset="builtin100", image_size=40, builtin_train_size=300, builtin_val_size=100,
                        cache_dir=str(tmp_path))
    ds = data.build_dataset(cfg100, "train")
    assert ds.num_classes == 100 and ds.images.shape[1:] == (3, 40, 40)
    assert torch.bincount(ds.labels, minlength=100).tolist() == [3] * 100
    # real variation: images of one class differ a lot
    same = tr.images[tr.labels == 0].float()
    assert (same - same.mean(0)).abs().mean() > 20


def test_calib_split_is_held_out_of_train(tmp_path, one_thread):
    cfg = DataConfig(dataset="builtin10", builtin_train_size=500, builtin_val_size=100, calib_fraction=0.2,
                     cache_dir=str(tmp_path))
    tr, ca = data.build_dataset(cfg, "train"), data.build_dataset(cfg, "calib")
    assert len(tr) == 400 and len(ca) == 100
    full = data.build_dataset(DataConfig(dataset="builtin10", builtin_train_size=500, builtin_val_size=100,
                                         cache_dir=str(tmp_path)), "train")
    idx = data.calib_indices(500, 0.2)
    assert torch.equal(ca.images, full.images[torch.as_tensor(idx)])
    keys = lambda t: {x.numpy().tobytes() for x in t}  # noqa: E731
    assert not keys(tr.images) & keys(ca.images)
    assert len(keys(tr.images) | keys(ca.images)) == 500
    with pytest.raises(UserError, match="calib_fraction"):
        data.build_dataset(DataConfig(dataset="builtin10", cache_dir=str(tmp_path)), "calib")


def test_config_errors_list_valid_names():
    with pytest.raises(UserError, match="builtin10.*imagefolder"):
        data.build_dataset(DataConfig(dataset="cifar1O"), "train")
    with pytest.raises(UserError, match="train, val, calib"):
        data.build_dataset(DataConfig(), "test")
    with pytest.raises(UserError, match="pad"):
        data.build_dataset(DataConfig(train_crop="random"), "train")
