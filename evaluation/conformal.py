"""Split-conformal prediction sets from a head's output, including the sparse heads' own support.

Campos, Santos, Martins et al., "Sparse Activations as Conformal Predictors", AISTATS 2025: the
support of a sparse mapping is a prediction set, and calibrating the temperature T of the logits
on held-out data makes it a conformal one. For γ-entmax with α ∈ (1, 2] (sparsemax α=2) written as
p_k = [(α−1) z_k / T − τ]_+^{1/(α−1)}, Σ_k p_k = 1, class y is in the support iff

    s(z, y) = (α−1) · ‖(z − z_y·1)_+‖_{1/(α−1)}  <  T.

Derivation: the threshold τ solves f(τ) = 1 with f(t) = Σ_k [(α−1) z_k/T − t]_+^{1/(α−1)} strictly
decreasing where positive, so (α−1) z_y/T > τ ⇔ f((α−1) z_y/T) < 1 ⇔
((α−1)/T)^{1/(α−1)} Σ_k (z_k − z_y)_+^{1/(α−1)} < 1 ⇔ s(z, y) < T.
For sparsemax this is Σ_k (z_k − z_y)_+ < T; for entmax-1.5, ½·‖(z − z_y)_+‖₂ < T. The score is a
closed form: no per-sample bisection over T is needed. With the conformal quantile q̂ of the
calibration scores, the set {y : s(z, y) ≤ q̂} is the support of head(z / T) for any T just above
q̂, and P(y ∈ set) ≥ 1 − ε for exchangeable data (Vovk et al. 2005; Angelopoulos & Bates 2021).

For every head the standard scores are also reported on its probabilities:
  - LAC (least ambiguous set-valued classifier; Sadinle, Lei & Wasserman 2019): s = 1 − p_y.
  - APS (adaptive prediction sets; Romano, Sesia & Candès 2020), randomized: s = the probability
    of the classes ranked above y + u·p_y, u ~ U(0, 1) (stable sort, so ties and results are
    deterministic). Randomization matters for sparse heads: without it the last class of the
    support ties with all zero-probability classes. The uniforms come from `aps_seed`, which eval.py
    derives from the run (its training seed and head): one draw shared by every run would bias a
    mean over seeds the way that one draw happens to fall (at a few hundred calibration samples it
    over-covered by 5-7 points), while a draw per run averages out over seeds.
Sets are {y : s(x, y) ≤ q̂}; with q̂ = +inf (too few calibration samples for 1 − ε) the set is all
classes. Everything is computed in float64.
"""
import math

import torch

from common.seeding import mix_seed
from configs.loader import config_to_dict
from models.registry import HEADS

EPSILONS = (0.1, 0.05)
# A finer sweep for the coverage-vs-set-size plot.
CURVE_EPSILONS = (0.4, 0.3, 0.2, 0.15, 0.1, 0.075, 0.05, 0.03, 0.02, 0.01)


def conformal_quantile(scores, eps):
    """The ⌈(n+1)(1−ε)⌉-th smallest calibration score (+inf when that exceeds n).

    With exchangeable calibration and test points, P(s_test ≤ q̂) ≥ 1 − ε (finite-sample valid).
    """
    scores = scores.reshape(-1).double()
    n = scores.numel()
    k = math.ceil((n + 1) * (1.0 - eps) - 1e-9)  # tolerance: (n+1)(1−ε) integer up to rounding
    if n == 0 or k > n:
        return math.inf
    return torch.kthvalue(scores, max(k, 1)).values.item()


# A calibration set whose coverage spread (one standard deviation over calibration draws) exceeds
# this gets a warning: the 1 − ε guarantee holds on average, not for the one set the user has.
COVERAGE_SD_LIMIT = 0.02


def coverage_spread(n, eps):
    """Standard deviation of the coverage of sets calibrated on n exchangeable samples (no ties):
    conditionally on the calibration set it is Beta(k, n + 1 − k) with k = ⌈(n+1)(1−ε)⌉ (Vovk 2012;
    Angelopoulos & Bates 2021, §3.2). None when k > n: the threshold is +inf, every set all classes."""
    k = math.ceil((n + 1) * (1.0 - eps) - 1e-9)
    if n <= 0 or k > n:
        return None
    a, b = k, n + 1 - k
    return math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1)))


def _enough_samples(epsilons, limit):
    """The smallest n whose coverage spread is at most `limit` at every ε."""
    n = 1
    while any(coverage_spread(n, e) is None or coverage_spread(n, e) > limit for e in epsilons):
        n += 1
    return n


def calibration_size_warning(n, epsilons=EPSILONS, limit=COVERAGE_SD_LIMIT):
    """One warning line when n calibration samples leave the finite-sample guarantee loose, else None.

    The guarantee 1 − ε ≤ P(y ∈ set) < 1 − ε + 1/(n+1) is an average over calibration draws; for the
    one calibration set at hand the coverage varies by `coverage_spread` (±5.5 points at n = 16,
    ε = 0.1), and when (n+1)(1−ε) > n the threshold is infinite (all classes in every set)."""
    parts, worst = [], 0.0
    for eps in sorted(epsilons, reverse=True):
        sd = coverage_spread(n, eps)
        if sd is None:
            parts.append(f"ε={eps:g}: needs n ≥ {math.ceil(1.0 / eps - 1 - 1e-9)}, every set is all classes")
            worst = math.inf
        else:
            parts.append(f"ε={eps:g}: average coverage {100 * (1 - eps):.4g}-{100 * (1 - eps + 1 / (n + 1)):.4g}%, "
                         f"±{100 * sd:.1f} points for this one calibration set")
            worst = max(worst, sd)
    if worst <= limit:
        return None
    return (f"warning: prediction sets calibrated on only {n} samples, so the finite-sample guarantee is loose "
            f"({'; '.join(parts)}); n ≥ {_enough_samples(epsilons, limit)} keeps it within ±{100 * limit:g} points")


# --- sparse support (temperature) scores -----------------------------------------------------

def _entmax_gap_score(gaps, alpha):
    """(α−1)·‖gaps‖_{1/(α−1)} per row, for non-negative gaps (N, K); overflow-safe."""
    if alpha >= 2.0:
        return gaps.sum(dim=1)
    r = 1.0 / (alpha - 1.0)
    # Factor out the largest gap so that gaps**r cannot overflow for large r (α close to 1).
    m = gaps.amax(dim=1, keepdim=True)
    ratio = gaps / m.clamp(min=torch.finfo(gaps.dtype).tiny)
    return (alpha - 1.0) * m.squeeze(1) * ratio.pow(r).sum(dim=1).pow(1.0 / r)


def _check_alpha(alpha):
    alpha = float(alpha)
    if not 1.0 < alpha <= 2.0:
        raise ValueError(f"entmax support scores need 1 < alpha <= 2, got {alpha}")
    return alpha


ROW_CHUNK = 4096  # bounds float64 temporaries to ROW_CHUNK × K (ImageNet val: 50000 × 1000)


def support_scores(logits, labels, alpha):
    """s(z, y) for the label of each row: the smallest temperature whose support contains y."""
    alpha = _check_alpha(alpha)
    parts = []
    for start in range(0, logits.shape[0], ROW_CHUNK):
        z = logits[start:start + ROW_CHUNK].double()
        z_y = z.gather(1, labels[start:start + ROW_CHUNK].view(-1, 1).long())
        parts.append(_entmax_gap_score((z - z_y).clamp(min=0), alpha))
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.float64)


def support_set_sizes(logits, alpha, q, z_sorted=None):
    """|{k : s(z, k) ≤ q}| per row, exactly, by bisection over the rank of the sorted logits.

    s(z, k) only grows as z_k decreases, so the set is a prefix of the sorted classes (ties all in
    or all out); each bisection step costs one O(N·K) score evaluation. `z_sorted` (the rows of
    logits sorted descending, float64) may be passed to share the sort across thresholds.
    """
    alpha = _check_alpha(alpha)
    n, num_classes = logits.shape
    if math.isinf(q):
        return torch.full((n,), num_classes, dtype=torch.long)
    if n > ROW_CHUNK:
        return torch.cat([
            support_set_sizes(logits[i:i + ROW_CHUNK], alpha, q,
                              None if z_sorted is None else z_sorted[i:i + ROW_CHUNK])
            for i in range(0, n, ROW_CHUNK)])
    z = logits.double()
    if z_sorted is None:
        z_sorted = z.sort(dim=1, descending=True).values
    lo = torch.ones(n, dtype=torch.long)  # rank 1 (the max) has score 0 ≤ q: always in
    hi = torch.full((n,), num_classes, dtype=torch.long)
    while bool((lo < hi).any()):
        mid = (lo + hi + 1) // 2
        threshold = z_sorted.gather(1, (mid - 1).view(-1, 1))
        inside = _entmax_gap_score((z - threshold).clamp(min=0), alpha) <= q
        lo = torch.where(inside, mid, lo)
        hi = torch.where(inside, hi, mid - 1)
    # Ties with the last included logit share its score, so they are in too.
    last = z_sorted.gather(1, (lo - 1).view(-1, 1))
    return (z >= last).sum(dim=1)


def support_set_mask(logits, alpha, q):
    """(N, K) bool: class k is in the set iff s(z, k) ≤ q, i.e. the classes whose logit is at least the
    last one `support_set_sizes` keeps (the set is a prefix of the sorted classes, ties included)."""
    z = logits.double()
    z_sorted = z.sort(dim=1, descending=True).values
    sizes = support_set_sizes(logits, alpha, q, z_sorted)
    return z >= z_sorted.gather(1, (sizes - 1).view(-1, 1))


# --- standard scores on probabilities --------------------------------------------------------

def lac_scores(probs, labels):
    """LAC non-conformity: 1 − p_y."""
    return 1.0 - probs.double().gather(1, labels.view(-1, 1).long()).squeeze(1)


def lac_set_mask(probs, q):
    """(N, K) bool: {k : 1 − p_k ≤ q} (all classes for q = +inf)."""
    if math.isinf(q):
        return torch.ones(probs.shape, dtype=torch.bool)
    return (1.0 - probs.double()) <= q


def lac_set_sizes(probs, q):
    return lac_set_mask(probs, q).sum(dim=1)


def _aps_sorted(probs):
    p = probs.double()
    order = p.sort(dim=1, descending=True, stable=True).indices
    return order, p.gather(1, order).cumsum(dim=1)


def aps_scores(probs, labels, u=None):
    """APS: probability mass of the classes ranked above y, plus u·p_y (u = 1: non-randomized).

    With u ~ U(0, 1) per sample (Romano et al.'s randomized version) a class of zero probability
    always scores the full mass while every class in a sparse support scores less; without it the
    last support class ties with the zeros, which inflates sparse heads' sets.
    """
    order, cum = _aps_sorted(probs)
    rank = (order == labels.view(-1, 1).long()).long().argmax(dim=1, keepdim=True)
    score = cum.gather(1, rank).squeeze(1)
    if u is None:
        return score
    p_y = probs.double().gather(1, labels.view(-1, 1).long()).squeeze(1)
    return score - (1.0 - u.double()) * p_y


def _aps_sorted_inside(cum, q, u=None):
    """(N, K) bool over the classes in sorted order: score ≤ q (a prefix: the score grows along it)."""
    if u is None:
        return cum <= q
    sorted_p = torch.diff(cum, dim=1, prepend=torch.zeros_like(cum[:, :1]))
    return cum - (1.0 - u.double().view(-1, 1)) * sorted_p <= q


def aps_set_sizes(probs, q, cum=None, u=None):
    """Set sizes for threshold q: the sorted prefix with score ≤ q (the score grows along it).
    `cum` (sorted cumulative probabilities) may be precomputed; u as in `aps_scores`."""
    if math.isinf(q):
        return torch.full((probs.shape[0],), probs.shape[1], dtype=torch.long)
    if cum is None:
        _, cum = _aps_sorted(probs)
    return _aps_sorted_inside(cum, q, u).sum(dim=1)


def aps_set_mask(probs, q, u=None):
    """(N, K) bool in class order: the classes `aps_set_sizes` counts (u as in `aps_scores`)."""
    if math.isinf(q):
        return torch.ones(probs.shape, dtype=torch.bool)
    order, cum = _aps_sorted(probs)
    return torch.zeros(probs.shape, dtype=torch.bool).scatter(1, order, _aps_sorted_inside(cum, q, u))


def aps_uniforms(n, stream, seed=0):
    """The per-sample U(0,1) draws of randomized APS: a pure function of (seed, stream, n), so they
    are reproducible and identical across processes; `stream` separates calibration and evaluation,
    `seed` separates runs (see the module docstring)."""
    generator = torch.Generator().manual_seed(mix_seed("aps-uniforms", int(seed), int(stream)))
    return torch.rand(n, generator=generator, dtype=torch.float64)


def set_mask(method, q, logits=None, probs=None, alpha=None, u=None):
    """(N, K) bool prediction sets of `method` at threshold q (as calibrated by `evaluate_method`):
    'support' needs logits and the head's alpha, 'lac' and 'aps' the probabilities (APS: u)."""
    if method == "support":
        return support_set_mask(logits, alpha, q)
    if method == "lac":
        return lac_set_mask(probs, q)
    if method == "aps":
        return aps_set_mask(probs, q, u)
    raise ValueError(f"unknown conformal method {method!r}; valid: support, lac, aps")


# --- the report ------------------------------------------------------------------------------

def methods_for_head(head_name):
    """Score families that make sense for a head: its own support if sparse, LAC and APS always."""
    return (("support",) if head_name in HEADS and HEADS[head_name].conformal_support else ()) + ("lac", "aps")


def aps_seed(cfg):
    """The seed of randomized APS's uniforms: one per run (its training seed, head and head settings,
    model norm), so seeds and heads do not all share one draw (aps_uniforms)."""
    head = ",".join(f"{k}={v}" for k, v in sorted(config_to_dict(cfg)["head"].items()))
    return mix_seed("eval-aps", int(cfg.train.seed), head, str(cfg.model.norm))


def _scores_and_sizer(method, logits, probs, labels, alpha, stream=0, aps_seed=0):
    """True-class scores and a function q -> set sizes (sorts shared across thresholds)."""
    if method == "support":
        z_sorted = logits.double().sort(dim=1, descending=True).values
        return support_scores(logits, labels, alpha), lambda q: support_set_sizes(logits, alpha, q, z_sorted)
    if method == "lac":
        p = probs.double()
        return lac_scores(probs, labels), lambda q: lac_set_sizes(p, q)
    if method == "aps":
        _, cum = _aps_sorted(probs)
        u = aps_uniforms(probs.shape[0], stream, aps_seed)
        return aps_scores(probs, labels, u), lambda q: aps_set_sizes(probs, q, cum, u)
    raise ValueError(f"unknown conformal method {method!r}; valid: support, lac, aps")


def evaluate_method(method, calib, evals, alpha=None, epsilons=EPSILONS, curve_epsilons=CURVE_EPSILONS,
                    aps_seed=0):
    """Calibrate `method` on `calib` and measure its sets on `evals` (`aps_seed`: see aps_uniforms).

    calib / evals: dicts with "logits" (N, K), "probs" (N, K), "labels" (N,).
    Returns {"eps": {"0.1": {"threshold", "coverage", "mean_set_size", "median_set_size",
    "empty_frac", "degenerate"}, ...}, "curve": [{"eps", "coverage", "mean_set_size"}, ...]}. For the
    support method the threshold is the calibrated temperature T (set = support of head(z / T));
    "degenerate" is True when T = 0: at least ⌈(n+1)(1−ε)⌉ calibration samples have the true class
    on top (score 0), so the set is the top-1 class alone (with its ties) and T is no temperature.
    "empty_frac" is the fraction of empty sets (LAC's sets are empty when no class has p ≥ 1 − q̂).
    """
    cal_scores, _ = _scores_and_sizer(method, calib["logits"], calib["probs"], calib["labels"], alpha, stream=1,
                                      aps_seed=aps_seed)
    ev_scores, set_sizes = _scores_and_sizer(method, evals["logits"], evals["probs"], evals["labels"], alpha,
                                             stream=2, aps_seed=aps_seed)

    def measure(eps):
        q = conformal_quantile(cal_scores, eps)
        sizes = set_sizes(q).double()
        n = ev_scores.numel()
        return {
            "threshold": q,
            "coverage": (ev_scores <= q).double().mean().item() if n else float("nan"),
            "mean_set_size": sizes.mean().item() if n else float("nan"),
            "median_set_size": sizes.quantile(0.5).item() if n else float("nan"),
            "empty_frac": (sizes == 0).double().mean().item() if n else float("nan"),
            "degenerate": method == "support" and q == 0.0,
        }

    result = {"eps": {str(eps): measure(eps) for eps in epsilons}, "curve": []}
    for eps in curve_epsilons:
        m = measure(eps)
        result["curve"].append({"eps": eps, "coverage": m["coverage"], "mean_set_size": m["mean_set_size"]})
    return result


def prediction_sets(head_name, alpha, calib, evals, epsilons=EPSILONS, curve_epsilons=CURVE_EPSILONS,
                    aps_seed=0):
    """Every applicable method for this head (see `methods_for_head`), calibrated and evaluated."""
    return {
        method: evaluate_method(method, calib, evals, alpha=alpha, epsilons=epsilons,
                                curve_epsilons=curve_epsilons, aps_seed=aps_seed)
        for method in methods_for_head(head_name)
    }
