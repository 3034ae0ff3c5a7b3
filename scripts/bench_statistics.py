#!/usr/bin/env python
"""Time the comparison's bootstraps (comparison/analysis/statistics.py) against the way they were computed
before: every replicate's rows gathered into an (R, S·n) copy and each metric taken over them.

Both paths see the same draws of the shared-example design (one example draw for all seeds, as
paired_bootstrap with example_ids) and of the two-level design (seeds, then examples, as
across_trainings). The library sums a replicate as its multiplicities times the per-example values,
one matrix product; the anchor gathers. Reported per design and metric: the median process CPU time of
each path over interleaved repetitions, their ratio (< 1: the library is faster) and the largest
difference of a replicate's value between the two paths (top-1 is exact; FY loss and ECE differ by
the order of a float64 sum). Synthetic heads on S seeds × n examples. Usage:

    python scripts/bench_statistics.py [--seeds 5] [--examples 10000] [--replicates 400] [--reps 5] [--quick]
"""
import argparse
import statistics as stats
import time

import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

import numpy as np

from comparison.analysis import statistics as st

METRICS = ("top1", "loss", "ece")


def synthetic_head(rng, n_rows):
    """Per-example arrays of one head (statistics' module docstring): confidence, correctness, loss."""
    confidence = rng.uniform(0.1, 1.0, n_rows)
    return {"confidence": confidence, "correct": rng.uniform(size=n_rows) < confidence,
            "loss": rng.exponential(size=n_rows)}


def gathered(values, metric, table, seed_picks, example_picks):
    """The anchor: each replicate's rows gathered, then the metric over them (each drawn seed a group)."""
    n_seeds, n = seed_picks.shape[1], example_picks.shape[1]
    rows = table[seed_picks[:, :, None], example_picks[:, None, :]].reshape(len(example_picks), -1)
    return st.metric_on_rows(values, metric, rows, np.repeat(np.arange(n_seeds), n))


def by_multiplicities(values, metric, table, seed_picks, example_picks):
    """The library's path: multiplicities of the drawn examples and seeds, one product per replicate set."""
    columns = st._example_columns(values, metric, table)
    return st.weighted_metric(columns, metric, st._multiplicities(example_picks, table.shape[1]),
                              st._multiplicities(seed_picks, table.shape[0]))


def _cpu(fn):
    start = time.process_time()
    out = fn()
    return time.process_time() - start, out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--examples", type=int, default=10000)
    parser.add_argument("--replicates", type=int, default=400, help="bootstrap replicates timed per repetition")
    parser.add_argument("--reps", type=int, default=5, help="interleaved repetitions (the median is reported)")
    parser.add_argument("--quick", action="store_true", help="2 seeds x 500 examples, 50 replicates, 2 reps")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.examples, args.replicates, args.reps = 2, 500, 50, 2
    rng = np.random.default_rng(0)
    n_seeds, n = args.seeds, args.examples
    head = synthetic_head(rng, n_seeds * n)
    table = np.arange(n_seeds * n).reshape(n_seeds, n)
    every_seed = np.tile(np.arange(n_seeds), (args.replicates, 1))
    designs = {"shared examples (paired_bootstrap)": lambda: every_seed,
               "seeds then examples (across_trainings)": lambda: rng.integers(0, n_seeds, size=every_seed.shape)}
    print(f"{n_seeds} seeds x {n} examples, {args.replicates} replicates, median of {args.reps} interleaved "
          f"repetitions (process CPU time)\n")
    print("| design | metric | gathered rows | multiplicities | ratio | largest difference |")
    print("|---|---|---|---|---|---|")
    for design, draw_seeds in designs.items():
        for metric in METRICS:
            times = {"gathered": [], "weighted": []}
            largest = 0.0
            for _ in range(args.reps):
                seed_picks, example_picks = draw_seeds(), rng.integers(0, n, size=(args.replicates, n))
                t_gather, anchor = _cpu(lambda: gathered(head, metric, table, seed_picks, example_picks))
                t_weight, ours = _cpu(lambda: by_multiplicities(head, metric, table, seed_picks, example_picks))
                times["gathered"].append(t_gather)
                times["weighted"].append(t_weight)
                largest = max(largest, float(np.abs(ours - anchor).max()))
            slow, fast = stats.median(times["gathered"]), stats.median(times["weighted"])
            print(f"| {design} | {metric} | {slow:.3f} s | {fast:.3f} s | {fast / max(slow, 1e-9):.2f} | "
                  f"{largest:.1e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
