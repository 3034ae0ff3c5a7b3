"""Paired statistics between two heads: bootstrap intervals, McNemar's exact test, sentences."""
import importlib.util
import math
import os
from fractions import Fraction

import numpy as np
import pytest
import torch

from comparison.analysis import statistics as st
from evaluation.metrics import calibration_from_confidence
from project_files import ROOT


def _ece(confidence, correct):
    """The ECE evaluation reports (evaluation.metrics, torch float64): the reference here."""
    return calibration_from_confidence(torch.as_tensor(np.asarray(confidence, dtype=np.float64)),
                                       torch.as_tensor(np.asarray(correct)))["ece"]


def _bootstrap_ece(confidence, correct):
    """statistics' own ECE (the one every bootstrap replicate uses), on the rows as given."""
    rows = np.arange(len(confidence))[None]
    return float(st.metric_on_rows({"confidence": confidence, "correct": correct}, "ece", rows,
                                   np.zeros(len(confidence), dtype=np.int64))[0])


def _two_heads(rng, n_seeds=3, n=400):
    rows = n_seeds * n

    def head(skill):
        confidence = rng.uniform(0.1, 1.0, rows)
        confidence[:7] = [0.0, 1.0, 1 / 15, 2 / 15, 0.5, 14 / 15, 1 / 3]  # bin edges and the ends
        return {"correct": rng.uniform(size=rows) < confidence * skill, "confidence": confidence,
                "loss": rng.exponential(size=rows)}

    groups = np.repeat(np.array([11, 5, 7][:n_seeds]), n)  # arbitrary seed ids, not sorted
    example_ids = np.tile(rng.permutation(n) + 1000, n_seeds)
    return head(1.0), head(0.95), groups, example_ids


def test_ece_matches_engine_calibration_including_bin_edges():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(600, 9, generator=gen, dtype=torch.float64) * 3
    probs = torch.softmax(logits, dim=1)
    probs[:5] = torch.eye(9, dtype=torch.float64)[:5]  # confidence exactly 1
    probs[5:8] = 1 / 9  # uniform: confidence 1/9
    probs[8, :2] = torch.tensor([2 / 15, 13 / 15], dtype=torch.float64)  # confidence on a bin edge
    probs[8, 2:] = 0
    labels = torch.randint(0, 9, (600,), generator=gen)
    confidence, pred = probs.max(dim=1)
    expected = _ece(confidence, pred == labels)
    assert _bootstrap_ece(confidence.numpy(), (pred == labels).numpy()) == pytest.approx(expected, abs=1e-12)
    assert expected > 0.01  # a real, non-trivial ECE


def test_replicate_metrics_match_brute_force_per_seed_and_pooled():
    rng = np.random.default_rng(1)
    a, _, groups, example_ids = _two_heads(rng, n=60)
    for ids in (None, example_ids):
        rows, column_group = st.resample_rows(groups.size, 5, np.random.default_rng(2), groups, ids)
        assert rows.shape == (5, groups.size)
        per_seed = st.metric_on_rows(a, "ece", rows, column_group)
        pooled = st.metric_on_rows(a, "ece", rows, column_group, ece_pooling="pooled")
        top1 = st.metric_on_rows(a, "top1", rows, column_group)
        loss = st.metric_on_rows(a, "loss", rows, column_group)
        for r in range(5):
            picked = rows[r]
            per_seed_ref = np.mean([_ece(a["confidence"][picked[column_group == g]],
                                         a["correct"][picked[column_group == g]])
                                    for g in range(3)])
            assert per_seed[r] == pytest.approx(per_seed_ref, abs=1e-12)
            assert pooled[r] == pytest.approx(_ece(a["confidence"][picked], a["correct"][picked]), abs=1e-12)
            assert top1[r] == pytest.approx(a["correct"][picked].mean(), abs=1e-12)
            assert loss[r] == pytest.approx(a["loss"][picked].mean(), abs=1e-12)


def test_replicates_from_multiplicities_match_the_drawn_rows_brute_force():
    """The bootstraps of the shared-example design sum each replicate as multiplicities @ per-example
    columns; here every replicate's rows are gathered explicitly (each drawn seed's rows of the drawn
    examples, a seed drawn twice counting twice) and measured with evaluation's ECE."""
    rng = np.random.default_rng(4)
    n_seeds, n, n_reps = 3, 80, 6
    a, _, groups, example_ids = _two_heads(rng, n_seeds=n_seeds, n=n)
    table = st._example_table(st._strata(groups, groups.size), example_ids)
    example_picks = rng.integers(0, n, size=(n_reps, n))
    for seed_picks in (np.tile(np.arange(n_seeds), (n_reps, 1)), rng.integers(0, n_seeds, size=(n_reps, n_seeds))):
        example_weights = st._multiplicities(example_picks, n)
        seed_weights = st._multiplicities(seed_picks, n_seeds)
        got = {(m, pool): st.weighted_metric(st._example_columns(a, m, table), m, example_weights, seed_weights,
                                             ece_pooling=pool)
               for m in ("top1", "loss", "ece") for pool in ("per_seed_mean", "pooled")}
        for r in range(n_reps):
            slots = [table[s][example_picks[r]] for s in seed_picks[r]]
            every = np.concatenate(slots)
            assert got["top1", "per_seed_mean"][r] == a["correct"][every].mean()  # integer sums: exact
            assert got["loss", "per_seed_mean"][r] == pytest.approx(a["loss"][every].mean(), abs=1e-12)
            per_slot = [_ece(a["confidence"][rows], a["correct"][rows]) for rows in slots]
            assert got["ece", "per_seed_mean"][r] == pytest.approx(np.mean(per_slot), abs=1e-12)
            assert got["ece", "pooled"][r] == pytest.approx(_ece(a["confidence"][every], a["correct"][every]),
                                                            abs=1e-12)


def test_resampling_is_stratified_by_seed_and_shares_examples_when_asked():
    rng = np.random.default_rng(3)
    _, _, groups, example_ids = _two_heads(rng, n=50)
    rows, column_group = st.resample_rows(groups.size, 20, np.random.default_rng(0), groups)
    assert np.array_equal(np.bincount(column_group), [50, 50, 50])
    assert np.array_equal(groups[rows], np.broadcast_to(np.repeat([11, 5, 7], 50), rows.shape))  # caller's order
    rows, column_group = st.resample_rows(groups.size, 20, np.random.default_rng(0), groups, example_ids)
    picked_ids = example_ids[rows].reshape(20, 3, 50)
    assert np.array_equal(picked_ids[:, 0], picked_ids[:, 1]) and np.array_equal(picked_ids[:, 0], picked_ids[:, 2])
    assert np.array_equal(groups[rows].reshape(20, 3, 50)[:, :, 0], np.broadcast_to([11, 5, 7], (20, 3)))
    assert len(np.unique(picked_ids[0, 0])) < 50  # drawn with replacement
    with pytest.raises(ValueError, match="same examples"):
        bad = example_ids.copy()
        bad[-1] = -1
        st.resample_rows(groups.size, 2, np.random.default_rng(0), groups, bad)


def test_paired_bootstrap_point_values_and_determinism():
    rng = np.random.default_rng(4)
    a, b, groups, example_ids = _two_heads(rng)
    out = st.paired_bootstrap(a, b, groups=groups, example_ids=example_ids, n_boot=300, seed=9)
    assert set(out) == {"top1", "loss", "ece"}
    assert out["top1"]["a"] == pytest.approx(a["correct"].mean())
    assert out["loss"]["difference"] == pytest.approx(a["loss"].mean() - b["loss"].mean())
    seed_ece = [_ece(a["confidence"][groups == g], a["correct"][groups == g]) for g in (11, 5, 7)]
    assert out["ece"]["a"] == pytest.approx(np.mean(seed_ece), abs=1e-12)
    for r in out.values():
        assert r["ci_low"] <= r["ci_high"] and r["n_groups"] == 3 and r["resampling"] == "shared_examples"
        assert r["significant"] == (r["ci_low"] > 0 or r["ci_high"] < 0)
    again = st.paired_bootstrap(a, b, groups=groups, example_ids=example_ids, n_boot=300, seed=9)
    assert again == out
    other = st.paired_bootstrap(a, b, groups=groups, example_ids=example_ids, n_boot=300, seed=10)
    assert other["top1"]["ci_low"] != out["top1"]["ci_low"]
    with pytest.raises(ValueError, match="needs per-example"):
        st.paired_bootstrap({"correct": a["correct"]}, {"correct": b["correct"]}, metrics=["ece"])
    with pytest.raises(ValueError, match="no metric"):
        st.paired_bootstrap({"pred": a["correct"]}, {"pred": b["correct"]})
    with pytest.raises(ValueError, match="same length"):
        st.paired_bootstrap({"correct": a["correct"]}, {"correct": b["correct"][:-1]})


def test_bootstrap_interval_covers_a_known_difference_at_the_nominal_rate():
    """200 synthetic experiments with a known population difference: the 95% interval must cover it
    in about 95% of them (binomial sd ~1.5 points at 200 experiments)."""
    rng = np.random.default_rng(123)
    cells = np.array([0.70, 0.12, 0.06, 0.12])  # P(both right), P(only A), P(only B), P(both wrong)
    true_top1 = cells[1] - cells[2]
    true_loss = 0.1
    covered_top1, covered_loss = [], []
    for experiment in range(200):
        cell = rng.choice(4, size=300, p=cells)
        base = rng.exponential(size=300)  # shared per-example difficulty: what pairing cancels
        a = {"correct": cell <= 1, "loss": base + rng.normal(true_loss, 0.5, 300)}
        b = {"correct": (cell == 0) | (cell == 2), "loss": base + rng.normal(0.0, 0.5, 300)}
        out = st.paired_bootstrap(a, b, n_boot=200, seed=experiment)
        covered_top1.append(out["top1"]["ci_low"] <= true_top1 <= out["top1"]["ci_high"])
        covered_loss.append(out["loss"]["ci_low"] <= true_loss <= out["loss"]["ci_high"])
    assert 0.88 <= np.mean(covered_top1) <= 0.99
    assert 0.88 <= np.mean(covered_loss) <= 0.99


def test_shared_example_design_covers_when_seeds_agree_on_hard_examples():
    """3 seeds on the same 200 examples whose difficulty is shared across seeds: resampling examples
    (shared across seeds) covers the population difference; independent within-seed resampling gives
    narrower intervals because it ignores the seeds' agreement."""
    rng = np.random.default_rng(7)
    kinds = np.array([[0.98, 0.7], [0.7, 0.98], [0.98, 0.98], [0.1, 0.1], [0.9, 0.6]])  # P(right) of A, B
    true_top1 = (kinds[:, 0] - kinds[:, 1]).mean()
    groups, example_ids = np.repeat(np.arange(3), 200), np.tile(np.arange(200), 3)
    covered, width_shared, width_within = [], [], []
    for experiment in range(200):
        kind = rng.integers(0, 5, 200)
        a = {"correct": (rng.uniform(size=(3, 200)) < kinds[kind, 0]).ravel()}
        b = {"correct": (rng.uniform(size=(3, 200)) < kinds[kind, 1]).ravel()}
        shared = st.paired_bootstrap(a, b, groups=groups, example_ids=example_ids, n_boot=200, seed=experiment)
        within = st.paired_bootstrap(a, b, groups=groups, n_boot=200, seed=experiment)
        covered.append(shared["top1"]["ci_low"] <= true_top1 <= shared["top1"]["ci_high"])
        width_shared.append(shared["top1"]["ci_high"] - shared["top1"]["ci_low"])
        width_within.append(within["top1"]["ci_high"] - within["top1"]["ci_low"])
    assert 0.88 <= np.mean(covered) <= 0.99
    assert np.mean(width_within) < 0.95 * np.mean(width_shared)


def test_identical_heads_are_not_significant():
    rng = np.random.default_rng(5)
    a, _, groups, example_ids = _two_heads(rng)
    out = st.paired_bootstrap(a, dict(a), groups=groups, example_ids=example_ids, n_boot=200)
    mc = st.mcnemar_exact(a["correct"], a["correct"], groups)
    assert mc["p_value"] == 1.0 and mc["n_discordant"] == 0
    for metric, r in out.items():
        assert r["difference"] == 0 and r["ci_low"] == 0 and r["ci_high"] == 0 and not r["significant"]
        sentence = st.describe_difference(r, "softmax", "softmax", mc)
        assert "not significant at 5%" in sentence
    assert st.describe_difference(out["top1"], "a", "b", mc) == \
        "a \u2212 b top-1: 0.0 pt [0.0, 0.0], not significant at 5% (McNemar exact p = 1)"


def test_clear_difference_is_significant_and_the_sentence_reads_right():
    rng = np.random.default_rng(6)
    truth = rng.uniform(size=2000)
    a = {"correct": truth < 0.9}
    b = {"correct": truth < 0.8}  # A right on every example B gets right, and 10% more
    out = st.paired_bootstrap(a, b, n_boot=500)["top1"]
    mc = st.mcnemar_exact(a["correct"], b["correct"])
    assert out["significant"] and out["ci_low"] > 0 and mc["c"] == 0 and mc["p_value"] < 1e-6
    assert st.describe_difference(out, "sparsemax", "softmax", mc).endswith(
        "significant at 5% (McNemar exact p < 0.001)")
    assert "not significant" not in st.describe_difference(out, "sparsemax", "softmax", mc)
    made_up = {"metric": "top1", "difference": 0.009, "ci_low": -0.003, "ci_high": 0.021, "level": 0.95,
               "significant": False}
    assert st.describe_difference(made_up, "sparsemax", "softmax", {"p_value": 0.2149}) == (
        "sparsemax \u2212 softmax top-1: +0.9 pt [\u22120.3, +2.1], not significant at 5% (McNemar exact p = 0.21)")
    ece = dict(made_up, metric="ece", difference=-0.0042, ci_low=-0.009, ci_high=-0.0004, significant=True)
    assert st.describe_difference(ece, "entmax15", "softmax") == (
        "entmax15 \u2212 softmax ECE: \u22120.42 pt [\u22120.90, \u22120.04], significant at 5%")
    loss = dict(made_up, metric="loss", difference=0.0123, ci_low=0.004, ci_high=0.0201, level=0.99, significant=True)
    assert st.describe_difference(loss, "a", "b") == "a \u2212 b FY loss: +0.012 [+0.004, +0.020], significant at 1%"


def _exact_tail(k, n):
    return float(sum(Fraction(math.comb(n, j), 2 ** n) for j in range(k + 1)))


def test_mcnemar_matches_hand_and_exact_rational_computation():
    assert st.mcnemar_p_value(1, 8) == pytest.approx(2 * (1 + 9) / 2 ** 9, rel=1e-12)  # 0.0390625
    assert st.mcnemar_p_value(8, 1) == st.mcnemar_p_value(1, 8)
    assert st.mcnemar_p_value(0, 0) == 1.0 and st.mcnemar_p_value(4, 4) == 1.0
    assert st.mcnemar_p_value(0, 5) == pytest.approx(2 / 32, rel=1e-12)
    for b, c in [(3, 17), (40, 62), (101, 160), (700, 820), (0, 1), (12, 13)]:
        expected = min(1.0, 2 * _exact_tail(min(b, c), b + c))
        assert st.mcnemar_p_value(b, c) == pytest.approx(expected, rel=1e-9), (b, c)


def test_mcnemar_large_counts_agree_with_the_normal_approximation():
    for b, c in [(480, 540), (10_000, 10_300), (400_000, 401_000)]:
        z = (abs(b - c) - 1) / math.sqrt(b + c)  # continuity-corrected McNemar statistic
        normal = math.erfc(z / math.sqrt(2))
        assert st.mcnemar_p_value(b, c) == pytest.approx(normal, rel=0.05), (b, c)
    tiny = st.mcnemar_p_value(1_000, 3_000)  # far tail: no underflow to a wrong value, no overflow
    assert 0 < tiny < 1e-200


def test_mcnemar_pools_seeds_by_summing_discordant_counts():
    rng = np.random.default_rng(8)
    a, b, groups, _ = _two_heads(rng)
    out = st.mcnemar_exact(a["correct"], b["correct"], groups)
    assert [g["group"] for g in out["per_group"]] == [11, 5, 7]
    assert out["b"] == sum(g["b"] for g in out["per_group"]) and out["c"] == sum(g["c"] for g in out["per_group"])
    ca, cb = a["correct"], b["correct"]
    assert out["b"] == int(np.sum(ca & ~cb)) and out["c"] == int(np.sum(~ca & cb))
    assert out["p_value"] == pytest.approx(min(1.0, 2 * _exact_tail(min(out["b"], out["c"]), out["n_discordant"])),
                                           rel=1e-9)


def test_bench_times_both_paths_on_the_same_draws(capsys):
    """scripts/bench_statistics.py: every design and metric, the top-1 of both paths exactly equal."""
    spec = importlib.util.spec_from_file_location("bench_statistics", os.path.join(ROOT, "scripts",
                                                                                    "bench_statistics.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--quick"]) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| s")]
    assert len(rows) == 6 and {row[1] for row in rows} == {"top1", "loss", "ece"}
    for row in rows:
        largest = float(row[5].rstrip(" |"))
        assert largest == 0.0 if row[1] == "top1" else largest < 1e-12
