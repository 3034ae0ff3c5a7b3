#!/usr/bin/env python3
"""One-call GPU benchmark: everything a GPU user asks of this repository, in < 8 minutes
on one H100/H200, written to one JSON file plus a printed table.

    python3 scripts/bench_gpu.py [--out DIR] [--quick] [--peak-tflops 989] [--train-seconds 120]

1. model:  ResMLP-S12/224 training img/s (forward + cross-entropy + backward + fused AdamW step,
           bf16 autocast, batch 256), ours vs timm's `resmlp_12_224`, eager and torch.compile'd,
           and model FLOPs utilisation (achieved FLOP/s / the GPU's bf16 dense peak).
2. heads:  every mapping and Fenchel-Young loss, forward + backward, vs the `entmax` package and
           vs F.cross_entropy, K in {10, 100, 1000, 32000} (scripts/bench_heads.py --device cuda).
3. step:   the per-head full training-step overhead at 1000 classes (scripts/bench_train_heads.py).
4. train:  a ~2-minute train.py run of resmlp_cifar_s12 on the built-in data with
           torch.cuda.set_sync_debug_mode("error") on every step that is not a log step
           (train.sync_debug=true): it fails if the loop syncs, and reports steps/s.

FLOPs are counted by torch.utils.flop_counter (matmuls; 2 per multiply-add) for one training
step; the peak comes from a small table of dense bf16 tensor-core figures by device name, or
--peak-tflops. Nothing is downloaded; models are randomly initialised. The CPU can run the
model part for a smoke test (--device cpu --quick), not for figures.
"""
import argparse
import json
import os
import subprocess
import sys
import time

from _root import ROOT  # the repository root, on sys.path (scripts/_root.py)

import timm
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import models.resmlp  # noqa: F401  (registers resmlp_* with timm)
from common import rundir
from common.children import ChildProcesses, StoppedBySignal
from common.cli import run_cli
from common.io import prepare_output, write_json, writing
from models.convert import convert_state_dict

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, from the vendors' data sheets.
PEAK_BF16_TFLOPS = {
    "H200": 989.4, "H100 SXM": 989.4, "H100 NVL": 835.5, "H100 PCIe": 756.5, "H100": 989.4,
    "GH200": 989.4, "B200": 2250.0, "A100": 312.0, "A10G": 70.0, "L40S": 362.1, "L4": 121.0,
    "RTX 4090": 165.2, "RTX 3090": 71.0,
}


def peak_tflops(device_name, override=None):
    if override:
        return float(override), "given"
    for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):  # most specific name first
        if key in device_name:
            return PEAK_BF16_TFLOPS[key], f"table ({key})"
    return None, "unknown device: pass --peak-tflops"


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def model_pair(device):
    """(ours, timm's) ResMLP-S12/224 with identical weights (timm's converted into ours)."""
    ref = timm.create_model("resmlp_12_224", num_classes=1000)
    ours = timm.create_model("resmlp_s12", num_classes=1000)
    ours.load_state_dict(convert_state_dict(ref.state_dict(), ours))
    return ours.to(device).train(), ref.to(device).train()


def train_step_fn(model, x, y, device):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def step_flops(model, x, y, device):
    counter = FlopCounterMode(display=False)
    with counter, torch.autocast(device.type, dtype=torch.bfloat16):
        F.cross_entropy(model(x).float(), y).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def time_steps(step, n, device):
    sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    sync(device)
    return time.perf_counter() - t0


def bench_model(device, batch, steps, reps, peak):
    """img/s of ours vs timm, eager and compiled; interleaved repetitions, best of `reps`."""
    torch.manual_seed(0)
    x = torch.randn(batch, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    results = {}
    for mode in ("eager", "compiled"):
        ours, ref = model_pair(device)
        nets = {"ours": ours, "timm": ref}
        if mode == "compiled":
            nets = {k: torch.compile(m) for k, m in nets.items()}
        fns = {k: train_step_fn(m, x, y, device) for k, m in nets.items()}
        warm = {}
        for k, f in fns.items():  # the first calls compile (minutes on CPU, ~1 min on GPU): not timed
            t0 = time.perf_counter()
            for _ in range(3):
                f()
            sync(device)
            warm[k] = time.perf_counter() - t0
        best = {k: float("inf") for k in fns}
        for r in range(reps):
            for k in (("ours", "timm") if r % 2 == 0 else ("timm", "ours")):
                best[k] = min(best[k], time_steps(fns[k], steps, device) / steps)
        flops = step_flops(ours, x, y, device)
        row = {"img_per_s": {k: batch / t for k, t in best.items()},
               "ours_over_timm": best["timm"] / best["ours"],
               "warmup_s": warm, "step_tflop": flops / 1e12}
        if peak:
            row["mfu"] = {k: flops / t / (peak * 1e12) for k, t in best.items()}
        results[mode] = row
        del nets, fns, ours, ref
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def run_script(children, args, timeout, log):
    """Run a sibling script with the same interpreter through `children` (common.children: while it
    runs our signals reach it, a time limit kills it with exit 124); return (exit code, seconds).
    Raises StoppedBySignal once this script was signalled."""
    t0 = time.perf_counter()
    with writing(log):
        f = open(log, "w")
    with f, children:
        rc = children.run([sys.executable, *args], timeout=timeout, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    children.check_stopped(f"{args[0]} stopped (exit {rc}); nothing more is measured", rc)
    return rc, time.perf_counter() - t0


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def bench_training(children, out, seconds, ips_guess, timeout):
    """~`seconds` of train.py on the built-in data under sync-debug "error" on non-log steps."""
    train_size = 50000
    epochs = max(1, round(seconds * ips_guess / train_size))
    run_dir = os.path.join(out, "train_sync_debug")
    args = ["train.py", "--config", "configs/quickstart.yaml", "--overwrite",
            "model.name=resmlp_cifar_s12", "data.batch_size=256", "data.eval_batch_size=1000",
            f"data.builtin_train_size={train_size}", f"optim.epochs={epochs}", "optim.warmup_epochs=0.2",
            "optim.lr_base_batch=256", "train.mixed_precision=bf16", "train.progress=false",
            "train.log_with=none", "train.save_every=100000", "train.log_every=50",
            "train.sync_debug=true", f"train.output_dir={run_dir}"]
    rc, wall = run_script(children, args, timeout, os.path.join(out, "train_sync_debug.log"))
    summary = read_json(os.path.join(run_dir, rundir.SUMMARY)) or {}
    return {"exit_code": rc, "wall_s": wall, "epochs": epochs, "steps": summary.get("steps"),
            "steps_per_s": (summary["steps"] / summary["train_time_s"]) if summary.get("train_time_s") else None,
            "img_per_s": summary.get("img_per_s"),
            "top1": (summary.get("final", {}).get("raw") or {}).get("top1")}


def print_table(res):
    print(f"\n==== bench_gpu: {res['device']}  torch {res['torch']}  peak bf16 "
          f"{res['peak_tflops']} TFLOP/s ({res['peak_source']})")
    for mode, row in res.get("model", {}).items():
        ips = row["img_per_s"]
        mfu = row.get("mfu", {})
        print(f"S12/224 {mode:<8} ours {ips['ours']:>8.0f} img/s  timm {ips['timm']:>8.0f} img/s  "
              f"ours/timm {row['ours_over_timm']:.3f}  MFU ours "
              + (f"{100 * mfu['ours']:.1f}%" if mfu else "n/a") + f"  ({row['step_tflop']:.2f} TFLOP/step)")
    for name in ("heads", "step_overhead"):
        part = res.get(name)
        if part:
            print(f"{name}: exit {part['exit_code']} in {part['wall_s']:.0f}s, table in {part['log']}")
    t = res.get("train")
    if t:
        top1 = t.get("top1")
        learned = "" if top1 is None else (f", val top-1 {100 * top1:.1f}%" + (
            "  ** DID NOT LEARN (chance is 10%): see tests/test_cuda_learning.py **" if top1 < 0.2 else ""))
        print(f"train.py sync-debug run: exit {t['exit_code']}, {t['steps']} steps, "
              f"{t['steps_per_s'] or float('nan'):.1f} steps/s, {t['img_per_s'] or float('nan'):.0f} img/s{learned}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/bench_gpu", help="folder for the JSON, logs and the training run")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="fewer steps (a smoke run; figures are rough)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--peak-tflops", type=float, default=None, help="bf16 dense peak of this GPU")
    ap.add_argument("--train-seconds", type=float, default=60)
    ap.add_argument("--skip", nargs="*", default=[], choices=["model", "heads", "step", "train"])
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA GPU visible; use --device cpu --quick for a smoke run", file=sys.stderr)
        return 2
    prepare_output(args.out, folder=True)  # a folder that cannot be written: one line (exit 74) before measuring
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak, source = peak_tflops(name, args.peak_tflops)
    res = {"device": name, "torch": torch.__version__, "peak_tflops": peak, "peak_source": source}
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    json_path = os.path.join(args.out, "bench_gpu.json")

    def save():  # after every part: a time limit that stops the script keeps what was measured
        write_json(res, json_path)

    try:
        run_parts(args, device, res, peak, save, ChildProcesses())
    except StoppedBySignal as stop:
        save()
        print(f"error: {stop} (written so far: {json_path})", file=sys.stderr)
        return stop.exit_code
    save()
    print_table(res)
    for name in ("heads", "step_overhead", "train"):
        if name in res and res[name]["exit_code"] != 0:
            print(f"--- {name} failed; last lines of its log:")
            log_path = res[name].get("log") or os.path.join(args.out, "train_sync_debug.log")
            print("".join(open(log_path).readlines()[-15:]))
    print(f"\nwritten: {json_path}")
    return 0


def run_parts(args, device, res, peak, save, children):
    """The parts not skipped, in order, each saved to the JSON when done."""
    dev = device.type
    if "model" not in args.skip:
        steps, reps = (3, 2) if args.quick else (10, 3)
        batch = 8 if dev == "cpu" else args.batch_size
        res["model"] = bench_model(device, batch, steps, reps, peak)
        save()
    if "heads" not in args.skip:
        log = os.path.join(args.out, "heads.txt")
        rc, wall = run_script(children, ["scripts/bench_heads.py", "--device", dev, "--quick"], 120, log)
        res["heads"] = {"exit_code": rc, "wall_s": wall, "log": log}
        save()
    if "step" not in args.skip:
        log = os.path.join(args.out, "step_overhead.txt")
        rc, wall = run_script(children, ["scripts/bench_train_heads.py", "--device", dev, "--bf16", "--quick",
                               "--classes", "1000", "--batch-size", str(args.batch_size if dev == "cuda" else 16),
                               "model.name=resmlp_s12", "data.image_size=224"], 120, log)
        res["step_overhead"] = {"exit_code": rc, "wall_s": wall, "log": log}
        save()
    if "train" not in args.skip and dev == "cuda":
        ips_guess = 40000.0  # resmlp_cifar_s12 bf16 on an H100-class GPU; only sizes the run
        res["train"] = bench_training(children, args.out, args.train_seconds, ips_guess,
                                      timeout=int(args.train_seconds + 90))
        save()


if __name__ == "__main__":
    run_cli(main)
