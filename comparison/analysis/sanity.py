"""Sanity checks a head comparison states before its verdicts: did the head learn anything, is a
coverage below 1 − ε more than sampling spread, did the training budget end before convergence.

Pure functions of numbers (no I/O); comparison/report/document.py turns them into report lines.

Chance. The best constant guess is right on the most frequent validation class, a fraction c of the
images (1/K on balanced classes). A head whose top-1, pooled over its S·n (seed, image) rows, is not
above c by more than CHANCE_Z binomial standard errors √(c(1−c)/(S·n)) is "within noise of
chance": the difference to another head then says nothing about the heads.

Coverage band. With n calibration scores and the conformal quantile at rank k = ⌈(n+1)(1−ε)⌉, the
coverage given the calibration set is Beta(k, n + 1 − k)-distributed (Vovk, ACML 2012, Prop. 2a;
Angelopoulos & Bates, "A Gentle Introduction to Conformal Prediction", 2021, sec. 3.2), with mean
k/(n+1) ≥ 1 − ε. The coverage measured on n_test further images is then Beta-binomial(n_test, k,
n + 1 − k). Its central BAND_LEVEL interval is the range a correct split-conformal set lands in: a
coverage below 1 − ε inside it is sampling spread, one below the band's lower end is a real
failure (calibration and test data not exchangeable, a wrong quantile). Ties in the scores only
raise coverage, so the lower end stays valid.

Budget. Validation top-1 per epoch (each run's curve, averaged over seeds): when the gain over the
last RISING_WINDOW of the epochs (at least the last one) exceeds RISING_Z binomial standard errors
of a difference of two accuracies at that level, √(2 p (1−p) / (S·n)), the head was still learning
when the budget ran out, and the comparison is about that budget, not about where the heads end up.
"""
import math

import numpy as np
import torch

CHANCE_Z = 3.0  # one-sided, ~0.1%: "not distinguishable from guessing"
BAND_LEVEL = 0.99  # two-sided; 99% so that a dozen (head, method, ε) checks rarely flag by chance
RISING_WINDOW = 0.25  # fraction of the epochs the last gain is measured over
RISING_Z = 2.0


def chance_level(labels):
    """Accuracy of the best constant guess: the most frequent label's share."""
    labels = np.asarray(labels).ravel()
    if labels.size == 0:
        return float("nan")
    return float(np.bincount(labels - labels.min()).max() / labels.size)


def nothing_learned(top1, chance, n_rows, z=CHANCE_Z):
    """True when `top1` (pooled over n_rows (seed, image) rows) is within z binomial standard errors
    above `chance` (or below it)."""
    if n_rows <= 0 or not math.isfinite(top1) or not math.isfinite(chance):
        return False
    return top1 <= chance + z * math.sqrt(chance * (1 - chance) / n_rows)


def beta_binomial_pmf(n, a, b):
    """P[X = x], x = 0..n, for X ~ Beta-binomial(n, a, b), in float64 (log space: any n)."""
    x = torch.arange(n + 1, dtype=torch.float64)
    log_choose = math.lgamma(n + 1) - torch.lgamma(x + 1) - torch.lgamma(n - x + 1)
    log_beta = torch.lgamma(x + a) + torch.lgamma(n - x + b) - math.lgamma(n + a + b)
    log_pmf = log_choose + log_beta - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
    return torch.softmax(log_pmf, dim=0).numpy()  # normalised: sums to 1 up to rounding anyway


def coverage_band(n_calib, n_test, eps, level=BAND_LEVEL):
    """(low, high, mean): the central `level` range of split-conformal empirical coverage on n_test
    images when calibrated on n_calib at level 1 − ε (None when the quantile is +inf: every set is
    all classes and coverage is 1)."""
    k = math.ceil((n_calib + 1) * (1.0 - eps) - 1e-9)  # the rank evaluation.conformal uses
    if n_calib < 1 or n_test < 1 or k > n_calib:
        return None
    a, b = float(max(k, 1)), float(n_calib + 1 - max(k, 1))
    cdf = np.cumsum(beta_binomial_pmf(n_test, a, b))
    tail = (1 - level) / 2
    low = int(np.searchsorted(cdf, tail))  # first x with P[X ≤ x] ≥ tail
    high = int(np.searchsorted(cdf, 1 - tail))
    return low / n_test, min(high, n_test) / n_test, a / (a + b)


def coverage_check(coverage, n_calib, n_test, eps, level=BAND_LEVEL):
    """'ok' (at or above 1 − ε), 'within band' (below 1 − ε, inside the band), 'below band', or
    None when no band applies; with the band."""
    band = coverage_band(n_calib, n_test, eps, level)
    if band is None:
        return None, None
    if coverage >= 1 - eps - 1e-12:
        return "ok", band
    return ("within band" if coverage >= band[0] - 1e-12 else "below band"), band


def still_rising(curve, n_rows, window=RISING_WINDOW, z=RISING_Z):
    """(rising, gain, epochs): curve [(epoch, mean top-1 over seeds)] sorted by epoch; the gain from
    the evaluation `window` of the epochs before the last (at least the previous one) to the last,
    and whether it exceeds z standard errors of a difference of two accuracies on n_rows rows.
    (None, None, None) with fewer than two evaluations."""
    if len(curve) < 2 or n_rows <= 0:
        return None, None, None
    last_epoch, last = curve[-1]
    back = max(1, round(window * last_epoch))
    earlier = [(e, v) for e, v in curve[:-1] if e <= last_epoch - back] or [curve[-2]]
    first_epoch, first = earlier[-1]
    level = min(max(last, 1e-6), 1 - 1e-6)
    noise = z * math.sqrt(2 * level * (1 - level) / n_rows)
    gain = last - first
    return bool(gain > noise), gain, (first_epoch, last_epoch)
