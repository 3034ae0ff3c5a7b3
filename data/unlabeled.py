"""Unlabeled images for prediction: the list of files a user means, and their decoded batches.

`list_images(spec)`: spec is a folder (searched recursively, hidden entries skipped, in the order
of ImageFolder's scan: sorted folders, then sorted files), a glob (`photos/*.png`, `**` recursive),
a list file (one path per line; blank lines and `#` comments skipped; relative paths are relative
to the current directory, like the output of `find`), or one image file. Only files with an image
extension (imagefolder.IMG_EXTENSIONS) are taken from a folder or glob; every path of a list file
is taken as given (a missing or undecodable one is reported as unreadable, not dropped silently).

`ImageBatches`: a DataLoader "dataset" whose item is a whole batch of indices: it decodes each file
(imagefolder.to_rgb: any mode, 16-bit scaled), applies the eval transform and returns the decoded
images, their indices, and the failures (index, reason) instead of raising.
"""
import glob
import os

import torch
from PIL import Image

from common.errors import UserError

from .imagefolder import IMG_EXTENSIONS, to_rgb
from .loaders import check_transformed_size

GLOB_CHARS = "*?["


def _is_image_name(name):
    return name.lower().endswith(IMG_EXTENSIONS)


def _walk(folder):
    """(image paths, count of other files) under folder, ImageFolder's order, hidden entries skipped."""
    images, others = [], 0
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(f for f in files if not f.startswith(".")):
            if _is_image_name(name):
                images.append(os.path.join(root, name))
            else:
                others += 1
    return images, others


def _from_folder(folder):
    images, others = _walk(folder)
    if images:
        return images
    if others:
        raise UserError(f"{folder} holds {others} file(s) but no images ({', '.join(IMG_EXTENSIONS)}, searched "
                        f"recursively); point --images at the images' folder, a glob or a list file")
    raise UserError(f"{folder} is empty (no files, searched recursively); point --images at a folder of images")


def _from_glob(pattern):
    matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    if not matches:
        raise UserError(f"no file matches --images {pattern!r} (quote the pattern so the shell leaves it to "
                        f"predict.py; use ** for subfolders)")
    images = [p for p in matches if _is_image_name(p)]
    if not images:
        raise UserError(f"--images {pattern!r} matches {len(matches)} file(s) but no images "
                        f"({', '.join(IMG_EXTENSIONS)})")
    return images


def _from_list_file(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [(n, line.strip()) for n, line in enumerate(f, 1)]
    paths, first_line = [], {}
    for n, line in lines:
        if not line or line.startswith("#"):
            continue
        if line in first_line:
            raise UserError(f"{path} line {n} repeats line {first_line[line]} ({line}); list each image once")
        first_line[line] = n
        paths.append(line)
    if not paths:
        raise UserError(f"{path} lists no images (one path per line expected)")
    return paths


def list_images(spec):
    """The image paths `spec` names (see the module docstring); UserError when it names none."""
    if os.path.isdir(spec):
        return _from_folder(spec)
    if os.path.isfile(spec):
        return [spec] if _is_image_name(spec) else _from_list_file(spec)
    if any(c in spec for c in GLOB_CHARS):
        return _from_glob(spec)
    raise UserError(f"--images {spec}: no such folder, file or glob match (give a folder of images, a glob "
                    f"such as 'photos/*.jpg', or a text file with one image path per line)")


def _reason(err):
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


class ImageBatches(torch.utils.data.Dataset):
    """Item = one batch task (an array of indices into `paths`) -> {"index": (n,) int64, "images":
    (n, 3, S, S) float or None, "failed": [(index, reason)]}; undecodable files never raise (a
    transform giving the wrong size is a bug, returned as {"error": message})."""

    def __init__(self, paths, transform, image_size):
        self.paths = paths
        self.transform = transform
        self.image_size = image_size

    def __len__(self):
        return len(self.paths)

    def _decode(self, i):
        with Image.open(self.paths[i]) as im:
            rgb = to_rgb(im, self.paths[i])
            rgb.load()
        return rgb

    def __getitem__(self, task):
        indices, images, failed = [], [], []
        for i in task:
            i = int(i)
            try:
                img = self._decode(i)
            except Exception as err:
                failed.append((i, _reason(err)))
                continue
            x = self.transform(img)
            try:
                check_transformed_size(x, self.image_size, img.size, "eval")
            except UserError as err:  # returned, not raised: a worker would wrap it in a traceback
                return {"error": str(err)}
            indices.append(i)
            images.append(x)
        return {"index": torch.tensor(indices, dtype=torch.int64),
                "images": torch.stack(images) if images else None, "failed": failed}
