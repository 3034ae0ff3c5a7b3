"""Paired statistics of a head comparison: each variant against the baseline, pooled over seeds.

For a pair (variant A, baseline B) the rows are every (seed, validation example) both have: seed s of
A is paired with seed s of B (same validation images, same order; checked on the labels). The
numbers are comparison.analysis.statistics (paired bootstrap of top-1, ECE and FY loss differences with a 95%
percentile interval; McNemar's exact test on top-1 correctness), with `example_ids` so that one
bootstrap draw of validation examples is shared by every seed. ECE is the mean of the per-run ECEs
(the main table's "mean of per-run" row), not the ECE of all seeds' rows binned together.

Two kinds of numbers, each labelled with the noise it includes:
  (a) across trainings: the per-seed differences, their t-interval and exact sign-flip p over
      seeds, a two-level bootstrap over seeds and validation images, the 80%-power minimum
      detectable difference and the seeds a true difference of the observed size would need, both as
      ranges over the seed s.d.'s 95% χ² interval (few seeds measure it poorly). The verdict sentence (one
      per variant) is the top-1 of (a): would another training of this recipe also differ?
  (b) given these trainings: the bootstrap over validation images and McNemar's test, both holding
      the trainings fixed (conditional on the seeds).
Before either, each head's top-1 is checked against chance (comparison/analysis/sanity.py): a pair where a
head learned nothing gets "no comparison: nothing learned" as its verdict.
"""
import numpy as np

from . import sanity
from .margins import METRIC_TABLE, METRICS
from .statistics import (
    across_trainings,
    describe_across_trainings,
    describe_difference,
    mcnemar_exact,
    paired_bootstrap,
)

N_BOOT = 2000


def per_example(records):
    """The statistics module's per-row inputs from one run's records (examples file)."""
    return {"correct": np.asarray(records["pred"]) == np.asarray(records["label"]),
            "confidence": np.asarray(records["max_prob"], dtype=np.float64),
            "loss": np.asarray(records["loss"], dtype=np.float64)}


def _stack(runs_by_seed, seeds):
    parts = [per_example(runs_by_seed[s]) for s in seeds]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def learned(runs_by_seed, seeds):
    """{"top1", "chance", "n_rows", "nothing_learned"} of one head over `seeds` (comparison/analysis/sanity.py)."""
    correct = np.concatenate([per_example(runs_by_seed[s])["correct"] for s in seeds])
    labels = np.concatenate([np.asarray(runs_by_seed[s]["label"]) for s in seeds])
    top1, chance = float(correct.mean()), sanity.chance_level(labels)
    return {"top1": top1, "chance": chance, "n_rows": int(correct.size),
            "nothing_learned": sanity.nothing_learned(top1, chance, correct.size)}


def nothing_learned_verdict(name_a, name_b, checks):
    """'A vs B: no comparison: nothing learned (...)' naming the head(s) at chance."""
    idle = [name for name in (name_a, name_b) if checks[name]["nothing_learned"]]
    chance = checks[idle[0]]["chance"]
    tops = ", ".join(f"{name} {100 * checks[name]['top1']:.1f}%" for name in idle)
    return (f"{name_a} vs {name_b}: no comparison: nothing learned ({' and '.join(idle)} within noise of "
            f"chance: top-1 {tops} vs {100 * chance:.1f}% for the best constant guess)")


def compare_pair(a_runs, b_runs, name_a, name_b, n_boot=N_BOOT, seed=0):
    """a_runs, b_runs: {training seed: records}. Returns None when no seed has both, else
    {"variant", "baseline", "seeds", "n_per_seed", "learned": {name: sanity check},
    "across": {metric: across_trainings entry}, "verdict": one sentence (top-1 across trainings, or
    "nothing learned"), "bootstrap": {metric: ...}, "mcnemar": {...} (given these trainings),
    "sentences": [one per metric, given these trainings]}."""
    seeds = sorted(set(a_runs) & set(b_runs))
    if not seeds:
        return None
    sizes = set()
    for s in seeds:
        la, lb = np.asarray(a_runs[s]["label"]), np.asarray(b_runs[s]["label"])
        if la.shape != lb.shape or not np.array_equal(la, lb):
            raise ValueError(f"{name_a} and {name_b} (seed {s}) were not evaluated on the same examples "
                             f"in the same order; evaluate both on the same split")
        sizes.add(la.size)
    if len(sizes) != 1:
        raise ValueError(f"seeds of {name_a} / {name_b} evaluated different numbers of examples: {sorted(sizes)}")
    n = sizes.pop()
    groups = np.repeat(np.arange(len(seeds)), n)
    example_ids = np.tile(np.arange(n), len(seeds))
    a, b = _stack(a_runs, seeds), _stack(b_runs, seeds)
    boot = paired_bootstrap(a, b, groups=groups, example_ids=example_ids, metrics=list(METRICS),
                            n_boot=n_boot, seed=seed)
    mcnemar = mcnemar_exact(a["correct"], b["correct"], groups=groups)
    sentences = [describe_difference(boot[m], name_a, name_b, mcnemar=mcnemar if m == "top1" else None)
                 for m in METRICS]
    across = across_trainings(a, b, groups=groups, example_ids=example_ids, metrics=list(METRICS),
                              n_boot=n_boot, seed=seed)
    checks = {name_a: learned(a_runs, seeds), name_b: learned(b_runs, seeds)}
    verdict = nothing_learned_verdict(name_a, name_b, checks) if any(c["nothing_learned"] for c in checks.values()) \
        else describe_across_trainings(across["top1"], name_a, name_b)
    return {"variant": name_a, "baseline": name_b, "seeds": seeds, "n_per_seed": n, "learned": checks,
            "across": across, "verdict": verdict, "bootstrap": boot, "mcnemar": mcnemar, "sentences": sentences}


def _signed(x, digits):
    return "nan" if np.isnan(x) else f"{x:+.{digits}f}".replace("-", "\u2212")


def _scaled(metric):
    """(scale, digits, unit) of a metric's differences in the tables: points or its own units."""
    return (100.0, 2, " pt") if METRIC_TABLE[metric].in_points else (1.0, 4, "")


def markdown_rows(results):
    """(header, rows) of the paired-differences table given these trainings (conditional)."""
    header = ["variant − baseline", "metric", "difference", "95% CI given these trainings", "significant at 5%",
              "McNemar exact p"]
    rows = []
    for res in results:
        for m in METRICS:
            r = res["bootstrap"][m]
            scale, digits, unit = _scaled(m)
            p = res["mcnemar"]["p_value"] if m == "top1" else None
            rows.append([f"{res['variant']} − {res['baseline']}", METRIC_TABLE[m].label,
                         _signed(scale * r["difference"], digits) + unit,
                         f"[{_signed(scale * r['ci_low'], digits)}, {_signed(scale * r['ci_high'], digits)}]",
                         "yes" if r["significant"] else "no", "" if p is None else f"{p:.3g}"])
    return header, rows


def _interval(low, high, scale, digits, n_seeds):
    if not (np.isfinite(low) and np.isfinite(high)):
        return "n/a (1 seed)" if n_seeds < 2 else "n/a (a difference is not finite)"
    return f"[{_signed(scale * low, digits)}, {_signed(scale * high, digits)}]"


def across_rows(results):
    """(header, rows) of the across-trainings table: per-seed differences and what they support."""
    header = ["variant − baseline", "metric", "per-seed differences", "mean", "95% t-interval over seeds",
              "sign-flip p (exact)", "95% two-level bootstrap (seeds × images)",
              "MDD, 80% power (over the s.d.'s 95% interval)", "seeds for a true difference of the mean (same)"]
    rows = []
    for res in results:
        for m in METRICS:
            r = res["across"][m]
            scale, digits, unit = _scaled(m)
            mdd = (r["mdd_low"], r["mdd_high"])
            needed = (r["seeds_needed_low"], r["seeds_needed_high"])
            rows.append([f"{res['variant']} − {res['baseline']}", METRIC_TABLE[m].label,
                         ", ".join(_signed(scale * d, digits) for d in r["per_seed"]),
                         _signed(scale * r["difference"], digits) + unit,
                         _interval(r["t_low"], r["t_high"], scale, digits, r["n_seeds"]),
                         ("n/a" if np.isnan(r["sign_flip_p"]) else f"{r['sign_flip_p']:.3g}")
                         + f" (min {r['min_sign_flip_p']:.3g})",
                         _interval(r["boot_low"], r["boot_high"], scale, digits, r["n_seeds"]),
                         "n/a" if not np.isfinite(mdd[0])
                         else "–".join(f"{scale * v:.{digits}f}" for v in mdd) + unit,
                         "n/a" if r["n_seeds"] < 2 or not np.isfinite(r["sd"])
                         else "–".join(str(v) if v is not None else "> 1000" for v in needed)])
    return header, rows
