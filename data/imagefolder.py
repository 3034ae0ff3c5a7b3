"""ImageNet-style folders: ROOT/train/<class>/*.{jpg,jpeg,png}, ROOT/val/<class>/*.

Class indices come from the sorted train class names and are reused for val, so a val class that
train lacks is an error (its index would be meaningless). An undecodable image raises a UserError
naming the file, or with `skip_corrupt` is replaced by the next decodable sample in the dataset
(batch shapes stay fixed, so every rank keeps the same number of steps) and counted:
`dataset.skipped` is the number of distinct skipped files seen by this process and its loader
workers (the loaders report worker skips back), and each newly skipped file is logged once as a
warning on the `data` logger.
"""
import logging
import os

from PIL import Image

from common.errors import UserError

log = logging.getLogger("data")
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png")


def _class_dirs(split_dir):
    return sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and not e.name.startswith("."))


def find_classes(root):
    """Sorted class names of ROOT/train (UserError if missing or empty)."""
    train_dir = os.path.join(root, "train")
    if not os.path.isdir(train_dir):
        raise UserError(f"no 'train' folder in {os.path.abspath(root)}; expected {os.path.abspath(root)}/train/<class>/*.jpg "
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
        raise UserError(f"no '{split}' folder in {os.path.abspath(root)}; expected {os.path.abspath(split_dir)}/<class>/*.jpg")
    index = {c: i for i, c in enumerate(classes)}
    names = _class_dirs(split_dir)
    unknown = [c for c in names if c not in index]
    if unknown:
        raise UserError(f"{split} class folder(s) {', '.join(unknown[:5])} in {os.path.abspath(split_dir)} do not exist "
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

    in_memory_capable = False

    def __init__(self, samples, classes, transform=None, skip_corrupt=False, skipped_files=None):
        self.samples = samples
        self.classes = classes
        self.num_classes = len(classes)
        self.transform = transform
        self.skip_corrupt = skip_corrupt
        self.skipped_files = skipped_files if skipped_files is not None else set()  # shared with subsets

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

    def load(self, i):
        """-> (PIL image, label, [skipped paths]) with corrupt-file handling."""
        skipped = []
        for k in range(len(self.samples)):
            path, label = self.samples[(i + k) % len(self.samples)]
            try:
                with Image.open(path) as im:
                    return im.convert("RGB"), label, skipped
            except Exception as e:
                if not self.skip_corrupt:
                    raise UserError(f"cannot decode image {path} ({type(e).__name__}); delete or replace it, "
                                    "or set data.skip_corrupt=true to skip undecodable files") from None
                skipped.append(path)
        raise UserError(f"no decodable image among the {len(self.samples)} files of this split")

    def __getitem__(self, i):
        img, label, skipped = self.load(i)
        self.note_skipped(skipped)
        return (self.transform(img) if self.transform is not None else img), label
