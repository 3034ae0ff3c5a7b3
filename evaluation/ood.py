"""Out-of-distribution detection from a head's output distribution: AUROC and FPR at 95% TPR.

Convention: in-distribution (ID) examples are the positives, and every score is oriented so that
HIGHER means MORE in-distribution. Scores (Hendrycks & Gimpel, "A Baseline for Detecting Misclassified
and Out-of-Distribution Examples in Neural Networks", ICLR 2017, for the first two):
  - "max_prob": the maximum probability;
  - "neg_entropy": minus the Shannon entropy −Σ p log p (natural log, 0·log 0 = 0, so the entropy of a
    sparse distribution is that of its support);
  - "neg_support" (sparse heads only): minus the support size, i.e. a smaller support is more ID (the
    hope for sparsemax/entmax: a diffuse support on unfamiliar inputs). Integer-valued: many ties.

AUROC = P(score_ID > score_OOD) + ½ P(score_ID = score_OOD), the Mann–Whitney U statistic divided by
n_ID·n_OOD (Mann & Whitney 1947; Hanley & McNeil, Radiology 1982), computed from mid-ranks so ties
count one half, in O(n log n).
FPR@95%TPR (as in Liang, Li & Srikant, "Enhancing the Reliability of Out-of-Distribution Image Detection
in Neural Networks" (ODIN), ICLR 2018): the fraction of OOD examples accepted as ID by the highest
threshold t that still accepts (score ≥ t) at least 95% of the ID examples; t is the ⌈0.95·n_ID⌉-th
largest ID score, so ties at t are accepted on both sides.
Pure functions (numpy float64; entropy in torch with float64 sums): no I/O, no model.
"""
import math

import numpy as np
import torch

from .ood_table import PROBABILITY_SCORES as SCORES  # the declared order (evaluation/ood_table.py)


def _scores_1d(x, name):
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {x.shape}")
    if np.isnan(x).any():
        raise ValueError(f"{name} contains NaN")
    return x


def midranks(values):
    """1-based ranks of `values`, tied values getting the mean of their ranks."""
    values = np.asarray(values, dtype=np.float64)
    n = values.size
    order = np.argsort(values, kind="stable")
    s = values[order]
    new_group = np.r_[True, s[1:] != s[:-1]]
    starts = np.flatnonzero(new_group)
    ends = np.r_[starts[1:], n]
    group_of = np.cumsum(new_group) - 1
    ranks = np.empty(n)
    ranks[order] = ((starts + 1 + ends) / 2.0)[group_of]  # mean of ranks start+1 .. end
    return ranks


def auroc(score_in, score_out):
    """Area under the ROC curve for ID (positive) vs OOD scores, ties counted one half."""
    score_in, score_out = _scores_1d(score_in, "score_in"), _scores_1d(score_out, "score_out")
    n_in, n_out = score_in.size, score_out.size
    ranks = midranks(np.concatenate([score_in, score_out]))
    u = ranks[:n_in].sum() - n_in * (n_in + 1) / 2.0
    return float(u / (n_in * n_out))


def fpr_at_tpr(score_in, score_out, tpr=0.95):
    """Fraction of OOD scores ≥ the highest threshold that keeps at least `tpr` of the ID scores."""
    score_in, score_out = _scores_1d(score_in, "score_in"), _scores_1d(score_out, "score_out")
    if not 0 < tpr <= 1:
        raise ValueError(f"tpr must be in (0, 1], got {tpr}")
    k = max(1, math.ceil(tpr * score_in.size - 1e-9))  # ID examples that must be accepted
    threshold = np.sort(score_in)[score_in.size - k]
    return float(np.mean(score_out >= threshold))


def entropy(probs):
    """Shannon entropy (nats) of each row of `probs` (..., K), float64; 0·log 0 = 0 (torch.special.entr)."""
    probs = torch.as_tensor(probs)
    return torch.special.entr(probs).sum(dim=-1, dtype=torch.float64)


def ood_scores(probs, sparse=False):
    """The ID-ness scores of each row of `probs` (N, K) -> {name: float64 numpy (N,)}.

    "neg_support" only for sparse heads (`sparse=True`): for a softmax head a zero is float underflow,
    not a decision of the head. Compute per batch for large N·K (no (N, K) float64 copy is made).
    """
    probs = torch.as_tensor(probs)
    if probs.dtype in (torch.float16, torch.bfloat16):  # entr has no CPU half kernels; float32 is exact enough
        probs = probs.float()
    out = {"max_prob": probs.max(dim=-1).values.double(), "neg_entropy": -entropy(probs)}
    if sparse:
        out["neg_support"] = -(probs > 0).sum(dim=-1).double()
    return {name: score.cpu().numpy() for name, score in out.items()}


def ood_detection(scores_in, scores_out, tpr=0.95):
    """AUROC and FPR@tpr for every score present in both mappings (e.g. from ood_scores).

    Returns {name: {"auroc", "fpr_at_tpr", "tpr", "n_in", "n_out"}} in SCORES order, then any other names.
    """
    names = [s for s in SCORES if s in scores_in and s in scores_out]
    names += [s for s in scores_in if s in scores_out and s not in names]
    return {name: {"auroc": auroc(scores_in[name], scores_out[name]),
                   "fpr_at_tpr": fpr_at_tpr(scores_in[name], scores_out[name], tpr), "tpr": tpr,
                   "n_in": int(np.asarray(scores_in[name]).size), "n_out": int(np.asarray(scores_out[name]).size)}
            for name in names}
