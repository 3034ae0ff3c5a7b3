"""Risk–coverage curves and AURC, against brute force over every tie-breaking order."""
import itertools

import numpy as np
import pytest

from evaluation import selective as sel


def _risks_of_order(errors_in_order):
    errors = np.asarray(errors_in_order, dtype=np.float64)
    return np.cumsum(errors) / np.arange(1, errors.size + 1)


def _brute_force_expected_risk(confidence, correct):
    """Average of the sorted cumulative risk over EVERY order consistent with decreasing confidence
    (all permutations inside each tie group): the definition, by enumeration."""
    confidence = np.asarray(confidence, dtype=np.float64)
    errors = ~np.asarray(correct, dtype=bool)
    groups = [np.flatnonzero(confidence == value) for value in sorted(set(confidence.tolist()), reverse=True)]
    curves = [_risks_of_order(errors[np.concatenate(perm)])
              for perm in itertools.product(*[list(itertools.permutations(g)) for g in groups])]
    return np.mean(curves, axis=0), len(curves)


def test_risk_coverage_matches_brute_force_with_ties():
    rng = np.random.default_rng(0)
    for trial in range(6):
        n = 9
        confidence = rng.choice([0.2, 0.5, 0.5001, 0.9], size=n)  # few distinct values: many ties
        correct = rng.uniform(size=n) < 0.6
        curve = sel.risk_coverage(confidence, correct)
        expected, n_orders = _brute_force_expected_risk(confidence, correct)
        assert n_orders > 1
        np.testing.assert_allclose(curve["risk"], expected, rtol=0, atol=1e-12)
        assert curve["aurc"] == pytest.approx(expected.mean(), abs=1e-12)
        np.testing.assert_allclose(curve["coverage"], np.arange(1, n + 1) / n)
        # operating points: accept confidence >= t, whole tie groups
        for t, cov, risk in zip(curve["thresholds"], curve["threshold_coverage"], curve["threshold_risk"]):
            accepted = confidence >= t
            assert cov == pytest.approx(accepted.mean()) and risk == pytest.approx((~correct[accepted]).mean())
        assert list(curve["thresholds"]) == sorted(set(confidence.tolist()), reverse=True)


def test_without_ties_aurc_is_the_mean_sorted_cumulative_risk_and_oracle_is_optimal():
    rng = np.random.default_rng(1)
    confidence = rng.permutation(500) / 500.0
    correct = rng.uniform(size=500) < 0.7
    curve = sel.risk_coverage(confidence, correct)
    errors_sorted = ~correct[np.argsort(-confidence)]
    assert curve["aurc"] == pytest.approx(_risks_of_order(errors_sorted).mean(), abs=1e-12)
    # the oracle: every correct example ranked first
    oracle = sel.risk_coverage(correct.astype(float) + rng.uniform(0, 0.5, 500), correct)
    assert oracle["aurc"] == pytest.approx(curve["optimal_aurc"], abs=1e-12)
    assert oracle["e_aurc"] == pytest.approx(0, abs=1e-12)
    assert curve["e_aurc"] == pytest.approx(curve["aurc"] - curve["optimal_aurc"]) and curve["e_aurc"] > 0
    n_err = int((~correct).sum())
    k = np.arange(1, 501)
    assert curve["optimal_aurc"] == pytest.approx(np.mean(np.maximum(0, k - (500 - n_err)) / k))
    assert curve["risk_full"] == pytest.approx(n_err / 500) == curve["risk"][-1]
    # the worst order (errors first) is above the random order, which is above the oracle
    worst = sel.risk_coverage(-(correct.astype(float)), correct)
    assert worst["aurc"] > curve["aurc"] > oracle["aurc"]


def test_all_tied_confidences_give_the_error_rate_at_every_coverage():
    correct = np.array([1, 0, 1, 1, 0, 1, 1, 1], dtype=bool)
    curve = sel.risk_coverage(np.full(8, 0.7), correct)
    np.testing.assert_allclose(curve["risk"], np.full(8, 0.25))
    assert curve["aurc"] == pytest.approx(0.25)
    assert list(curve["threshold_coverage"]) == [1.0]
    # and the result does not depend on the input order within a tie
    perm = np.random.default_rng(2).permutation(8)
    np.testing.assert_allclose(sel.risk_coverage(np.full(8, 0.7), correct[perm])["risk"], curve["risk"])


def test_risk_at_coverage_reads_the_curve():
    confidence = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05])
    correct = np.array([1, 1, 1, 0, 1, 1, 0, 1, 0, 0], dtype=bool)
    curve = sel.risk_coverage(confidence, correct)
    at = sel.risk_at_coverage(curve, (0.1, 0.35, 0.5, 1.0))
    assert at == pytest.approx({0.1: 0.0, 0.35: 1 / 4, 0.5: 1 / 5, 1.0: 0.4})
    with pytest.raises(ValueError, match="coverage"):
        sel.risk_at_coverage(curve, (0.0,))


def test_support_confidence_orders_by_support_then_max_prob():
    support = np.array([3, 1, 2, 1, 2, 3, 1])
    max_prob = np.array([0.5, 0.9, 0.6, 0.99, 0.6, 0.4, 0.9])
    score = sel.support_confidence(support, max_prob)
    ranking = sorted(range(7), key=lambda i: (-support[i], max_prob[i]))  # ascending confidence
    assert all(score[ranking[i]] <= score[ranking[i + 1]] for i in range(6))
    assert score[1] == score[6] and score[2] == score[4]  # exact ties on both keys stay tied
    assert len(set(score.tolist())) == 5
    assert score[3] == score.max() and score[5] == score.min()
    # the resulting risk–coverage curve is the brute-force one of the lexicographic order
    correct = np.array([0, 1, 1, 1, 0, 0, 1], dtype=bool)
    expected, _ = _brute_force_expected_risk(score, correct)
    np.testing.assert_allclose(sel.risk_coverage(score, correct)["risk"], expected, atol=1e-12)


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="same length"):
        sel.risk_coverage(np.ones(3), np.ones(4, dtype=bool))
    with pytest.raises(ValueError, match="NaN"):
        sel.risk_coverage(np.array([0.1, np.nan]), np.ones(2, dtype=bool))
    with pytest.raises(ValueError, match="at least one"):
        sel.risk_coverage(np.zeros(0), np.zeros(0, dtype=bool))
