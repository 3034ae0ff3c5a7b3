"""The DALI data path (data.backend=dali), on CPU-only DALI pipelines, against the PIL path and timm.

The host-side parameter draws (data/dali_params.py) are checked against timm's own loops fed the
same uniforms; the pipeline against PIL/timm references on tiny generated JPEGs (mixed sizes,
grayscale, CMYK). Tests that run DALI skip, with the reason shown, when it is not installed
(`make test` installs it on Linux via requirements-dali.txt).
"""
import math
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import data
from common import rundir
from common.errors import UserError
from configs.schema import IMAGENET_MEAN, IMAGENET_STD, DataConfig
from data import dali_params as P
from data.dali_loader import INSTALL_HINT, dali_available

needs_dali = pytest.mark.skipif(not dali_available(), reason="NVIDIA DALI not installed "
                                "(pip install -r requirements-dali.txt); DALI pipeline tests skipped")
MEAN, STD = np.array(IMAGENET_MEAN), np.array(IMAGENET_STD)


# ----------------------------------------------------------------------------- fixtures
def smooth_image(rng, h, w):
    """Upsampled noise: JPEG-friendly and smooth enough that interpolation details stay small."""
    small = torch.from_numpy(rng.integers(0, 256, size=(1, 3, 6, 6), dtype=np.uint8)).float()
    img = F.interpolate(small, size=(h, w), mode="bicubic", align_corners=False).round().clamp(0, 255)
    return img[0].permute(1, 2, 0).contiguous().to(torch.uint8).numpy()


def write_mixed_folder(root, n_train=24, n_val=9, classes=3, seed=0):
    """ImageFolder with mixed sizes (36..90 px) and modes: RGB, grayscale and CMYK JPEGs."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("val", n_val)):
        for i in range(n):
            d = os.path.join(root, split, f"class_{i % classes}")
            os.makedirs(d, exist_ok=True)
            im = Image.fromarray(smooth_image(rng, int(rng.integers(36, 90)), int(rng.integers(36, 90))))
            im = im.convert("L") if i % 6 == 1 else im.convert("CMYK") if i % 6 == 2 else im
            im.save(os.path.join(d, f"img{i:03d}.jpg"), quality=92)
    return root


def solid_colours(n):
    return [((37 * i) % 256, (91 * i + 40) % 256, (53 * i + 100) % 256) for i in range(n)]


def write_solid_folder(root, n=16):
    """n solid-colour RGB JPEGs, 2 classes: every crop of sample i has sample i's colour."""
    for i, colour in enumerate(solid_colours(n)):
        d = os.path.join(root, "train", f"class_{i % 2}")
        os.makedirs(d, exist_ok=True)
        Image.new("RGB", (40 + i, 56), colour).save(os.path.join(d, f"s{i:02d}.jpg"), quality=95)
    return root


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    return write_mixed_folder(str(tmp_path_factory.mktemp("mixed")))


def cfg_for(root, **kw):
    base = dict(dataset="imagefolder", root=root, image_size=32, batch_size=4, eval_batch_size=4, num_workers=1,
                backend="dali", crop_pct=0.9, interpolation="bicubic")
    base.update(kw)
    return DataConfig(**base)


DEIT = dict(auto_augment="rand-m9-mstd0.5-inc1", reprob=0.25)


def epoch(cfg, ds, **kw):
    args = dict(seed=0, epoch=0, rank=0, world_size=1)
    args.update(kw)
    return list(data.build_train_loader(ds, cfg, **args))


# ----------------------------------------------------------------------------- host parameters (no DALI)
def timm_rrc_loop(u, W, H, scale=P.RRC_SCALE, ratio=P.RRC_RATIO):
    """timm RandomResizedCropAndInterpolation.get_params, its random draws replaced by u."""
    area = W * H
    for attempt in range(10):
        target_area = (scale[0] + (scale[1] - scale[0]) * u[attempt]) * area
        log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
        aspect_ratio = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * u[10 + attempt])
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 1 <= w <= W and 1 <= h <= H:
            i = int(u[20 + attempt] * (H - h + 1))
            j = int(u[30 + attempt] * (W - w + 1))
            return j, i, w, h
    in_ratio = W / H
    if in_ratio < min(ratio):
        w, h = W, int(round(W / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = H, int(round(H * max(ratio)))
    else:
        w, h = W, H
    return (W - w) // 2, (H - h) // 2, w, h


def test_rrc_windows_equal_timm_loop_with_the_same_draws():
    rng = np.random.default_rng(1)
    n = 3000
    seeds = rng.integers(0, 2**63, size=n, dtype=np.uint64)
    # include extreme aspect ratios so the central-crop fallback is exercised
    W = np.where(np.arange(n) % 7 == 0, 400, rng.integers(8, 600, size=n))
    H = np.where(np.arange(n) % 7 == 0, 12, rng.integers(8, 600, size=n))
    x, y, w, h = P.rrc_windows(seeds, W, H)
    u = P.uniforms(seeds, 0, 40)
    ref = np.array([timm_rrc_loop(u[k], int(W[k]), int(H[k])) for k in range(n)])
    assert np.array_equal(np.stack([x, y, w, h], 1), ref)
    assert (x >= 0).all() and (y >= 0).all() and (x + w <= W).all() and (y + h <= H).all() and (w >= 1).all()
    fallback = (w == W) & (h < H) | (h == H) & (w < W)
    assert fallback[np.arange(n) % 7 == 0].mean() > 0.5  # the 400x12 images mostly fall back


def test_erase_boxes_equal_timm_loop_with_the_same_draws():
    seeds = np.random.default_rng(2).integers(0, 2**63, size=2000, dtype=np.uint64)
    size, prob = 32, 0.6
    apply, top, left, h, w = P.erase_boxes(seeds, size, prob)
    u = P.uniforms(seeds, 192, 41)
    for k in range(len(seeds)):
        ref = None
        if not u[k, 0] > prob:  # timm: `if random.random() > self.probability: return`
            for attempt in range(10):
                area = (P.ERASE_AREA[0] + (P.ERASE_AREA[1] - P.ERASE_AREA[0]) * u[k, 1 + attempt]) * size * size
                lo, hi = P.ERASE_LOG_ASPECT
                aspect = math.exp(lo + (hi - lo) * u[k, 11 + attempt])
                hh, ww = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
                if ww < size and hh < size:
                    ref = (int(u[k, 21 + attempt] * (size - hh + 1)), int(u[k, 31 + attempt] * (size - ww + 1)), hh, ww)
                    break
        assert bool(apply[k]) == (ref is not None)
        if ref is not None:
            assert (top[k], left[k], h[k], w[k]) == ref
    assert abs(apply.mean() - prob) < 0.04


def test_rand_augment_plan_follows_timm_distribution():
    spec = P.parse_rand_augment("rand-m9-mstd0.5-inc1")
    assert spec == P.RandAugmentSpec(magnitude=9, num_layers=2, magnitude_std=0.5, magnitude_max=10, increasing=True,
                                     prob=0.5)
    n = 40000
    seeds = np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    op, bins, signs = P.rand_augment_plan(seeds, spec, 15)
    assert op.shape == bins.shape == signs.shape == (n, 2)
    applied = op < 15
    assert abs(applied.mean() - 0.5) < 0.01
    freq = np.bincount(op[applied], minlength=15) / applied.sum()
    assert np.abs(freq - 1 / 15).max() < 0.006  # uniform choice with replacement
    levels = bins / 10.0
    ref = np.clip(np.random.default_rng(0).normal(9, 0.5, size=10**6), 0, 10)  # timm: clip(gauss(m, std), 0, mmax)
    assert abs(levels.mean() - ref.mean()) < 0.01 and abs(levels.std() - ref.std()) < 0.01
    assert abs(signs.mean() - 0.5) < 0.01
    uni = P.rand_augment_plan(seeds, P.parse_rand_augment("rand-m9-mstd101-n3"), 15)[1] / 10.0  # mstd > 100: U(0, m)
    assert uni.shape == (n, 3) and abs(uni.mean() - 4.5) < 0.05 and uni.max() <= 9.0
    for bad in ("augmix-m5", "rand-m9-w0", "original"):
        with pytest.raises(ValueError):
            P.parse_rand_augment(bad)


def test_header_sizes_match_pil(tmp_path):
    import io

    rng = np.random.default_rng(3)
    rgb = Image.fromarray(rng.integers(0, 256, size=(37, 53, 3), dtype=np.uint8))
    for name, im, kw in (("rgb", rgb, {}), ("gray", rgb.convert("L"), {}), ("cmyk", rgb.convert("CMYK"), {}),
                         ("progressive", rgb, {"progressive": True}),
                         ("exif", rgb, {"exif": b"Exif\x00\x00" + bytes(40)})):
        buf = io.BytesIO()
        im.save(buf, "JPEG", **kw)
        assert P.image_size(buf.getvalue()) == (53, 37), name
    buf = io.BytesIO()
    rgb.save(buf, "PNG")
    assert P.image_size(buf.getvalue()) == (53, 37)
    assert P.image_size(b"not an image at all") is None
    assert P.image_size(buf.getvalue()[:12]) is None
    jpeg = io.BytesIO()
    rgb.save(jpeg, "JPEG")
    assert P.image_size(jpeg.getvalue()[:20]) is None  # cut before the frame header


def test_eval_geometry_matches_torchvision():
    from torchvision import transforms as T

    size, crop_pct = 32, 0.9
    for W, H in ((36, 90), (90, 36), (64, 64), (41, 43), (500, 375)):
        rw, rh, cx, cy = (int(v[0]) for v in P.eval_geometry([W], [H], size, crop_pct))
        assert T.Resize(math.floor(size / crop_pct))(Image.new("RGB", (W, H))).size == (rw, rh)
        # pixel (x, y) of a ramp image holds (x, y): the centre crop's top-left pixel is its offset
        xs, ys = np.meshgrid(np.arange(rw), np.arange(rh))
        ramp = np.stack([xs, ys, np.zeros_like(xs)], -1).astype(np.uint8)
        corner = np.asarray(T.CenterCrop(size)(Image.fromarray(ramp)))[0, 0]
        assert (corner[0], corner[1]) == (cx, cy)


def test_backend_config_errors_are_one_line(tmp_path, monkeypatch, mixed):
    from configs import config_from_dict

    with pytest.raises(UserError) as e:  # checked once, when the config loads (no re-checks)
        config_from_dict({"data": {"dataset": "imagefolder", "root": str(mixed), "backend": "dail"}})
    assert "\n" not in str(e.value) and "pil, dali, auto" in str(e.value)
    with pytest.raises(UserError) as e:
        data.build_dataset(DataConfig(dataset="cifar10", root=str(tmp_path), backend="dali"), "train")
    assert "\n" not in str(e.value) and "data.backend=pil" in str(e.value)
    with pytest.raises(UserError) as e:
        data.build_dataset(cfg_for(mixed, auto_augment="augmix-m5"), "train")
    assert "\n" not in str(e.value) and "augmix-m5" in str(e.value)
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # as if DALI were not installed
    with pytest.raises(UserError) as e:
        data.build_dataset(cfg_for(mixed), "train")
    assert str(e.value) == INSTALL_HINT and "pip install -r requirements-dali.txt" in INSTALL_HINT
    # auto falls back to PIL without DALI (and without a CUDA device)
    cfg = cfg_for(mixed, backend="auto")
    loader = data.build_train_loader(data.build_dataset(cfg, "train"), cfg, seed=0, epoch=0, rank=0, world_size=1)
    assert type(loader).__name__ == "TrainLoader"


# ----------------------------------------------------------------------------- DALI pipelines (CPU)
@needs_dali
def test_auto_picks_pil_without_cuda(mixed):
    cfg = cfg_for(mixed, backend="auto")
    loader = data.build_train_loader(data.build_dataset(cfg, "train"), cfg, seed=0, epoch=0, rank=0, world_size=1)
    assert type(loader).__name__ == ("DaliTrainLoader" if torch.cuda.is_available() else "TrainLoader")


@needs_dali
@pytest.mark.parametrize("repeated_aug", [False, True])
def test_labels_and_class_order_identical_to_pil(mixed, repeated_aug):
    dali_cfg = cfg_for(mixed, repeated_aug=repeated_aug)
    pil_cfg = cfg_for(mixed, repeated_aug=repeated_aug, backend="pil", num_workers=0)
    ds_d, ds_p = data.build_dataset(dali_cfg, "train"), data.build_dataset(pil_cfg, "train")
    assert ds_d.classes == ds_p.classes == ["class_0", "class_1", "class_2"]
    for rank in (0, 1):
        got_d = epoch(dali_cfg, ds_d, seed=5, epoch=2, rank=rank, world_size=2)
        got_p = epoch(pil_cfg, ds_p, seed=5, epoch=2, rank=rank, world_size=2)
        assert len(got_d) == len(got_p) > 0
        assert [y.tolist() for _, y in got_d] == [y.tolist() for _, y in got_p]
    vd, vp = data.build_dataset(dali_cfg, "val"), data.build_dataset(pil_cfg, "val")
    eval_d = list(data.build_eval_loader(vd, dali_cfg, rank=1, world_size=2))
    eval_p = list(data.build_eval_loader(vp, pil_cfg, rank=1, world_size=2))
    assert [y.tolist() for _, y in eval_d] == [y.tolist() for _, y in eval_p]


@needs_dali
def test_train_pixels_equal_reference_crop_resize_flip(mixed):
    """No RandAugment/erasing: each output is the host-drawn window of the PIL-decoded image,
    bicubic-resized, flipped by the host flag, normalised (an independent PIL reference)."""
    cfg = cfg_for(mixed, hflip=0.5)
    ds = data.build_dataset(cfg, "train")
    loader = data.build_train_loader(ds, cfg, seed=1, epoch=0, rank=0, world_size=1)
    flipped_checked = 0
    for (x, _), (indices, seeds) in zip(loader, loader.tasks):
        assert x.dtype == torch.float32 and x.shape == (4, 3, 32, 32) and x.device.type == "cpu"
        images = [ds.load(int(i))[0] for i in indices]
        wx, wy, ww, wh = P.rrc_windows(seeds, [im.width for im in images], [im.height for im in images])
        flips = P.flips(seeds, 0.5)
        for k, im in enumerate(images):
            ref = np.asarray(im.crop((wx[k], wy[k], wx[k] + ww[k], wy[k] + wh[k])).resize((32, 32), Image.BICUBIC))
            want = _normalised(ref[:, ::-1] if flips[k] else ref)
            err = (x[k] - want).abs().mean().item()
            assert err < 0.06, (k, err)
            if flips[k]:
                assert (x[k] - _normalised(ref)).abs().mean().item() > 2 * err  # the flip is really applied
                flipped_checked += 1
    assert flipped_checked > 0



def _normalised(image):
    """An HxWx3 uint8 image as the pipelines' normalised 3xHxW float32 tensor."""
    return torch.from_numpy(((image / 255.0 - MEAN) / STD).transpose(2, 0, 1).astype(np.float32))

@needs_dali
def test_eval_pixels_close_to_pil(mixed):
    dali_cfg, pil_cfg = cfg_for(mixed), cfg_for(mixed, backend="pil", num_workers=0)
    out_d = list(data.build_eval_loader(data.build_dataset(dali_cfg, "val"), dali_cfg, rank=0, world_size=1))
    out_p = list(data.build_eval_loader(data.build_dataset(pil_cfg, "val"), pil_cfg, rank=0, world_size=1))
    assert [x.shape for x, _ in out_d] == [x.shape for x, _ in out_p] == [(4, 3, 32, 32)] * 2 + [(1, 3, 32, 32)]
    for (xd, _), (xp, _) in zip(out_d, out_p):
        assert (xd - xp).abs().mean().item() < 0.05  # CMYK/grayscale conversions and bicubic agree closely


@needs_dali
def test_deit_train_stats_close_to_pil(mixed):
    """RandAugment m9 mstd0.5 + erasing: same shapes/dtype, values in range, per-channel stats close."""
    dali_cfg = cfg_for(mixed, **DEIT)
    pil_cfg = cfg_for(mixed, backend="pil", num_workers=0, **DEIT)
    xs = {}
    for name, cfg in (("dali", dali_cfg), ("pil", pil_cfg)):
        ds = data.build_dataset(cfg, "train")
        xs[name] = torch.cat([x for e in range(3) for x, _ in epoch(cfg, ds, seed=0, epoch=e)])
    d, p = xs["dali"], xs["pil"]
    assert d.shape == p.shape == (72, 3, 32, 32) and d.dtype == p.dtype == torch.float32
    assert torch.isfinite(d).all() and d.abs().max() < 8  # erasing noise is N(0, 1)
    lo, hi = torch.tensor((0 - MEAN) / STD).view(3, 1, 1), torch.tensor((1 - MEAN) / STD).view(3, 1, 1)
    inside = ((d >= lo.float() - 1e-4) & (d <= hi.float() + 1e-4)).float().mean()
    assert inside > 0.9  # everything but the erased boxes lies in the normalised [0, 255] range
    mean_d, mean_p = d.mean(dim=(0, 2, 3)), p.mean(dim=(0, 2, 3))
    std_d, std_p = d.std(dim=(0, 2, 3)), p.std(dim=(0, 2, 3))
    assert (mean_d - mean_p).abs().max() < 0.15, (mean_d, mean_p)
    assert ((std_d / std_p) - 1).abs().max() < 0.15, (std_d, std_p)


@needs_dali
def test_rand_augment_ops_match_timm_pil_ops():
    """Each DALI RandAugment op at a (level, sign) against timm's PIL op with the same arguments
    (bilinear, grey fill): equal up to interpolation rounding; geometric signs match timm's."""
    import timm.data.auto_augment as AA
    from nvidia.dali import fn, pipeline_def, types

    from data.dali_pipeline import rand_augment_suite

    spec = P.parse_rand_augment("rand-m9-mstd0.5-inc1")
    img = smooth_image(np.random.default_rng(4), 48, 48)
    suite = rand_augment_suite(spec, 48)
    names = AA._RAND_INCREASING_TRANSFORMS
    assert len(suite) == len(names) + 1

    def dali(k, index):
        @pipeline_def
        def pipe():
            x = fn.external_source(source=lambda: [img], batch=True, layout="HWC")
            i = fn.external_source(source=lambda: [np.array(index, np.int32)], batch=True)
            op, table, _ = suite[k]
            return op(x, None if table is None else types.Constant(table)[i])

        p = pipe(batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1)
        p.build()
        return np.array(p.run()[0].at(0)).astype(np.float64)

    def timm(name, level, negate, monkeypatch):
        monkeypatch.setattr(AA, "_randomly_negate", (lambda v: -v) if negate else (lambda v: v))
        args = AA.LEVEL_TO_ARG[name](level, AA._HPARAMS_DEFAULT) if AA.LEVEL_TO_ARG[name] else ()
        out = AA.NAME_TO_OP[name](Image.fromarray(img), *args, fillcolor=(115,) * 3, resample=Image.BILINEAR)
        return np.asarray(out).astype(np.float64)

    def opencv_equalize(channel):  # DALI follows OpenCV's equalizeHist formula, PIL has its own
        hist = np.bincount(channel.ravel(), minlength=256)
        cdf, first = np.cumsum(hist), hist[hist > 0][0]
        return np.clip(np.rint((cdf - first) * 255.0 / (channel.size - first)), 0, 255)[channel]

    with pytest.MonkeyPatch.context() as mp:
        for k, name in enumerate(names):
            for level, negate in ((7.3, 0), (9.0, 1)):
                out = dali(k, int(round(level * 10)) * 2 + negate)
                if name == "Equalize":
                    ref = np.stack([opencv_equalize(img[..., c]) for c in range(3)], -1)
                else:
                    ref = timm(name, level, negate, mp)
                err = np.abs(out - ref).mean()
                assert err < 1.0, (name, level, negate, err)
                if name in ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel", "BrightnessIncreasing"):
                    assert np.abs(out - timm(name, level, 1 - negate, mp)).mean() > 10 * max(err, 0.5), name
        assert np.array_equal(dali(len(names), 0), img.astype(np.float64))  # 'not applied'


@needs_dali
def test_deterministic_for_seed_and_epoch_and_thread_count(mixed):
    cfg = cfg_for(mixed, **DEIT)
    ds = data.build_dataset(cfg, "train")
    a = epoch(cfg, ds, seed=7, epoch=1)
    b = epoch(cfg, ds, seed=7, epoch=1)
    c = epoch(cfg_for(mixed, num_workers=2, **DEIT), ds, seed=7, epoch=1)
    other = epoch(cfg, ds, seed=7, epoch=2)
    for (xa, ya), (xb, yb), (xc, yc) in zip(a, b, c):
        assert torch.equal(xa, xb) and torch.equal(ya, yb) and torch.equal(xa, xc) and torch.equal(ya, yc)
    assert not all(torch.equal(xa, xo) for (xa, _), (xo, _) in zip(a, other))


@needs_dali
def test_resume_mid_epoch_is_exact(mixed):
    """Documented behaviour: start_batch=b yields exactly batches b.. of the uninterrupted epoch,
    same samples, labels and pixels (RandAugment and erasing included); nothing is replayed."""
    cfg = cfg_for(mixed, **DEIT)
    ds = data.build_dataset(cfg, "train")
    full = epoch(cfg, ds, seed=3, epoch=4, rank=1, world_size=2)
    resumed = data.build_train_loader(ds, cfg, seed=3, epoch=4, rank=1, world_size=2, start_batch=2)
    assert len(resumed) == len(full) == 3
    got = list(resumed)
    assert len(got) == 1
    assert torch.equal(got[0][0], full[2][0]) and torch.equal(got[0][1], full[2][1])


@needs_dali
def test_two_ranks_see_disjoint_halves(tmp_path):
    """Solid-colour images: the output colour names the sample, so this checks what DALI decoded."""
    root = write_solid_folder(str(tmp_path / "solid"))
    cfg = cfg_for(root, batch_size=4, hflip=0.5)
    ds = data.build_dataset(cfg, "train")
    colours = np.array(solid_colours(16), dtype=np.float64)
    by_path = {os.path.basename(p): i for i, (p, _) in enumerate(ds.samples)}
    colour_of_sample = {by_path[f"s{i:02d}.jpg"]: colours[i] for i in range(16)}
    seen = {}
    for rank in (0, 1):
        loader = data.build_train_loader(ds, cfg, seed=11, epoch=0, rank=rank, world_size=2)
        seen[rank] = []
        for (x, y), (indices, _) in zip(loader, loader.tasks):
            rgb = (x[:, :, 16, 16].numpy() * STD + MEAN) * 255  # centre pixel, back to 0..255
            for k, i in enumerate(indices):
                nearest = min(colour_of_sample, key=lambda j: np.abs(colour_of_sample[j] - rgb[k]).sum())
                assert nearest == i and np.abs(colour_of_sample[i] - rgb[k]).max() < 6
                assert y[k] == ds.samples[i][1]
                seen[rank].append(int(i))
    assert len(seen[0]) == len(seen[1]) == 8
    assert not set(seen[0]) & set(seen[1]) and set(seen[0]) | set(seen[1]) == set(range(16))


def corrupt_folder(root):
    """Mixed folder plus one non-image (header fails on the host), one truncated JPEG (fails in
    DALI's decoder) and a dangling link (unreadable), so every detection route is exercised; and a
    BMP named .jpg, which both paths decode."""
    write_mixed_folder(root, n_train=12, n_val=3)
    os.symlink(os.path.join(root, "nowhere.jpg"), os.path.join(root, "train", "class_0", "img100.jpg"))
    Image.fromarray(smooth_image(np.random.default_rng(9), 40, 50)).save(
        os.path.join(root, "train", "class_0", "img101.jpg"), format="BMP")
    with open(os.path.join(root, "train", "class_1", "img004.jpg"), "wb") as f:
        f.write(b"this is not a jpeg")
    path = os.path.join(root, "train", "class_2", "img005.jpg")
    with open(path, "rb") as f:
        whole = f.read()
    with open(path, "wb") as f:
        f.write(whole[:len(whole) // 2])
    return root


@needs_dali
def test_corrupt_jpegs_same_error_and_skip_as_pil(tmp_path):
    root = corrupt_folder(str(tmp_path / "corrupt"))
    results = {}
    for backend in ("pil", "dali"):
        # 14 files: all used
        cfg = cfg_for(root, backend=backend, num_workers=0 if backend == "pil" else 1, batch_size=7)
        ds = data.build_dataset(cfg, "train")
        with pytest.raises(UserError) as e:
            epoch(cfg, ds, seed=0, epoch=0)
        cfg.skip_corrupt = True
        ds = data.build_dataset(cfg, "train")
        labels = [y.tolist() for _, y in epoch(cfg, ds, seed=0, epoch=0)]
        results[backend] = (str(e.value), labels, ds.skipped_files)
    assert "\n" not in results["dali"][0] and "data.skip_corrupt=true" in results["dali"][0]
    assert results["dali"][0] == results["pil"][0]  # the same one-line message, naming the same file
    assert results["dali"][1] == results["pil"][1]  # the same substitutes take the skipped slots
    assert results["dali"][2] == results["pil"][2] and len(results["pil"][2]) == 3


@needs_dali
def test_shards_give_the_same_batches_as_the_folder(mixed, tmp_path):
    from data.shards import write_shards

    write_shards(mixed, str(tmp_path / "shards"), max_count=7, log=lambda *_: None)
    cfg_f = cfg_for(mixed, **DEIT)
    cfg_s = cfg_for(str(tmp_path / "shards"), dataset="shards", **DEIT)
    got_f = epoch(cfg_f, data.build_dataset(cfg_f, "train"), seed=2, epoch=0)
    got_s = epoch(cfg_s, data.build_dataset(cfg_s, "train"), seed=2, epoch=0)
    for (xf, yf), (xs, ys) in zip(got_f, got_s):
        assert torch.equal(xf, xs) and torch.equal(yf, ys)
    ev_f = list(data.build_eval_loader(data.build_dataset(cfg_f, "val"), cfg_f, rank=0, world_size=1))
    ev_s = list(data.build_eval_loader(data.build_dataset(cfg_s, "val"), cfg_s, rank=0, world_size=1))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(ev_f, ev_s))


@needs_dali
def test_mixup_applies_to_dali_batches(mixed):
    cfg = cfg_for(mixed, mixup=0.8, cutmix=1.0, label_smoothing=0.1, **DEIT)
    ds = data.build_dataset(cfg, "train")
    mixup = data.build_mixup(cfg, ds.num_classes)
    x, y = epoch(cfg, ds)[0]
    xm, target = mixup(x.clone(), y)
    assert xm.shape == x.shape and target.shape == (4, 3)
    assert torch.allclose(target.sum(1), torch.ones(4)) and not torch.equal(xm, x)


@needs_dali
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_pipeline_matches_cpu_pipeline(mixed):
    """The same graph with device_id set: batches on the GPU, same labels, pixels close to the
    CPU pipeline's (nvJPEG and libjpeg-turbo may differ by a level here and there)."""
    cfg = cfg_for(mixed, **DEIT)
    ds = data.build_dataset(cfg, "train")
    cpu = epoch(cfg, ds, seed=1, epoch=0)
    gpu = epoch(cfg, ds, seed=1, epoch=0, device="cuda")
    for (xc, yc), (xg, yg) in zip(cpu, gpu):
        assert xg.device.type == "cuda" and yg.device.type == "cuda" and torch.equal(yc, yg.cpu())
        assert (xc - xg.cpu()).abs().mean().item() < 0.05


@needs_dali
def test_train_py_resume_mid_epoch_bit_identical(mixed, tmp_path):
    """train.py end to end on the DALI backend: resuming from a mid-epoch checkpoint ends with the
    same weights as the uninterrupted run (RandAugment, erasing, Mixup/CutMix on)."""
    import shutil

    from test_train_helpers import run_inprocess, tiny_cfg, weights
    from training.checkpoint.state import read_trainer_state

    recipe = ["data.dataset=imagefolder", f"data.root={mixed}", "data.backend=dali", "data.num_workers=1",
              "data.batch_size=4", "data.eval_batch_size=8", "data.image_size=16",
              "data.auto_augment=rand-m9-mstd0.5-inc1", "data.reprob=0.25", "data.mixup=0.8", "data.cutmix=1.0",
              "data.repeated_aug=true", "optim.epochs=2", "train.save_every=4", "train.eval_every=1",
              "train.keep_last=10"]
    ref = str(tmp_path / "ref")
    assert run_inprocess(tiny_cfg(ref, *recipe)) == 0
    mid = os.path.join(ref, "checkpoints", rundir.checkpoint_name(4))
    assert read_trainer_state(mid).batch == 4  # inside the first epoch (6 batches)
    run = str(tmp_path / "resumed")
    shutil.copytree(mid, os.path.join(run, "checkpoints", rundir.checkpoint_name(4)))
    assert run_inprocess(tiny_cfg(run, *recipe), resume="auto") == 0
    a, b = weights(run), weights(ref)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
