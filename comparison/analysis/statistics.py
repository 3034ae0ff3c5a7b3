"""Paired comparison of two heads on the same validation examples, pooled over training seeds.

Input per head: per-example arrays over every (seed, example) row, in the same row order for both heads
(row r of head A and row r of head B are the same image under the same seed):
    "correct"    (N,) bool: argmax == label (top-1 correctness)
    "confidence" (N,) float: the probability of the predicted class (for ECE)
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
    A replicate is computed from how often it drew each example (its multiplicities times the
    per-example values: one matrix product, no gathered copy of the rows): 3-8x faster than gathering
    (scripts/bench_statistics.py).
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

Across trainings (the seed as the unit). The bootstrap and McNemar above hold the trainings fixed:
they answer "on these validation images, for these trainings". Whether another training of the same
recipe would also differ needs the seed-to-seed variation, which only the per-seed paired
differences d_s = metric(A, seed s) − metric(B, seed s) carry (seed s of A and of B share the
validation images and the data order). On them:
  - a t-interval, d̄ ± t_{S−1, 1−α/2} · s_d / √S (Student 1908; assumes roughly normal d_s);
  - the exact sign-flip (permutation) test (Fisher 1935, ch. 21): under "no difference" each d_s is
    symmetric about 0, so all 2^S sign patterns of (±d_s) are equally likely; p is the fraction
    whose |mean| reaches the observed |d̄|. Distribution-free, but its smallest value is 2 / 2^S
    (0.25 with 3 seeds), so with fewer than 6 seeds it can never reach 5%;
  - a two-level bootstrap (Davison & Hinkley 1997, sec. 3.8, "multistage sampling"): each replicate
    draws S seeds with replacement (a seed brings both heads' runs), then validation examples with
    replacement (one draw shared by the drawn seeds), and takes the mean over the drawn seeds of
    the per-seed differences. With a handful of seeds the seed stage can only resample a few
    values, so this interval is narrower than the t-interval; it is shown, not used for the verdict;
  - the power of the paired t-test (the non-central t, computed by quadrature): the minimum
    difference detectable with 80% power at the seeds at hand (MDD) and the seeds that would detect
    the observed difference were it the true one. Both scale with the seed s.d., which a handful of
    seeds measures poorly, so both are given as ranges over the s.d.'s χ² confidence interval,
    s_d·√(ν / χ²_{ν, 1−α/2}) to s_d·√(ν / χ²_{ν, α/2}), ν = S − 1 (normal d_s): with 3 seeds it
    spans a factor of 12, so these ranges say how little the seeds at hand tell about planning, and
    the observed difference is not the true one (post-hoc power): plan seeds from a pilot.

Pure functions of arrays (numpy, float64): no I/O, no model.
"""
import functools
import math

import numpy as np

from evaluation.ece_bins import ECE_BINS  # the bins of every ECE (evaluation/metrics.py's too)

from .margins import METRIC_TABLE, METRICS

_NEEDS = {m: t.needs for m, t in METRIC_TABLE.items()}
_LABELS = {m: t.label for m, t in METRIC_TABLE.items()}
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


def _draw_examples(rng, n_boot, n):
    """The shared-example design's draw: n of the n examples with replacement, per replicate."""
    return rng.integers(0, n, size=(n_boot, n))


def _multiplicities(picks, n):
    """(R, k) picks among n items -> (R, n) float64: how often each replicate drew each item."""
    n_reps = picks.shape[0]
    keys = (np.arange(n_reps) * n)[:, None] + picks
    return np.bincount(keys.ravel(), minlength=n_reps * n).reshape(n_reps, n).astype(np.float64)


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
        picks = _draw_examples(rng, n_boot, table.shape[1])
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
        correct = np.asarray(values["correct"])
        if correct.dtype == bool:  # count in bytes, not float64: the same exact sum, an 8th of the memory traffic
            return correct[rows].sum(axis=1, dtype=np.int64) / rows.shape[1]
        return correct.astype(np.float64)[rows].mean(axis=1)
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
    # one bincount for every (replicate, seed, bin): the sum of (correct − confidence) in that bin; the
    # keys (replicate * groups + seed) * bins + bin are built in place (no (R, N) temporaries)
    keys = bins[rows]
    keys += (column_group * n_bins)[None, :]
    keys += (np.arange(n_reps) * (n_groups * n_bins))[:, None]
    sums = np.bincount(keys.ravel(), weights=gap[rows].ravel(), minlength=n_reps * n_groups * n_bins)
    per_seed = np.abs(sums.reshape(n_reps, n_groups, n_bins)).sum(axis=2) / np.bincount(column_group)
    return per_seed.mean(axis=1)


def _example_columns(values, metric, table, n_bins=ECE_BINS):
    """The per-example values a replicate sums, one column block per seed: (n, S) correct or loss for
    top-1 and FY loss; for ECE (n, S·B) holding (correct − confidence) in its seed's bin's column."""
    if metric in ("top1", "loss"):
        return np.asarray(values["correct" if metric == "top1" else "loss"], dtype=np.float64)[table].T.copy()
    confidence = np.asarray(values["confidence"], dtype=np.float64)[table]
    gap = np.asarray(values["correct"], dtype=np.float64)[table] - confidence
    n_seeds, n = table.shape
    columns = np.zeros((n, n_seeds, n_bins))
    columns[np.arange(n)[None, :], np.arange(n_seeds)[:, None], ece_bin_index(confidence, n_bins)] = gap
    return columns.reshape(n, n_seeds * n_bins)


def weighted_metric(columns, metric, example_weights, seed_weights, n_bins=ECE_BINS, ece_pooling="per_seed_mean"):
    """`metric` of each shared-example replicate from multiplicities, with no (R, S·n) gather: the
    replicate's sums are one product example_weights (R, n) @ columns (n, S·k). seed_weights (R, S):
    how often the replicate takes each seed (all ones when every seed is kept once). The same value as
    metric_on_rows on the rows these multiplicities describe: top-1 exactly (integer sums), FY loss
    and ECE up to the order of a float64 sum."""
    sums = example_weights @ columns
    n_reps, n_slots = seed_weights.shape
    n = example_weights.shape[1]
    if metric in ("top1", "loss"):
        return (sums * seed_weights).sum(axis=1) / (n_slots * n)
    bins = sums.reshape(n_reps, -1, n_bins) * seed_weights[:, :, None]
    if ece_pooling == "pooled":
        return np.abs(bins.sum(axis=1)).sum(axis=1) / (n_slots * n)
    return np.abs(bins).sum(axis=(1, 2)) / (n_slots * n)


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
    if example_ids is not None:  # a replicate is one draw of examples: multiplicities, no gather
        table = rows.reshape(int(column_group.max()) + 1, -1)  # the (S, n) example table resample_rows checked
        columns = {m: (_example_columns(results_a, m, table, n_bins), _example_columns(results_b, m, table, n_bins))
                   for m in metrics}
    for start in range(0, n_boot, chunk):
        size = min(chunk, n_boot - start)
        if example_ids is not None:
            weights = _multiplicities(_draw_examples(rng, size, table.shape[1]), table.shape[1])
            every_seed = np.ones((size, table.shape[0]))
            for m in metrics:  # the same draw for both heads: paired
                a, b = columns[m]
                diffs[m].append(weighted_metric(a, m, weights, every_seed, n_bins, ece_pooling)
                                - weighted_metric(b, m, weights, every_seed, n_bins, ece_pooling))
            continue
        rows, column_group = resample_rows(n_rows, size, rng, groups, example_ids)
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
    # heavy: torch (seconds); compare_heads checks its --margin with this module before torch loads
    import torch

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


# ---- across trainings: Student t, sign-flip, power, two-level bootstrap --------------------------------
_QUAD_POINTS = 401  # Simpson nodes (odd); the integrands below are smooth and bounded (error < 1e-9)
_EXACT_SIGN_FLIP_MAX = 16  # up to 2^16 sign patterns are enumerated; beyond, Monte Carlo
_MAX_SEEDS_SEARCHED = 1000


def _simpson(values, step):
    """Composite Simpson rule over an odd number of equally spaced values (last axis)."""
    return step / 3 * (values[..., 0] + values[..., -1] + 4 * values[..., 1:-1:2].sum(axis=-1)
                       + 2 * values[..., 2:-1:2].sum(axis=-1))


def student_t_cdf(x, df):
    """P[T ≤ x] for Student's t with `df` > 0 degrees of freedom (float64 quadrature).

    With t = √df · tan θ the density becomes c · cos^(df−1) θ on θ ∈ (−π/2, π/2), bounded and smooth
    for df ≥ 1, so P[0 < T ≤ x] = c ∫_0^atan(x/√df) cos^(df−1) θ dθ by Simpson's rule.
    """
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    if math.isinf(x):
        return 1.0 if x > 0 else 0.0
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(math.pi)
    upper = math.atan(abs(x) / math.sqrt(df))
    theta = np.linspace(0.0, upper, _QUAD_POINTS)
    half = math.exp(log_c) * _simpson(np.cos(theta) ** (df - 1), upper / (_QUAD_POINTS - 1))
    return 0.5 + math.copysign(min(half, 0.5), x)


def student_t_sf(x, df):
    """P[T > x] for Student's t with `df` > 0 degrees of freedom, the upper tail integrated directly,
    c ∫_atan(x/√df)^(π/2) cos^(df−1) θ dθ (Simpson), so a far tail keeps its relative accuracy
    (1 − student_t_cdf would cancel to nothing below ~1e-12)."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    if math.isnan(x):
        return float("nan")
    if x < 0:
        return 1.0 - student_t_sf(-x, df)
    if math.isinf(x):
        return 0.0
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(math.pi)
    lower = math.atan(x / math.sqrt(df))
    theta = np.linspace(lower, math.pi / 2, _QUAD_POINTS)
    return float(min(0.5, math.exp(log_c) * _simpson(np.cos(theta) ** (df - 1), (math.pi / 2 - lower)
                                                      / (_QUAD_POINTS - 1))))


@functools.lru_cache(maxsize=256)
def student_t_isf(p, df):
    """x with P[T > x] = p, 0 < p ≤ 1/2 (bisection on student_t_sf to 1e-12 relative): the quantile for
    small tail probabilities, where 1 − p would lose digits."""
    if not 0 < p <= 0.5:
        raise ValueError(f"need 0 < p <= 0.5, got {p}")
    low, high = 0.0, 1.0
    while student_t_sf(high, df) > p:
        low, high = high, 2 * high
    while high - low > 1e-12 * max(1.0, high):
        mid = (low + high) / 2
        low, high = (mid, high) if student_t_sf(mid, df) > p else (low, mid)
    return (low + high) / 2


@functools.lru_cache(maxsize=256)  # the power searches ask for the same few quantiles many times
def student_t_quantile(p, df):
    """x with P[T ≤ x] = p (bisection on student_t_cdf to 1e-12)."""
    if not 0 < p < 1:
        raise ValueError(f"need 0 < p < 1, got {p}")
    if p < 0.5:
        return -student_t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < p:
        low, high = high, 2 * high
    while high - low > 1e-12 * max(1.0, high):
        mid = (low + high) / 2
        low, high = (mid, high) if student_t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


def _normal_cdf(x):
    """Φ(x) elementwise (math.erfc per element: a few thousand values, no thread-pool start-up)."""
    x = np.asarray(x, dtype=np.float64)
    return np.fromiter((0.5 * math.erfc(-v / math.sqrt(2)) for v in x.ravel()), np.float64, x.size).reshape(x.shape)


def chi2_cdf(x, df):
    """P[X ≤ x] for X ~ χ²_df: the regularized lower incomplete gamma P(df/2, x/2) by its power
    series x^a e^(−x) / Γ(a+1) · Σ_k x^k / ((a+1)…(a+k)) (all terms positive: no cancellation)."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    if x <= 0:
        return 0.0
    a, half = df / 2, x / 2
    term = total = 1.0
    k = 0
    while term > 1e-17 * total:
        k += 1
        term *= half / (a + k)
        total += term
    return min(1.0, math.exp(a * math.log(half) - half - math.lgamma(a + 1) + math.log(total)))


@functools.lru_cache(maxsize=256)
def chi2_quantile(p, df):
    """x with P[χ²_df ≤ x] = p (bisection on chi2_cdf to 1e-12 relative)."""
    if not 0 < p < 1:
        raise ValueError(f"need 0 < p < 1, got {p}")
    low, high = 0.0, float(df)
    while chi2_cdf(high, df) < p:
        low, high = high, 2 * high
    while high - low > 1e-12 * high:
        mid = (low + high) / 2
        low, high = (mid, high) if chi2_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


def sd_interval(sd, n_seeds, level=0.95):
    """(low, high): the `level` confidence interval of a normal s.d. estimated as `sd` from `n_seeds`
    values, s·√(ν / χ²_{ν, 1−α/2}) to s·√(ν / χ²_{ν, α/2}), ν = n − 1 (nan below 2 values)."""
    if n_seeds < 2 or not math.isfinite(sd):
        return float("nan"), float("nan")
    nu, alpha = n_seeds - 1, 1 - level
    return (sd * math.sqrt(nu / chi2_quantile(1 - alpha / 2, nu)),
            sd * math.sqrt(nu / chi2_quantile(alpha / 2, nu)))


def paired_t_power(difference, sd, n_seeds, alpha=0.05):
    """Power of the two-sided paired t-test at level α with `n_seeds` pairs, when the true mean
    difference is `difference` and the per-pair s.d. is `sd`.

    T = (Z + δ) / U with δ = difference·√n / sd, Z ~ N(0, 1) and U = √(V/ν), V ~ χ²_ν, ν = n − 1
    (the non-central t). P[|T| > c] = E_U[Φ(δ − cU) + Φ(−δ − cU)], integrated over U's density
    2 (ν/2)^(ν/2) u^(ν−1) e^(−νu²/2) / Γ(ν/2) by Simpson's rule.
    """
    if n_seeds < 2 or not (math.isfinite(difference) and math.isfinite(sd)):
        return float("nan")
    if sd <= 0:
        return 1.0 if difference != 0 else alpha
    nu = n_seeds - 1
    crit = student_t_quantile(1 - alpha / 2, nu)
    delta = abs(difference) * math.sqrt(n_seeds) / sd
    top = 1 + 12 / math.sqrt(nu)  # U's density is below 1e-30 beyond
    u = np.linspace(0.0, top, _QUAD_POINTS)
    with np.errstate(divide="ignore"):
        power_of_u = (nu - 1) * np.log(u) if nu != 1 else 0.0  # u^(ν−1): 0 at u = 0 for ν > 1
    density = np.exp(math.log(2) + (nu / 2) * math.log(nu / 2) - math.lgamma(nu / 2) + power_of_u
                     - nu * u ** 2 / 2)
    tails = _normal_cdf(delta - crit * u) + _normal_cdf(-delta - crit * u)
    return float(min(1.0, _simpson(tails * density, top / (_QUAD_POINTS - 1))))


def min_detectable_difference(sd, n_seeds, power=0.8, alpha=0.05):
    """Smallest true difference the paired t-test detects with `power` at `n_seeds` (same units as sd)."""
    if n_seeds < 2 or not math.isfinite(sd) or sd <= 0:
        return 0.0 if n_seeds >= 2 and sd == 0 else float("nan")
    low, high = 0.0, sd
    while paired_t_power(high, sd, n_seeds, alpha) < power:
        low, high = high, 2 * high
    while high - low > 1e-5 * high:  # far below the 0.1 pt the report prints
        mid = (low + high) / 2
        low, high = (mid, high) if paired_t_power(mid, sd, n_seeds, alpha) < power else (low, mid)
    return high


def seeds_needed(difference, sd, power=0.8, alpha=0.05, max_seeds=_MAX_SEEDS_SEARCHED):
    """Fewest seeds (≥ 2) at which the paired t-test detects `difference` with `power`; None when
    more than `max_seeds` would be needed (or the difference is 0, or either is not finite)."""
    if not (math.isfinite(difference) and math.isfinite(sd)):
        return None
    if sd <= 0:
        return 2 if difference != 0 else None
    if difference == 0 or paired_t_power(difference, sd, max_seeds, alpha) < power:
        return None
    low, high = 1, max_seeds  # power(low) < power <= power(high); power grows with the seeds
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if paired_t_power(difference, sd, mid, alpha) < power else (low, mid)
    return high


def sign_flip_p_value(differences, max_exact=_EXACT_SIGN_FLIP_MAX, n_random=2 ** 16, seed=0):
    """Two-sided sign-flip (permutation) p-value of the mean of paired differences.

    Exact for up to `max_exact` pairs: the fraction of all 2^S sign patterns whose |mean| is at least
    the observed |mean| (1e-12 relative tolerance, so that ties count). Beyond, a Monte-Carlo p
    (count + 1) / (n_random + 1) over random patterns.
    """
    d = np.asarray(differences, dtype=np.float64).ravel()
    if d.size == 0 or not np.all(np.isfinite(d)):  # nan stays nan: no pattern's mean compares with it
        return float("nan")
    observed = abs(d.mean())
    tolerance = 1e-12 * max(np.abs(d).max(), 1e-300)
    if d.size <= max_exact:
        patterns = (np.arange(2 ** d.size)[:, None] >> np.arange(d.size)) & 1
        means = np.abs((1 - 2 * patterns) @ d) / d.size
        return float(np.mean(means >= observed - tolerance))
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(n_random, d.size))
    hits = np.count_nonzero(np.abs(signs @ d) / d.size >= observed - tolerance)
    return float((hits + 1) / (n_random + 1))


def t_interval(differences, level=0.95):
    """(mean, s.d., low, high) of the paired differences: mean ± t_{S−1} · s.d. / √S (nan below 2)."""
    d = np.asarray(differences, dtype=np.float64).ravel()
    mean = float(d.mean()) if d.size else float("nan")
    if d.size < 2:
        return mean, float("nan"), float("nan"), float("nan")
    sd = float(d.std(ddof=1))
    half = student_t_quantile(1 - (1 - level) / 2, d.size - 1) * sd / math.sqrt(d.size)
    return mean, sd, mean - half, mean + half


def _draw_seeds_and_examples(rng, n_boot, n_seeds, n):
    """The two-level draw of each replicate: S seeds with replacement, then n examples with replacement."""
    return rng.integers(0, n_seeds, size=(n_boot, n_seeds)), rng.integers(0, n, size=(n_boot, n))


def across_trainings(results_a, results_b, *, groups, example_ids, metrics=None, n_boot=2000, seed=0,
                     level=0.95, power=0.8, n_bins=ECE_BINS):
    """Seed-level comparison of A − B (see the module docstring): for each metric
    {"metric", "per_seed" (A − B of each seed, in the caller's seed order), "difference" (their mean),
    "sd", "t_low", "t_high", "sign_flip_p", "min_sign_flip_p" (2 / 2^S, the smallest possible),
    "boot_low", "boot_high" (two-level bootstrap percentile interval), "mdd" (80%-power minimum
    detectable difference at S seeds, at the observed s.d.), "seeds_needed" (for the observed
    difference at the observed s.d.; None: > 1000 or 0), "sd_low", "sd_high" (the s.d.'s `level`
    χ² interval), "mdd_low", "mdd_high", "seeds_needed_low", "seeds_needed_high" (the same at the
    interval's ends: the ranges the sentences print), "significant" (the t-interval excludes 0),
    "n_seeds", "level", "power"}; power=None skips the power analysis (mdd nan, seeds_needed None).

    groups / example_ids as paired_bootstrap's shared-example design: every seed holds the same
    examples once each. Deterministic given `seed`.
    """
    metrics, n_rows = _check_inputs(results_a, results_b, metrics)
    if n_rows == 0:
        raise ValueError("no examples to compare")
    table = _example_table(_strata(groups, n_rows), example_ids)
    n_seeds, n = table.shape
    one_seed = np.zeros(n, dtype=np.int64)
    per_seed = {m: np.array([metric_on_rows(results_a, m, table[s][None], one_seed, n_bins)[0]
                             - metric_on_rows(results_b, m, table[s][None], one_seed, n_bins)[0]
                             for s in range(n_seeds)]) for m in metrics}
    rng = np.random.default_rng(seed)
    chunk = max(1, _MAX_GATHERED // table.size)
    boots = {m: [] for m in metrics}
    columns = {m: (_example_columns(results_a, m, table, n_bins), _example_columns(results_b, m, table, n_bins))
               for m in metrics}
    for start in range(0, n_boot, chunk):
        seed_picks, example_picks = _draw_seeds_and_examples(rng, min(chunk, n_boot - start), n_seeds, n)
        seed_weights, example_weights = _multiplicities(seed_picks, n_seeds), _multiplicities(example_picks, n)
        for m in metrics:
            a, b = columns[m]
            boots[m].append(weighted_metric(a, m, example_weights, seed_weights, n_bins)
                            - weighted_metric(b, m, example_weights, seed_weights, n_bins))
    alpha = 1 - level
    out = {}
    for m in metrics:
        d = per_seed[m]
        mean, sd, low, high = t_interval(d, level)
        boot = np.concatenate(boots[m]) if boots[m] else np.array([mean])
        boot_low, boot_high = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
        enough = n_seeds >= 2
        if not enough:  # no seed stage: the bootstrap would be the conditional one
            boot_low = boot_high = float("nan")
        plan = enough and power
        sd_low, sd_high = sd_interval(sd, n_seeds, level)
        mdd_at = (lambda s: min_detectable_difference(s, n_seeds, power, alpha)) if plan else (lambda s: float("nan"))
        need_at = (lambda s: seeds_needed(mean, s, power, alpha)) if plan else (lambda s: None)
        out[m] = {"metric": m, "per_seed": [float(x) for x in d], "difference": mean, "sd": sd,
                  "t_low": low, "t_high": high, "sign_flip_p": sign_flip_p_value(d),
                  "min_sign_flip_p": min(1.0, 2.0 / 2 ** n_seeds), "boot_low": float(boot_low),
                  "boot_high": float(boot_high),
                  "mdd": mdd_at(sd), "seeds_needed": need_at(sd), "sd_low": sd_low, "sd_high": sd_high,
                  "mdd_low": mdd_at(sd_low), "mdd_high": mdd_at(sd_high),
                  "seeds_needed_low": need_at(sd_low), "seeds_needed_high": need_at(sd_high),
                  # all equal (s.d. 0): the t-test has no scale, so no claim (comparison/analysis/equivalence.py)
                  "significant": bool(enough and np.ptp(d) > 0 and (low > 0 or high < 0)), "n_seeds": n_seeds,
                  "level": level,
                  "power": power}
    return out


# ---- sentences -----------------------------------------------------------------------------------------
def _signed(x, digits):
    text = f"{abs(x):.{digits}f}"
    if math.isnan(x) or float(text) == 0:  # nan unsigned: never "−nan"
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
    in_points = METRIC_TABLE[metric].in_points
    scale = 100.0 if in_points else 1.0
    digits = digits if digits is not None else METRIC_TABLE[metric].digits
    verdict = "significant" if result["significant"] else "not significant"
    alpha = f"{(1 - result['level']) * 100:g}%"
    text = (f"{name_a} {_MINUS} {name_b} {_LABELS[metric]}: {_signed(result['difference'] * scale, digits)}"
            f"{' pt' if in_points else ''} [{_signed(result['ci_low'] * scale, digits)}, "
            f"{_signed(result['ci_high'] * scale, digits)}], {verdict} at {alpha}")
    if mcnemar is not None and metric == "top1":
        text += f" (McNemar exact {format_p_value(mcnemar['p_value'])})"
    return text


def signed_points(x, digits=1):
    """A fraction as signed percentage points with `digits` decimals, one more when a non-zero value
    would print as 0.0 (so that an interval that excludes 0 never reads [0.0, ...])."""
    if x != 0 and float(f"{abs(100 * x):.{digits}f}") == 0:
        digits += 1
    return _signed(100 * x, digits)


def two_figures(x):
    """x to two significant figures, never in exponent form: 29.7 -> "30", 2.47 -> "2.5", 0.474 -> "0.47"."""
    if not math.isfinite(x) or x == 0:
        return f"{x:g}"
    return f"{x:.{max(0, 1 - math.floor(math.log10(abs(x))))}f}"


def seeds_range_text(result):
    """'6–420 seeds', '30 to more than 1000 seeds': the seeds the observed difference would need, over
    the seed s.d.'s χ² interval (an across_trainings entry's seeds_needed_low / _high)."""
    low, high = result["seeds_needed_low"], result["seeds_needed_high"]
    over = f"more than {_MAX_SEEDS_SEARCHED}"
    return (f"{over} seeds" if low is None else
            f"{low}–{high} seeds" if high is not None and high != low else
            f"{low} seeds" if high is not None else f"{low} to {over} seeds")


def mdd_range_text(result):
    """'2.4–29 pt': the 80%-power minimum detectable difference over the seed s.d.'s χ² interval."""
    return f"{two_figures(100 * result['mdd_low'])}–{two_figures(100 * result['mdd_high'])} pt"


def power_range_text(result):
    """The power clause of a not-significant verdict: the seed s.d.'s χ² interval, the MDD over it and
    the seeds a true difference of the observed size would need over it, e.g. "the per-seed
    differences have s.d. 1.4 pt, but with 3 seeds the seed s.d. is known only to [0.7, 8.8] pt (95% χ²
    interval): MDD 2.4–29 pt (80% power, non-central t); were the true difference the observed −1.2 pt,
    it would take 6–420 seeds; plan seeds from a pilot"."""
    n, power, level = result["n_seeds"], f"{100 * result['power']:g}%", f"{100 * result['level']:g}%"
    seeds = seeds_range_text(result)
    return (f"the per-seed differences have s.d. {100 * result['sd']:.1f} pt, but with {n} seeds the seed s.d. is "
            f"known only to [{100 * result['sd_low']:.1f}, {100 * result['sd_high']:.1f}] pt ({level} χ² interval): "
            f"MDD {mdd_range_text(result)} ({power} power, "
            f"non-central t); were the true difference the observed {signed_points(result['difference'])} pt, it "
            f"would take {seeds}; plan seeds from a pilot")


def describe_across_trainings(result, name_a, name_b, metric_label=None):
    """The verdict sentence from an across_trainings entry (top-1 or ECE in points), e.g.
    "sparsemax − softmax top-1 across 3 trainings: +3.1 pt [−1.0, +7.3] (t-interval over seeds;
    sign-flip p = 0.25), not significant at 5%: not resolvable with 3 seeds; " + power_range_text."""
    label = metric_label or _LABELS[result["metric"]]
    n, alpha = result["n_seeds"], f"{(1 - result['level']) * 100:g}%"
    diff = signed_points(result["difference"])
    lead = f"{name_a} {_MINUS} {name_b} {label}"
    if n < 2:
        return (f"{lead}: {diff} pt on 1 seed: not resolvable with 1 seed (training-to-training "
                f"variation needs ≥ 2 seeds to be measured; the interval given this training leaves it out)")
    if all(d == 0 for d in result["per_seed"]):
        return f"{lead}: 0.0 pt on each of the {n} seeds: no difference, not significant at {alpha}"
    if all(d == result["per_seed"][0] for d in result["per_seed"]):
        return (f"{lead}: {diff} pt on each of the {n} seeds (s.d. 0: no spread to measure the noise by, so no "
                f"t-test), not significant at {alpha}")
    interval = f"[{signed_points(result['t_low'])}, {signed_points(result['t_high'])}]"
    text = (f"{lead} across {n} trainings: {diff} pt {interval} "
            f"(t-interval over seeds; sign-flip {format_p_value(result['sign_flip_p'])})")
    if result["significant"]:
        text += f", significant at {alpha}"
        if result["min_sign_flip_p"] > 1 - result["level"]:
            needed = next(s for s in range(n, 64) if 2.0 / 2 ** s <= 1 - result["level"])
            text += (f" by the t-interval; the sign-flip test cannot confirm it with {n} seeds (its smallest "
                     f"p is {result['min_sign_flip_p']:.2g}; ≥ {needed} seeds)")
        return text
    return f"{text}, not significant at {alpha}: not resolvable with {n} seeds; {power_range_text(result)}"
