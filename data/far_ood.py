"""Generated "far" out-of-distribution sets, for any in-distribution dataset and image size:

* noise_ood: i.i.d. uniform noise in every pixel and channel;
* blobs_ood: a few Gaussian blobs of random colour, position and width on a random flat background
  (smooth, low-frequency images with no object outline).

Far OOD (nothing like natural or rendered objects: a detector should find them easily) beside the
"near" sets of the built-in family (builtin10_ood: other outlines through the same renderer).
Each split is a pure function of (kind, split, n, image size, data.builtin_seed), with data.builtin_train_size /
builtin_val_size images; labels are all 0 (OOD evaluation ignores them).
"""
import torch

from common.seeding import mix_seed

from .arrays import ArrayDataset
from .names import FAR_OOD_KINDS

KINDS = FAR_OOD_KINDS
BLOBS = 4
_STREAM = {"train": 1, "val": 2}


def generate(kind, n, size, seed, stream):
    """uint8 (n, 3, size, size) images of `kind`."""
    g = torch.Generator().manual_seed(mix_seed("far_ood", kind, n, size, seed, stream))
    if kind == "noise":
        return torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)
    coords = (torch.arange(size, dtype=torch.float32) + 0.5) / size * 2 - 1
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    img = torch.rand(n, 3, 1, 1, generator=g).expand(n, 3, size, size).clone()
    for _ in range(BLOBS):
        centre = torch.rand(n, 2, generator=g) * 2 - 1
        width = 0.15 + 0.5 * torch.rand(n, generator=g)
        d2 = (xx - centre[:, 0, None, None]) ** 2 + (yy - centre[:, 1, None, None]) ** 2
        weight = torch.exp(-d2 / (2 * width[:, None, None] ** 2))[:, None]  # (n, 1, H, W)
        img = torch.lerp(img, torch.rand(n, 3, 1, 1, generator=g).expand_as(img), weight)
    return (img.clamp(0, 1) * 255).round().to(torch.uint8)


def build_split(data_cfg, split, kind):
    n = data_cfg.builtin_train_size if split == "train" else data_cfg.builtin_val_size
    images = generate(kind, n, data_cfg.image_size, data_cfg.builtin_seed, _STREAM[split])
    return ArrayDataset(images, torch.zeros(n, dtype=torch.long), 1, name=data_cfg.dataset)
