"""Loader throughput vs training throughput: data must never be the bottleneck (ratio >= 3).

    python scripts/bench_data.py [--quick] [--workers 2] [--root DIR]

Rows (img/s, measured in this run on this machine):
  cifar in-memory   uint8 split on device, batch crop/flip/normalise   vs  resmlp_cifar_s12 training
  cifar PIL         timm/torchvision per-sample path, N workers         vs  resmlp_cifar_s12 training
  cifar PIL + RA    same with RandAugment rand-m9-mstd0.5-inc1 + erasing vs  resmlp_cifar_s12 training
  imagefolder DeiT  generated 224 px JPEGs, DeiT train transform        vs  resmlp_s12 training
Uses real CIFAR-10 under --root if present, else CIFAR-format fixtures (random pixels) in a temp dir.
Training throughput: fwd+bwd+AdamW step, bf16 autocast on CPU, batch as in the loader rows.

DALI rows (need NVIDIA DALI, else skipped with a note): decode + DeiT train transform
(random-resized crop, flip, RandAugment rand-m9-mstd0.5-inc1, erasing 0.25) at 224 px on
ImageNet-like 500x375 JPEGs, in images per CPU-second (process CPU time, so other jobs on a shared
machine do not distort it): PIL in-process (the anchor) vs DALI-CPU, ratio target >= 2; plus a
DALI-GPU row (wall img/s) when a CUDA GPU is present.

    python scripts/bench_data.py --dali-gpu [--quick]   # GPU check: DALI-GPU loader img/s at 224 px
                                    # (6 DALI + 2 reader threads) and its ratio to ResMLP-S12 train img/s
"""
import argparse
import os
import pickle
import tempfile
import time

import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

import numpy as np
import timm
import torch
import torch.nn.functional as F
from PIL import Image

import data
from configs.schema import DataConfig
from data.dali_loader import dali_available  # (DALI itself stays optional: imported inside)

try:  # registers the project's resmlp_* names with timm; without them make_model falls back to timm's own
    from models import resmlp  # noqa: F401
except ImportError:
    pass


def write_cifar_fixture(root, n):
    folder = os.path.join(root, "cifar-10-batches-py")
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    # smooth-ish images (upsampled noise): closer to real JPEG/PNG statistics than white noise
    for name, m in [(f"data_batch_{i}", n // 5) for i in range(1, 6)] + [("test_batch", n // 5)]:
        small = rng.integers(0, 256, size=(m, 3, 8, 8), dtype=np.uint8)
        x = torch.from_numpy(small).float()
        x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False).round().clamp(0, 255)
        d = {b"data": x.to(torch.uint8).reshape(m, 3072).numpy(), b"labels": rng.integers(0, 10, m).tolist()}
        with open(os.path.join(folder, name), "wb") as f:
            pickle.dump(d, f, protocol=2)


def write_imagefolder_fixture(root, n, size=256, classes=10):
    rng = np.random.default_rng(0)
    for split, m in (("train", n), ("val", max(classes, n // 10))):
        for i in range(m):
            c = f"class{i % classes:03d}"
            d = os.path.join(root, split, c)
            os.makedirs(d, exist_ok=True)
            small = torch.from_numpy(rng.integers(0, 256, size=(1, 3, 16, 16), dtype=np.uint8)).float()
            img = F.interpolate(small, size=(size, int(size * 1.25)), mode="bilinear", align_corners=False)
            arr = img[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()
            Image.fromarray(arr).save(os.path.join(d, f"{i}.JPEG"), quality=90)


def write_imagenet_like_fixture(root, n, classes=10):
    """n smooth 500x375 JPEGs (ImageNet's typical size; quality 90, ~60 KB each)."""
    rng = np.random.default_rng(1)
    for i in range(n):
        d = os.path.join(root, "train", f"class{i % classes:03d}")
        os.makedirs(d, exist_ok=True)
        small = torch.from_numpy(rng.integers(0, 256, size=(1, 3, 48, 64), dtype=np.uint8)).float()
        img = F.interpolate(small, size=(375, 500), mode="bicubic", align_corners=False)
        arr = img[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).contiguous().numpy()
        Image.fromarray(arr).save(os.path.join(d, f"{i}.JPEG"), quality=90)
    os.makedirs(os.path.join(root, "val"), exist_ok=True)
    for c in range(classes):  # build_dataset validates the layout; val is not read here
        os.makedirs(os.path.join(root, "val", f"class{c:03d}"), exist_ok=True)


def per_core_throughput(ds, cfg, max_batches, max_s, device="cpu"):
    """(wall img/s, img per CPU-second of this process) over one epoch's loader after its first batch."""
    loader = data.build_train_loader(ds, cfg, seed=0, epoch=0, rank=0, world_size=1, device=device)
    n, t0, c0 = 0, None, None
    for i, (x, y) in enumerate(loader):
        if i == 0:  # pipeline build / first-batch latency not counted
            t0, c0 = time.perf_counter(), time.process_time()
            continue
        n += len(y)
        if i >= max_batches or time.perf_counter() - t0 > max_s:
            break
    if device != "cpu":
        torch.cuda.synchronize()
    return n / (time.perf_counter() - t0), n / max(time.process_time() - c0, 1e-9)


def dali_rows(tmp, quick, workers):
    """PIL vs DALI-CPU per core (and DALI-GPU) for decode + DeiT augmentation at 224 px."""
    if not dali_available():
        print("(DALI rows skipped: NVIDIA DALI not installed; pip install -r requirements-dali.txt)")
        return
    root = os.path.join(tmp, "imagenet_like")
    n = 160 if quick else 640
    write_imagenet_like_fixture(root, n)
    deit = dict(dataset="imagefolder", root=root, image_size=224, batch_size=32, auto_augment="rand-m9-mstd0.5-inc1",
                reprob=0.25, interpolation="bicubic", crop_pct=0.9)
    max_b, max_s = (4, 10) if quick else (19, 40)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the per-core rows count every thread of this process
    pil_cfg = DataConfig(**deit, backend="pil", num_workers=0)
    pil = per_core_throughput(data.build_dataset(pil_cfg, "train"), pil_cfg, max_b, max_s)
    cpu_cfg = DataConfig(**deit, backend="dali", num_workers=1)
    dali_cpu = per_core_throughput(data.build_dataset(cpu_cfg, "train"), cpu_cfg, max_b, max_s)
    rows = [("PIL in-process (anchor)", pil), ("DALI-CPU, 1 thread", dali_cpu)]
    if workers > 1:
        multi_cfg = DataConfig(**deit, backend="dali", num_workers=workers)
        rows.append((f"DALI-CPU, {workers} threads", per_core_throughput(data.build_dataset(multi_cfg, "train"),
                                                                       multi_cfg, max_b, max_s)))
    torch.set_num_threads(threads)
    print(f"\ndecode + DeiT train transform, 224 px, {n} ImageNet-like 500x375 JPEGs, batch 32")
    print(f"{'loader':32s} {'img/s (wall)':>13s} {'img/CPU-s':>10s} {'per core vs PIL':>16s}")
    for name, (wall, per_cpu) in rows:
        print(f"{name:32s} {wall:13.0f} {per_cpu:10.0f} {per_cpu / pil[1]:15.2f}x")
    print("(per core = images per CPU-second of this process, all its threads; target DALI-CPU >= 2x PIL)")
    if torch.cuda.is_available():
        gpu_cfg = DataConfig(**{**deit, "batch_size": 256}, backend="dali", num_workers=min(8, max(workers, 1)))
        wall, _ = dali_gpu_throughput(data.build_dataset(gpu_cfg, "train"), gpu_cfg, 5 if quick else 20)
        print(f"{'DALI-GPU (batch 256, ' + str(gpu_cfg.num_workers) + ' threads)':32s} {wall:13.0f}")


def dali_gpu_throughput(ds, cfg, seconds):
    """(img/s, images) of the DALI-GPU train loader over whole epochs until `seconds` have passed
    (the first batch, i.e. pipeline build and warm-up, not counted)."""
    n, t0, ep = 0, None, 0
    while t0 is None or time.perf_counter() - t0 < seconds:
        for x, y in data.build_train_loader(ds, cfg, seed=0, epoch=ep, rank=0, world_size=1, device="cuda"):
            if t0 is None:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                continue
            n += len(y)
        ep += 1
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t0), n


def gpu_train_throughput(batch, steps):
    """ResMLP-S12 (1000 classes) fwd+bwd+AdamW img/s on the GPU, bf16 autocast, 224 px."""
    model, name = make_model("resmlp_s12", 1000, "resmlp_12_224")
    model = model.cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")
    for i in range(steps + 3):
        if i == 3:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    return batch * steps / (time.perf_counter() - t0), name


def dali_gpu_check(quick, threads):
    """The gpu_check.sh step: DALI-GPU loader img/s at 224 px with RandAugment, <= 8 CPU threads,
    and loader img/s / ResMLP-S12 train img/s (targets: >= 10,000 img/s and >= 1.5)."""
    if not torch.cuda.is_available():
        print("dali-gpu: SKIPPED (no CUDA GPU)")
        return 0
    if not dali_available():
        print("dali-gpu: SKIPPED (NVIDIA DALI not installed: pip install -r requirements-dali.txt)")
        return 0
    dali_threads = min(6, threads)  # + 2 reader threads (file reads, header sizes): 8 CPU threads
    torch.set_num_threads(1)
    tmp = tempfile.TemporaryDirectory()
    n = 512 if quick else 2048
    t = time.perf_counter()
    write_imagenet_like_fixture(tmp.name, n)
    print(f"(fixture: {n} ImageNet-like 500x375 JPEGs in {time.perf_counter() - t:.0f}s)")
    cfg = DataConfig(dataset="imagefolder", root=tmp.name, image_size=224, batch_size=256, num_workers=dali_threads,
                     auto_augment="rand-m9-mstd0.5-inc1", reprob=0.25, interpolation="bicubic", crop_pct=0.9,
                     repeated_aug=True, backend="dali")
    ds = data.build_dataset(cfg, "train")
    ds.samples = ds.samples * (8192 // n)  # long epochs over page-cached files: no per-epoch restart in the figure
    loader_ips, images = dali_gpu_throughput(ds, cfg, 10 if quick else 30)
    train_ips, model = gpu_train_throughput(256, 10 if quick else 30)
    ratio = loader_ips / train_ips
    print(f"dali-gpu loader: {loader_ips:,.0f} img/s at 224 px (RandAugment m9 mstd0.5, erasing 0.25, batch 256, "
          f"{dali_threads} DALI + 2 reader threads, {images} images; target >= 10,000)")
    print(f"dali-gpu train:  {train_ips:,.0f} img/s {model} bf16 batch 256; loader / train = {ratio:.2f} "
          "(target >= 1.5)")
    tmp.cleanup()
    return 0


def loader_throughput(ds, cfg, max_batches, max_s):
    """img/s of one epoch's train loader (stops after max_batches or max_s seconds)."""
    loader = data.build_train_loader(ds, cfg, seed=0, epoch=0, rank=0, world_size=1)
    n, t0 = 0, None
    for i, (x, y) in enumerate(loader):
        if i == 1:  # don't count worker start-up / first-batch latency
            t0, n = time.perf_counter(), 0
        elif i > 1:
            n += len(y)
        if i >= max_batches or (t0 and time.perf_counter() - t0 > max_s):
            break
    return n / (time.perf_counter() - t0)


def make_model(name, num_classes, fallback):
    try:
        return timm.create_model(name, num_classes=num_classes), name
    except RuntimeError as e:  # an unknown model: the project's did not import (above)
        return timm.create_model(fallback, num_classes=num_classes), f"{fallback} (fallback: {type(e).__name__})"


def train_throughput(model, batch, size, steps):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = torch.randn(batch, 3, size, size), torch.randint(0, model.num_classes, (batch,))
    for i in range(steps + 1):
        if i == 1:
            t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return batch * steps / (time.perf_counter() - t0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small fixtures and few steps (~1 min)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--root", default="datasets", help="uses ROOT/cifar-10-batches-py if it exists")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dali-gpu", action="store_true", help="only the DALI-GPU loader vs ResMLP-S12 training check")
    p.add_argument("--no-dali", action="store_true", help="skip the DALI rows")
    args = p.parse_args()
    if args.dali_gpu:
        return dali_gpu_check(args.quick, max(args.workers, 8))
    torch.set_num_threads(args.threads)
    q = args.quick
    tmp = tempfile.TemporaryDirectory()
    cifar_root = args.root
    if not os.path.isdir(os.path.join(args.root, "cifar-10-batches-py")):
        cifar_root = os.path.join(tmp.name, "cifar")
        write_cifar_fixture(cifar_root, 2000 if q else 10000)
        print(f"(CIFAR-format fixture: {2000 if q else 10000} generated images in {cifar_root})")
    folder_root = os.path.join(tmp.name, "folder")
    n_jpeg = 300 if q else 1500
    write_imagefolder_fixture(folder_root, n_jpeg)
    print(f"(ImageFolder fixture: {n_jpeg} generated 256x320 JPEGs)")

    max_b, max_s = (15, 8) if q else (60, 30)
    base = DataConfig(dataset="cifar10", root=cifar_root, download=False, batch_size=128, num_workers=args.workers)
    cifar_train = data.build_dataset(base, "train")
    rows = []
    rows.append(("cifar in-memory (crop+flip)", loader_throughput(cifar_train, base, max_b * 4, max_s), "cifar"))
    pil = DataConfig(**{**base.__dict__, "in_memory": False})
    rows.append((f"cifar PIL path ({args.workers} workers)",
                 loader_throughput(cifar_train, pil, max_b, max_s), "cifar"))
    ra = DataConfig(**{**pil.__dict__, "auto_augment": "rand-m9-mstd0.5-inc1", "reprob": 0.25})
    rows.append((f"cifar PIL + RandAugment ({args.workers} w)",
                 loader_throughput(cifar_train, ra, max_b, max_s), "cifar"))
    deit = DataConfig(dataset="imagefolder", root=folder_root, image_size=224, batch_size=32, num_workers=args.workers,
                      auto_augment="rand-m9-mstd0.5-inc1", reprob=0.25, interpolation="bicubic", crop_pct=0.9)
    folder_train = data.build_dataset(deit, "train")
    rows.append((f"imagefolder DeiT 224px ({args.workers} w)",
                 loader_throughput(folder_train, deit, max_b, max_s), "imagenet"))

    steps = 3 if q else 10
    m_cifar, n_cifar = make_model("resmlp_cifar_s12", 10, "resmlp_12_224")
    train_cifar = train_throughput(m_cifar, 128, 32 if "fallback" not in n_cifar else 224, steps)
    del m_cifar
    m_in, n_in = make_model("resmlp_s12", 1000, "resmlp_12_224")
    train_in = train_throughput(m_in, 32, 224, max(2, steps // 2))
    train = {"cifar": (train_cifar, n_cifar), "imagenet": (train_in, n_in)}

    print(f"\n{'loader':40s} {'loader img/s':>13s} {'train img/s':>12s} {'ratio':>7s}  model")
    for name, ips, kind in rows:
        t, mname = train[kind]
        ratio = ips / t
        flag = "" if ratio >= 3 else "  (< 3: loader could bottleneck)"
        print(f"{name:40s} {ips:13.0f} {t:12.1f} {ratio:7.1f}  {mname}{flag}")
    print(f"\n(torch threads {args.threads}, loader workers {args.workers}; training: bf16 autocast on CPU, "
          "batch 128 @32px / 32 @224px; numbers are noisy on a shared machine, ratios are what matter)")
    if not args.no_dali:
        dali_rows(tmp.name, q, args.workers)
    tmp.cleanup()


if __name__ == "__main__":
    main()
