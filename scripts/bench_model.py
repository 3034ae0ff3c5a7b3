"""Training-step throughput of this project's ResMLP vs timm's, same config and same weights,
eager and compiled (torch.compile), fp32 and bf16 autocast, all in one run.

    python scripts/bench_model.py            # CIFAR S12 (32 px) and S12/224
    python scripts/bench_model.py --quick    # CIFAR S12 only, small batch, fewer repetitions

A step is forward + cross-entropy + backward (the optimizer update is identical for both models
and left out). timm's model is converted into ours with models.convert, so both compute the same
function. The anchor is timm's model measured in the same run, in the same mode (eager or
compiled) and precision: the table reports medians and the ratio ours ÷ timm in throughput
(higher is better for us). Timings on a shared machine are noisy: the two models are measured in
interleaved repetitions with alternating order, and the ratio is the median of per-repetition
ratios. Compilation happens in the warm-up steps, which are not timed.
"""
import argparse
import statistics
import time
from functools import partial

import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

import torch
import torch.nn.functional as F
from timm.models.mlp_mixer import Affine as TimmAffine
from timm.models.mlp_mixer import MlpMixer, ResBlock

from models.convert import convert_state_dict
from models.resmlp import VARIANTS, create_resmlp

FULL_CASES = (("resmlp_cifar_s12", 64), ("resmlp_s12", 16))
QUICK_CASES = (("resmlp_cifar_s12", 32),)


def build_pair(name, num_classes, device):
    """(ours, timm's) for variant `name`, holding identical weights, in training mode."""
    cfg = VARIANTS[name]
    with torch.device("meta"):  # skip our init: the weights come from timm's model
        ours = create_resmlp(name, num_classes=num_classes)
    ref = MlpMixer(num_classes=num_classes, img_size=cfg["img_size"], patch_size=cfg["patch_size"],
                   num_blocks=cfg["depth"], embed_dim=cfg["embed_dim"], mlp_ratio=4,
                   block_layer=partial(ResBlock, init_values=ours.init_values), norm_layer=TimmAffine)
    ours.load_state_dict(convert_state_dict(ref.state_dict(), ours), assign=True)
    for p in ours.parameters():  # assign=True would share storage with timm's tensors
        p.data = p.data.clone()
    return ours.to(device).train(), ref.to(device).train()


def step_fn(model, x, y, amp, device):
    def step():
        model.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
    return step


def timed(step, n, device):
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def bench(models, size, batch, amp, device, steps, reps, warmup):
    """Interleaved timing of `models` ({"ours": m, "anchor": m}) on one random batch.

    Returns (images/s per model from median times, median over repetitions of anchor time ÷ ours).
    """
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    steps_by = {k: step_fn(m, x, y, amp, device) for k, m in models.items()}
    for s in steps_by.values():  # warm-up: compilation, allocator, oneDNN primitive caches
        timed(s, warmup, device)
    times = {k: [] for k in models}
    ratios = []
    keys = list(models)
    for r in range(reps):
        order = keys if r % 2 == 0 else keys[::-1]  # interleave, alternate order
        t = {k: timed(steps_by[k], steps, device) for k in order}
        for k in t:
            times[k].append(t[k])
        ratios.append(t["anchor"] / t["ours"])
    ips = {k: batch * steps / statistics.median(v) for k, v in times.items()}
    return ips, statistics.median(ratios)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="CIFAR S12 only, 1 step per repetition, 3 repetitions, batch 32 on CPU")
    ap.add_argument("--steps", type=int, default=None, help="steps per timed repetition")
    ap.add_argument("--reps", type=int, default=None, help="interleaved repetitions per model")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    ap.add_argument("--modes", default="eager,compiled", help="comma-separated subset of eager,compiled")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - {"eager", "compiled"}:
        ap.error(f"--modes takes eager and/or compiled, got {args.modes!r}")
    steps = args.steps or (1 if args.quick else 2)
    reps = args.reps or (3 if args.quick else 5)
    cases = QUICK_CASES if args.quick else FULL_CASES
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {steps} steps x {reps} interleaved reps; "
          "anchor: timm's ResMLP in the same mode and precision")
    print(f"{'device':6} {'model':18} {'batch':>5} {'mode':8} {'precision':9} "
          f"{'ours img/s':>11} {'timm img/s':>11} {'ours/timm':>9}")
    for device in devices:
        for name, batch in cases:
            batch = batch * 4 if device == "cuda" else batch
            torch.manual_seed(0)
            ours, ref = build_pair(name, 10, device)
            for mode in modes:
                if mode == "compiled":
                    models = {"ours": torch.compile(ours), "anchor": torch.compile(ref)}
                else:
                    models = {"ours": ours, "anchor": ref}
                for amp in (False, True):
                    ips, ratio = bench(models, VARIANTS[name]["img_size"], batch, amp, device, steps, reps,
                                       warmup=2 if mode == "compiled" else 1)
                    print(f"{device:6} {name:18} {batch:5d} {mode:8} {'bf16' if amp else 'fp32':9} "
                          f"{ips['ours']:11.1f} {ips['anchor']:11.1f} {ratio:9.2f}", flush=True)


if __name__ == "__main__":
    main()
