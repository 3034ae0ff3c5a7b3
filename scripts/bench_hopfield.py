"""Hopfield pooling against average pooling: training-step overhead and accuracy.

1. Step overhead. The same model (the config's) with model.pool=avg and with model.pool=hopfield under
   each --mappings, on the same batch with the same optimizer; a step is forward + the head's loss +
   backward + optimizer update, as in train.py. The variants are timed in interleaved rounds (one step
   each in turn, order alternating) so a shared machine's load hits them alike; the median step time
   of each is reported as a ratio against avg measured in the same run.
2. Accuracy. Each variant is trained on the built-in data for each of --seeds (train.py, then eval.py, as
   child processes; a tiny recipe on top of the config: --img-size, --train-size, --val-size, --epochs) and evaluated by
   eval.py (which reports the pooling support); each hopfield variant is compared with avg by
   comparison.analysis.paired.compare_pair: across trainings (per-seed paired differences, t-interval over
   seeds, exact sign-flip p, two-level bootstrap, 80%-power minimum detectable difference, seeds
   needed), and given these trainings (bootstrap over validation images, McNemar).

    python scripts/bench_hopfield.py [--config configs/quickstart_compare.yaml] [--mappings softmax sparsemax ksubset]
        [--pool-k 4]
        [--seeds 0 1 2] [--img-size 16] [--train-size 6000] [--val-size 1000] [--epochs 2]
        [--rounds 5] [--steps 4] [--runs-dir DIR] [--speed-only | --accuracy-only] [--quick] [key.sub=value ...]

The defaults (resmlp_tiny at 16 px: 16 patches; fp32, batch 32, 2 epochs over 6000 images; 3 seeds x 3 variants) take
about 5 minutes on an idle 2-core CPU; --quick (1 seed, 1 epoch over 1000 images, 2 rounds) checks
that everything runs. The accuracy is at a fixed short budget: it says how fast each pooling learns
at this scale, not where it ends up. Runs go to --runs-dir (default: a temporary folder, removed at
the end); a finished run found there (summary.json and eval.json) is reused, so a rerun only reports.
"""
import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time

from _root import ROOT  # the repository root, on sys.path (scripts/_root.py)

import torch

import configs
from common import rundir
from common.children import ChildProcesses
from common.cli import run_cli
from common.errors import UserError
from comparison.analysis import paired
from comparison.report import document
from evaluation import tables
from models import create_classifier
from models.hopfield_pool import POOL_MAPPINGS
from models.mapping_table import MAPPINGS
from training.optim import build_optimizer

ANCHOR = "avg"
NUM_CLASSES = 10  # the built-in data's


def variant_name(mapping):
    return ANCHOR if mapping is None else f"hopfield-{mapping}"


def pool_k_of(mapping, k):
    """model.pool_k for the mappings that retrieve a k-subset (ksubset), None for the others."""
    return k if mapping is not None and "k" in MAPPINGS[mapping].needs else None


def pool_overrides(mapping, k):
    if mapping is None:
        return ["model.pool=avg"]
    k = pool_k_of(mapping, k)
    return ["model.pool=hopfield", f"model.pool_mapping={mapping}"] + ([f"model.pool_k={k}"] if k else [])


def recipe_overrides(args):
    """The tiny recipe on top of the config (one place: speed and accuracy use the same model)."""
    # fp32: bf16 autocast is ~10x slower than fp32 on CPUs without native bf16 matmuls. Batch 32 at
    # the config's lr (not scaled down): more updates per image, past the initial plateau sooner.
    return [f"data.image_size={args.img_size}", f"data.builtin_train_size={args.train_size}",
            f"data.builtin_val_size={args.val_size}", "data.calib_fraction=0", f"optim.epochs={args.epochs}",
            "data.batch_size=32", "optim.lr_base_batch=32", "train.mixed_precision=no", "train.ema=false",
            "train.progress=false", "train.log_with=none"] + args.overrides


# ------------------------------------------------------------------------------------- step overhead
def make_step(model, opt, x, y):
    def step():
        loss = model.output_head.loss(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def step_times(cfg, mappings, batch, rounds, steps, pool_k):
    """{variant: [seconds per step]} over interleaved rounds, the same batch for every variant."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, cfg.data.image_size, cfg.data.image_size, generator=g)
    y = torch.randint(0, NUM_CLASSES, (batch,), generator=g)
    fns = {}
    for mapping in [None] + mappings:
        model_cfg = dataclasses.replace(cfg.model, pool="avg" if mapping is None else "hopfield",
                                        pool_mapping=mapping or "softmax", pool_k=pool_k_of(mapping, pool_k))
        torch.manual_seed(0)
        model = create_classifier(model_cfg, cfg.head, NUM_CLASSES, img_size=cfg.data.image_size).train()
        opt = build_optimizer(model, cfg.optim, global_batch=cfg.optim.lr_base_batch)
        fns[variant_name(mapping)] = make_step(model, opt, x, y)
        for _ in range(2):  # warm-up (allocator, lazy init)
            fns[variant_name(mapping)]()
    times = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds * steps):
        for name in (names if r % 2 == 0 else names[::-1]):  # alternate: no variant always goes first
            t0 = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t0)
    return times


def print_speed(times, cfg, batch, rounds, steps):
    anchor = statistics.median(times[ANCHOR])
    print(f"step overhead: {cfg.model.name} ({cfg.data.image_size} px, {(cfg.data.image_size // 4) ** 2} patches), "
          f"batch {batch}, {cfg.optim.name}, fp32, threads {torch.get_num_threads()}, {rounds} rounds x {steps} "
          f"steps, interleaved")
    print(f"{'pooling':<22}{'step ms':>10}{'img/s':>9}{'ratio vs avg':>14}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<22}{1000 * med:>10.2f}{batch / med:>9.0f}{med / anchor:>13.3f}x")
    return {name: statistics.median(ts) / anchor for name, ts in times.items()}


# ------------------------------------------------------------------------------------------ accuracy
def train_and_evaluate(children, config, overrides, run_dir):
    """Train (unless finished) and evaluate (unless evaluated) one run: train.py, then eval.py, each a
    child process that gets this one's signals (common/children.py)."""
    out = os.path.join(run_dir, rundir.EVAL_RESULT)
    steps = []
    if not os.path.isfile(os.path.join(run_dir, rundir.SUMMARY)):
        steps.append(("training", ["train.py", "--config", config, *overrides, f"train.output_dir={run_dir}",
                                   "--resume", "auto"]))
    if not (os.path.isfile(out) and os.path.isfile(rundir.examples_path(out))):
        steps.append(("evaluating", ["eval.py", "--checkpoint", run_dir, "--output", out, "--calib", "none",
                                     "--quiet"]))
    for what, (script, *rest) in steps:
        status = children.run([sys.executable, os.path.join(ROOT, script), *rest])
        children.check_stopped(f"{what} {run_dir} stopped (exit {status})", status)
        if status:
            raise UserError(f"{what} {run_dir} failed (exit {status})")
    return out


def accuracy_runs(args, mappings, runs_dir, children):
    """{variant: {seed: document.load_run(...)}} after training and evaluating every missing run."""
    runs = {}
    for mapping in [None] + mappings:
        name = variant_name(mapping)
        for seed in args.seeds:
            run_dir = os.path.join(runs_dir, f"{name}-s{seed}")
            t0 = time.perf_counter()
            out = train_and_evaluate(children, args.config,
                                     recipe_overrides(args) + pool_overrides(mapping, args.pool_k)
                                     + [f"train.seed={seed}"], run_dir)
            run = document.load_run(run_dir, os.path.basename(out), seed=seed)
            runs.setdefault(name, {})[seed] = run
            pooling = run["result"].get("pooling")
            print(f"  {name} seed {seed}: top-1 {100 * run['result']['top1']:.2f}%"
                  + (f", pooling support {pooling['support_mean']:.2f} of {pooling['num_patches']} patches"
                     if pooling else "") + f" ({time.perf_counter() - t0:.0f}s)", flush=True)
    return runs


def _mean_sd(values):
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def print_accuracy(runs):
    print(f"\n{'pooling':<22}{'top-1 (mean ± sd over seeds)':>30}{'support mean (patches)':>26}")
    for name, by_seed in runs.items():
        m, s = _mean_sd([r["result"]["top1"] for r in by_seed.values()])
        sup = [r["result"]["pooling"]["support_mean"] for r in by_seed.values() if r["result"].get("pooling")]
        sup_text = "all (average)" if not sup else "{:.2f} ± {:.2f}".format(*_mean_sd(sup))
        print(f"{name:<22}{f'{100 * m:.2f} ± {100 * s:.2f}%':>30}{sup_text:>26}")
    results = []
    for name, by_seed in runs.items():
        if name == ANCHOR:
            continue
        res = paired.compare_pair({s: r["records"] for s, r in by_seed.items()},
                                  {s: r["records"] for s, r in runs[ANCHOR].items()}, name, ANCHOR)
        results.append(res)
    if not results:
        return []
    print("\nAcross trainings (the seed is the unit):")
    header, rows = paired.across_rows(results)
    print(tables.text_table(header, [r for r in rows if r[1] == "top-1"]))
    print("\nGiven these trainings (conditional on the seeds):")
    header, rows = paired.markdown_rows(results)
    print(tables.text_table(header, [r for r in rows if r[1] == "top-1"]))
    print("\nVerdicts:")
    for res in results:
        print(f"- {res['verdict']}")
    return results


# ---------------------------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=os.path.join(configs.CONFIG_DIR, "quickstart_compare.yaml"))
    p.add_argument("--mappings", nargs="+", default=["softmax", "sparsemax", "ksubset"],
                   help=f"hopfield pooling mappings to compare with avg: {' '.join(POOL_MAPPINGS)}")
    p.add_argument("--pool-k", type=int, default=4, help="model.pool_k of ksubset pooling (patches retrieved)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--img-size", type=int, default=16)
    p.add_argument("--train-size", type=int, default=6000)
    p.add_argument("--val-size", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=None, help="step-overhead batch (default data.batch_size)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=4, help="timed steps per variant per round (interleaved)")
    p.add_argument("--runs-dir", default=None, help="keep the accuracy runs here (default: a temporary folder)")
    only = p.add_mutually_exclusive_group()
    only.add_argument("--speed-only", action="store_true")
    only.add_argument("--accuracy-only", action="store_true")
    p.add_argument("--quick", action="store_true", help="1 seed, 1 epoch over 1000 images, 2 rounds x 2 steps")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("overrides", nargs="*", help="config overrides key.sub=value (every run)")
    args = p.parse_args(argv)
    for m in args.mappings:
        if m not in POOL_MAPPINGS:
            raise UserError(f"unknown --mappings '{m}'; valid: {', '.join(POOL_MAPPINGS)}")
    if args.quick:
        args.seeds, args.epochs, args.train_size, args.val_size = args.seeds[:1], 1, 1000, 200
        args.rounds, args.steps = 2, 2
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = configs.load_config(args.config, recipe_overrides(args))  # fail fast on a bad config / override
    start = time.perf_counter()
    if not args.accuracy_only:
        torch.set_flush_denormal(True)  # as train.py does
        batch = args.batch_size or cfg.data.batch_size
        print_speed(step_times(cfg, args.mappings, batch, args.rounds, args.steps, args.pool_k), cfg, batch,
                    args.rounds, args.steps)
        torch.set_flush_denormal(False)
    if not args.speed_only:
        runs_dir = args.runs_dir or tempfile.mkdtemp(prefix="bench-hopfield-")
        print(f"\naccuracy: {cfg.data.dataset} {cfg.data.builtin_train_size} train / {cfg.data.builtin_val_size} val "
              f"images at {args.img_size} px, {args.epochs} epoch(s), seeds {' '.join(map(str, args.seeds))} "
              f"(runs in {runs_dir}; a fixed short budget: how fast each pooling learns)", flush=True)
        try:
            with ChildProcesses() as children:
                runs = accuracy_runs(args, args.mappings, runs_dir, children)
            print_accuracy(runs)
        finally:
            if args.runs_dir is None:
                shutil.rmtree(runs_dir, ignore_errors=True)  # our own temporary folder
    print(f"\ntotal {time.perf_counter() - start:.0f}s")
    return 0


if __name__ == "__main__":
    run_cli(main)
