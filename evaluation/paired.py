"""Paired statistics of a head comparison: each variant against the baseline, pooled over seeds.

For a pair (variant A, baseline B) the rows are every (seed, validation example) both have: seed s of
A is paired with seed s of B (same validation images, same order; checked on the labels). The
numbers are evaluation.statistics (paired bootstrap of top-1, ECE and FY loss differences with a 95%
percentile interval; McNemar's exact test on top-1 correctness), with `example_ids` so that one
bootstrap draw of validation examples is shared by every seed. ECE is the mean of the per-run ECEs
(the main table's "mean of per-run" row), not the ECE of all seeds' rows binned together.
"""
import numpy as np

from .statistics import describe_difference, mcnemar_exact, paired_bootstrap

METRICS = ("top1", "ece", "loss")
METRIC_LABELS = {"top1": "top-1", "ece": "ECE", "loss": "FY loss"}
N_BOOT = 2000


def per_example(records):
    """The statistics module's per-row inputs from one run's records (examples file)."""
    return {"correct": np.asarray(records["pred"]) == np.asarray(records["label"]),
            "confidence": np.asarray(records["max_prob"], dtype=np.float64),
            "loss": np.asarray(records["loss"], dtype=np.float64)}


def _stack(runs_by_seed, seeds):
    parts = [per_example(runs_by_seed[s]) for s in seeds]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def compare_pair(a_runs, b_runs, name_a, name_b, n_boot=N_BOOT, seed=0):
    """a_runs, b_runs: {training seed: records}. Returns None when no seed has both, else
    {"variant", "baseline", "seeds", "n_per_seed", "bootstrap": {metric: ...}, "mcnemar": {...},
    "sentences": [one per metric]}."""
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
    return {"variant": name_a, "baseline": name_b, "seeds": seeds, "n_per_seed": n, "bootstrap": boot,
            "mcnemar": mcnemar, "sentences": sentences}


def _signed(x, digits):
    return f"{x:+.{digits}f}".replace("-", "\u2212")


def markdown_rows(results):
    """(header, rows) of the paired-differences table."""
    header = ["variant − baseline", "metric", "difference", "95% CI", "significant at 5%", "McNemar exact p"]
    rows = []
    for res in results:
        for m in METRICS:
            r = res["bootstrap"][m]
            scale, digits, unit = (100.0, 2, " pt") if m in ("top1", "ece") else (1.0, 4, "")
            p = res["mcnemar"]["p_value"] if m == "top1" else None
            rows.append([f"{res['variant']} − {res['baseline']}", METRIC_LABELS[m],
                         _signed(scale * r["difference"], digits) + unit,
                         f"[{_signed(scale * r['ci_low'], digits)}, {_signed(scale * r['ci_high'], digits)}]",
                         "yes" if r["significant"] else "no", "" if p is None else f"{p:.3g}"])
    return header, rows
