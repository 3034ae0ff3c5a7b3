#!/usr/bin/env python
"""A head sweep on cached features against the same sweep through images: all 8 output heads x 5
seeds of a linear probe on builtin100 features, including the report (scripts/compare_heads.py
--features), and the wall-time ratio to the image path.

    python scripts/bench_feature_sweep.py [--backbone RUN] [--quick] [--work DIR]

1. Backbone: --backbone RUN (a train.py run directory), or a tiny ResMLP trained here on builtin10
   (not timed: it stands for any pretrained model).
2. Extraction: scripts/extract_features.py of builtin100's train/calib/val and its OOD set (timed
   on its own: it is paid once per backbone, not per head or seed).
3. Feature sweep (the figure the target is about, <= 60 s on 2 CPU cores): compare_heads --features
   for every head x seed, trained and evaluated (prediction sets, selective prediction, OOD), and
   the report with its statistics and plots.
4. Image sweep: the same probe through images (model.pretrained + model.freeze=backbone, the same
   recipe) is ESTIMATED, not run 40 times: one head x one seed is trained and evaluated through
   compare_heads' image path (train.py and eval.py subprocesses), and that time, less the report
   (measured once with it), times the number of runs, plus the feature sweep's report time.
   The anchor is measured in the same run, so the ratio holds on a shared machine; the wall times
   themselves depend on it (other jobs on the cores), so the CPU time of each is printed too.
Every command runs at one thread (OMP_NUM_THREADS=1), the image path too.
"""
import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from _root import ROOT  # the repository root, on sys.path (scripts/_root.py)

import yaml

from common.cli import run_cli
from common.io import atomic_write_text, prepare_output
from models.heads import HEAD_NAMES

TARGET_S = 60.0
# The data of the sweep: builtin100 at 32 px, 10% of train held out to calibrate the prediction sets.
DATA = {"dataset": "builtin100", "image_size": 32, "builtin_train_size": 10000, "builtin_val_size": 2000,
        "calib_fraction": 0.1, "num_workers": 0, "eval_batch_size": 1000}
QUICK_DATA = {**DATA, "builtin_train_size": 1000, "builtin_val_size": 400}
# The probe's recipe (the same for both paths): AdamW, 3 epochs of batch 500 on the features.
PROBE = {"data": {"hflip": 0.0, "crop_padding": 0, "batch_size": 500},
         "optim": {"name": "adamw", "lr": 1.0e-2, "lr_base_batch": 500, "weight_decay": 1.0e-4, "epochs": 3,
                   "warmup_epochs": 0, "min_lr": 1.0e-4},
         "train": {"ema": False, "log_with": "none", "progress": False, "save_every": 100000, "log_every": 50}}
BACKBONE = {"name": "backbone", "model": {"name": "resmlp_tiny"},
            "data": {"dataset": "builtin10", "image_size": 32, "builtin_train_size": 4000, "builtin_val_size": 500,
                     "num_workers": 0, "batch_size": 64},
            "optim": {"name": "adamw", "lr": 4.0e-3, "lr_base_batch": 64, "epochs": 2, "warmup_epochs": 0.2,
                      "weight_decay": 0.05},
            "train": {"ema": False, "log_with": "none", "progress": False, "save_every": 100000}}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backbone", default=None, metavar="RUN",
                   help="a train.py run directory (default: train a tiny one)")
    p.add_argument("--quick", action="store_true", help="small data, 2 heads x 2 seeds (a smoke test)")
    p.add_argument("--work", default=None, help="working folder (default: a temporary one, removed); its runs "
                   "and reports are redone each time")
    return p.parse_args(argv)


def write_yaml(obj, path):
    atomic_write_text(path, yaml.safe_dump(obj))
    return path


def _children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(cmd, cpu=None):
    """A command at one thread (OMP_NUM_THREADS=1: the probe's matrices are small, and two threads on
    shared cores are slower than one), its output shown on failure; -> wall seconds, or (wall, CPU
    seconds) when `cpu` is a list to append the CPU time to (the figure other jobs do not inflate)."""
    t0, c0 = time.perf_counter(), _children_cpu()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    if cpu is not None:
        cpu.append(_children_cpu() - c0)
    return time.perf_counter() - t0, proc.stdout


def main(argv=None):
    args = parse_args(argv)
    work = args.work or tempfile.mkdtemp(prefix="bench_features_")
    prepare_output(work, folder=True)  # a folder that cannot be written: one line (exit 74) before any timing
    for old in ("runs_f", "report_f", "report_f2", "runs_i", "report_i"):  # this script's own outputs: timed afresh
        shutil.rmtree(os.path.join(work, old), ignore_errors=True)
    data = QUICK_DATA if args.quick else DATA
    heads = ["softmax", "sparsemax"] if args.quick else list(HEAD_NAMES)
    seeds = [0, 1] if args.quick else [0, 1, 2, 3, 4]
    py = sys.executable
    try:
        backbone = args.backbone
        if backbone is None:
            backbone = os.path.join(work, "backbone")
            cfg = write_yaml({**BACKBONE, "train": {**BACKBONE["train"], "output_dir": backbone}},
                             os.path.join(work, "backbone.yaml"))
            seconds, _ = run([py, "train.py", "--config", cfg, "--overwrite"] +
                             (["data.builtin_train_size=1000", "optim.epochs=1"] if args.quick else []))
            print(f"backbone: resmlp_tiny trained on builtin10 in {seconds:.1f}s (not part of the sweeps)")
        features = os.path.join(work, "features")
        data_overrides = [f"data.{k}={v}" for k, v in data.items()]
        seconds, _ = run([py, "scripts/extract_features.py", "--checkpoint", backbone, "--output", features,
                          "--ood", "auto", *data_overrides])
        print(f"extraction: builtin100 train/calib/val + builtin100_ood val through the backbone in {seconds:.1f}s "
              f"(once per backbone)")

        probe = write_yaml({"name": "probe", **PROBE, "data": {**PROBE["data"], **data}},
                           os.path.join(work, "probe.yaml"))
        sweep = [py, "scripts/compare_heads.py", "--config", probe, "--heads", *heads, "--seeds", *map(str, seeds)]
        cpu = []
        t_features, out = run(sweep + ["--features", features, "--runs-dir", os.path.join(work, "runs_f"),
                                       "--report-dir", os.path.join(work, "report_f")], cpu)
        n = len(heads) * len(seeds)
        t_report_f, _ = run(sweep + ["--features", features, "--runs-dir", os.path.join(work, "runs_f"),
                                     "--report-dir", os.path.join(work, "report_f2"), "--report-only"], cpu)
        print(f"feature sweep: {len(heads)} heads x {len(seeds)} seeds = {n} runs, trained + evaluated + reported in "
              f"{t_features:.1f}s wall, {cpu[0]:.1f}s CPU at one thread (load average now "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; target <= {TARGET_S:.0f}s on 2 CPU cores: "
              f"{'met' if t_features <= TARGET_S else 'NOT met'}); the report alone (--report-only) {t_report_f:.1f}s")

        image = [py, "scripts/compare_heads.py", "--config", probe, "--heads", "softmax", "--seeds", "0",
                 f"model.pretrained={os.path.abspath(backbone)}", "model.freeze=backbone",
                 "--runs-dir", os.path.join(work, "runs_i"), "--report-dir", os.path.join(work, "report_i")]
        t_one, _ = run(image, cpu)
        t_report_i, _ = run(image + ["--report-only"], cpu)
        per_run = max(t_one - t_report_i, 0.0)
        t_images = per_run * n + t_report_f
        print(f"image sweep (ESTIMATED): one frozen-backbone probe through images (softmax, seed 0) trained + "
              f"evaluated in {per_run:.1f}s (compare_heads {t_one:.1f}s less its report {t_report_i:.1f}s); x {n} runs "
              f"+ the report {t_report_f:.1f}s = {t_images:.0f}s")
        cpu_sweep, cpu_report_f, cpu_one, cpu_report_i = cpu
        cpu_images = max(cpu_one - cpu_report_i, 0.0) * n + cpu_report_f
        print(f"ratio: the image sweep takes {t_images / t_features:.1f}x the feature sweep in wall time "
              f"({t_images:.0f}s vs {t_features:.1f}s); in CPU time {cpu_images:.0f}s (one image run "
              f"{cpu_one - cpu_report_i:.1f}s x {n} + the report {cpu_report_f:.1f}s) vs {cpu_sweep:.1f}s: "
              f"{cpu_images / cpu_sweep:.1f}x")
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    run_cli(main)
