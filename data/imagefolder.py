"""ImageNet-style folders: ROOT/train/<class>/*.{jpg,jpeg,png}, ROOT/val/<class>/*.

Class indices come from the sorted train class names and are reused for val, so a val class that
train lacks is an error (its index would be meaningless); `dataset.class_names` is that list.

An undecodable image raises a UserError naming the file. With `skip_corrupt` it is counted and, for
TRAINING, replaced by the next decodable sample in the dataset (batch shapes stay fixed, so every
rank keeps the same number of steps); the eval loader asks `load(i, replace_corrupt=False)` and
drops it instead, so an evaluation counts each decodable image exactly once (`n` = decodable
images). `dataset.skipped` is the number of distinct skipped files seen by this process and its
loader workers (the loaders report worker skips back), and each newly skipped file is logged once
as a warning on the `data` logger.

16-bit images: PIL opens a 16-bit grayscale PNG as mode I;16 (or I), and its `convert("RGB")`
clips every value above 255 to white. `to_rgb` scales such pixels to 8 bits instead
(round(v / 257), so 0 -> 0 and 65535 -> 255); 16-bit RGB(A) PNGs already arrive as 8-bit RGB(A)
(PIL keeps the high byte).
"""
import logging
import os

import numpy as np
from PIL import Image

from common.errors import UserError

from .image_list import IMG_EXTENSIONS  # (one list: predict.py's --images takes the same)

log = logging.getLogger("data")


_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")


def to_rgb(im, path=""):
    """PIL image -> 8-bit RGB, scaling 16-bit (and 32-bit integer 'I' holding 16-bit) gray correctly."""
    if im.mode in _SIXTEEN_BIT_MODES or im.mode == "I":
        values = np.asarray(im).astype(np.int64)
        if values.size and (values.min() < 0 or values.max() > 65535):
            raise UserError(f"image {path} has {im.mode} pixels outside 0..65535, which have no 8-bit meaning; "
                            "convert it to an 8- or 16-bit PNG/JPEG")
        eight_bit = ((values * 255 + 32767) // 65535).astype(np.uint8)  # round(v / 257)
        return Image.fromarray(eight_bit, mode="L").convert("RGB")
    return im.convert("RGB")


def _class_dirs(split_dir):
    return sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and not e.name.startswith("."))


def find_classes(root):
    """Sorted class names of ROOT/train (UserError if missing or empty)."""
    train_dir = os.path.join(root, "train")
    if not os.path.isdir(train_dir):
        raise UserError(f"no 'train' folder in {os.path.abspath(root)}; expected "
                        f"{os.path.abspath(root)}/train/<class>/*.jpg "
                        "(set data.root to the dataset folder)")
    classes = _class_dirs(train_dir)
    if not classes:
        raise UserError(f"no class folders in {os.path.abspath(train_dir)}; expected train/<class>/*.jpg")
    return classes


def scan_split(root, split):
    """-> (samples [(path, label)], classes). Validates the layout, raising one-line UserErrors."""
    classes = find_classes(root)
    split_dir = os.path.join(root, split)
    if not os.path.isdir(split_dir):
        raise UserError(f"no '{split}' folder in {os.path.abspath(root)}; expected "
                        f"{os.path.abspath(split_dir)}/<class>/*.jpg")
    index = {c: i for i, c in enumerate(classes)}
    names = _class_dirs(split_dir)
    unknown = [c for c in names if c not in index]
    if unknown:
        raise UserError(f"{split} class folder(s) {', '.join(unknown[:5])} in {os.path.abspath(split_dir)} do not "
                        f"exist "
                        "in train/; val classes must be a subset of the train classes")
    samples = []
    for c in names:
        d = os.path.join(split_dir, c)
        files = sorted(f for f in os.listdir(d) if f.lower().endswith(IMG_EXTENSIONS))
        if not files:
            raise UserError(f"empty class folder {os.path.abspath(d)} (no {'/'.join(IMG_EXTENSIONS)} files); "
                            "add images or remove the folder")
        samples.extend((os.path.join(d, f), index[c]) for f in files)
    return samples, classes


class ImageFolderDataset:
    """Items are (transform(PIL RGB image), label); `transform=None` returns the PIL image."""

    def __init__(self, samples, classes, transform=None, skip_corrupt=False, skipped_files=None):
        self.samples = samples
        self.classes = classes
        self.num_classes = len(classes)
        self.transform = transform
        self.skip_corrupt = skip_corrupt
        self.skipped_files = skipped_files if skipped_files is not None else set()  # shared with subsets

    @property
    def class_names(self):
        """Label index -> class (folder) name."""
        return list(self.classes)

    @property
    def skipped(self):
        return len(self.skipped_files)

    @property
    def labels(self):
        return [label for _, label in self.samples]

    def __len__(self):
        return len(self.samples)

    def subset(self, indices):
        return ImageFolderDataset([self.samples[i] for i in indices], self.classes, self.transform,
                                  self.skip_corrupt, self.skipped_files)

    def note_skipped(self, paths):
        """Record skips (e.g. reported by a loader worker); logs each new file once."""
        for p in paths:
            if p not in self.skipped_files:
                self.skipped_files.add(p)
                log.warning("skipped undecodable image %s (%d skipped so far)", p, len(self.skipped_files))

    def load(self, i, replace_corrupt=True):
        """-> (PIL image, label, [skipped paths]) with corrupt-file handling.

        With skip_corrupt, an undecodable sample is replaced by the next decodable one
        (`replace_corrupt`, training: fixed batch shapes) or, with `replace_corrupt=False`
        (evaluation), returned as (None, label, [path]) for the caller to drop."""
        skipped = []
        for k in range(len(self.samples)):
            j = (i + k) % len(self.samples)
            path, label = self.samples[j]
            try:
                with self.open_image(j) as im:
                    return to_rgb(im, path), label, skipped
            except UserError:
                raise
            except Exception as e:
                if not self.skip_corrupt:
                    raise UserError(f"cannot decode image {path} ({type(e).__name__}); delete or replace it, "
                                    "or set data.skip_corrupt=true to skip undecodable files") from None
                skipped.append(path)
                if not replace_corrupt:
                    return None, label, skipped
        raise UserError(f"no decodable image among the {len(self.samples)} files of this split")

    def open_image(self, i):
        """The undecoded PIL image of sample i (a file here; a tar member for shards)."""
        return Image.open(self.samples[i][0])

    def __getitem__(self, i):
        img, label, skipped = self.load(i)
        self.note_skipped(skipped)
        return (self.transform(img) if self.transform is not None else img), label


def build_split(data_cfg, split):
    """Split 'train' or 'val' of the folder data.root (data/registry.py declares it)."""
    samples, classes = scan_split(data_cfg.root, split)
    return ImageFolderDataset(samples, classes, skip_corrupt=data_cfg.skip_corrupt)
