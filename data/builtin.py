"""The built-in dataset: procedurally generated shape images, no files, no network.

`builtin10`: 10 shape classes (disk, ring, square, triangle, plus, star, frame, half-disk,
dumbbell, bar; five of them with a surface pattern in the shape's frame: stripes, checker, dots)
drawn at a random position, scale, aspect, rotation (+-30 deg) and colour (dark-on-light or
light-on-dark) over a random gradient background with clutter (thin lines, dots) and pixel noise.
Random position and pattern phase make the class nearly invisible to a linear classifier on
pixels, while a small ResMLP (local patch features + pooling) learns it in CPU minutes
(numbers: scripts/check_builtin.py).
`builtin100`: the same 10 shapes x 10 foreground hue bins (hue decides the second digit of the
label), so sparse heads have many classes to choose among.
`builtin10_ood` / `builtin100_ood`: an out-of-distribution set for the two above. builtin100's classes
are builtin10's shapes in other hues, so they are not new to a builtin10 model; instead these sets
draw 10 *other* outlines (OOD_SHAPES: crescent, L, trefoil, arrow, bow tie, T, two bars, chevron, arc,
four dots) through the very same pipeline (pose, colours or hues, background, clutter, noise, and the
surface patterns, reused by label index), so only the global outline is new: a semantic shift with
matched low-level statistics. Their labels index OOD_SHAPES and mean nothing to the ID model.

Generation is vectorised in torch and cached twice: in this
process (dict) and on disk as .npy (no pickle) keyed by every generation parameter.
"""
import logging
import math
import os

import numpy as np
import torch

from common.io import WriteError, atomic_write, through_file
from common.seeding import mix_seed

from .arrays import ArrayDataset

log = logging.getLogger(__name__)

SHAPES = ("disk", "ring", "square", "triangle", "plus", "star", "frame", "halfdisk", "dumbbell", "bar")
# Outlines for the out-of-distribution sets; none is a pose (rotation <= 30 deg, aspect) of a SHAPES
# outline (tests/test_builtin_ood.py checks their masks' overlap against every in-distribution shape).
OOD_SHAPES = ("crescent", "lshape", "trefoil", "arrow", "bowtie", "tee", "twobars", "chevron", "arc", "fourdots")
FAMILIES = {"id": SHAPES, "ood": OOD_SHAPES}
GENERATOR_VERSION = 4  # bump when the drawing code or the seed hash changes: invalidates disk caches
MAX_ROTATION = math.pi / 6  # radians either way
PATTERN_CONTRAST = 0.6
_SPLIT_STREAM = {"train": 1, "val": 2}
_MEMORY_CACHE = {}


def class_names(num_classes):
    """Label index -> name: the shape, plus the hue bin for builtin100 (label = shape + 10 * hue bin)."""
    if num_classes == len(SHAPES):
        return list(SHAPES)
    return [f"{SHAPES[label % len(SHAPES)]}_hue{label // len(SHAPES)}" for label in range(num_classes)]


def _box(u, v, w, h):
    return torch.maximum(u.abs() - w, v.abs() - h)


def _segment(u, v, ax, ay, bx, by, radius):
    """Signed distance to the segment (ax, ay)-(bx, by) thickened by `radius` (a capsule)."""
    du, dv, eu, ev = u - ax, v - ay, bx - ax, by - ay
    t = ((du * eu + dv * ev) / (eu * eu + ev * ev)).clamp(0, 1)
    return torch.sqrt((du - t * eu) ** 2 + (dv - t * ev) ** 2) - radius


def _disk_at(u, v, cx, cy, radius):
    return torch.sqrt((u - cx) ** 2 + (v - cy) ** 2) - radius


def _ood_shape_sdf(shape, u, v):
    """Signed distance (negative inside, approximate) of an OOD_SHAPES outline, local units."""
    if shape == "crescent":
        return torch.maximum(_disk_at(u, v, 0, 0, 0.9), -_disk_at(u, v, 0.5, -0.1, 0.7))
    if shape == "lshape":
        return torch.minimum(_box(u + 0.55, v, 0.3, 0.9), _box(u, v - 0.6, 0.85, 0.3))
    if shape == "trefoil":
        lobes = [_disk_at(u, v, 0.6 * math.cos(a), 0.6 * math.sin(a), 0.38)
                 for a in (math.pi / 2, math.pi / 2 + 2 * math.pi / 3, math.pi / 2 + 4 * math.pi / 3)]
        return torch.minimum(torch.minimum(lobes[0], lobes[1]), lobes[2])
    if shape == "arrow":
        shaft = _box(u + 0.35, v, 0.6, 0.16)
        head = torch.maximum((v.abs() - (0.95 - u) * 0.75) * 0.8, 0.1 - u)  # tip at u = 0.95
        return torch.minimum(shaft, head)
    if shape == "bowtie":
        return torch.maximum((v.abs() - 0.85 * u.abs()) * 0.75, u.abs() - 0.95)
    if shape == "tee":
        return torch.minimum(_box(u, v + 0.62, 0.9, 0.26), _box(u, v - 0.2, 0.26, 0.75))
    if shape == "twobars":
        return torch.minimum(_box(u, v - 0.45, 0.95, 0.18), _box(u, v + 0.45, 0.95, 0.18))
    if shape == "chevron":
        return torch.minimum(_segment(u, v, -0.8, -0.55, 0, 0.55, 0.2), _segment(u, v, 0, 0.55, 0.8, -0.55, 0.2))
    if shape == "arc":
        return torch.maximum(((u * u + v * v).sqrt() - 0.72).abs() - 0.22, v - 0.1)
    if shape == "fourdots":
        return torch.minimum(torch.minimum(_disk_at(u, v, 0.55, 0.55, 0.32), _disk_at(u, v, -0.55, 0.55, 0.32)),
                             torch.minimum(_disk_at(u, v, 0.55, -0.55, 0.32), _disk_at(u, v, -0.55, -0.55, 0.32)))
    raise KeyError(shape)


def shape_sdf(shape, u, v):
    """Signed distance of any SHAPES or OOD_SHAPES outline."""
    return _ood_shape_sdf(shape, u, v) if shape in OOD_SHAPES else _shape_sdf(shape, u, v)


def _shape_sdf(shape, u, v):
    """Approximate signed distance (negative inside) of `shape` in local units (radius ~1)."""
    r = torch.sqrt(u * u + v * v)
    if shape == "disk":
        return r - 0.9
    if shape == "ring":
        return (r - 0.72).abs() - 0.24
    if shape == "square":
        return _box(u, v, 0.75, 0.75)
    if shape == "triangle":
        vv = v + 0.2
        return torch.maximum(u.abs() * 0.866 + vv * 0.5, -vv) - 0.5
    if shape == "plus":
        return torch.minimum(_box(u, v, 1.0, 0.3), _box(u, v, 0.3, 1.0))
    if shape == "star":
        phi = torch.atan2(v, u)
        return (r - (0.62 + 0.38 * torch.cos(5 * phi))) * 0.6
    if shape == "frame":
        return (torch.maximum(u.abs(), v.abs()) - 0.72).abs() - 0.2
    if shape == "halfdisk":
        vv = v + 0.4
        return torch.maximum(torch.sqrt(u * u + vv * vv) - 1.0, -vv)
    if shape == "dumbbell":
        a = torch.sqrt((u - 0.6) ** 2 + v * v) - 0.38
        b = torch.sqrt((u + 0.6) ** 2 + v * v) - 0.38
        return torch.minimum(a, b)
    if shape == "bar":
        return _box(u, v, 1.0, 0.22)
    raise KeyError(shape)


def _pattern(k, u, v):
    """Surface pattern of class k in [0, 1] (1 = darkened), local units."""
    two_pi = 2 * math.pi
    if k == 2:  # stripes across u
        return (torch.sin(two_pi * u / 0.55) > 0).float()
    if k == 3:  # checker
        return (torch.sin(two_pi * u / 0.7) * torch.sin(two_pi * v / 0.7) > 0).float()
    if k == 5:  # dots
        fu, fv = torch.frac(u / 0.5 + 10) - 0.5, torch.frac(v / 0.5 + 10) - 0.5
        return (fu * fu + fv * fv < 0.07).float()
    if k == 6:  # stripes across v
        return (torch.sin(two_pi * v / 0.45) > 0).float()
    if k == 7:  # diagonal stripes
        return (torch.sin(two_pi * (u + v) / 0.6) > 0).float()
    return torch.zeros_like(u)  # solid


def _hsv_to_rgb(h, s, v):
    """h, s, v: (n,) in [0, 1] -> (n, 3)."""
    k = torch.stack([(5 + h * 6) % 6, (3 + h * 6) % 6, (1 + h * 6) % 6], dim=1)
    f = torch.clamp(torch.minimum(k, 4 - k), 0, 1)
    return v[:, None] - v[:, None] * s[:, None] * f


def _draw_chunk(labels, size, n_hues, g, shapes=SHAPES):
    """Render images for `labels` (n,) -> uint8 (n, 3, size, size). All randomness from `g`;
    `shapes` (SHAPES or OOD_SHAPES) names the outline of each label mod 10."""
    n = labels.shape[0]
    U = lambda *shape: torch.rand(*shape, generator=g)  # noqa: E731
    coords = (torch.arange(size, dtype=torch.float32) + 0.5) / size * 2 - 1  # pixel centres in [-1, 1]
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    yy, xx = yy[None], xx[None]
    px = size / 2  # pixels per unit

    # --- background: dark or light gradient -------------------------------------------------
    dark = U(n) < 0.5
    base = torch.where(dark[:, None], U(n, 3) * 0.4, 0.6 + U(n, 3) * 0.4)
    if n_hues > 1:  # many-class variant: hue is part of the label, keep the background greyish
        base = base.mean(1, keepdim=True).expand(n, 3) * 0.6 + base * 0.4
    ang = U(n) * 2 * math.pi
    amp = (U(n) * 0.25)[:, None, None]
    grad = (xx * torch.cos(ang)[:, None, None] + yy * torch.sin(ang)[:, None, None]) * amp
    sign = torch.where(dark, 1.0, -1.0)[:, None, None]
    img = base[:, :, None, None] + (sign * grad)[:, None]  # (n, 3, H, W)

    # --- clutter: thin random line segments and small dots in random colours -------------------
    for _ in range(2):
        p0 = U(n, 2) * 2 - 1
        d = U(n, 2) * 1.2 - 0.6
        dd = (d * d).sum(1).clamp_min(1e-4)
        t = ((xx - p0[:, 0, None, None]) * d[:, 0, None, None] + (yy - p0[:, 1, None, None]) * d[:, 1, None, None])
        t = (t / dd[:, None, None]).clamp(0, 1)
        dist = torch.sqrt((xx - p0[:, 0, None, None] - t * d[:, 0, None, None]) ** 2
                          + (yy - p0[:, 1, None, None] - t * d[:, 1, None, None]) ** 2)
        a = (0.5 - (dist * px - 0.5)).clamp(0, 1) * 0.5  # ~1 px wide, half transparent
        col = U(n, 3)
        img.lerp_(col[:, :, None, None].expand_as(img), a[:, None].expand_as(img))
    for _ in range(2):
        c = U(n, 2) * 2 - 1
        rad = 0.03 + U(n) * 0.05
        dist = torch.sqrt((xx - c[:, 0, None, None]) ** 2 + (yy - c[:, 1, None, None]) ** 2) - rad[:, None, None]
        a = (0.5 - dist * px).clamp(0, 1)
        col = U(n, 3)
        img.lerp_(col[:, :, None, None].expand_as(img), a[:, None].expand_as(img))

    # --- the class shape: random affine pose ------------------------------------------------------
    shape_id = labels % len(SHAPES)
    scale = 0.5 + U(n) * 0.25  # radius 8..12 px at 32 px
    aspect = torch.exp((U(n) - 0.5) * 0.3)
    theta = (U(n) * 2 - 1) * MAX_ROTATION
    center = (U(n, 2) * 2 - 1) * (0.95 - scale)[:, None]  # keep the shape (mostly) inside
    dx, dy = xx - center[:, 0, None, None], yy - center[:, 1, None, None]
    cos, sin = torch.cos(theta)[:, None, None], torch.sin(theta)[:, None, None]
    sx, sy = (scale * aspect)[:, None, None], (scale / aspect)[:, None, None]
    u = (cos * dx + sin * dy) / sx
    v = (-sin * dx + cos * dy) / sy
    sdf = torch.empty_like(u)
    for k, name in enumerate(shapes):
        m = shape_id == k
        if m.any():
            sdf[m] = shape_sdf(name, u[m], v[m])
    alpha = (0.5 - sdf * (scale[:, None, None] * px)).clamp(0, 1)  # ~1 px anti-aliased edge
    # class-specific surface pattern in the shape's own frame (random phase): a second cue that is
    # local (easy for a patch MLP) but phase-randomised (invisible to a linear map on pixels)
    phase = U(n, 2)[:, :, None, None]
    pattern = torch.zeros_like(u)
    for k, name in enumerate(SHAPES):
        m = shape_id == k
        if m.any():
            pattern[m] = _pattern(k, u[m] + phase[m, 0], v[m] + phase[m, 1])

    if n_hues > 1:
        hue_bin = (labels // len(SHAPES)).float()
        hue = (hue_bin + 0.5 + (U(n) - 0.5) * 0.5) / n_hues
        fg = _hsv_to_rgb(hue % 1.0, 0.65 + U(n) * 0.35, 0.7 + U(n) * 0.3)
    else:
        fg = torch.where(dark[:, None], 0.55 + U(n, 3) * 0.45, U(n, 3) * 0.45)
    fg_img = fg[:, :, None, None] * (1 - PATTERN_CONTRAST * pattern[:, None])
    img.lerp_(fg_img, alpha[:, None].expand_as(img))

    # --- pixel noise --------------------------------------------------------------------------
    sigma = (0.02 + U(n) * 0.04)[:, None, None, None]
    img.add_(torch.randn(img.shape, generator=g).mul_(sigma))
    return img.clamp_(0, 1).mul_(255).add_(0.5).to(torch.uint8)


def generate(num_classes, n, size, seed, stream, chunk=4096, family="id"):
    """Generate `n` images of `num_classes` classes -> (uint8 (n, 3, size, size), int64 labels (n,)).

    Labels are exactly balanced (counts differ by at most one) and shuffled; output is a pure
    function of the arguments (each chunk has its own generator, so chunking doesn't matter).
    family "id" draws SHAPES (builtin10/100), "ood" draws OOD_SHAPES from seed streams of its own.
    """
    if num_classes % len(SHAPES):
        raise ValueError(f"num_classes must be a multiple of {len(SHAPES)}")
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    # The in-distribution family keeps its historical seeds (and so its images and caches).
    tag = () if family == "id" else (family,)
    n_hues = num_classes // len(SHAPES)
    g = torch.Generator().manual_seed(mix_seed("labels", *tag, GENERATOR_VERSION, num_classes, n, size, seed, stream))
    labels = (torch.arange(n) % num_classes)[torch.randperm(n, generator=g)]
    images = torch.empty((n, 3, size, size), dtype=torch.uint8)
    for start in range(0, n, chunk):
        gc = torch.Generator().manual_seed(
            mix_seed("chunk", *tag, GENERATOR_VERSION, num_classes, size, seed, stream, start // chunk, chunk))
        images[start:start + chunk] = _draw_chunk(labels[start:start + chunk], size, n_hues, gc, FAMILIES[family])
    return images, labels


def default_cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "resmlp-data", "builtin")


def load_split(num_classes, split, n, size, seed, cache_dir=None, family="id"):
    """Cached `generate` for split 'train' or 'val' (different seed streams, hence disjoint)."""
    key = (GENERATOR_VERSION, num_classes, split, n, size, seed, family)
    if key in _MEMORY_CACHE:
        return _MEMORY_CACHE[key]
    cache_dir = cache_dir or default_cache_dir()
    suffix = "" if family == "id" else f"_{family}"
    name = f"builtin{num_classes}{suffix}_v{GENERATOR_VERSION}_{split}_n{n}_s{size}_seed{seed}"
    path = os.path.join(cache_dir, name + ".npz")
    out = None
    if os.path.exists(path):
        try:
            with np.load(path, allow_pickle=False) as z:
                out = torch.from_numpy(z["images"].copy()), torch.from_numpy(z["labels"].copy())
        except Exception as e:  # corrupt cache: regenerate (it's only a cache)
            log.warning("ignoring unreadable built-in dataset cache %s (%s)", path, e)
    if out is None:
        out = generate(num_classes, n, size, seed, _SPLIT_STREAM[split], family=family)
        try:  # best effort: a read-only home must not break training
            # atomic (common.io): concurrent processes never read a half-written cache, none is left behind
            atomic_write(path, through_file(lambda f: np.savez(f, images=out[0].numpy(), labels=out[1].numpy())))
        except WriteError as e:
            log.info("could not cache the built-in dataset in %s (%s)", cache_dir, e)
    _MEMORY_CACHE[key] = out
    return out


def build_split(data_cfg, split, num_classes, family):
    """Split 'train' or 'val' of builtin<num_classes> (family 'id') or its OOD set ('ood'), as the
    config sets its sizes, image size, seed and cache (data/registry.py declares the four)."""
    n = data_cfg.builtin_train_size if split == "train" else data_cfg.builtin_val_size
    images, labels = load_split(num_classes, split, n, data_cfg.image_size, data_cfg.builtin_seed,
                                data_cfg.cache_dir, family=family)
    return ArrayDataset(images, labels, num_classes, name=data_cfg.dataset)
