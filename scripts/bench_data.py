"""Loader throughput vs training throughput (issue 4): data must never be the bottleneck (ratio >= 3).

    python scripts/bench_data.py [--quick] [--workers 2] [--root DIR]

Rows (img/s, measured in this run on this machine):
  cifar in-memory   uint8 split on device, batch crop/flip/normalise   vs  resmlp_cifar_s12 training
  cifar PIL         timm/torchvision per-sample path, N workers         vs  resmlp_cifar_s12 training
  cifar PIL + RA    same with RandAugment rand-m9-mstd0.5-inc1 + erasing vs  resmlp_cifar_s12 training
  imagefolder DeiT  generated 224 px JPEGs, DeiT train transform        vs  resmlp_s12 training
Uses real CIFAR-10 under --root if present, else CIFAR-format fixtures (random pixels) in a temp dir.
Training throughput: fwd+bwd+AdamW step, bf16 autocast on CPU, batch as in the loader rows.
"""
import argparse
import os
import pickle
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from PIL import Image  # noqa: E402

import data  # noqa: E402
from configs.schema import DataConfig  # noqa: E402


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
    import timm

    try:
        from models import resmlp  # noqa: F401  (registers the project's resmlp_* names)

        return timm.create_model(name, num_classes=num_classes), name
    except (ImportError, RuntimeError) as e:
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
    args = p.parse_args()
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
    rows.append((f"cifar PIL path ({args.workers} workers)", loader_throughput(cifar_train, pil, max_b, max_s), "cifar"))
    ra = DataConfig(**{**pil.__dict__, "auto_augment": "rand-m9-mstd0.5-inc1", "reprob": 0.25})
    rows.append((f"cifar PIL + RandAugment ({args.workers} w)", loader_throughput(cifar_train, ra, max_b, max_s), "cifar"))
    deit = DataConfig(dataset="imagefolder", root=folder_root, image_size=224, batch_size=32, num_workers=args.workers,
                      auto_augment="rand-m9-mstd0.5-inc1", reprob=0.25, interpolation="bicubic", crop_pct=0.9)
    folder_train = data.build_dataset(deit, "train")
    rows.append((f"imagefolder DeiT 224px ({args.workers} w)", loader_throughput(folder_train, deit, max_b, max_s), "imagenet"))

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
    tmp.cleanup()


if __name__ == "__main__":
    main()
