"""Host-side random parameters for the DALI path: pure numpy functions of per-sample seeds.

The PIL path reseeds every RNG with a sample's aug seed (a pure function of (seed, epoch,
position), data/samplers.py) before augmenting it. The DALI path keeps that property without
touching DALI's own RNGs: every random choice (crop window, flip, RandAugment ops, magnitudes and
signs, erasing box) is drawn here, vectorised over a batch, from counter-based uniforms
u(seed, k) = splitmix64(seed + k * golden), and fed to the pipeline as data. Augmentations then
do not depend on thread count, batch composition or resume point, and DALI's CPU and GPU
pipelines receive identical parameters.

The draws follow timm's algorithms (not its RNG streams, so pixels differ from the PIL path but
the distributions match):
- RandomResizedCrop (Szegedy et al. 2015; timm `RandomResizedCropAndInterpolation.get_params`):
  10 attempts of area ~ U(scale) * image area, log aspect ~ U(log ratio), then a centre crop;
- RandAugment (Cubuk et al. 2020) as timm's `rand-mM-nN-mstdS-incI` (DeiT, Touvron et al. 2021):
  N layers, each an op drawn uniformly with replacement, applied with probability p (0.5),
  magnitude ~ clip(N(M, S), 0, mmax) (uniform(0, M) for S = inf), sign +/- with p 0.5;
- RandomErasing (Zhong et al. 2020; timm `RandomErasing`, mode "pixel", one box): with
  probability reprob, 10 attempts of area ~ U(0.02, 1/3), log aspect ~ U(log 0.3, log 1/0.3).
"""
import math
import struct
from dataclasses import dataclass

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
RRC_SCALE = (0.08, 1.0)
RRC_RATIO = (3.0 / 4.0, 4.0 / 3.0)
ERASE_AREA = (0.02, 1.0 / 3.0)
ERASE_LOG_ASPECT = (math.log(0.3), math.log(1.0 / 0.3))
LEVEL_STEPS = 10  # magnitude levels are quantised to 1/10 (timm's level scale is 0..10)

# Draw-index blocks: each use of randomness reads its own counters, so adding one never shifts another.
_RRC, _FLIP, _RA, _ERASE = 0, 64, 96, 192


def uniforms(seeds, start, count):
    """(B,) uint64 seeds -> (B, count) float64 uniforms in [0, 1) (splitmix64 of seed + k*golden)."""
    seeds = np.asarray(seeds, dtype=np.uint64)
    k = np.arange(start + 1, start + count + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = seeds[:, None] + k[None, :] * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _randint(u, low, high):
    """Inclusive integer in [low, high] from uniforms u (arrays broadcast)."""
    return np.minimum(low + np.floor(u * (high - low + 1)), high).astype(np.int64)


def rrc_windows(seeds, widths, heights, scale=RRC_SCALE, ratio=RRC_RATIO):
    """timm's RandomResizedCrop window per sample -> (x, y, w, h) int64 arrays (anchor top-left)."""
    W = np.asarray(widths, dtype=np.float64)[:, None]
    H = np.asarray(heights, dtype=np.float64)[:, None]
    u = uniforms(seeds, _RRC, 40)
    target_area = W * H * (scale[0] + (scale[1] - scale[0]) * u[:, 0:10])
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = np.exp(log_lo + (log_hi - log_lo) * u[:, 10:20])
    tw = np.rint(np.sqrt(target_area * aspect))  # rint = python round(): half to even
    th = np.rint(np.sqrt(target_area / aspect))
    ok = (tw <= W) & (th <= H) & (tw >= 1) & (th >= 1)
    first = np.argmax(ok, axis=1)
    rows = np.arange(len(first))
    found = ok[rows, first]
    w, h = tw[rows, first], th[rows, first]
    W, H = W[:, 0], H[:, 0]
    y = _randint(u[rows, 20 + first], 0, H - h)
    x = _randint(u[rows, 30 + first], 0, W - w)
    # fallback: central crop, aspect clamped into `ratio`
    in_ratio = W / H
    fw = np.where(in_ratio < min(ratio), W, np.where(in_ratio > max(ratio), np.rint(H * max(ratio)), W))
    fh = np.where(in_ratio < min(ratio), np.rint(W / min(ratio)), np.where(in_ratio > max(ratio), H, H))
    fw, fh = np.maximum(fw, 1), np.maximum(fh, 1)
    w, h = np.where(found, w, fw), np.where(found, h, fh)
    x = np.where(found, x, (W - fw) // 2)
    y = np.where(found, y, (H - fh) // 2)
    return x.astype(np.int64), y.astype(np.int64), w.astype(np.int64), h.astype(np.int64)


def flips(seeds, prob):
    """Horizontal flip flags (int32 0/1) with probability prob."""
    return (uniforms(seeds, _FLIP, 1)[:, 0] < prob).astype(np.int32)


@dataclass(frozen=True)
class RandAugmentSpec:
    """timm's 'rand-...' config string, parsed (only the keys the DALI path implements)."""

    magnitude: float = 10.0
    num_layers: int = 2
    magnitude_std: float = 0.0
    magnitude_max: float = 10.0
    increasing: bool = False
    prob: float = 0.5

    @property
    def num_bins(self):
        return int(round(self.magnitude_max * LEVEL_STEPS)) + 1


def parse_rand_augment(text):
    """'rand-m9-mstd0.5-inc1' -> RandAugmentSpec; ValueError naming the unsupported part."""
    parts = text.split("-")
    if parts[0] != "rand":
        raise ValueError(f"only timm RandAugment strings ('rand-m9-mstd0.5-inc1') are supported, got '{text}'")
    kw = {}
    for part in parts[1:]:
        key = next((k for k in ("mstd", "mmax", "inc", "m", "n", "p") if part.startswith(k)), None)
        if key is None:
            raise ValueError(f"RandAugment option '{part}' in '{text}' is not supported "
                             "(supported: m, n, mstd, mmax, inc, p)")
        value = float(part[len(key):])
        if key == "mstd":
            kw["magnitude_std"] = float("inf") if value > 100 else value  # timm: mstd > 100 means uniform
        elif key == "mmax":
            kw["magnitude_max"] = value
        elif key == "inc":
            kw["increasing"] = bool(value)
        elif key == "m":
            kw["magnitude"] = value
        elif key == "n":
            kw["num_layers"] = int(value)
        else:
            kw["prob"] = value
    return RandAugmentSpec(**kw)


def rand_augment_plan(seeds, spec, num_ops):
    """Per sample and layer: op index (num_ops = 'not applied', i.e. identity), magnitude bin
    (level * LEVEL_STEPS) and sign (1 = negate) -> three int32 arrays of shape (B, num_layers)."""
    n = spec.num_layers
    u = uniforms(seeds, _RA, 5 * n)
    op = np.minimum(np.floor(u[:, 0:n] * num_ops), num_ops - 1).astype(np.int32)
    applied = u[:, n:2 * n] <= spec.prob  # timm: skipped when random() > prob
    level = np.full(op.shape, float(spec.magnitude))
    if spec.magnitude_std == float("inf"):
        level = u[:, 2 * n:3 * n] * spec.magnitude
    elif spec.magnitude_std > 0:  # Box-Muller normal from two uniforms
        u1, u2 = 1.0 - u[:, 2 * n:3 * n], u[:, 3 * n:4 * n]
        level = level + spec.magnitude_std * np.sqrt(-2.0 * np.log(u1)) * np.cos(2 * math.pi * u2)
    level = np.clip(level, 0.0, spec.magnitude_max)
    bins = np.rint(level * LEVEL_STEPS).astype(np.int32)
    signs = (u[:, 4 * n:5 * n] > 0.5).astype(np.int32)  # timm negates when random() > 0.5
    return np.where(applied, op, num_ops).astype(np.int32), bins, signs


def erase_boxes(seeds, size, prob):
    """timm RandomErasing (one box) on a size x size image -> (apply bool, top, left, h, w) arrays."""
    u = uniforms(seeds, _ERASE, 41)
    area = float(size * size)
    target = area * (ERASE_AREA[0] + (ERASE_AREA[1] - ERASE_AREA[0]) * u[:, 1:11])
    aspect = np.exp(ERASE_LOG_ASPECT[0] + (ERASE_LOG_ASPECT[1] - ERASE_LOG_ASPECT[0]) * u[:, 11:21])
    h = np.rint(np.sqrt(target * aspect))
    w = np.rint(np.sqrt(target / aspect))
    ok = (w < size) & (h < size)
    first = np.argmax(ok, axis=1)
    rows = np.arange(len(first))
    apply = (u[:, 0] <= prob) & ok[rows, first]  # timm: no erasing when random() > probability
    h, w = h[rows, first].astype(np.int64), w[rows, first].astype(np.int64)
    top = _randint(u[rows, 21 + first], 0, size - h)
    left = _randint(u[rows, 31 + first], 0, size - w)
    return apply, top, left, h, w


def eval_geometry(widths, heights, image_size, crop_pct):
    """timm eval transform geometry: Resize(floor(size / crop_pct)) on the shorter side (torchvision
    rounding), then CenterCrop(size) -> (resized w, resized h, crop x, crop y) int64 arrays."""
    scale = math.floor(image_size / crop_pct)
    W, H = np.asarray(widths, dtype=np.int64), np.asarray(heights, dtype=np.int64)
    short, long = np.minimum(W, H), np.maximum(W, H)
    new_long = (scale * long // short).astype(np.int64)  # torchvision: int(size * long / short)
    rw = np.where(W <= H, scale, new_long)
    rh = np.where(W <= H, new_long, scale)
    cx = np.rint((rw - image_size) / 2.0).astype(np.int64)  # torchvision CenterCrop: int(round(...))
    cy = np.rint((rh - image_size) / 2.0).astype(np.int64)
    return rw, rh, cx, cy


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def image_size(buf):
    """(width, height) from a JPEG or PNG header without decoding; None if not recognised."""
    if buf[:2] == b"\xff\xd8":
        i, n = 2, len(buf)
        while i + 9 < n:
            if buf[i] != 0xFF:
                return None
            marker = buf[i + 1]
            if marker == 0xFF:  # fill byte
                i += 1
                continue
            if marker in _SOF:
                h, w = struct.unpack(">HH", buf[i + 5:i + 9])
                return (w, h) if w > 0 and h > 0 else None
            if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
                i += 2
                continue
            i += 2 + struct.unpack(">H", buf[i + 2:i + 4])[0]
        return None
    if buf[:8] == b"\x89PNG\r\n\x1a\n" and len(buf) >= 24 and buf[12:16] == b"IHDR":
        w, h = struct.unpack(">II", buf[16:24])
        return (w, h) if w > 0 and h > 0 else None
    return None
