"""Selective prediction of one run, from its per-example records.

The curves and AURC are `evaluation.selective.risk_coverage` (definitions and references there). The
confidences: the probability of the predicted class (records' max_prob) for every head and, for the
sparse heads, also the support (`selective.support_confidence`: 1/support size, ties broken by the max
probability).

eval.py stores `run_summary` in its JSON; the comparison report recomputes the same numbers from the
per-example records of a head's seeds (comparison/report/selective_section.py), and draws its plot from the
very values its table shows.
"""
import numpy as np

from models.registry import is_sparse

from .selective import risk_at_coverage, risk_coverage, support_confidence

COVERAGES = (0.5, 0.8, 0.9, 0.95, 1.0)  # the table's risk-at-coverage columns


def confidences(records, head_name):
    """{name: (N,) float64 confidence} for this head: max_prob always, support for sparse heads."""
    max_prob = np.asarray(records["max_prob"], dtype=np.float64)
    out = {"max_prob": max_prob}
    if is_sparse(head_name):
        out["support"] = support_confidence(np.asarray(records["support_size"]), max_prob)
    return out


def correct_of(records):
    return np.asarray(records["pred"]) == np.asarray(records["label"])


def run_summary(records, head_name):
    """JSON-ready selective-prediction results of one evaluation:
    {confidence: {"aurc", "optimal_aurc", "e_aurc", "risk_full", "risk_at_coverage": {"0.9": risk}}}."""
    correct = correct_of(records)
    if correct.size == 0:
        return {}
    out = {}
    for name, conf in confidences(records, head_name).items():
        curve = risk_coverage(conf, correct)
        out[name] = {"aurc": curve["aurc"], "optimal_aurc": curve["optimal_aurc"], "e_aurc": curve["e_aurc"],
                     "risk_full": curve["risk_full"],
                     "risk_at_coverage": {str(c): r for c, r in risk_at_coverage(curve, COVERAGES).items()}}
    return out
