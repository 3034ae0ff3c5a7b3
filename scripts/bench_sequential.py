#!/usr/bin/env python
"""Measure the error rates of the sequential seed design (comparison/analysis/sequential.py), not assume them.

Simulated comparisons: per-seed differences d_s ~ N(μ, 1) (the unit is the seed-to-seed s.d. of the
paired differences; the t statistics are scale free, so any s.d. gives the same rates), at true
differences μ = 0, a difference inside the margin (δ/2), the margin itself (the worst case for a false
equivalence), and 1, 2 and 3 seed s.d. Each runs through the group-sequential design (looks at
3, 5, 8, 12 seeds, O'Brien–Fleming-type α-spending, both ways onto the t scale) and through the fixed
design with the same maximum number of seeds (one look at 12: the plain paired t-test and TOST of
comparison/analysis/equivalence.py). Every design sees the same simulated seeds (common random numbers).

Reported per (μ, design): how often each verdict comes out, the mean number of seeds used, and the
rates the row measures, each with its Monte-Carlo standard error √(p(1 − p)/N): the false-positive
rate (superior or inferior when μ = 0), the false-equivalence rate (equivalent when |μ| ≥ δ), the
power (equivalent when |μ| < δ; superior when μ ≥ δ). The rates are for normal differences; with
heavier-tailed ones they would differ. Usage (the table in docs/comparison.md):

    python scripts/bench_sequential.py [--sims 100000] [--seed 20240] [--margin 1] [--alpha 0.05] [--quick]
"""
import argparse
import math
import time

import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

import numpy as np

from comparison.analysis.equivalence import VERDICTS
from comparison.analysis.sequential import DEFAULT_LOOKS, METHODS, Design, walk


def settings(margin):
    """[(label, μ)] in seed s.d.: none, inside the margin, at the margin, 1, 2, 3 s.d. (no repeats)."""
    out = [("no difference", 0.0), ("inside the margin (δ/2)", margin / 2), ("at the margin (δ)", margin)]
    out += [(f"{k} seed s.d.", float(k)) for k in (1, 2, 3) if not math.isclose(k, margin)]
    return out


def designs(looks, alpha, margin):
    """{name: Design}: the sequential design by each method, and the fixed one at the last look."""
    out = {f"sequential ({method})": Design(margin=margin, looks=looks, alpha=alpha, method=method)
           for method in METHODS}
    out[f"fixed, {looks[-1]} seeds"] = Design(margin=margin, looks=(looks[-1],), alpha=alpha, method="bonferroni-t")
    return out


def measure(decisions, mu, margin):
    """[(name, rate)] of what a row measures: the false-positive rate at μ = 0, the power to find
    equivalence inside the margin; at and beyond it the power to find the head superior and the
    false-equivalence rate."""
    if mu == 0:
        return [("false positive", np.mean(decisions["superior"] | decisions["inferior"]))]
    if abs(mu) < margin:
        return [("power (equivalent)", np.mean(decisions["equivalent"]))]
    return [("power (superior)", np.mean(decisions["superior"])),
            ("false equivalence", np.mean(decisions["equivalent"]))]


def _rate_text(name, rate, sims):
    return f"{name} {100 * rate:.2f}% ± {100 * math.sqrt(rate * (1 - rate) / sims):.2f}"


def run(sims, seed, looks, alpha, margin):
    """Rows of the table: one per (setting, design)."""
    rows = []
    for index, (label, mu) in enumerate(settings(margin)):
        draws = np.random.default_rng([seed, index]).standard_normal((sims, looks[-1])) + mu
        for name, design in designs(looks, alpha, margin).items():
            decisions = walk(draws, design)
            counts = np.bincount(decisions["verdict"], minlength=len(VERDICTS)) / sims
            rows.append([label, f"{mu:g}", name, *(f"{100 * c:.2f}%" for c in counts),
                         f"{decisions['n_used'].mean():.2f}",
                         "; ".join(_rate_text(what, rate, sims) for what, rate in measure(decisions, mu, margin))])
    return rows


def markdown(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sims", type=int, default=100_000, help="simulated comparisons per setting (≥ 10,000)")
    p.add_argument("--seed", type=int, default=20240)
    p.add_argument("--looks", type=int, nargs="+", default=list(DEFAULT_LOOKS))
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--margin", type=float, default=1.0, help="the margin δ in seed s.d. of the differences")
    p.add_argument("--quick", action="store_true", help="10,000 per setting")
    args = p.parse_args(argv)
    sims = 10_000 if args.quick else args.sims
    start = time.perf_counter()
    rows = run(sims, args.seed, tuple(args.looks), args.alpha, args.margin)
    header = ["true difference", "μ (seed s.d.)", "design", *VERDICTS, "mean seeds", "measures (± MC s.e.)"]
    print(f"{sims} simulated comparisons per setting, seed {args.seed}, looks {tuple(args.looks)}, "
          f"α = {args.alpha:g}, margin δ = {args.margin:g} seed s.d.; N(μ, 1) per-seed differences\n")
    print(markdown(header, rows))
    print(f"\n({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
