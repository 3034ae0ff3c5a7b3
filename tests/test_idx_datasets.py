"""Fashion-MNIST, MNIST and Kuzushiji-MNIST (data/idx.py) from IDX files this test writes in the
official format (big-endian header, magic 0x00000803 for images and 0x00000801 for labels, gzip) in
torchvision's folders, never the real data: each split reads back as written (gray in the three
channels), Debian's folder and decompressed files are read too, a colour image reaches a gray model
gray, each damaged or missing file is one line, and a tiny train.py / eval.py / predict.py chain runs
on them. The registry contract of each set is in tests/test_dataset_registry.py."""
import gzip
import json
import os
import struct

import numpy as np
import pytest
import torch
from PIL import Image

import data
from common.errors import UserError
from configs.schema import DataConfig
from data.transforms import build_eval_transform, eval_transform
from test_train_helpers import ROOT, main_inprocess, reset_accelerate_state, tiny_cfg, write_cfg

# The official layout, written out here rather than read from data/ (an independent reference).
FOLDERS = {"fashion_mnist": "FashionMNIST", "mnist": "MNIST", "kmnist": "KMNIST"}
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "val": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
IMAGES_MAGIC, LABELS_MAGIC = 0x00000803, 0x00000801


def idx_bytes(array, magic):
    """An IDX file: the magic number, each dimension as a big-endian uint32, then the uint8 values."""
    return struct.pack(f">I{array.ndim}I", magic, *array.shape) + np.ascontiguousarray(array, np.uint8).tobytes()


def make_split(n, seed):
    """n 28x28 images and labels 0..9: label k is a bright bar on rows 2k..2k+3 over dark noise."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n, dtype=np.uint8) % 10
    rng.shuffle(labels)
    images = rng.integers(0, 60, (n, 28, 28), dtype=np.uint8)
    for i, k in enumerate(labels):
        images[i, 2 * k + 2:2 * k + 6, 4:24] = 230
    return images, labels


def write_idx_set(root, name, n_train=60, n_test=20, seed=0, folder=None, gz=True):
    """The four files of `name` in ROOT/<torchvision folder>/raw (or ROOT/`folder`), gzipped or not;
    -> {split: (images (N, 28, 28), labels (N,))} as written."""
    where = os.path.join(root, folder or os.path.join(FOLDERS[name], "raw"))
    os.makedirs(where, exist_ok=True)
    written = {}
    for split, n, offset in (("train", n_train, 0), ("val", n_test, 1)):
        images, labels = make_split(n, seed * 2 + offset)
        for base, blob in zip(FILES[split], (idx_bytes(images, IMAGES_MAGIC), idx_bytes(labels, LABELS_MAGIC))):
            path = os.path.join(where, base + (".gz" if gz else ""))
            with open(path, "wb") as f:
                f.write(gzip.compress(blob) if gz else blob)
        written[split] = (images, labels)
    return written


@pytest.fixture(autouse=True)
def _no_system_datasets(tmp_path_factory, monkeypatch):
    """This machine's installed dataset-fashion-mnist stays out of these tests: they read only what they wrote."""
    monkeypatch.setattr("data.idx.SYSTEM_ROOT", str(tmp_path_factory.mktemp("no-system-datasets")))


def config(name, root, **changes):
    return DataConfig(**{"dataset": name, "root": str(root), "image_size": 28, "download": False, **changes})


def assert_reads_as_written(cfg, written):
    for split, (images, labels) in written.items():
        ds = data.build_dataset(cfg, split)
        assert ds.images.shape == (len(images), 3, 28, 28) and ds.images.dtype == torch.uint8
        for c in range(3):  # the gray value in every channel
            assert torch.equal(ds.images[:, c], torch.from_numpy(images))
        assert torch.equal(ds.labels, torch.from_numpy(labels.astype(np.int64)))


@pytest.mark.parametrize("name", sorted(FOLDERS))
def test_each_split_reads_the_files_as_written(tmp_path, name):
    written = write_idx_set(tmp_path, name, seed=len(name))
    assert_reads_as_written(config(name, tmp_path), written)


def test_debians_folder_and_decompressed_files_are_read(tmp_path):
    """Debian's dataset-fashion-mnist layout (ROOT/fashion-mnist/*.gz: data.root=/usr/share/datasets) and the
    decompressed files torchvision's download leaves beside the .gz."""
    debian = write_idx_set(tmp_path / "debian", "fashion_mnist", folder="fashion-mnist")
    assert_reads_as_written(config("fashion_mnist", tmp_path / "debian"), debian)
    plain = write_idx_set(tmp_path / "plain", "mnist", gz=False, seed=3)
    assert_reads_as_written(config("mnist", tmp_path / "plain"), plain)
    with pytest.raises(UserError, match="MNIST: no train-images-idx3-ubyte.gz"):  # MNIST is never read from there
        data.build_dataset(config("mnist", tmp_path / "debian"), "train")


def _one_line(cfg, split="train"):
    with pytest.raises(UserError) as err:
        data.build_dataset(cfg, split)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_missing_files_say_where_to_put_them(tmp_path):
    folder = os.path.join(os.path.abspath(tmp_path), "FashionMNIST", "raw") + os.sep
    message = _one_line(config("fashion_mnist", tmp_path))
    assert message.startswith("Fashion-MNIST: no train-images-idx3-ubyte.gz under")
    assert (f"put the official train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and "
            f"t10k-labels-idx1-ubyte.gz in {folder} (or apt-get install dataset-fashion-mnist: its "
            f"/usr/share/datasets/fashion-mnist/ is read whatever data.root)") in message
    assert message.endswith("(or set data.download=true)")
    kmnist = _one_line(config("kmnist", tmp_path))
    assert os.path.join(os.path.abspath(tmp_path), "KMNIST", "raw") + os.sep in kmnist and "apt-get" not in kmnist
    write_idx_set(tmp_path, "mnist")
    os.remove(tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz")
    assert _one_line(config("mnist", tmp_path), "val").startswith("MNIST: no t10k-labels-idx1-ubyte.gz under")


def _damage(folder, how):
    images, labels = (os.path.join(folder, f + ".gz") for f in FILES["train"])
    if how == "swapped":
        os.replace(labels, images + ".tmp")
        os.replace(images, labels)
        os.replace(images + ".tmp", images)
    elif how == "truncated gzip":
        blob = open(images, "rb").read()
        open(images, "wb").write(blob[:len(blob) // 2])
    elif how == "truncated data":
        blob = gzip.decompress(open(images, "rb").read())
        open(images, "wb").write(gzip.compress(blob[:-28]))
    elif how == "extra data":
        blob = gzip.decompress(open(images, "rb").read())
        open(images, "wb").write(gzip.compress(blob + b"\0"))
    elif how == "label count":
        blob = gzip.decompress(open(labels, "rb").read())
        open(labels, "wb").write(gzip.compress(struct.pack(">II", LABELS_MAGIC, 59) + blob[8:-1]))
    elif how == "image size":
        images_32 = np.zeros((60, 32, 32), np.uint8)
        open(images, "wb").write(gzip.compress(idx_bytes(images_32, IMAGES_MAGIC)))
    elif how == "label range":
        blob = gzip.decompress(open(labels, "rb").read())
        open(labels, "wb").write(gzip.compress(blob[:-1] + b"\x0a"))


DAMAGES = {  # how -> the line (a regular expression)
    "swapped": r"train-images-idx3-ubyte.gz is not an IDX images file: magic number 0x00000801, expected "
               r"0x00000803 \(an IDX labels file: are the file names swapped\?\); fetch the official file again",
    "truncated gzip": r"train-images-idx3-ubyte.gz is truncated or damaged \(EOFError: .*\); fetch the official",
    "truncated data": r"train-images-idx3-ubyte.gz is truncated: its header declares 60 x 28 x 28 values \(47056 "
                      r"bytes in all\) but it holds 47028 bytes; fetch the official file again",
    "extra data": r"train-images-idx3-ubyte.gz has bytes past its data: .* holds 47057 bytes",
    "label count": r"train-labels-idx1-ubyte.gz holds 59 labels but .*train-images-idx3-ubyte.gz holds 60 images; "
                   r"the two files must be the same split of the same set",
    "image size": r"train-images-idx3-ubyte.gz holds 32x32 images; Fashion-MNIST's are 28x28: is this Fashion-MNIST",
    "label range": r"train-labels-idx1-ubyte.gz has label 10, outside 0..9: is this Fashion-MNIST",
}


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_file_is_one_line_naming_it(tmp_path, how):
    write_idx_set(tmp_path, "fashion_mnist")
    _damage(tmp_path / "FashionMNIST" / "raw", how)
    assert pytest.raises(UserError, data.build_dataset, config("fashion_mnist", tmp_path), "train").match(DAMAGES[how])
    assert "\n" not in _one_line(config("fashion_mnist", tmp_path))


def test_missing_files_are_downloaded_with_torchvision_when_asked(tmp_path, monkeypatch):
    """data.download=true hands a missing set to torchvision's class (here a stand-in that writes the files
    where torchvision's download puts them, or fails as it does offline, in several lines)."""
    written = {}

    class Downloads:
        def __init__(self, root, train, download):
            assert (train, download) == (True, True)
            written.update(write_idx_set(root, "kmnist", seed=5))

    monkeypatch.setattr("torchvision.datasets.KMNIST", Downloads)
    assert_reads_as_written(config("kmnist", tmp_path, download=True), written)

    class Offline:
        def __init__(self, root, train, download):
            raise RuntimeError("Error downloading train-images-idx3-ubyte.gz:\nTried http://mirror/, got:\n<urlopen>")

    monkeypatch.setattr("torchvision.datasets.FashionMNIST", Offline)
    message = _one_line(config("fashion_mnist", tmp_path / "offline", download=True))
    assert message.startswith("Fashion-MNIST not found under ")
    assert "the download failed (RuntimeError: Error downloading" in message
    assert message.endswith("is read whatever data.root)")


def test_a_gray_model_sees_a_colour_image_gray(tmp_path):
    """The eval transform of a gray set (what predict.py applies to user files) turns a colour photo into its
    gray version (Pillow's convert('L')) in all three channels, at any size; the set's own images are unchanged;
    a colour set keeps colour. The export's description says so."""
    rng = np.random.default_rng(0)
    photo = Image.fromarray(rng.integers(0, 256, (45, 31, 3), dtype=np.uint8))
    gray_cfg = config("fashion_mnist", tmp_path, mean=(0.3, 0.3, 0.3), std=(0.35, 0.35, 0.35))
    transform = build_eval_transform(gray_cfg, None)
    got = transform(photo)
    assert got.shape == (3, 28, 28) and torch.equal(got[0], got[1]) and torch.equal(got[0], got[2])
    assert torch.equal(got, transform(photo.convert("L").convert("RGB")))
    colour = build_eval_transform(config("cifar10", tmp_path, mean=(0.3,) * 3, std=(0.35,) * 3, image_size=28), None)
    assert not torch.equal(colour(photo)[0], colour(photo)[1])
    own = Image.fromarray(np.repeat(make_split(1, 0)[0][0][:, :, None], 3, axis=2))
    stored = build_eval_transform(gray_cfg, 28)
    assert torch.equal(stored(own), (torch.from_numpy(np.array(own)).permute(2, 0, 1) / 255.0 - 0.3) / 0.35)
    assert eval_transform(gray_cfg).describe()["color"] == "gray"
    assert eval_transform(config("cifar10", tmp_path)).describe()["color"] == "RGB"
    assert data.dataset_spec("fashion_mnist").grayscale and not data.dataset_spec("cifar10").grayscale


def test_the_export_consumer_turns_a_colour_image_gray_as_eval_does(tmp_path):
    """scripts/onnx_predict.py follows the sidecar's preprocessing.color: a gray set's model gets a colour photo
    as eval's transform gives it; the sidecar check refuses a colour it does not know."""
    import runpy

    from common import sidecar_format

    consumer = runpy.run_path(os.path.join(ROOT, "scripts", "onnx_predict.py"))
    cfg = config("fashion_mnist", tmp_path, mean=(0.3, 0.3, 0.3), std=(0.35, 0.35, 0.35))
    pre = eval_transform(cfg).describe()
    photo = Image.fromarray(np.random.default_rng(2).integers(0, 256, (31, 45, 3), dtype=np.uint8))
    got = torch.from_numpy(consumer["preprocess"](photo, pre))
    assert torch.allclose(got, build_eval_transform(cfg, None)(photo), atol=1e-5) and torch.equal(got[0], got[2])
    sidecar = {"format": "onnx", "output": "logits", "classes": list(data.class_names(cfg)), "preprocessing": pre}
    assert sidecar_format.check_sidecar(sidecar, "m.onnx.json") is sidecar
    pre["color"] = "grey"
    with pytest.raises(sidecar_format.SidecarError, match="'preprocessing.color' must be one of RGB, gray"):
        sidecar_format.check_sidecar(sidecar, "m.onnx.json")


# a few steps of a tiny model on generated Fashion-MNIST files (calib held out of train)
TINY_FASHION = ["data.dataset=fashion_mnist", "data.download=false", "data.image_size=28", "data.calib_fraction=0.2",
                "data.batch_size=16", "data.hflip=0", "data.mean=[0.286,0.286,0.286]", "data.std=[0.353,0.353,0.353]",
                "optim.epochs=1", "optim.lr_base_batch=16", "train.ema=false", "train.compile=false"]


def test_train_eval_and_predict_on_fashion_mnist_files(tmp_path, one_line_error):
    """train.py on generated Fashion-MNIST files (a few steps of a tiny model, calib held out of train);
    eval.py on its test split with --ood-dataset auto (MNIST, beside it under data.root); predict.py gives a
    colour photo the probabilities of its gray version. A missing set is train.py's one error line."""
    import eval as eval_entry
    import predict

    root, run = tmp_path / "data", tmp_path / "run"
    write_idx_set(root, "fashion_mnist", n_train=80, n_test=20)
    write_idx_set(root, "mnist", n_train=10, n_test=12, seed=4)
    config_file = write_cfg(tiny_cfg(run, f"data.root={root}", *TINY_FASHION), tmp_path / "fashion.yaml")
    done = main_inprocess("--config", config_file)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.load(open(run / "classes.json"))["classes"][0] == "T-shirt/top"

    reset_accelerate_state()
    out = str(tmp_path / "eval.json")
    assert eval_entry.main(["--checkpoint", str(run), "--output", out, "--quiet", "--ood-dataset", "auto"]) == 0
    result = json.load(open(out))
    assert result["n"] == 20 and 0.0 <= result["top1"] <= 1.0
    assert (result["ood"]["dataset"], result["ood"]["n_in"], result["ood"]["n_out"]) == ("mnist", 20, 12)

    rng = np.random.default_rng(1)
    photos = tmp_path / "photos"
    photos.mkdir()
    colour = Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8))
    colour.save(photos / "colour.png")
    colour.convert("L").save(photos / "gray.png")
    reset_accelerate_state()
    predictions = str(tmp_path / "predictions.jsonl")
    assert predict.main(["--checkpoint", str(run), "--images", str(photos), "--output", predictions]) == 0
    rows = {os.path.basename(r["path"]): r for r in map(json.loads, open(predictions))}
    assert rows["colour.png"]["topk"] == rows["gray.png"]["topk"] and len(rows["gray.png"]["topk"]) == 5

    error = one_line_error("train", ["--config", config_file, f"data.root={tmp_path / 'empty'}",
                                     f"train.output_dir={tmp_path / 'run2'}"])
    assert "Fashion-MNIST: no train-images-idx3-ubyte.gz under" in error and "FashionMNIST" in error


def test_the_installed_debian_package_is_found_whatever_data_root(tmp_path, monkeypatch):
    """data.root stays a writable folder (for a download); the package's folder is read after it."""
    installed = write_idx_set(tmp_path / "system", "fashion_mnist", folder="fashion-mnist", seed=7)
    monkeypatch.setattr("data.idx.SYSTEM_ROOT", str(tmp_path / "system"))
    assert_reads_as_written(config("fashion_mnist", tmp_path / "empty"), installed)
    with pytest.raises(UserError, match="MNIST: no train-images-idx3-ubyte.gz"):  # only Fashion-MNIST has a package
        data.build_dataset(config("mnist", tmp_path / "empty"), "train")


def test_compare_heads_reads_the_ood_set_before_anything_trains(tmp_path, capsys):
    """--ood-dataset auto on Fashion-MNIST is MNIST, which every evaluation reads: its missing files are one
    line before the first training (not after each), naming the way out; with the files there, the check
    reads them and says nothing."""
    import compare_heads
    from common.cli import run_cli
    from comparison import cli
    from comparison.command import check_ood_data

    root = tmp_path / "data"
    write_idx_set(root, "fashion_mnist", n_train=80, n_test=20)
    config_file = write_cfg(tiny_cfg(tmp_path / "unused", f"data.root={root}", *TINY_FASHION), tmp_path / "f.yaml")
    argv = ["--config", config_file, "--heads", "softmax", "--seeds", "0", "--no-mlflow",
            "--runs-dir", str(tmp_path / "runs")]
    with pytest.raises(SystemExit) as exit_:
        run_cli(compare_heads.main, argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1, err
    assert "--ood-dataset auto (mnist)" in err and "MNIST: no t10k-images-idx3-ubyte.gz" in err, err
    assert "--report-only" in err and err.endswith("--ood-dataset none"), err
    assert not os.path.exists(tmp_path / "runs" / "softmax-s0")  # nothing trained

    write_idx_set(root, "mnist", n_train=10, n_test=12, seed=4)
    args = cli.parse_args(argv)
    check_ood_data(args, cli.resolved_config(args), "mnist")
