"""Small calibration sets warn (the finite-sample guarantee is loose there); the prediction-set
masks predict.py uses are the sets eval.py measures; the training bar prints once in a log file."""
import io
import math
import sys

import numpy as np
import pytest
import torch

from evaluation import conformal as C


def test_coverage_spread_matches_a_simulation():
    """Coverage of one calibration draw, over many draws, with continuous scores: its std is the Beta's."""
    rng = np.random.default_rng(0)
    n, eps, draws = 16, 0.1, 20000
    k = math.ceil((n + 1) * (1 - eps))
    # uniform scores: the coverage of threshold = k-th smallest of n is that order statistic itself
    coverage = np.sort(rng.random((draws, n)), axis=1)[:, k - 1]
    assert C.coverage_spread(n, eps) == pytest.approx(coverage.std(), rel=0.03)
    assert coverage.mean() >= 1 - eps and coverage.mean() < 1 - eps + 1 / (n + 1)
    assert C.coverage_spread(16, 0.05) is None  # ⌈17 · 0.95⌉ = 17 > 16: the threshold is +inf


def test_sixteen_calibration_images_warn_and_thousands_do_not():
    line = C.calibration_size_warning(16, (0.1, 0.05))
    assert line.startswith("warning: prediction sets calibrated on only 16 samples") and "\n" not in line
    assert "±5.5 points" in line and "ε=0.05: needs n ≥ 19" in line
    n_enough = int(line.rsplit("n ≥ ", 1)[1].split()[0])
    assert C.coverage_spread(n_enough, 0.1) <= C.COVERAGE_SD_LIMIT < C.coverage_spread(n_enough - 1, 0.1)
    assert C.calibration_size_warning(2500, (0.1, 0.05)) is None  # the quick start's 2500 calibration images
    assert C.calibration_size_warning(n_enough, (0.1, 0.05)) is None


def _brute_force_sets(method, logits, probs, q, alpha, u):
    """Class k is in the set iff its own non-conformity score s(x, k) ≤ q (every class scored as a label)."""
    n, k = logits.shape
    inside = torch.zeros(n, k, dtype=torch.bool)
    for c in range(k):
        labels = torch.full((n,), c, dtype=torch.long)
        if method == "support":
            s = C.support_scores(logits, labels, alpha)
        elif method == "lac":
            s = C.lac_scores(probs, labels)
        else:
            s = C.aps_scores(probs, labels, u)
        inside[:, c] = s <= q
    return inside


@pytest.mark.parametrize("head_name", ["sparsemax", "entmax15", "softmax"])
def test_set_masks_are_the_sets_eval_measures(head_name):
    from models.heads import OutputHead

    torch.manual_seed(0)
    head = OutputHead(head_name)
    logits = torch.randn(300, 7) * 2
    logits[:5, :3] = 1.0  # ties
    labels = torch.randint(0, 7, (300,))
    data = {"logits": logits, "probs": head(logits).float(), "labels": labels}
    alpha = float(head.alpha) if head_name != "softmax" else None
    for method in C.methods_for_head(head_name):
        u = C.aps_uniforms(300, stream=2, seed=3) if method == "aps" else None
        scores, sizer = C._scores_and_sizer(method, logits, data["probs"], labels, alpha, stream=2, aps_seed=3)
        for q in (C.conformal_quantile(scores, 0.1), C.conformal_quantile(scores, 0.5), 0.0, math.inf):
            mask = C.set_mask(method, q, logits=logits, probs=data["probs"], alpha=alpha, u=u)
            assert torch.equal(mask.sum(dim=1), sizer(q)), (method, q)
            if math.isfinite(q):
                assert torch.equal(mask, _brute_force_sets(method, logits, data["probs"], q, alpha, u)), (method, q)
            else:
                assert mask.all()


def test_the_training_bar_is_off_when_stdout_is_not_a_terminal(monkeypatch):
    from training.logging import console, progress_bar

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    log = io.StringIO()
    monkeypatch.setattr(sys, "stdout", log)
    bar = progress_bar(10, enabled=True)
    for _ in range(10):
        bar.update(1)
    console("epoch 1: done")
    console("summary")
    bar.close()
    assert log.getvalue() == "epoch 1: done\nsummary\n"  # no bar, so no copies of it
    monkeypatch.setattr(sys, "stdout", Terminal())
    assert not progress_bar(10, enabled=True).disable and progress_bar(10, enabled=False).disable
