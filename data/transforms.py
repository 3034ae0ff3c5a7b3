"""Transforms: timm's `create_transform` for the per-sample (PIL) path, and the in-memory batch
augmentation (random crop with padding + horizontal flip, normalisation folded in) on device.

Both paths implement the same CIFAR recipe: zero-pad by `crop_padding`, random `image_size` crop,
flip with probability `hflip`, then (x/255 - mean)/std, then optional timm RandomErasing.
The DeiT recipe (RandomResizedCrop, RandAugment, colour jitter) exists only in the per-sample
path; `uses_memory_path` sends those configs there automatically.

Evaluation: `eval_transform(cfg)` is the one description of the evaluation transform (shorter
side resized to floor(image_size / crop_pct), centre crop, normalisation). `build_eval_transform`
builds the torchvision transform from it, the DALI eval pipeline takes its crop_pct and
interpolation, and exports write its `describe()` (the sidecar) and `timm_config()` (a model's
pretrained_cfg), so what a deployment reads is what evaluation did.
"""
import dataclasses
import math
import random
from typing import Tuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from timm.data import create_transform
from timm.data.auto_augment import posterize
from timm.data.random_erasing import RandomErasing
from torchvision import transforms as T

from common.errors import UserError
from common.sidecar_format import GRAY

from .names import CROP_RECIPES, INTERPOLATIONS, TRAIN_CROPS  # noqa: F401  (re-exported)
from .registry import dataset_spec

# How a gray dataset's eval transform (preprocessing.color GRAY in an export's sidecar) turns an image gray
GRAY_FORMULA = "L = R * 299/1000 + G * 587/1000 + B * 114/1000 (Pillow's convert('L')), in all three channels"


def train_crop_mode(cfg):
    """data.train_crop, with auto resolved to the dataset's declared recipe (data/registry.py)."""
    if cfg.train_crop not in TRAIN_CROPS:
        raise UserError(f"unknown data.train_crop '{cfg.train_crop}'; valid: {', '.join(TRAIN_CROPS)}")
    if cfg.train_crop != "auto":
        return cfg.train_crop
    return dataset_spec(cfg.dataset).train_crop


def in_memory_path(cfg):
    """Whether cfg's dataset sits in memory as one uint8 tensor and data.in_memory asks to use that."""
    return bool(cfg.in_memory) and dataset_spec(cfg.dataset).in_memory


def uses_memory_path(cfg):
    """The device fast path covers pad-crop + flip + erasing; anything else goes per-sample."""
    return in_memory_path(cfg) and not cfg.auto_augment and not cfg.color_jitter and train_crop_mode(cfg) == "pad"


def _posterize_zero_safe(img, bits_to_keep, **kw):
    """timm's posterize, but bits_to_keep=0 gives the black image older Pillow produced (Pillow
    >= 11 raises ValueError for 0 bits, which timm's 'inc1' RandAugment can ask for at level 10)."""
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)
    return posterize(img, bits_to_keep, **kw)


def _patch_posterize(transform):
    for t in getattr(transform, "transforms", []):
        for op in getattr(t, "ops", []):
            if "Posterize" in getattr(op, "name", ""):
                op.aug_fn = _posterize_zero_safe
        _patch_posterize(t)
    return transform


def _timm_train_parts(cfg):
    """(primary, secondary, final) from timm; we replace only `primary` in pad-crop mode."""
    return tuple(_patch_posterize(t) for t in create_transform(
        cfg.image_size, is_training=True, hflip=cfg.hflip, color_jitter=cfg.color_jitter or None,
        auto_augment=cfg.auto_augment, interpolation=cfg.interpolation, mean=tuple(cfg.mean), std=tuple(cfg.std),
        re_prob=cfg.reprob, re_mode="pixel", re_count=1, separate=True))


def to_square(cfg, native_size):
    """The pad recipe's first step: bicubic resize of the shorter side to image_size, then a centre
    crop to image_size x image_size, so images of any shape (portrait, landscape) come out square.
    Nothing for datasets stored square at image_size (CIFAR, built-in: `native_size`)."""
    if native_size == cfg.image_size:
        return []
    return [T.Resize(cfg.image_size, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(cfg.image_size)]


def build_train_transform(cfg, native_size):
    """PIL image -> normalised float tensor, per-sample randomness from `random`/torch RNG."""
    primary, secondary, final = _timm_train_parts(cfg)
    if train_crop_mode(cfg) == "rrc":
        return T.Compose([primary, secondary, final])
    primary = T.Compose(to_square(cfg, native_size) + [T.RandomCrop(cfg.image_size, padding=cfg.crop_padding),
                               T.RandomHorizontalFlip(cfg.hflip)])
    return T.Compose([primary, secondary, final])


@dataclasses.dataclass(frozen=True)
class EvalTransform:
    """The evaluation transform as data. PIL image -> RGB (16-bit gray scaled to 8 bits) -> with
    `grayscale` (the model of a gray dataset, data/registry.py) gray in all three channels -> the
    shorter side resized to `resize_to` (the longer one to int(resize_to * long / short)) with
    `interpolation` -> centre crop to image_size (offsets round((resized - image_size) / 2), half to
    even) -> pixel / 255 -> (x - mean) / std per channel -> float32 (3, H, W)."""
    image_size: int
    crop_pct: float
    interpolation: str
    mean: Tuple[float, float, float]
    std: Tuple[float, float, float]
    grayscale: bool = False

    @property
    def resize_to(self) -> int:
        return math.floor(self.image_size / self.crop_pct)

    def describe(self) -> dict:
        """The plain description an export carries: every number a consumer without torch needs."""
        color = {"color": GRAY, "gray": GRAY_FORMULA} if self.grayscale else {"color": "RGB"}
        return {
            **color, "sixteen_bit_gray": "round(v / 257)", "layout": "CHW", "dtype": "float32",
            "resize": {"shorter_side": self.resize_to, "longer_side": "int(shorter_side * longer / shorter)",
                       "interpolation": self.interpolation},
            "center_crop": {"size": [self.image_size, self.image_size],
                            "offset": "round((resized - size) / 2), half to even"},
            "crop_pct": self.crop_pct, "scale": "pixel / 255",
            "mean": list(self.mean), "std": list(self.std), "normalise": "(x - mean) / std",
        }

    def timm_config(self) -> dict:
        """The same transform as timm's data config keys (timm.data.resolve_data_config reads them
        from a model's pretrained_cfg; timm's eval transform is then this one)."""
        return dict(input_size=(3, self.image_size, self.image_size), crop_pct=self.crop_pct, crop_mode="center",
                    interpolation=self.interpolation, mean=tuple(self.mean), std=tuple(self.std))


def eval_transform(cfg) -> EvalTransform:
    """The evaluation transform of data config `cfg`. The pad recipe resizes the shorter side to
    image_size, bicubic, and centre-crops (crop_pct 1.0 whatever data.crop_pct says); the DeiT (rrc)
    recipe resizes to image_size / data.crop_pct with data.interpolation ('random' is a training
    choice: bicubic at evaluation)."""
    pad = train_crop_mode(cfg) == "pad"
    interpolation = "bicubic" if pad or cfg.interpolation == "random" else cfg.interpolation
    return EvalTransform(int(cfg.image_size), 1.0 if pad else float(cfg.crop_pct), interpolation,
                         tuple(float(v) for v in cfg.mean), tuple(float(v) for v in cfg.std),
                         dataset_spec(cfg.dataset).grayscale)


def build_eval_transform(cfg, native_size):
    """PIL image -> the normalised image_size x image_size tensor `eval_transform(cfg)` describes:
    timm's eval transform with its settings; datasets stored square at image_size (CIFAR, built-in:
    `native_size`) under the pad recipe are only normalised (their resize and crop do nothing). A
    gray dataset's transform turns every image gray first (a no-op on its own images)."""
    spec = eval_transform(cfg)
    gray = [T.Grayscale(num_output_channels=3)] if spec.grayscale else []
    if native_size == spec.image_size == spec.resize_to:
        return T.Compose(gray + [T.ToTensor(), T.Normalize(spec.mean, spec.std)])
    timm_eval = create_transform(spec.image_size, is_training=False, interpolation=spec.interpolation,
                                 crop_pct=spec.crop_pct, crop_mode="center", mean=spec.mean, std=spec.std)
    return T.Compose(gray + [timm_eval]) if gray else timm_eval


def resize_uint8(images, size):
    """Whole-tensor bicubic resize of uint8 (N, 3, H, W) images (done once per device)."""
    if images.shape[-1] == size and images.shape[-2] == size:
        return images
    out = [F.interpolate(images[i:i + 1024].float(), size=(size, size), mode="bicubic", antialias=True,
                         align_corners=False)
           for i in range(0, len(images), 1024)]
    return torch.cat(out).round_().clamp_(0, 255).to(torch.uint8)


class Normalize:
    """uint8 (B,3,H,W) -> float (x/255 - mean)/std as one fused multiply-add."""

    def __init__(self, mean, std, device):
        std = torch.tensor(std, dtype=torch.float32, device=device)
        self.scale = (1.0 / (255.0 * std)).view(1, 3, 1, 1)
        self.bias = (-torch.tensor(mean, dtype=torch.float32, device=device) / std).view(1, 3, 1, 1)

    def __call__(self, x):
        return torch.addcmul(self.bias, x.float(), self.scale)


class BatchAugment:
    """In-memory training augmentation of a uint8 batch on its device.

    Each sample's crop offset and flip come from its own 64-bit `aug_seed` (a pure function of
    (seed, epoch, position) computed by the sampler), so the result does not depend on batch
    composition, rank or resume point. Random erasing uses timm's RandomErasing per sample under
    a forked, reseeded RNG (it draws from `random` and torch's global generator).
    """

    def __init__(self, cfg, device):
        self.pad = int(cfg.crop_padding)
        self.hflip = float(cfg.hflip)
        self.size = int(cfg.image_size)
        self.normalize = Normalize(cfg.mean, cfg.std, device)
        self.device = torch.device(device)
        self.erasing = RandomErasing(cfg.reprob, mode="pixel", device=str(self.device)) if cfg.reprob > 0 else None

    def placements(self, aug_seeds):
        """Each sample's crop offsets and flip from its aug seed, host side: int64 (N,) row and column
        offsets in [0, 2 * crop_padding] and a bool (N,) flip. The memory loader computes them for a
        whole epoch and moves them to the device once (data/loaders.py)."""
        seeds = np.asarray(aug_seeds, dtype=np.uint64)
        span = np.uint64(2 * self.pad + 1)
        oy = torch.from_numpy((seeds % span).astype(np.int64))
        ox = torch.from_numpy(((seeds >> np.uint64(8)) % span).astype(np.int64))
        uniform = ((seeds >> np.uint64(16)) & np.uint64(0xFFFFFF)).astype(np.float64) / float(1 << 24)
        return oy, ox, torch.from_numpy(uniform < self.hflip)

    def __call__(self, images, aug_seeds, placed=None):
        """`placed`: this batch's (oy, ox, flip) already on the images' device (`placements`), or None
        to compute and move them here (a synchronous copy each call)."""
        b, c, h, w = images.shape
        dev = images.device
        oy, ox, flip = placed if placed is not None else (t.to(dev) for t in self.placements(aug_seeds))
        if self.pad:
            images = F.pad(images, (self.pad,) * 4)  # zero fill, as torchvision RandomCrop(padding=p)
        ar_h = torch.arange(self.size, device=dev)
        ar_w = torch.arange(self.size, device=dev)
        rows = oy[:, None] + ar_h[None]  # (B, S)
        cols = torch.where(flip[:, None], ox[:, None] + (self.size - 1 - ar_w)[None], ox[:, None] + ar_w[None])
        bidx = torch.arange(b, device=dev)[:, None, None]
        out = images.permute(0, 2, 3, 1)[bidx, rows[:, :, None], cols[:, None, :]]  # (B, S, S, C)
        out = self.normalize(out.permute(0, 3, 1, 2))
        if self.erasing is not None:
            self._erase(out, np.asarray(aug_seeds, dtype=np.uint64))
        return out.contiguous()

    def _erase(self, out, seeds):
        devices = [out.device] if out.device.type == "cuda" else []
        state = random.getstate()
        try:
            with torch.random.fork_rng(devices=devices):
                for i, s in enumerate(seeds.tolist()):
                    s = (s * 0x9E3779B97F4A7C15 + 1) & ((1 << 63) - 1)  # decorrelate from crop/flip bits
                    random.seed(s)
                    torch.manual_seed(s)
                    self.erasing(out[i])
        finally:
            random.setstate(state)
