"""Equivalence, non-inferiority and superiority verdicts on seed-paired differences, against a margin δ.

A test of "no difference" that fails to reject says only that the seeds at hand cannot tell; it is no
evidence that two heads are equally good. With a margin δ (the largest difference that does not
matter, per metric: `margins.METRIC_TABLE`, or `--margin METRIC=δ` through `margins.parse_margins`), the
per-seed differences d_s = metric(head, seed s) − metric(reference, seed s) of S seeds (mean d̄,
s.d. s, se = s / √S, ν = S − 1, normal d_s assumed as for the t-interval) support four claims, each
a test at the comparison's level α (5%: 1 − the across-trainings level):
  - superior / inferior: the two-sided paired t-test of d = 0 (Student 1908), i.e. the 1 − α
    t-interval excludes 0 on the better / worse side ("better" from the metric's higher_is_better);
  - equivalent within ±δ: TOST, the two one-sided tests of H0: d ≤ −δ and H0: d ≥ +δ, each at α
    (Schuirmann 1987, J. Pharmacokin. Biopharm. 15:657); p = max of the two one-sided p-values, and
    it rejects iff the 1 − 2α t-interval lies inside (−δ, +δ) (Westlake 1981; Berger & Hsu 1996,
    Stat. Sci. 11:283; Lakens 2017, Soc. Psychol. Personal. Sci. 8:355);
  - non-inferior: the one of those one-sided tests that guards the worse side (H0: d ≤ −δ when higher
    is better, H0: d ≥ +δ when lower is) at α, i.e. the 1 − 2α interval's worse end lies inside the
    margin (ICH E9, 1998; Wellek, "Testing Statistical Hypotheses of Equivalence and Noninferiority",
    2010, ch. 2).
The verdict names the strongest claim that holds, in the order superior, inferior, equivalent,
non-inferior, undecided; every claim that holds is flagged (superior-and-equivalent: better, but by
less than the margin). Per head, all of them at once make a false claim with probability ≤ α: each
false claim's rejection region lies inside that of the one-sided test of the margin on the side
where the truth is (a false "superior" or "equivalent" when d ≤ −δ needs the interval's lower end
above −δ, and so on).

Several heads against one reference: Holm's step-down (Holm 1979, Scand. J. Stat. 6:65) over the heads,
separately for each metric and each kind of claim (difference, equivalence, non-inferiority), so the
chance of any false claim of that kind among the heads is at most α (family-wise; the adjusted
p-values decide, the intervals shown are the per-comparison ones). `multiplicity="none"` gives the
per-comparison verdicts (each head's own error rate ≤ α). Heads without a test are not in the family
(its size K counts the others).

No test (every p nan, no interval, verdict "undecided", the reason in "untested"): fewer than 2
seeds; a non-finite difference (a diverged run's NaN loss or ECE: nan stays nan, it is no evidence
either way); or differences all equal (s.d. 0). The t-tests assume normal differences with σ > 0,
under which s.d. 0 has probability 0: equal differences come from identical runs or a coarse metric
(top-1 on a few hundred images moves in steps of one image), and d̄ / 0 would claim anything with
p = 0. Such a pair gets no verdict, in the fixed design and at every look of the sequential one
(comparison/analysis/sequential.py). A pair where a head learned nothing is not compared at all
(comparison/analysis/sanity.py; comparison/report/document.py leaves it out of the family).

What the numbers include: seed-to-seed training noise and the validation sample as each seed's
metric carries it (the across-trainings unit), nothing about other datasets or budgets.
Pure functions of arrays (numpy, float64), plus the one-line parser of `--margin`.
"""
import math

import numpy as np

from .margins import METRIC_TABLE, margin_units
from .statistics import format_p_value, signed_points, student_t_isf, student_t_sf

ALPHA = 0.05  # the comparison's level when none is given: the across-trainings 95% t-interval's
VERDICTS = ("superior", "inferior", "equivalent", "non-inferior", "undecided")
MULTIPLICITIES = ("holm", "none")
MULTIPLICITY = "holm"
_MINUS = "\u2212"


# ---- the claims ----------------------------------------------------------------------------------------
def claims_from_bounds(diff_low, diff_high, eq_low, eq_high, margin, higher_is_better):
    """(superior, inferior, equivalent, non_inferior) boolean arrays from interval ends (numpy, any
    shape): diff_* the two-sided 1 − α interval of d, eq_* the 1 − 2α one (or, for a sequential look,
    its repeated intervals). The claims read off intervals, as comparison/analysis/sequential.py does at each
    look; equivalence_verdict reads the same tests by their p-values (Holm adjusts p-values), and
    tests/test_sequential.py checks that a one-look design and equivalence_verdict agree."""
    diff_low, diff_high, eq_low, eq_high = (np.asarray(v, dtype=np.float64) for v in (diff_low, diff_high,
                                                                                      eq_low, eq_high))
    above, below = diff_low > 0, diff_high < 0
    superior, inferior = (above, below) if higher_is_better else (below, above)
    equivalent = (eq_low > -margin) & (eq_high < margin)
    non_inferior = eq_low > -margin if higher_is_better else eq_high < margin
    return superior, inferior, equivalent, non_inferior


def verdict_index(superior, inferior, equivalent, non_inferior):
    """Index into VERDICTS of the strongest claim that holds (arrays of flags -> integer array)."""
    return np.select([superior, inferior, equivalent, non_inferior], [0, 1, 2, 3], default=4)


def _p_above(shifted, se, df):
    """P[T_df ≥ shifted / se], the one-sided p of H0 'mean ≤ shift' for shifted = d̄ − shift (that of
    H0 'mean ≥ shift' is _p_above(−shifted, ...)); se > 0 (equivalence_verdict tests nothing else)."""
    return student_t_sf(shifted / se, df)


UNTESTED = {"one seed": ("1 seed", "1 seed: the seed-to-seed variation is not measured"),
            "not finite": ("not finite", "a per-seed difference is not a finite number (a diverged run?): no test"),
            "no spread": ("s.d. 0", "s.d. 0: with no spread a t-test has no scale, so no claim")}
"""Why a pair gets no test (equivalence_verdict's "untested"): (a table cell's words, the sentence's)."""


def untested_reason(differences):
    """None when the paired t-tests apply to `differences`, else the UNTESTED key saying why not."""
    d = np.asarray(differences, dtype=np.float64).ravel()
    if d.size < 2:
        return "one seed"
    if not np.all(np.isfinite(d)):
        return "not finite"
    return "no spread" if np.all(d == d[0]) else None


def equivalence_verdict(differences, margin, alpha=ALPHA, higher_is_better=True):
    """The four claims on paired differences d_s (head − reference), at level α, with margin δ > 0 in
    the differences' units (module docstring). Returns {"n", "mean", "sd", "margin", "alpha",
    "higher_is_better", "interval" (low, high: the 1 − 2α t-interval, TOST's), "interval_level",
    "difference_interval" (the 1 − α one), "difference_level", "p_lower" (H0: d ≤ −δ), "p_upper"
    (H0: d ≥ +δ), "p_equivalence" (their max), "p_non_inferiority", "p_superiority", "p_inferiority"
    (one-sided, of d = 0), "p_difference" (two-sided), "superior", "inferior", "equivalent",
    "non_inferior", "verdict", "untested" (None, or why there is no test: an UNTESTED key)}; with no
    test (fewer than 2 differences, a non-finite one, or all equal) every p and the intervals are nan,
    no claim holds and the verdict is "undecided"."""
    if not (math.isfinite(margin) and margin > 0) or not 0 < alpha < 0.5:
        raise ValueError(f"need a positive finite margin and 0 < alpha < 0.5, got margin={margin}, alpha={alpha}")
    d = np.asarray(differences, dtype=np.float64).ravel()
    n = int(d.size)
    mean = float(d.mean()) if n else float("nan")
    untested = untested_reason(d)
    out = {"n": n, "mean": mean, "margin": float(margin), "alpha": alpha, "higher_is_better": higher_is_better,
           "interval_level": 1 - 2 * alpha, "difference_level": 1 - alpha, "untested": untested}
    if untested:
        nan = float("nan")
        return {**out, "sd": 0.0 if untested == "no spread" else nan, "interval": (nan, nan),
                "difference_interval": (nan, nan),
                **{k: nan for k in ("p_lower", "p_upper", "p_equivalence", "p_non_inferiority", "p_superiority",
                                    "p_inferiority", "p_difference")},
                "superior": False, "inferior": False, "equivalent": False, "non_inferior": False,
                "verdict": "undecided"}
    sd = float(d.std(ddof=1))
    se, df = sd / math.sqrt(n), n - 1
    p_lower, p_upper = _p_above(mean + margin, se, df), _p_above(margin - mean, se, df)
    p_up, p_down = _p_above(mean, se, df), _p_above(-mean, se, df)
    eq_half, diff_half = student_t_isf(alpha, df) * se, student_t_isf(alpha / 2, df) * se
    out.update(sd=sd, interval=(mean - eq_half, mean + eq_half), difference_interval=(mean - diff_half,
                                                                                     mean + diff_half),
               p_lower=p_lower, p_upper=p_upper, p_equivalence=max(p_lower, p_upper),
               p_non_inferiority=p_lower if higher_is_better else p_upper,
               p_superiority=p_up if higher_is_better else p_down, p_inferiority=p_down if higher_is_better else p_up,
               p_difference=min(1.0, 2 * min(p_up, p_down)))
    return {**out, **_claims_from_p(out, out, alpha)}


def _claims_from_p(result, p, alpha):
    """The four flags and the verdict from p-values (`p`: a mapping with p_difference, p_equivalence and
    p_non_inferiority, plain or adjusted): p < α rejects, as the intervals' strict inside does."""
    better = result["mean"] > 0 if result["higher_is_better"] else result["mean"] < 0
    significant = bool(p["p_difference"] < alpha)
    flags = {"superior": significant and better, "inferior": significant and not better,
             "equivalent": bool(p["p_equivalence"] < alpha), "non_inferior": bool(p["p_non_inferiority"] < alpha)}
    return {**flags, "verdict": VERDICTS[int(verdict_index(*flags.values()))]}


# ---- several heads against one reference -----------------------------------------------------------------
def holm_adjust(p_values):
    """Holm's step-down adjusted p-values (Holm 1979), in the given order: with the p sorted
    ascending, p̃_(i) = max_{j ≤ i} min(1, (K − j + 1) p_(j)); nan entries are left out of the family
    (K counts the others) and stay nan."""
    p = np.asarray(p_values, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    tested = np.flatnonzero(~np.isnan(p))
    order = tested[np.argsort(p[tested], kind="stable")]
    k = order.size
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (k - rank) * p[index]))
        out[index] = running
    return out


FAMILY_P = ("p_difference", "p_equivalence", "p_non_inferiority")  # one Holm family per kind of claim


def family_verdicts(results, multiplicity=MULTIPLICITY):
    """equivalence_verdict results of several heads against one reference (same metric, margin and α)
    -> the same results with "multiplicity", "family_size", "<p>_adjusted" for each FAMILY_P, the
    per-comparison flags and verdict kept as "unadjusted_verdict", and the flags and verdict from the
    adjusted p-values (per-comparison ones when multiplicity is "none")."""
    if multiplicity not in MULTIPLICITIES:
        raise ValueError(f"multiplicity must be one of {MULTIPLICITIES}, got {multiplicity!r}")
    results = list(results)
    tested = [r for r in results if not math.isnan(r["p_difference"])]
    adjusted = {key: holm_adjust([r[key] for r in results]) if multiplicity == "holm"
                else np.array([r[key] for r in results]) for key in FAMILY_P}
    out = []
    for i, r in enumerate(results):
        p = {key: float(adjusted[key][i]) for key in FAMILY_P}
        entry = {**r, "multiplicity": multiplicity, "family_size": len(tested),
                 "unadjusted_verdict": r["verdict"], **{f"{key}_adjusted": p[key] for key in FAMILY_P}}
        if not math.isnan(r["p_difference"]):
            entry.update(_claims_from_p(r, p, r["alpha"]))
        out.append(entry)
    return out


# ---- words ---------------------------------------------------------------------------------------------
def format_difference(metric, x):
    """A difference as the report writes it: signed points for top-1 / ECE, own units for the loss."""
    if METRIC_TABLE[metric].in_points:
        return signed_points(x, METRIC_TABLE[metric].digits)
    text = f"{abs(x):.{METRIC_TABLE[metric].digits}f}"
    return text if math.isnan(x) or float(text) == 0 else ("+" if x > 0 else _MINUS) + text


def with_unit(metric, text):
    """'+0.4 pt' for top-1 / ECE, the text alone for the loss."""
    unit = margin_units(metric)
    return f"{text} {unit}" if unit else text


def margin_text(metric, margin):
    """'±0.5 pt' from a margin in the differences' units (0.005 for top-1)."""
    shown = margin * 100 if METRIC_TABLE[metric].in_points else margin
    unit = margin_units(metric)
    return f"±{shown:g}{' ' + unit if unit else ''}"


def interval_text(metric, interval, level):
    """'90% CI [−0.3, +0.4]'."""
    low, high = interval
    return f"{100 * level:g}% CI [{format_difference(metric, low)}, {format_difference(metric, high)}]"


def describe_equivalence(result, name_a, name_b, metric):
    """One sentence for an equivalence_verdict (or family_verdicts) entry, e.g. "sparsemax top-1 is
    within ±0.5 pt of softmax (90% CI [−0.3, +0.4] over 8 seeds; TOST p = 0.01)"."""
    label, n = METRIC_TABLE[metric].label, result["n"]
    margin, verdict = margin_text(metric, result["margin"]), result["verdict"]
    untested = result.get("untested", "one seed" if n < 2 else None)
    if untested:
        every = (f"every seed's difference is {with_unit(metric, format_difference(metric, result['mean']))}, "
                 if untested == "no spread" else "")
        return f"{name_a} vs {name_b} {label}: undecided at the {margin} margin ({every}{UNTESTED[untested][1]})"
    seeds = f"over {n} seeds"
    eq = interval_text(metric, result["interval"], result["interval_level"])
    diff = interval_text(metric, result["difference_interval"], result["difference_level"])
    tost = f"TOST {format_p_value(result['p_equivalence'])}"
    # what the per-comparison intervals show (the words say that; _holm_note says what Holm changed)
    (eq_low, eq_high), (diff_low, diff_high) = result["interval"], result["difference_interval"]
    inside = -result["margin"] < eq_low and eq_high < result["margin"]
    if verdict in ("superior", "inferior"):
        word = "better" if verdict == "superior" else "worse"
        mean = with_unit(metric, format_difference(metric, result["mean"]))
        text = f"{name_a} {label} is {word} than {name_b}: {mean} ({diff} {seeds})"
        if result["equivalent"]:
            text += f", by less than the {margin} margin ({eq})"
        elif verdict == "inferior" and result["non_inferior"]:
            text += f", but by less than the margin: non-inferior at {margin} ({eq})"
    elif verdict == "equivalent":
        text = f"{name_a} {label} is within {margin} of {name_b} ({eq} {seeds}; {tost})"
    elif verdict == "non-inferior":
        shown = "the interval lies within the margin too" if inside else "equivalence not shown"
        text = (f"{name_a} {label} is non-inferior to {name_b} at the {margin} margin: not worse by more than "
                f"{margin[1:]} ({eq} {seeds}); {shown} ({tost})")
    else:
        reach = "lies within the margin" if inside else "reaches past the margin"
        zero = (f"its {diff} excludes 0" if diff_low > 0 or diff_high < 0
                else f"not distinguishable from 0 at {100 * result['alpha']:g}%")
        text = (f"{name_a} vs {name_b} {label}: undecided at the {margin} margin ({eq} {seeds} {reach}; {tost}), "
                f"and {zero}")
    return text + _holm_note(result)


_FAMILY_TESTS = (("difference", "p_difference"), ("TOST", "p_equivalence"), ("non-inferiority", "p_non_inferiority"))


def _holm_note(result):
    """What Holm's correction did to the verdict, when it applies: each test that passes per comparison
    but not once corrected, with its p before and after."""
    if result.get("multiplicity") != "holm" or result.get("family_size", 1) < 2:
        return ""
    k, alpha, before = result["family_size"], result["alpha"], result["unadjusted_verdict"]
    lost = [f"its {test} p from {result[key]:.2g} to {result[key + '_adjusted']:.2g}" for test, key in _FAMILY_TESTS
            if result[key] < alpha <= result[key + "_adjusted"]]
    if before == result["verdict"] or not lost:
        return f" (Holm across {k} heads)"
    return (f" (Holm across {k} heads: per comparison it would read {before}, but the correction raises "
            f"{' and '.join(lost)}, not below {100 * alpha:g}%)")
