"""evaluation.metrics on hand-built probabilities with known answers (through the functions
evaluation uses: example records, then metrics of them)."""
import math

import pytest
import torch

from evaluation import metrics


def _calibration(probs, labels):
    conf, pred = probs.double().max(dim=1)
    return metrics.calibration_from_confidence(conf, pred == labels)


def _support_stats(probs, labels):
    support = probs > 0
    return metrics.support_stats_of_sizes(support.sum(dim=1), support.gather(1, labels.view(-1, 1)).squeeze(1),
                                          probs.shape[1])


def _nll(probs, labels):
    return metrics.nll_of_true_class(probs.gather(1, labels.view(-1, 1)).squeeze(1))


def _all_metrics(logits, labels, head):
    return metrics.metrics_from_records(metrics.example_records(logits, labels, head), logits.shape[1])


def test_top1_and_top5_cap_k_and_use_logits_for_ties():
    logits = torch.tensor([[3.0, 2.0, 1.0], [1.0, 2.0, 3.0], [0.0, 5.0, 1.0], [2.0, 1.0, 0.5]])
    labels = torch.tensor([0, 1, 2, 2])
    out = _all_metrics(logits, labels, _SoftmaxStub())
    assert out["top1"] == pytest.approx(1 / 4)
    assert out["top5"] == pytest.approx(1.0)  # k capped at 3 classes
    records = metrics.example_records(logits, labels, _SoftmaxStub())
    assert records["pred"].tolist() == [0, 2, 1, 0]


def test_ece_and_reliability_known_values():
    # conf 0.9 (right), 0.9 (wrong), 0.62 (right), 0.7 (right): bins 13, 13, 9, 10 of 15.
    probs = torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.62, 0.38], [0.3, 0.7]])
    labels = torch.tensor([0, 1, 0, 1])
    cal = _calibration(probs, labels)
    expected = 2 / 4 * abs(0.5 - 0.9) + 1 / 4 * abs(1 - 0.62) + 1 / 4 * abs(1 - 0.7)
    assert cal["ece"] == pytest.approx(expected, abs=1e-6)
    rel = cal["reliability"]
    assert len(rel["count"]) == 15 and sum(rel["count"]) == 4
    assert rel["count"][13] == 2 and rel["count"][9] == 1 and rel["count"][10] == 1
    assert rel["accuracy"][13] == pytest.approx(0.5)
    assert rel["confidence"][13] == pytest.approx(0.9, abs=1e-6)
    assert rel["confidence"][0] is None and rel["accuracy"][0] is None  # empty bin
    assert rel["bin_lower"][0] == 0.0 and rel["bin_upper"][-1] == 1.0


def test_perfect_calibration_has_zero_ece():
    # 10 samples at confidence 0.7 with exactly 7 right.
    probs = torch.tensor([[0.7, 0.3]] * 10)
    labels = torch.tensor([0] * 7 + [1] * 3)
    assert _calibration(probs, labels)["ece"] == pytest.approx(0.0, abs=1e-6)


def test_support_stats_and_nll_with_zero_probabilities():
    probs = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.2, 0.3, 0.5], [0.0, 0.6, 0.4]])
    labels = torch.tensor([2, 0, 1, 1])
    s = _support_stats(probs, labels)
    assert s["support_mean"] == pytest.approx(2.0)
    assert s["support_median"] == pytest.approx(2.0)
    assert s["support_hist"] == [1, 2, 1]  # sizes 1, 2, 3
    assert s["support_coverage"] == pytest.approx(3 / 4)
    nll = _nll(probs, labels)
    assert nll["zero_prob_frac"] == pytest.approx(1 / 4)
    assert nll["nll_n"] == 3
    assert nll["nll"] == pytest.approx((0 - math.log(0.3) - math.log(0.6)) / 3, rel=1e-5)


def test_support_median_is_the_usual_median():
    probs = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0], [0.25] * 4, [0.25] * 4])
    s = _support_stats(probs, torch.zeros(4, dtype=torch.long))
    assert s["support_median"] == pytest.approx(3.0)  # (2 + 4) / 2


def test_per_class_accuracy_and_missing_class():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [2.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    labels = torch.tensor([0, 0, 0, 1])
    out = metrics.class_accuracy(logits.argmax(dim=1), labels, 3)
    assert out["per_class_accuracy"][0] == pytest.approx(2 / 3)
    assert out["per_class_accuracy"][1] == pytest.approx(1.0)
    assert out["per_class_accuracy"][2] is None
    assert out["balanced_accuracy"] == pytest.approx((2 / 3 + 1) / 2)
    assert out["worst_class_accuracy"] == pytest.approx(2 / 3)


class _SoftmaxStub(torch.nn.Module):
    """Minimal OutputHead stand-in (softmax + cross-entropy) for the aggregate function."""
    name = "softmax"

    def forward(self, logits, dim=-1, ids=None):
        return torch.softmax(logits, dim=dim)

    def loss(self, logits, target, reduction="mean", **_):
        return torch.nn.functional.cross_entropy(logits, target, reduction=reduction)


def test_metrics_from_records_softmax_matches_cross_entropy():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(300, 7, generator=g) * 3
    labels = torch.randint(0, 7, (300,), generator=g)
    out = _all_metrics(logits, labels, _SoftmaxStub())
    ce = torch.nn.functional.cross_entropy(logits.double(), labels).item()
    assert out["n"] == 300 and out["num_classes"] == 7
    assert out["loss"] == pytest.approx(ce, rel=1e-5)
    assert out["nll"] == pytest.approx(ce, rel=1e-5)  # softmax: FY loss == NLL, all finite
    assert out["zero_prob_frac"] == 0.0 and out["support_coverage"] == 1.0
    assert out["support_hist"][-1] == 300 and out["support_mean"] == 7
    assert out["top1"] == pytest.approx((logits.argmax(1) == labels).double().mean().item())


def test_metrics_from_records_with_real_sparse_head():
    heads = pytest.importorskip("models.heads")
    head = heads.OutputHead("sparsemax")
    logits = torch.tensor([[3.0, 0.0, -1.0], [1.0, 0.9, 0.8], [0.0, 2.0, 0.0]])
    labels = torch.tensor([1, 2, 1])
    out = _all_metrics(logits, labels, head)
    # sparsemax: row 0 -> [1,0,0]; row 1 -> all three; row 2 -> [0,1,0]
    assert out["support_hist"] == [2, 0, 1]
    assert out["support_coverage"] == pytest.approx(2 / 3)
    assert out["zero_prob_frac"] == pytest.approx(1 / 3)
    assert out["loss"] > 0 and math.isfinite(out["loss"])
