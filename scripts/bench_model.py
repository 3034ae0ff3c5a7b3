"""Training-step throughput of this project's ResMLP vs timm's, same config and same weights.

    python scripts/bench_model.py            # CIFAR S12 (32px) and S12/224, fp32 and bf16 autocast
    python scripts/bench_model.py --quick    # fewer steps/repetitions, for a smoke run

A step is forward + cross-entropy + backward (the optimizer update is identical for both models
and left out). timm's model is converted into ours with models.convert, so both compute the same
function. Timings on a shared machine are noisy: the two models are measured in interleaved
repetitions and the table reports medians and the ratio ours ÷ timm (higher is better for us).
"""
import argparse
import os
import statistics
import sys
import time
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from timm.models.mlp_mixer import Affine as TimmAffine, MlpMixer, ResBlock  # noqa: E402

from models.convert import convert_state_dict  # noqa: E402
from models.resmlp import VARIANTS, create_resmlp  # noqa: E402

CASES = (("resmlp_cifar_s12", 64), ("resmlp_s12", 16))


def build_pair(name, num_classes, device):
    cfg = VARIANTS[name]
    with torch.device("meta"):  # skip our init: the weights come from timm's model
        ours = create_resmlp(name, num_classes=num_classes)
    ref = MlpMixer(num_classes=num_classes, img_size=cfg["img_size"], patch_size=cfg["patch_size"],
                   num_blocks=cfg["depth"], embed_dim=cfg["embed_dim"], mlp_ratio=4,
                   block_layer=partial(ResBlock, init_values=ours.init_values), norm_layer=TimmAffine)
    ours.load_state_dict(convert_state_dict(ref.state_dict(), ours), assign=True)
    ours = ours.to(device)
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


def bench(ours, ref, name, batch, amp, device, steps, reps):
    size = VARIANTS[name]["img_size"]
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    steps_by = {"ours": step_fn(ours, x, y, amp, device), "timm": step_fn(ref, x, y, amp, device)}
    for s in steps_by.values():  # warmup (allocator, oneDNN primitive caches)
        timed(s, 1, device)
    times = {"ours": [], "timm": []}
    ratios = []
    for r in range(reps):
        order = ("ours", "timm") if r % 2 == 0 else ("timm", "ours")  # interleave, alternate order
        t = {k: timed(steps_by[k], steps, device) for k in order}
        for k in t:
            times[k].append(t[k])
        ratios.append(t["timm"] / t["ours"])
    ips = {k: batch * steps / statistics.median(v) for k, v in times.items()}
    return ips, statistics.median(ratios)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short run (1 step per repetition, half batch on CPU)")
    ap.add_argument("--steps", type=int, default=None, help="steps per timed repetition")
    ap.add_argument("--reps", type=int, default=None, help="interleaved repetitions per model")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    steps = args.steps or (1 if args.quick else 2)
    reps = args.reps or (3 if args.quick else 5)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {steps} steps x {reps} interleaved reps")
    print(f"{'device':6} {'model':18} {'batch':>5} {'precision':9} {'ours img/s':>11} {'timm img/s':>11} {'ours/timm':>9}")
    for device in devices:
        for name, batch in CASES:
            if device == "cuda":
                batch *= 4
            elif args.quick:
                batch //= 2
            torch.manual_seed(0)
            ours, ref = build_pair(name, 10, device)
            for amp in (False, True):
                ips, ratio = bench(ours, ref, name, batch, amp, device, steps, reps)
                print(f"{device:6} {name:18} {batch:5d} {'bf16' if amp else 'fp32':9} "
                      f"{ips['ours']:11.1f} {ips['timm']:11.1f} {ratio:9.2f}", flush=True)


if __name__ == "__main__":
    main()
