"""Selective prediction: risk–coverage curves and the area under them (AURC), per head.

A selective classifier answers on the examples it is most confident about and abstains on the rest
(El-Yaniv & Wiener, JMLR 2010; Geifman & El-Yaniv, NeurIPS 2017). Sorting the n examples by decreasing
confidence, the selective risk at coverage k/n is the error rate (0/1 loss) of the k most confident.

Definitions used here (Geifman, Uziel & El-Yaniv, "Bias-Reduced Uncertainty Estimation for Deep Neural
Classifiers", ICLR 2019):
  - AURC = (1/n) Σ_{k=1..n} risk(k/n), the mean selective risk over the n coverages k/n;
  - optimal AURC = the AURC of an oracle confidence that ranks every correct example above every error
    (risk(k/n) = max(0, k − n_correct) / k), the floor given the head's error rate;
  - E-AURC = AURC − optimal AURC (excess over the oracle; comparable across heads of different accuracy).
Ties in confidence: examples with equal confidence cannot be told apart, so a tie group is accepted in
an order that carries no information. risk(k/n) is the expectation over a uniformly random order within
each tie group; at the k-th position, j items into a tie group of size g holding e errors, the expected
error count is (errors before the group) + j·e/g. It is exact (linearity of expectation: k is fixed),
equals the plain sorted cumulative risk when there are no ties, and does not depend on how a sort
happens to order equal values. The curve points at each distinct threshold t (accept confidence ≥ t,
a whole tie group at once) are returned too: they are the operating points one can actually choose.

Confidences: the max probability; for sparse heads also the support size (smaller = more confident)
with ties broken by the max probability, as one lexicographic score (`support_confidence`).
Pure functions of arrays (numpy, float64): no I/O, no model.
"""
import math

import numpy as np


def lexicographic_score(*keys):
    """A float64 score ordering examples by keys[0], then keys[1], ... (larger = more confident).

    The value is the dense rank (0, 1, ...) of the key tuple: equal tuples share a score, so only
    exact ties on every key remain ties.
    """
    arrays = [np.asarray(k, dtype=np.float64) for k in keys]
    if not arrays or any(a.shape != arrays[0].shape or a.ndim != 1 for a in arrays):
        raise ValueError("keys must be 1-D arrays of the same length")
    n = arrays[0].size
    if n == 0:
        return np.zeros(0)
    order = np.lexsort(arrays[::-1])  # lexsort sorts by its LAST key first
    changed = np.zeros(n, dtype=bool)
    for a in arrays:
        s = a[order]
        changed[1:] |= s[1:] != s[:-1]
    score = np.empty(n)
    score[order] = np.cumsum(changed)
    return score


def support_confidence(support_size, max_prob):
    """Confidence of a sparse head from its support: 1/support size (smaller support = more confident),
    ties broken by the max probability. Returns a lexicographic score (only its order matters)."""
    return lexicographic_score(-np.asarray(support_size, dtype=np.float64), max_prob)


def risk_coverage(confidence, correct):
    """Risk–coverage curve and AURC of one head.

    confidence: (n,) higher = more confident; correct: (n,) bool (argmax == label).
    Returns {
      "coverage": (n,) k/n, "risk": (n,) expected error rate of the k most confident (ties: see module),
      "aurc", "optimal_aurc", "e_aurc", "risk_full" (error rate at full coverage), "n",
      "thresholds": (m,) distinct confidences, decreasing, "threshold_coverage": (m,) fraction with
      confidence ≥ threshold, "threshold_risk": (m,) error rate among them }.
    """
    confidence = np.asarray(confidence, dtype=np.float64)
    errors = ~np.asarray(correct, dtype=bool)
    if confidence.ndim != 1 or confidence.shape != errors.shape:
        raise ValueError(f"confidence and correct must be 1-D of the same length, got {confidence.shape} "
                         f"and {errors.shape}")
    if np.isnan(confidence).any():
        raise ValueError("confidence contains NaN")
    n = confidence.size
    if n == 0:
        raise ValueError("risk_coverage needs at least one example")
    order = np.argsort(-confidence, kind="stable")
    conf_sorted, err_sorted = confidence[order], errors[order].astype(np.float64)
    # tie groups of the sorted confidences: [start, end)
    new_group = np.r_[True, conf_sorted[1:] != conf_sorted[:-1]]
    starts = np.flatnonzero(new_group)
    ends = np.r_[starts[1:], n]
    cum_err = np.r_[0.0, np.cumsum(err_sorted)]
    group_err = cum_err[ends] - cum_err[starts]
    group_of = np.cumsum(new_group) - 1
    k = np.arange(1, n + 1, dtype=np.float64)
    into_group = k - starts[group_of]
    expected_err = cum_err[starts][group_of] + into_group * group_err[group_of] / (ends - starts)[group_of]
    risk = expected_err / k
    n_correct = n - int(errors.sum())
    optimal = np.maximum(0.0, k - n_correct) / k
    aurc, optimal_aurc = float(risk.mean()), float(optimal.mean())
    return {"coverage": k / n, "risk": risk, "aurc": aurc, "optimal_aurc": optimal_aurc,
            "e_aurc": aurc - optimal_aurc, "risk_full": float(errors.mean()), "n": n,
            "thresholds": conf_sorted[starts], "threshold_coverage": ends / n,
            "threshold_risk": cum_err[ends] / ends}


def risk_at_coverage(curve, coverages=(0.5, 0.8, 0.9, 0.95, 1.0)):
    """Selective risk at given coverages, from a risk_coverage result: the risk of the ceil(c·n) most
    confident examples (at least one). Returns {coverage: risk}."""
    n = curve["n"]
    out = {}
    for c in coverages:
        if not 0 < c <= 1:
            raise ValueError(f"coverage must be in (0, 1], got {c}")
        k = min(n, max(1, math.ceil(c * n - 1e-9)))
        out[c] = float(curve["risk"][k - 1])
    return out
