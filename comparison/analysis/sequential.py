"""Adding seeds in looks: a group-sequential design on the paired t statistic, with Lan–DeMets
O'Brien–Fleming-type α-spending, that stops a head's comparison once superiority, inferiority or
equivalence within ±δ is established.

Design: looks at n_1 < … < n_K seeds (default 3, 5, 8, 12), level α, margin δ (the differences'
units), the metric's direction. At look k the first n_k per-seed differences (head − reference)
give d̄_k, s_k, se_k = s_k / √n_k and, for a shift μ0, T_k(μ0) = (d̄_k − μ0) / se_k. Four one-sided
tests, each with its own boundary sequence c_1, …, c_K on the t scale:
  - superiority and inferiority (H0: d ≤ 0, H0: d ≥ 0), α/2 each (the two-sided test of the fixed
    design, as in comparison/analysis/equivalence.py): T_k(0) > c_k(α/2), T_k(0) < −c_k(α/2);
  - the two halves of TOST (H0: d ≤ −δ, H0: d ≥ +δ), α each: T_k(−δ) > c_k(α) and T_k(+δ) < −c_k(α).
Equivalently the repeated confidence intervals (Jennison & Turnbull 1989, JRSS B 51:305)
d̄_k ± c_k(α/2)·se_k and d̄_k ± c_k(α)·se_k, whose coverage holds at every look at once (≥ 1 − α and
≥ 1 − 2α), are read by the one rule of comparison/analysis/equivalence.py (claims_from_bounds).
Stopping rule per head: stop at the first look where superior, inferior or equivalent holds; at
the last look the verdict is whatever holds (non-inferior, or undecided). Error rates: each
boundary sequence gives its one-sided test probability ≤ its α of ever crossing under its null, and
stopping for another reason only removes chances to cross (the boundaries are non-binding), so a
false superior/inferior when d = 0 has probability ≤ α, a false equivalence when |d| ≥ δ ≤ α.
Measured, not assumed: scripts/bench_sequential.py (docs/comparison.md).

Boundaries. α-spending (Lan & DeMets 1983, Biometrika 70:659), O'Brien–Fleming type
α(τ) = 2 − 2Φ(z_{1−α/2} / √τ) at information fraction τ_k = n_k / n_K: a look spends
α(τ_k) − α(τ_{k−1}).
For the z statistic (known variance) the boundary b_k solves P[Z_1 < b_1, …, Z_{k−1} < b_{k−1},
Z_k ≥ b_k] = that increment, with the Z_k jointly normal, corr √(τ_j/τ_k): computed by recursive
numerical integration of the density of the continuing paths (Armitage, McPherson & Rowe 1969, JRSS A
132:235; Jennison & Turnbull, "Group Sequential Methods", 2000, ch. 19), Simpson's rule on a grid,
bisection for b_k. With an estimated variance the T_k are not jointly normal; two ways onto the
t scale:
  - "monte-carlo-t" (default): under each null, T_k(μ0) of normal differences has a law free of σ
    (it is scale invariant), so the boundaries are calibrated on M seeded simulated paths of
    N(0, 1) differences: c_k is the order statistic of the continuing paths' T_k that leaves
    round(M·α(τ_k)) crossings in all (c_k = ∞ when that look may spend nothing). Exact for normal
    differences up to the Monte-Carlo error of the attained α, ±√(α(1−α)/M) (±0.0004 at M = 2^18),
    deterministic given the design's mc_seed, cached per design;
  - "bonferroni-t": no simulation, and the level kept by construction: look k tests at the α its
    spending gives it, c_k = t_{n_k−1}^{-1}(1 − (α(τ_k) − α(τ_{k−1}))) (∞ where that is 0). Under
    the null each T_k(μ0) is exactly t_{n_k−1}, so P[some T_k > c_k] ≤ Σ_k P[T_k > c_k] = α
    (Bonferroni's inequality over the looks): conservative, since the looks' statistics overlap
    (2.2% attained one-sided at 2.5%, looks 3, 5, 8, 12). It replaces "nominal-t", which gave each
    look the z boundary's nominal level, c_k = t_{n_k−1}^{-1}(Φ(b_k)) (the significance level
    approach, Jennison & Turnbull 2000, ch. 3): that keeps each look's own level but not the
    design's, since the s.d. estimated afresh at each look makes the T_k less correlated than the
    Z_k the b_k were computed for, so more paths cross somewhere (2.60%, 2.65% and 2.77% one-sided
    at 2.5% for looks 3, 5, 8, 12 / 3, 5 / 2, 3, over 2·10^6 simulated null paths each).

No evidence at a look with s.d. 0. The boundaries hold for normal differences with σ > 0, under
which s.d. 0 has probability 0; equal differences (identical runs, a coarse metric) give T = d̄ / 0,
which is no measurement of the noise. Such a look's repeated intervals are (−∞, +∞): it establishes
nothing, and at the last look the verdict is "undecided" (the fixed design's rule too:
comparison/analysis/equivalence.py). So two heads with identical per-seed results never stop.
Pure functions; the Design is frozen, serialisable (to_dict / from_dict) and checked on reload.
"""
import functools
import hashlib
import json
import math
from dataclasses import asdict, dataclass
from typing import NamedTuple, Tuple

import numpy as np
import torch

from comparison.limits import MAX_LOOKS, MAX_SEEDS, MIN_SEEDS

from .equivalence import VERDICTS, claims_from_bounds, verdict_index
from .statistics import student_t_isf

DEFAULT_LOOKS = (3, 5, 8, 12)
METHODS = ("monte-carlo-t", "bonferroni-t")
SPENDINGS = ("obrien-fleming",)
MC_PATHS = 2 ** 18
_GRID = 2001  # Simpson nodes per look (odd): a step of ~0.006 s.d. of the score, far below the 1e-4 the tests ask
_TAIL_SD = 8.0  # the grid's lower end in s.d.: the continuing paths' mass below it is < 1e-15
_MC_CHUNK = 2 ** 16  # paths drawn at a time (bounds memory for long designs; part of the seeded stream's layout)
_MC_CHUNK_VALUES = 2 ** 22  # ... and at most this many draws at a time (32 MB: long designs, fewer rows)
MAX_MC_PATHS = 2 ** 20  # a recorded design's mc_paths: the calibration's time grows with them


# ---- α-spending and the z boundaries ------------------------------------------------------------------
def _normal_sf(x):
    """1 − Φ(x) elementwise (float64, accurate in the far tail)."""
    return torch.special.ndtr(torch.as_tensor(-np.asarray(x, dtype=np.float64))).numpy()


def _normal_isf(p):
    """z with 1 − Φ(z) = p."""
    return float(-torch.special.ndtri(torch.tensor(p, dtype=torch.float64)))


def obf_spending(fraction, alpha):
    """Cumulative one-sided α spent by information fraction τ (array or scalar): Lan & DeMets' O'Brien–
    Fleming type, 2 − 2Φ(z_{1−α/2} / √τ); α at τ = 1."""
    tau = np.asarray(fraction, dtype=np.float64)
    return 2.0 * _normal_sf(_normal_isf(alpha / 2) / np.sqrt(tau))


def _simpson_grid(low, high, n=_GRID):
    nodes = np.linspace(low, high, n)
    weights = np.full(n, 2.0)
    weights[1::2] = 4.0
    weights[0] = weights[-1] = 1.0
    return nodes, weights * (high - low) / (3 * (n - 1))


def _bisect_decreasing(f, target, low=-10.0, high=40.0, tol=1e-10):
    """x in [low, high] with f(x) = target for a decreasing f."""
    while high - low > tol:
        mid = (low + high) / 2
        low, high = (mid, high) if f(mid) > target else (low, mid)
    return (low + high) / 2


@functools.lru_cache(maxsize=64)
def normal_boundaries(fractions, alpha):
    """One-sided upper z boundaries b_1..b_K (tuple) of the O'Brien–Fleming-type spending at one-sided
    level α for increasing information fractions (a tuple ending at 1), by recursive integration on
    the score scale W_k = Z_k √τ_k (independent increments, Var W_k = τ_k)."""
    tau = np.asarray(fractions, dtype=np.float64)
    if tau.ndim != 1 or tau.size == 0 or np.any(np.diff(tau) <= 0) or tau[0] <= 0 or abs(tau[-1] - 1) > 1e-12:
        raise ValueError(f"information fractions must increase to 1, got {fractions}")
    spent = obf_spending(tau, alpha)
    bounds = [_normal_isf(float(spent[0]))]
    w, weights = _simpson_grid(-_TAIL_SD * math.sqrt(tau[0]), bounds[0] * math.sqrt(tau[0]))
    density = np.exp(-w ** 2 / (2 * tau[0])) / math.sqrt(2 * math.pi * tau[0])  # W_1 on the continuation
    for k in range(1, tau.size):
        step_sd = math.sqrt(tau[k] - tau[k - 1])
        mass = weights * density
        root = math.sqrt(tau[k])

        def crossing(b):
            return float(mass @ _normal_sf((b * root - w) / step_sd))

        bounds.append(_bisect_decreasing(crossing, float(spent[k] - spent[k - 1])))
        if k < tau.size - 1:  # the continuing paths' density at look k
            new_w, new_weights = _simpson_grid(-_TAIL_SD * root, bounds[-1] * root)
            gap = (new_w[None, :] - w[:, None]) / step_sd
            kernel = np.exp(-gap ** 2 / 2) / (step_sd * math.sqrt(2 * math.pi))
            w, weights, density = new_w, new_weights, mass @ kernel
    return tuple(bounds)


# ---- onto the t scale -------------------------------------------------------------------------------------
def t_statistics(differences, looks):
    """(M, K) paired t statistics of the first n_k columns of `differences` (M, ≥ n_K), at each look
    (nan where the s.d. is 0 and the mean too; ±inf where only the s.d. is)."""
    d = np.asarray(differences, dtype=np.float64)
    n = np.asarray(looks)
    total, squares = np.cumsum(d, axis=1)[:, n - 1], np.cumsum(d ** 2, axis=1)[:, n - 1]
    mean = total / n
    var = np.maximum(squares - n * mean ** 2, 0.0) / (n - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return mean / np.sqrt(var / n)


@functools.lru_cache(maxsize=8)
def _null_t_statistics(looks, paths, seed):
    """T_k of `paths` seeded paths of N(0, 1) differences at each look (float64, (paths, K))."""
    rng = np.random.default_rng(seed)
    parts, left = [], paths
    rows = min(_MC_CHUNK, max(1, _MC_CHUNK_VALUES // looks[-1]))  # whole rows: the same stream for any chunking
    while left:
        size = min(rows, left)
        parts.append(t_statistics(rng.standard_normal((size, looks[-1])), looks))
        left -= size
    return np.concatenate(parts)


def _calibrated(t_null, spent):
    """Boundaries c_k on simulated null statistics: after look k, round(M·α(τ_k)) paths have crossed."""
    paths = t_null.shape[0]
    alive = np.ones(paths, dtype=bool)
    crossed, bounds = 0, []
    for k, cumulative in enumerate(spent):
        quota = int(round(paths * float(cumulative))) - crossed
        values = np.sort(t_null[alive, k])[::-1]
        if quota <= 0:
            c = math.inf
        elif quota >= values.size:
            c = float(values[-1]) - 1.0
        else:  # between the quota-th and the next largest: exactly `quota` continuing paths cross
            c = float(values[quota - 1] + values[quota]) / 2
        hit = alive & (t_null[:, k] > c)
        crossed += int(hit.sum())
        alive &= ~hit
        bounds.append(c)
    return tuple(bounds)


@functools.lru_cache(maxsize=64)
def t_boundaries(looks, alpha, method, paths=MC_PATHS, seed=0):
    """One-sided upper boundaries c_1..c_K on the paired t statistic at one-sided level α (tuple)."""
    fractions = tuple(n / looks[-1] for n in looks)
    if method == "bonferroni-t":  # each look at its own share of α: Bonferroni over the looks
        spent = np.diff(obf_spending(np.asarray(fractions), alpha), prepend=0.0)
        return tuple(student_t_isf(float(a), n - 1) if a > 0 else math.inf for a, n in zip(spent, looks))
    if method == "monte-carlo-t":
        return _calibrated(_null_t_statistics(looks, paths, seed), obf_spending(np.asarray(fractions), alpha))
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


# ---- the design --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Design:
    """A sequential comparison of one head with the reference on one metric (module docstring).
    margin: δ > 0 in the units of the differences passed (fractions for top-1: 0.005 = 0.5 pt)."""

    margin: float
    looks: Tuple[int, ...] = DEFAULT_LOOKS
    alpha: float = 0.05
    higher_is_better: bool = True
    method: str = "monte-carlo-t"
    spending: str = "obrien-fleming"
    mc_paths: int = MC_PATHS
    mc_seed: int = 0

    def __post_init__(self):
        if not all(_is_whole(n) for n in self.looks):
            raise ValueError(f"looks must be whole numbers of seeds, got {self.looks}")
        looks = tuple(int(n) for n in self.looks)
        object.__setattr__(self, "looks", looks)
        if not looks or looks[0] < MIN_SEEDS or any(b <= a for a, b in zip(looks, looks[1:])):
            raise ValueError(f"looks must be increasing seed counts of at least {MIN_SEEDS}, got {self.looks}")
        if looks[-1] > MAX_SEEDS or len(looks) > MAX_LOOKS:
            raise ValueError(f"looks must be at most {MAX_LOOKS} seed counts of at most {MAX_SEEDS} seeds, got "
                             f"{len(looks)} up to {looks[-1]}")
        if not (math.isfinite(self.margin) and self.margin > 0):
            raise ValueError(f"margin must be positive and finite, got {self.margin}")
        if not 0 < self.alpha < 0.5:
            raise ValueError(f"need 0 < alpha < 0.5, got {self.alpha}")
        if self.method not in METHODS or self.spending not in SPENDINGS:
            raise ValueError(f"method must be one of {METHODS} and spending one of {SPENDINGS}, "
                             f"got {self.method!r}, {self.spending!r}")
        if not (_is_whole(self.mc_paths) and 1000 <= self.mc_paths <= MAX_MC_PATHS and _is_whole(self.mc_seed)
                and self.mc_seed >= 0):
            raise ValueError(f"mc_paths must be a whole number from 1000 to {MAX_MC_PATHS} and mc_seed one >= 0, "
                             f"got {self.mc_paths!r}, {self.mc_seed!r}")

    def boundaries(self):
        """{"difference": c_k at α/2 (superiority / inferiority), "equivalence": c_k at α (each TOST half)}."""
        def at(level):
            return t_boundaries(self.looks, level, self.method, self.mc_paths, self.mc_seed)
        return {"difference": at(self.alpha / 2), "equivalence": at(self.alpha)}

    def next_look(self, n_seeds):
        """The seed count of the next look after n_seeds seeds (None after the last)."""
        return next((n for n in self.looks if n > n_seeds), None)

    def fingerprint(self):
        """sha256 of the design's fields (canonical JSON): what a rerun compares."""
        return hashlib.sha256(json.dumps(_fields(self), sort_keys=True).encode()).hexdigest()

    def to_dict(self):
        """The fields, their fingerprint and the boundaries they give (JSON-ready)."""
        return {**_fields(self), "fingerprint": self.fingerprint(),
                "boundaries": {k: [_json_float(c) for c in v] for k, v in self.boundaries().items()}}

    @classmethod
    def from_dict(cls, data):
        """The design recorded by to_dict; ValueError when its fingerprint or its boundaries differ from
        what these fields give now (the design, or the code computing it, changed)."""
        fields = {k: data[k] for k in _fields(cls(margin=1.0)) if k in data}
        design = cls(**fields)
        if "fingerprint" in data and data["fingerprint"] != design.fingerprint():
            raise ValueError("the recorded design's fingerprint does not match its fields: the record was edited")
        recorded = data.get("boundaries")
        if recorded is not None:
            now = design.to_dict()["boundaries"]
            for kind, values in now.items():
                if not np.allclose(_as_floats(recorded.get(kind, ())), _as_floats(values), rtol=1e-9, atol=0):
                    raise ValueError(f"the {kind} boundaries changed since the design was recorded: "
                                     f"{recorded.get(kind)} then, {values} now")
        return design


def _is_whole(n):
    return isinstance(n, (int, np.integer)) and not isinstance(n, bool)


def _fields(design):
    out = asdict(design)
    out["looks"] = list(design.looks)
    return out


def _json_float(x):
    return None if math.isinf(x) else float(x)  # JSON has no infinity: null = "this look cannot stop"


def _as_floats(values):
    return np.array([math.inf if v is None else float(v) for v in values], dtype=np.float64)


# ---- decisions ---------------------------------------------------------------------------------------------
class Interval(NamedTuple):
    """A repeated confidence interval of the mean difference at a look: its level holds at every look
    at once. look: its index + 1 (0: no look reached); n: the seeds it uses."""

    low: float
    high: float
    level: float
    look: int
    n: int


class Decision(NamedTuple):
    """stop?, verdict, the interval that supports it, and the 1 − α repeated interval of the same look
    (the one superiority and inferiority read: an undecided verdict needs both; None before a look).
    idle: the heads within noise of chance over the look's seeds, as (name, top-1, chance) — the
    caller's sanity check (comparison/settle.py): such a pair stops with no comparison."""

    stop: bool
    verdict: str
    interval: Interval
    difference_interval: Interval = None
    idle: tuple = ()


def _half_width(c, se):
    """c·se; infinite where the boundary is (the look spends no α) and where se is not positive
    (identical differences: no evidence, module docstring)."""
    c, se = np.broadcast_arrays(np.asarray(c, dtype=np.float64), np.asarray(se, dtype=np.float64))
    out = np.full(c.shape, np.inf)
    np.multiply(c, se, out=out, where=~np.isinf(c) & (se > 0))  # ∞ · 0 never computed: no invalid-value warning
    return out


def walk(differences, design):
    """The sequential procedure on M paths of per-seed differences (M, n) at once, over every look
    n_k ≤ n. Returns {"stopped" (bool: stopped at a look, or reached the last), "look" (index of the
    look decided at, −1 none), "n_used", "verdict" (index into equivalence.VERDICTS), "superior",
    "inferior", "equivalent", "non_inferior", "eq_low", "eq_high", "diff_low", "diff_high"} arrays."""
    d = np.atleast_2d(np.asarray(differences, dtype=np.float64))
    paths, n = d.shape
    bounds = design.boundaries()
    out = {"stopped": np.zeros(paths, dtype=bool), "look": np.full(paths, -1), "n_used": np.zeros(paths, dtype=int),
           "verdict": np.full(paths, VERDICTS.index("undecided"))}
    for key in ("superior", "inferior", "equivalent", "non_inferior"):
        out[key] = np.zeros(paths, dtype=bool)
    for key in ("eq_low", "eq_high", "diff_low", "diff_high"):
        out[key] = np.full(paths, np.nan)
    total, squares = np.cumsum(d, axis=1), np.cumsum(d ** 2, axis=1)
    # all equal so far: exactly, as the sums of squares would not say (0.0025 · 3 leaves a rounding residue)
    equal = np.maximum.accumulate(d, axis=1) == np.minimum.accumulate(d, axis=1)
    last = len(design.looks) - 1
    for k, n_k in enumerate(design.looks):
        if n_k > n:
            break
        mean = total[:, n_k - 1] / n_k
        se = np.sqrt(np.maximum(squares[:, n_k - 1] - n_k * mean ** 2, 0.0) / (n_k - 1) / n_k)
        se[equal[:, n_k - 1]] = 0.0  # no evidence at this look (_half_width)
        half_diff, half_eq = _half_width(bounds["difference"][k], se), _half_width(bounds["equivalence"][k], se)
        ends = {"diff_low": mean - half_diff, "diff_high": mean + half_diff, "eq_low": mean - half_eq,
                "eq_high": mean + half_eq}
        flags = claims_from_bounds(ends["diff_low"], ends["diff_high"], ends["eq_low"], ends["eq_high"],
                                   design.margin, design.higher_is_better)
        live = ~out["stopped"]  # paths still going take this look's reading
        for key, value in (*ends.items(), *zip(("superior", "inferior", "equivalent", "non_inferior"), flags)):
            out[key] = np.where(live, value, out[key])
        out["verdict"] = np.where(live, verdict_index(*flags), out["verdict"])
        out["look"] = np.where(live, k, out["look"])
        out["n_used"] = np.where(live, n_k, out["n_used"])
        out["stopped"] |= live & (flags[0] | flags[1] | flags[2] | (k == last))
    return out


def sequential_decision(differences_so_far, design):
    """(stop?, verdict, interval) for one head after the per-seed differences seen so far (head −
    reference, in seed order). Every look reached is replayed in order, so the decision is the one
    the procedure took at its first stopping look; seeds beyond the last look reached wait for the
    next one. verdict: one of equivalence.VERDICTS; interval: the repeated interval that supports it
    (the 1 − α one for superior / inferior, else the 1 − 2α one, TOST's)."""
    d = np.asarray(differences_so_far, dtype=np.float64).ravel()
    if d.size < design.looks[0]:
        return Decision(False, "undecided", Interval(math.nan, math.nan, 1 - 2 * design.alpha, 0, int(d.size)))
    r = {k: v[0] for k, v in walk(d[None, :], design).items()}
    verdict = VERDICTS[int(r["verdict"])]
    look, n = int(r["look"]) + 1, int(r["n_used"])
    difference = Interval(float(r["diff_low"]), float(r["diff_high"]), 1 - design.alpha, look, n)
    interval = difference if verdict in ("superior", "inferior") else \
        Interval(float(r["eq_low"]), float(r["eq_high"]), 1 - 2 * design.alpha, look, n)
    return Decision(bool(r["stopped"]), verdict, interval, difference)
