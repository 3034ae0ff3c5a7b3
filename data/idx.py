"""The MNIST family from the official IDX files: Fashion-MNIST (Xiao et al., 2017), MNIST (LeCun et
al., 1998), Kuzushiji-MNIST (Clanuwat et al., 2018). Each is read from torchvision's layout

    ROOT/FashionMNIST/raw/{train,t10k}-images-idx3-ubyte[.gz], {train,t10k}-labels-idx1-ubyte[.gz]
    ROOT/MNIST/raw/...,  ROOT/KMNIST/raw/...

or, for Fashion-MNIST, from Debian's package (`apt-get install dataset-fashion-mnist` puts the four
.gz files in /usr/share/datasets/fashion-mnist/, read whatever data.root is; or ROOT/fashion-mnist/). A file is read as
published (.gz) or decompressed (torchvision's download leaves both; the decompressed one is read).
Missing files are downloaded with torchvision when data.download is on; otherwise, or when that
fails, one line says where to put them. The official test set is the val split; calib and tune are
held out of train (data/datasets.py).

Our own reader rather than torchvision's classes: those refuse a folder of .gz files alone (they
look for the decompressed ones) and check a file with asserts; here a wrong magic number, a
truncated file, images that are not 28x28 and a label file whose count differs from its image
file's are each one UserError line naming the file.

The images are gray; a split is an ArrayDataset of uint8 (N, 3, 28, 28) with the gray value in all
three channels, so that the model, the normalisation, the exports and predict.py take these sets as
they take any RGB data. The declarations say `grayscale` (data/registry.py): the eval transform
then turns a colour image given to predict.py into gray first (data/transforms.py).
"""
import contextlib
import gzip
import io
import os
import zlib

import numpy as np
import torch
import torchvision

from common.errors import UserError

from .arrays import ArrayDataset
from .names import DEBIAN_DATASETS, IDX, IDX_FILES

SIZE = 28  # every set of the family: 28 x 28 gray
SYSTEM_ROOT = DEBIAN_DATASETS  # read after data.root (tests point it at an empty folder)
MAGIC = {"images": 0x00000803, "labels": 0x00000801}  # unsigned bytes, 3 dimensions / 1 dimension

# Label index -> name: torchvision's (Fashion-MNIST's and KMNIST's as their authors publish them).
CLASS_NAMES = {
    "fashion_mnist": ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                      "Ankle boot"),
    "mnist": tuple("0123456789"),
    "kmnist": ("o", "ki", "su", "tsu", "na", "ha", "ma", "ya", "re", "wo"),
}


def class_names(data_cfg, name):
    return list(CLASS_NAMES[name])


def torchvision_folder(name, root):
    """ROOT/<folder>/raw: where torchvision's class reads and downloads `name`."""
    return os.path.join(root, IDX[name]["folder"], "raw")


def candidate_folders(name, root):
    """The folders `name` may be read from, in order: torchvision's under ROOT, then Debian's package
    folder under ROOT and where the package puts it (so data.root may stay a writable folder for a
    download while the installed package is found)."""
    folders = [torchvision_folder(name, root)]
    if IDX[name]["debian"] is not None:
        for base in (root, SYSTEM_ROOT):
            folder = os.path.join(base, IDX[name]["debian"][1])
            if folder not in folders:
                folders.append(folder)
    return folders


def _present(folder, base):
    """The path of IDX file `base` in folder (decompressed first, then .gz), None when neither is there."""
    for path in (os.path.join(folder, base), os.path.join(folder, base + ".gz")):
        if os.path.isfile(path):
            return path
    return None


def where_to_put(name, root):
    """The one-line fix for missing files: the exact folder and file names (and the Debian package)."""
    files = [f + ".gz" for pair in IDX_FILES.values() for f in pair]
    text = (f"put the official {', '.join(files[:-1])} and {files[-1]} in "
            f"{os.path.abspath(torchvision_folder(name, root))}{os.sep}")
    if IDX[name]["debian"] is not None:
        package, folder = IDX[name]["debian"]
        text += f" (or apt-get install {package}: its {DEBIAN_DATASETS}/{folder}/ is read whatever data.root)"
    return text


def _one_line(e):
    return " ".join(f"{type(e).__name__}: {e}".split())[:300]


def _download(name, root):
    """torchvision's download into ROOT/<folder>/raw; UserError (one line) when it fails."""
    spec = IDX[name]
    os.makedirs(root, exist_ok=True)
    try:  # torchvision prints its progress to stdout; keep that off our single error line
        with contextlib.redirect_stdout(io.StringIO()):
            getattr(torchvision.datasets, spec["tv_class"])(root, train=True, download=True)
    except Exception as e:
        raise UserError(f"{spec['title']} not found under {os.path.abspath(root)} and the download failed "
                        f"({_one_line(e)}); {where_to_put(name, root)}") from None


def split_files(name, root, split, download):
    """(images path, labels path) of `split` ('train' | 'val'), downloaded when missing and `download`."""
    needed = IDX_FILES[split]
    for folder in candidate_folders(name, root):
        paths = [_present(folder, base) for base in needed]
        if all(paths):
            return paths
    if download:
        _download(name, root)
        paths = [_present(torchvision_folder(name, root), base) for base in needed]
        if all(paths):
            return paths
    missing = next(base for base in needed if _present(torchvision_folder(name, root), base) is None)
    raise UserError(f"{IDX[name]['title']}: no {missing}.gz under {os.path.abspath(root)}; {where_to_put(name, root)}"
                    + ("" if download else " (or set data.download=true)"))


def _read_bytes(path):
    try:
        with open(path, "rb") as f:
            raw = f.read()
        return gzip.decompress(raw) if path.endswith(".gz") else raw
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise UserError(f"{path} is truncated or damaged ({_one_line(e)}); fetch the official file again") from None
    except OSError as e:
        raise UserError(f"cannot read {path} ({_one_line(e)})") from None


def read_idx(path, kind):
    """The uint8 array of an IDX file of `kind` ('images': (N, H, W); 'labels': (N,)), checked."""
    raw = _read_bytes(path)
    want = MAGIC[kind]
    magic = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
    if magic != want:
        other = next((k for k, m in MAGIC.items() if m == magic), None)
        found = "no 4-byte header" if magic is None else f"magic number 0x{magic:08X}"
        why = f" (an IDX {other} file: are the file names swapped?)" if other else ""
        raise UserError(f"{path} is not an IDX {kind} file: {found}, expected 0x{want:08X}{why}; fetch the "
                        f"official file again")
    ndim = want & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise UserError(f"{path} is truncated: {len(raw)} bytes, shorter than its {header}-byte header; fetch the "
                        f"official file again")
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    size = header + int(np.prod(shape, dtype=np.int64))
    if len(raw) != size:
        what = "is truncated" if len(raw) < size else "has bytes past its data"
        raise UserError(f"{path} {what}: its header declares {' x '.join(map(str, shape))} values ({size} bytes "
                        f"in all) but it holds {len(raw)} bytes; fetch the official file again")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def load_idx(name, root, split, download=True):
    """-> (uint8 tensor (N, 3, 28, 28), gray in the three channels; int64 labels (N,); class count)."""
    title, k = IDX[name]["title"], len(CLASS_NAMES[name])
    images_path, labels_path = split_files(name, root, split, download)
    images, labels = read_idx(images_path, "images"), read_idx(labels_path, "labels")
    if images.shape[1:] != (SIZE, SIZE):
        raise UserError(f"{images_path} holds {images.shape[1]}x{images.shape[2]} images; {title}'s are "
                        f"{SIZE}x{SIZE}: is this {title}?")
    if len(labels) != len(images):
        raise UserError(f"{labels_path} holds {len(labels)} labels but {images_path} holds {len(images)} images; "
                        f"the two files must be the same split of the same set: fetch the official files again")
    if labels.size and labels.max() >= k:
        raise UserError(f"{labels_path} has label {int(labels.max())}, outside 0..{k - 1}: is this {title}?")
    gray = torch.from_numpy(images.copy()).unsqueeze(1)
    return gray.expand(-1, 3, -1, -1).contiguous(), torch.from_numpy(labels.astype(np.int64)), k


def build_split(data_cfg, split, name):
    """Split 'train' or 'val' (the official test set) of `name` under data.root (data/registry.py)."""
    images, labels, k = load_idx(name, data_cfg.root, split, data_cfg.download)
    return ArrayDataset(images, labels, k, name=name)
