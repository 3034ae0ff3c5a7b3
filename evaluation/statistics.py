"""Paired comparison of two heads on the same validation examples, pooled over training seeds.

Input per head: per-example arrays over every (seed, example) row, in the same row order for both heads
(row r of head A and row r of head B are the same image under the same seed):
    "correct"    (N,) bool: argmax == label (top-1 correctness)
    "confidence" (N,) float: max probability (for ECE)
    "loss"       (N,) float: per-example Fenchel-Young loss of the head (label smoothing off)
Any key may be missing; only the metrics it feeds are computed.

Paired bootstrap (Efron & Tibshirani, "An Introduction to the Bootstrap", 1993, ch. 13: percentile
interval). Each replicate resamples rows with replacement and evaluates BOTH heads on the same
resampled rows (that is what makes it paired: the example-to-example variation common to both heads
cancels in the difference). Top-1 and FY loss are means of per-example values; ECE is not, so each
replicate recomputes ECE (15 equal-width bins over the max-probability confidence, exactly as
`evaluation.metrics.calibration_from_confidence` bins it) from the resampled (confidence, correct) pairs of each head.
The interval is the (α/2, 1 − α/2) percentile interval of the replicate differences A − B, and a
difference is called significant when that interval excludes 0.

Pooling over seeds, stratified by seed (`groups` = seed id of each row). Each seed is a separate run
evaluated on the same validation set, so every replicate keeps each seed's row count (no seed can be
over- or under-represented by chance). Two resampling designs:
  - `example_ids` given (recommended when every seed saw the same validation images): a replicate
    draws validation examples with replacement ONCE and takes every seed's rows of those examples.
    The unit of sampling is the example, as it is in the population the validation set stands for;
    the seed-to-seed correlation of an example's outcome (a hard image is hard for every seed) is
    kept, so the interval is not too narrow. Every seed must hold each example id exactly once.
  - without `example_ids`: rows are resampled independently within each seed (stratified bootstrap).
    This treats a seed's outcomes as independent of the other seeds' on the same images; when they
    are positively correlated (they usually are) its interval is narrower than the shared design's.
Both designs hold the training seeds fixed: the interval is about the validation sample, conditional
on these seeds, not about seed-to-seed training noise (3 seeds are too few to bootstrap over).
Pooled metrics: top-1 and FY loss are the mean over all rows (= the mean over seeds of each seed's
value when seeds have equal sizes); ECE is the mean over seeds of each seed's ECE (the per-run ECE the
report's table averages), or with `ece_pooling="pooled"` the ECE of all rows binned together.

McNemar's exact test (McNemar, Psychometrika 1947; exact conditional form as in Fagerland, Lydersen &
Laake, BMC Med. Res. Methodol. 2013): on the discordant pairs (b = A right & B wrong, c = A wrong &
B right), two-sided p = min(1, 2 · P[X ≤ min(b, c)]) with X ~ Binomial(b + c, 1/2), computed in log
space. Pooled over seeds by summing the discordant counts of all seeds, i.e. treating every
(seed, example) pair as one matched pair; this ignores the correlation between seeds on the same image
and so is somewhat anti-conservative with several seeds. The per-seed tests are returned as well.

Pure functions of arrays (numpy, float64): no I/O, no model.
"""
import math

import numpy as np
import torch

from evaluation.metrics import ECE_BINS

METRICS = ("top1", "loss", "ece")
_NEEDS = {"top1": ("correct",), "loss": ("loss",), "ece": ("confidence", "correct")}
_LABELS = {"top1": "top-1", "loss": "FY loss", "ece": "ECE"}
_MINUS = "\u2212"
_MAX_GATHERED = 4_000_000  # rows x replicates per chunk: bounds memory for large validation sets


# ---- ECE ---------------------------------------------------------------------------------------------
def ece_bin_index(confidence, n_bins=ECE_BINS):
    """Bin of each confidence, as in evaluation.metrics.calibration_from_confidence: (b/B, (b+1)/B] -> b,
    0 -> bin 0."""
    confidence = np.asarray(confidence, dtype=np.float64)
    return np.clip(np.ceil(confidence * n_bins) - 1, 0, n_bins - 1).astype(np.int64)


# ---- resampling ----------------------------------------------------------------------------------------
def _strata(groups, n_rows):
    """Row indices of each seed (in order of first appearance of the group id)."""
    if groups is None:
        return [np.arange(n_rows)]
    groups = np.asarray(groups)
    if groups.shape != (n_rows,):
        raise ValueError(f"groups must have one entry per row ({n_rows}), got shape {groups.shape}")
    _, first, inverse = np.unique(groups, return_index=True, return_inverse=True)
    order = np.argsort(first)  # keep the caller's group order
    return [np.flatnonzero(inverse == g) for g in order]


def _example_table(strata, example_ids):
    """(G, n) row of each (seed, example): every seed must hold the same example ids once each."""
    example_ids = np.asarray(example_ids)
    ids0 = np.sort(example_ids[strata[0]])
    table = []
    for rows in strata:
        ids = example_ids[rows]
        order = np.argsort(ids, kind="stable")
        if ids.shape != ids0.shape or not np.array_equal(ids[order], ids0):
            raise ValueError("with example_ids, every seed must hold the same examples")
        table.append(rows[order])
    if np.unique(ids0).size != ids0.size:
        raise ValueError("example_ids repeat within a seed")
    return np.stack(table)


def resample_rows(n_rows, n_boot, rng, groups=None, example_ids=None):
    """Bootstrap row indices (n_boot, n_rows) and the seed index (n_rows,) of each column.

    Columns are laid out seed by seed (seed g occupies as many columns as it has rows). With
    `example_ids`, one draw of examples is shared by all seeds (see the module docstring); otherwise
    each seed's rows are drawn independently. n_boot = 0 gives the original rows, once.
    """
    strata = _strata(groups, n_rows)
    column_group = np.concatenate([np.full(len(rows), g) for g, rows in enumerate(strata)])
    if example_ids is not None:
        table = _example_table(strata, example_ids)
        if n_boot == 0:
            return table.reshape(1, -1), column_group
        picks = rng.integers(0, table.shape[1], size=(n_boot, table.shape[1]))
        return table[:, picks].transpose(1, 0, 2).reshape(n_boot, -1), column_group
    if n_boot == 0:
        return np.concatenate(strata)[None], column_group
    return np.concatenate([rows[rng.integers(0, len(rows), size=(n_boot, len(rows)))] for rows in strata],
                          axis=1), column_group


def metric_on_rows(values, metric, rows, column_group, n_bins=ECE_BINS, ece_pooling="per_seed_mean"):
    """`metric` of one head on each row set: rows (R, N) indices, column_group (N,) -> (R,) float64.

    values: mapping with the per-example arrays (see the module docstring).
    """
    if metric == "top1":
        return np.asarray(values["correct"], dtype=np.float64)[rows].mean(axis=1)
    if metric == "loss":
        return np.asarray(values["loss"], dtype=np.float64)[rows].mean(axis=1)
    if metric != "ece":
        raise ValueError(f"unknown metric {metric!r}; valid: {', '.join(METRICS)}")
    confidence = np.asarray(values["confidence"], dtype=np.float64)
    gap = np.asarray(values["correct"], dtype=np.float64) - confidence
    bins = ece_bin_index(confidence, n_bins)
    n_reps, n_cols = rows.shape
    n_groups = int(column_group.max()) + 1
    if ece_pooling == "pooled":
        keys = np.arange(n_reps)[:, None] * n_bins + bins[rows]
        sums = np.bincount(keys.ravel(), weights=gap[rows].ravel(), minlength=n_reps * n_bins)
        return np.abs(sums.reshape(n_reps, n_bins)).sum(axis=1) / n_cols
    if ece_pooling != "per_seed_mean":
        raise ValueError(f"ece_pooling must be 'per_seed_mean' or 'pooled', got {ece_pooling!r}")
    # one bincount for every (replicate, seed, bin): the sum of (correct − confidence) in that bin
    keys = (np.arange(n_reps)[:, None] * n_groups + column_group[None, :]) * n_bins + bins[rows]
    sums = np.bincount(keys.ravel(), weights=gap[rows].ravel(), minlength=n_reps * n_groups * n_bins)
    per_seed = np.abs(sums.reshape(n_reps, n_groups, n_bins)).sum(axis=2) / np.bincount(column_group)
    return per_seed.mean(axis=1)


def _check_inputs(results_a, results_b, metrics):
    available = [m for m in METRICS if all(k in results_a and k in results_b for k in _NEEDS[m])]
    if metrics is None:
        metrics = available
    for m in metrics:
        if m not in METRICS:
            raise ValueError(f"unknown metric {m!r}; valid: {', '.join(METRICS)}")
        if m not in available:
            raise ValueError(f"metric {m!r} needs per-example {' and '.join(_NEEDS[m])} for both heads")
    if not metrics:
        raise ValueError("no metric to compare: give per-example 'correct', 'loss' or 'confidence' arrays")
    lengths = {np.asarray(r[k]).shape for r in (results_a, results_b) for m in metrics for k in _NEEDS[m]}
    if len(lengths) != 1 or len(next(iter(lengths))) != 1:
        raise ValueError(f"per-example arrays must be 1-D with the same length for both heads, got {lengths}")
    return list(metrics), next(iter(lengths))[0]


def paired_bootstrap(results_a, results_b, *, groups=None, example_ids=None, metrics=None, n_boot=2000, seed=0,
                     level=0.95, n_bins=ECE_BINS, ece_pooling="per_seed_mean"):
    """Difference A − B of each metric with a paired, seed-stratified percentile bootstrap interval.

    results_a, results_b: mappings of per-example arrays (module docstring), same rows in the same order.
    groups: seed id of each row (None: one run). example_ids: validation index of each row (shared-example
    design; see the module docstring). metrics: subset of ("top1", "loss", "ece"); default: all that the
    arrays allow. Returns {metric: {"metric", "a", "b", "difference", "ci_low", "ci_high", "std_error",
    "level", "significant", "n_boot", "n_rows", "n_groups", "resampling"}}: "a"/"b" are the pooled values
    on the original rows, "significant" means the interval excludes 0. Deterministic given `seed`.
    """
    metrics, n_rows = _check_inputs(results_a, results_b, metrics)
    if n_rows == 0:
        raise ValueError("no examples to compare")
    if n_boot < 1 or not 0 < level < 1:
        raise ValueError(f"need n_boot >= 1 and 0 < level < 1, got n_boot={n_boot}, level={level}")
    rng = np.random.default_rng(seed)
    rows, column_group = resample_rows(n_rows, 0, rng, groups, example_ids)
    observed = {m: (metric_on_rows(results_a, m, rows, column_group, n_bins, ece_pooling)[0],
                    metric_on_rows(results_b, m, rows, column_group, n_bins, ece_pooling)[0]) for m in metrics}
    chunk = max(1, _MAX_GATHERED // n_rows)
    diffs = {m: [] for m in metrics}
    for start in range(0, n_boot, chunk):
        rows, column_group = resample_rows(n_rows, min(chunk, n_boot - start), rng, groups, example_ids)
        for m in metrics:  # the same rows for both heads: paired
            diffs[m].append(metric_on_rows(results_a, m, rows, column_group, n_bins, ece_pooling)
                            - metric_on_rows(results_b, m, rows, column_group, n_bins, ece_pooling))
    alpha = 1 - level
    out = {}
    for m in metrics:
        d = np.concatenate(diffs[m])
        low, high = np.quantile(d, [alpha / 2, 1 - alpha / 2])
        a, b = observed[m]
        out[m] = {"metric": m, "a": float(a), "b": float(b), "difference": float(a - b),
                  "ci_low": float(low), "ci_high": float(high), "std_error": float(d.std(ddof=1)) if d.size > 1
                  else 0.0, "level": level, "significant": bool(low > 0 or high < 0), "n_boot": n_boot,
                  "n_rows": n_rows, "n_groups": int(column_group.max()) + 1,
                  "resampling": "shared_examples" if example_ids is not None else "within_seed"}
    return out


# ---- McNemar -------------------------------------------------------------------------------------------
def binomial_half_tail(k, n):
    """P[X ≤ k] for X ~ Binomial(n, 1/2), summed in log space (exact up to float64 rounding, any n)."""
    if n == 0 or k >= n:
        return 1.0
    if k < 0:
        return 0.0
    j = torch.arange(k + 1, dtype=torch.float64)
    log_pmf = (math.lgamma(n + 1) - torch.lgamma(j + 1) - torch.lgamma(n - j + 1)) - n * math.log(2.0)
    return float(torch.logsumexp(log_pmf, dim=0).exp().clamp(max=1.0))


def mcnemar_counts(correct_a, correct_b):
    """(b, c): pairs with A right & B wrong, and with A wrong & B right."""
    a = np.asarray(correct_a, dtype=bool)
    b = np.asarray(correct_b, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"correct_a and correct_b differ in shape: {a.shape} vs {b.shape}")
    return int(np.count_nonzero(a & ~b)), int(np.count_nonzero(~a & b))


def mcnemar_p_value(b, c):
    """Two-sided exact McNemar p = min(1, 2 · P[Binomial(b + c, 1/2) ≤ min(b, c)]); 1 with no discordant pair."""
    return min(1.0, 2.0 * binomial_half_tail(min(b, c), b + c))


def mcnemar_exact(correct_a, correct_b, groups=None):
    """McNemar's exact test on per-example correctness of two heads (rows paired as in paired_bootstrap).

    Pooled over seeds by summing discordant counts (see the module docstring for what that assumes).
    Returns {"b", "c", "n_discordant", "n_pairs", "p_value", "per_group": [{"group", "b", "c", "p_value"}]}.
    """
    b, c = mcnemar_counts(correct_a, correct_b)
    out = {"b": b, "c": c, "n_discordant": b + c, "n_pairs": int(np.asarray(correct_a).size),
           "p_value": mcnemar_p_value(b, c), "per_group": []}
    if groups is not None:
        groups = np.asarray(groups)
        a, bb = np.asarray(correct_a, dtype=bool), np.asarray(correct_b, dtype=bool)
        for g, rows in zip(*_group_ids_and_rows(groups)):
            gb, gc = mcnemar_counts(a[rows], bb[rows])
            out["per_group"].append({"group": g, "b": gb, "c": gc, "p_value": mcnemar_p_value(gb, gc)})
    return out


def _group_ids_and_rows(groups):
    strata = _strata(groups, groups.size)
    ids = [groups[rows[0]].item() for rows in strata]
    return ids, strata


# ---- sentences -----------------------------------------------------------------------------------------
def _signed(x, digits):
    text = f"{abs(x):.{digits}f}"
    if float(text) == 0:
        return text
    return ("+" if x > 0 else _MINUS) + text


def format_p_value(p):
    return "p < 0.001" if p < 0.001 else f"p = {p:.2g}"


def describe_difference(result, name_a, name_b, mcnemar=None, digits=None):
    """One sentence for a paired_bootstrap entry, e.g.
    "sparsemax − softmax top-1: +0.9 pt [−0.3, +2.1], not significant at 5% (McNemar exact p = 0.21)".

    Top-1 and ECE are shown in percentage points (pt), FY loss in its own units. `mcnemar`: the
    mcnemar_exact result, appended for top-1.
    """
    metric = result["metric"]
    in_points = metric in ("top1", "ece")
    scale = 100.0 if in_points else 1.0
    digits = digits if digits is not None else {"top1": 1, "ece": 2, "loss": 3}[metric]
    verdict = "significant" if result["significant"] else "not significant"
    alpha = f"{(1 - result['level']) * 100:g}%"
    text = (f"{name_a} {_MINUS} {name_b} {_LABELS[metric]}: {_signed(result['difference'] * scale, digits)}"
            f"{' pt' if in_points else ''} [{_signed(result['ci_low'] * scale, digits)}, "
            f"{_signed(result['ci_high'] * scale, digits)}], {verdict} at {alpha}")
    if mcnemar is not None and metric == "top1":
        text += f" (McNemar exact {format_p_value(mcnemar['p_value'])})"
    return text
