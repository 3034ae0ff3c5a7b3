"""Calibration check for the built-in dataset: a linear classifier on pixels should do
clearly worse (<= ~70%) than a small ResMLP (dim 128, depth 4, patch 4), which should reach >= 90%
validation accuracy on builtin10 within about two minutes of 2-core CPU training.

    python scripts/check_builtin.py [--dataset builtin10] [--epochs 5] [--batch-size 64] [--lr 2e-3]
                                    [--threads 2] [--budget-s 600] [--skip-linear]

Trains through the real in-memory train loader (random crop + flip) with bf16 autocast and AdamW
(wd 0.05), linear warmup (1/4 epoch) + cosine over the given epochs (stops early at the time
budget), then prints val accuracy with wall and process-CPU seconds. On a machine shared with
other jobs, --threads 1 is faster and the CPU seconds are the meaningful cost.
"""
import argparse
import math
import time

import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

import timm
import torch
import torch.nn.functional as F
from timm.models.mlp_mixer import Affine, MlpMixer, ResBlock

import data
from configs.schema import DataConfig

try:  # the project's resmlp_tiny (registered with timm on this import), else timm's MlpMixer of its shape
    from models import resmlp
except ImportError:
    resmlp = None


def make_model(num_classes):
    if resmlp is not None:
        return timm.create_model("resmlp_tiny", num_classes=num_classes), "models.resmlp resmlp_tiny"
    m = MlpMixer(img_size=32, patch_size=4, num_blocks=4, embed_dim=128, block_layer=ResBlock,
                 norm_layer=Affine, num_classes=num_classes)
    return m, "timm MlpMixer(ResBlock, Affine) dim128 depth4 patch4"


@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    correct = n = 0
    for x, y in loader:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            correct += (model(x).argmax(1) == y).sum().item()
        n += y.numel()
    model.train()
    return correct / n


def linear_probe(train_ds, val_ds, epochs=30):
    """Multinomial logistic regression on normalised pixels (full-batch-ish AdamW)."""
    xtr = train_ds.images.float().flatten(1) / 255
    xva = val_ds.images.float().flatten(1) / 255
    mu, sd = xtr.mean(0), xtr.std(0) + 1e-3
    xtr, xva = (xtr - mu) / sd, (xva - mu) / sd
    ytr, yva = train_ds.labels, val_ds.labels
    lin = torch.nn.Linear(xtr.shape[1], train_ds.num_classes)
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-3, weight_decay=1e-2)
    g = torch.Generator().manual_seed(0)
    best_val = 0.0
    for _ in range(epochs):
        perm = torch.randperm(len(ytr), generator=g)
        for i in range(0, len(perm), 512):
            idx = perm[i:i + 512]
            loss = F.cross_entropy(lin(xtr[idx]), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            train_acc = (lin(xtr).argmax(1) == ytr).float().mean().item()
            best_val = max(best_val, (lin(xva).argmax(1) == yva).float().mean().item())
    return train_acc, best_val


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", default="builtin10")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--budget-s", type=float, default=600.0)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--train-size", type=int, default=20000)
    p.add_argument("--skip-linear", action="store_true")
    p.add_argument("--threads", type=int, default=2,
                   help="torch threads (1 is faster on a machine shared with other jobs)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    cfg = DataConfig(dataset=args.dataset, batch_size=args.batch_size, builtin_train_size=args.train_size)
    t0 = time.time()
    train_ds, val_ds = data.build_dataset(cfg, "train"), data.build_dataset(cfg, "val")
    print(f"dataset {args.dataset}: train {len(train_ds)} val {len(val_ds)} classes {train_ds.num_classes} "
          f"(generated/loaded in {time.time() - t0:.1f}s)", flush=True)

    if not args.skip_linear:
        t0 = time.time()
        tr, va = linear_probe(train_ds, val_ds)
        print(f"linear classifier on pixels: train acc {tr:.3f}  val acc {va:.3f}  ({time.time() - t0:.0f}s)",
              flush=True)

    torch.manual_seed(0)
    model, desc = make_model(train_ds.num_classes)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    val_loader = data.build_eval_loader(val_ds, cfg, rank=0, world_size=1)
    steps_per_epoch = len(data.build_train_loader(train_ds, cfg, seed=0, epoch=0, rank=0, world_size=1))
    total = steps_per_epoch * args.epochs
    warmup = steps_per_epoch // 4
    step, t0, cpu0, stop = 0, time.time(), time.process_time(), False
    for epoch in range(args.epochs):
        for x, y in data.build_train_loader(train_ds, cfg, seed=0, epoch=epoch, rank=0, world_size=1):
            lr = args.lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / total))
            for group in opt.param_groups:
                group["lr"] = lr
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if time.time() - t0 > args.budget_s:
                stop = True
                break
        elapsed = time.time() - t0
        cpu = time.process_time() - cpu0
        acc = evaluate(model, val_loader)
        print(f"epoch {epoch}: step {step} loss {loss.item():.3f} val acc {acc:.3f} "
              f"train time {elapsed:.0f}s wall, {cpu:.0f}s CPU ({step * args.batch_size / elapsed:.0f} img/s)",
              flush=True)
        if stop:
            break
    print(f"RESULT {desc}: val acc {acc:.3f} after {step} steps of batch {args.batch_size} "
          f"({step * args.batch_size} images), {time.time() - t0:.0f}s wall / "
          f"{time.process_time() - cpu0:.0f}s CPU of training")


if __name__ == "__main__":
    main()
