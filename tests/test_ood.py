"""OOD detection: AUROC (ties one half) and FPR@95%TPR against brute force; the scores of a head."""
import numpy as np
import pytest
import torch
from entmax import sparsemax

from evaluation import ood


def _brute_force_auroc(score_in, score_out):
    diff = np.asarray(score_in, dtype=np.float64)[:, None] - np.asarray(score_out, dtype=np.float64)[None, :]
    return float(((diff > 0) + 0.5 * (diff == 0)).mean())


def _brute_force_fpr(score_in, score_out, tpr):
    """Lowest FPR over all thresholds 'accept score >= t' whose TPR reaches `tpr`."""
    best = 1.0
    for t in np.unique(np.concatenate([score_in, score_out])):
        if np.mean(score_in >= t) >= tpr:
            best = min(best, float(np.mean(score_out >= t)))
    return best


def test_separable_scores_give_auroc_one_and_no_false_positives():
    score_in, score_out = np.linspace(0.6, 1.0, 50), np.linspace(0.0, 0.5, 70)
    assert ood.auroc(score_in, score_out) == 1.0
    assert ood.fpr_at_tpr(score_in, score_out) == 0.0
    assert ood.auroc(score_out, score_in) == 0.0  # reversed roles: the convention matters
    assert ood.fpr_at_tpr(score_out, score_in) == 1.0


def test_identical_distributions_give_about_one_half():
    rng = np.random.default_rng(0)
    score_in, score_out = rng.normal(size=4000), rng.normal(size=3000)
    assert ood.auroc(score_in, score_out) == pytest.approx(0.5, abs=0.02)
    assert ood.fpr_at_tpr(score_in, score_out) == pytest.approx(0.95, abs=0.02)
    same = np.full(100, 0.3)
    assert ood.auroc(same, same[:40]) == 0.5  # all tied: exactly one half
    assert ood.fpr_at_tpr(same, same[:40]) == 1.0


def test_auroc_and_fpr_equal_brute_force_with_heavy_ties():
    rng = np.random.default_rng(1)
    for trial in range(20):
        n_in, n_out = rng.integers(1, 80, size=2)
        score_in = rng.integers(0, 6, n_in).astype(float)  # integer scores, like -support size
        score_out = rng.integers(-2, 4, n_out).astype(float)
        assert ood.auroc(score_in, score_out) == pytest.approx(_brute_force_auroc(score_in, score_out), abs=1e-12)
        for tpr in (0.95, 0.8, 1.0):
            assert ood.fpr_at_tpr(score_in, score_out, tpr) == _brute_force_fpr(score_in, score_out, tpr)


def test_midranks_average_tied_ranks():
    np.testing.assert_allclose(ood.midranks([3.0, 1.0, 3.0, 2.0, 3.0]), [4.0, 1.0, 4.0, 2.0, 4.0])


def test_entropy_of_sparse_rows_counts_zero_as_zero():
    probs = torch.tensor([[0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.25] * 4])
    np.testing.assert_allclose(ood.entropy(probs).numpy(), [np.log(2), 0.0, np.log(4)], atol=1e-7)
    assert ood.entropy(probs).dtype == torch.float64


def test_scores_of_a_sparse_head_against_float64_references():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 10, generator=gen) * 2
    probs = sparsemax(logits, dim=-1)  # the entmax package: exact zeros
    scores = ood.ood_scores(probs, sparse=True)
    p64 = probs.double().numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(p64 > 0, p64 * np.log(p64), 0.0)
    np.testing.assert_allclose(scores["neg_entropy"], plogp.sum(1), atol=1e-6)
    np.testing.assert_allclose(scores["max_prob"], p64.max(1))
    np.testing.assert_array_equal(scores["neg_support"], -(p64 > 0).sum(1))
    assert (scores["neg_support"] < -1).any()  # some rows really are multi-class supports
    assert set(ood.ood_scores(torch.softmax(logits, -1))) == {"max_prob", "neg_entropy"}
    bf16 = ood.ood_scores(probs.bfloat16(), sparse=True)
    np.testing.assert_allclose(bf16["neg_entropy"], scores["neg_entropy"], atol=0.05)


def test_ood_detection_reports_every_shared_score():
    rng = np.random.default_rng(2)
    scores_in = {"max_prob": rng.uniform(0.5, 1, 200), "neg_entropy": -rng.uniform(0, 1, 200),
                 "neg_support": -rng.integers(1, 3, 200).astype(float)}
    scores_out = {"max_prob": rng.uniform(0.2, 0.8, 150), "neg_entropy": -rng.uniform(0.5, 2, 150)}
    out = ood.ood_detection(scores_in, scores_out)
    assert list(out) == ["max_prob", "neg_entropy"]
    for name, r in out.items():
        assert r["auroc"] == pytest.approx(_brute_force_auroc(scores_in[name], scores_out[name]))
        assert r["fpr_at_tpr"] == _brute_force_fpr(scores_in[name], scores_out[name], 0.95)
        assert r["n_in"] == 200 and r["n_out"] == 150 and r["tpr"] == 0.95
    with pytest.raises(ValueError, match="NaN"):
        ood.auroc([0.1, np.nan], [0.2])
    with pytest.raises(ValueError, match="non-empty"):
        ood.fpr_at_tpr([], [0.2])
