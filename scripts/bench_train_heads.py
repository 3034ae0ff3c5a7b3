"""Training-step throughput per output head at 1000 classes.

Same model, same batch, same optimizer (the config's: timm LAMB by default); only the head
differs. A step is forward + the head's training loss (fp32 on the logits, soft Mixup-style
targets unless --hard-targets) + backward + optimizer update, as in train.py. Heads are timed in
interleaved rounds (every head of models.heads.HEAD_NAMES in turn, order alternating) so a noisy,
shared machine affects them alike (one step per head in turn); the median step time per head is
reported with its overhead over softmax as a percentage of the step (target: <= 2% at 1000 classes).

    python scripts/bench_train_heads.py [--config configs/quickstart.yaml] [--classes 1000]
        [--batch-size 128] [--bf16] [--rounds 7] [--steps 10] [--quick] [--device cpu|cuda]
"""
import argparse
import os
import statistics
import time

import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

import torch

import configs
from common.cli import run_cli
from models import create_classifier
from models.heads import HEAD_NAMES
from training.optim import build_optimizer


def build(cfg, head, num_classes, device):
    cfg.head.name = head
    torch.manual_seed(0)
    model = create_classifier(cfg.model, cfg.head, num_classes, img_size=cfg.data.image_size).to(device).train()
    opt = build_optimizer(model, cfg.optim, global_batch=cfg.optim.lr_base_batch)
    return model, opt


def make_step(model, opt, x, target, device, bf16):
    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        loss = model.output_head.loss(logits.float(), target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=os.path.join(configs.CONFIG_DIR, "quickstart.yaml"))
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (as train.mixed_precision=bf16)")
    p.add_argument("--hard-targets", action="store_true", help="int labels instead of soft (Mixup-like) targets")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=10, help="timed steps per head per round (interleaved)")
    p.add_argument("--quick", action="store_true", help="3 rounds x 4 steps")
    p.add_argument("--heads", default=",".join(HEAD_NAMES))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--keep-denormals", action="store_true", help="don't flush denormals (shows their CPU cost)")
    p.add_argument("overrides", nargs="*", help="config overrides key.sub=value")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.steps = 3, 4
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.keep_denormals:
        torch.set_flush_denormal(True)  # as train.py does
    device = torch.device(args.device)
    cfg = configs.load_config(args.config, args.overrides)
    heads = args.heads.split(",")

    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch_size, 3, cfg.data.image_size, cfg.data.image_size, generator=g).to(device)
    if args.hard_targets:
        target = torch.randint(0, args.classes, (args.batch_size,), generator=g).to(device)
    else:  # Mixup-like rows: two classes mixed, label-smoothed
        y1 = torch.randint(0, args.classes, (args.batch_size,), generator=g)
        y2 = torch.randint(0, args.classes, (args.batch_size,), generator=g)
        lam = torch.rand(args.batch_size, 1, generator=g)
        eps = 0.1
        one = lambda y: torch.nn.functional.one_hot(y, args.classes).float() * (1 - eps) + eps / args.classes  # noqa: E731
        target = (lam * one(y1) + (1 - lam) * one(y2)).to(device)

    steps = {}
    for h in heads:
        model, opt = build(cfg, h, args.classes, device)
        steps[h] = make_step(model, opt, x, target, device, args.bf16)
        for _ in range(2):  # warm-up (allocator, autotuning, lazy init)
            steps[h]()
    sync(device)
    times = {h: [] for h in heads}
    for r in range(args.rounds * args.steps):
        order = heads if r % 2 == 0 else heads[::-1]  # alternate the order: no head always goes first
        for h in order:  # one step per head in turn: load changes on a shared machine hit all alike
            sync(device)
            t0 = time.perf_counter()
            steps[h]()
            sync(device)
            times[h].append(time.perf_counter() - t0)

    anchor = statistics.median(times["softmax"]) if "softmax" in times else None
    print(f"model {cfg.model.name} ({cfg.data.image_size}px), {args.classes} classes, batch {args.batch_size}, "
          f"{'bf16' if args.bf16 else 'fp32'}, {cfg.optim.name}, {'hard' if args.hard_targets else 'soft'} targets, "
          f"device {device}, threads {torch.get_num_threads()}, {args.rounds} rounds x {args.steps} steps, "
          f"denormals {'kept' if args.keep_denormals else 'flushed'}")
    print(f"{'head':<14}{'step ms':>10}{'img/s':>10}{'overhead vs softmax':>22}")
    for h in heads:
        med = statistics.median(times[h])
        over = f"{100 * (med - anchor) / anchor:+.1f}% of step" if anchor else "-"
        print(f"{h:<14}{1000 * med:>10.2f}{args.batch_size / med:>10.0f}{over:>22}")
    return 0


if __name__ == "__main__":
    run_cli(main)
