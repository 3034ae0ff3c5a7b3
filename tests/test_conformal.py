"""evaluation.conformal: closed-form sparse support scores, LAC/APS, coverage on exchangeable data."""
import math

import pytest
import torch

from evaluation import conformal

entmax = pytest.importorskip("entmax")  # independent oracle only (never imported at runtime)


@pytest.fixture(autouse=True)
def _one_thread():
    """Many small tensor ops: one intra-op thread is ~10x faster than two on a shared 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _oracle_support(z, alpha, temperature):
    w = (z / temperature).double()
    if alpha == 2.0:
        p = entmax.sparsemax(w, dim=-1)
    else:
        p = entmax.entmax_bisect(w, alpha=alpha, dim=-1, n_iter=200)
    return p > 0


def test_conformal_quantile_finite_sample_rank():
    scores = torch.arange(1, 10, dtype=torch.float64)  # n = 9
    assert conformal.conformal_quantile(scores, 0.1) == 9.0  # ceil(10*0.9) = 9
    assert conformal.conformal_quantile(scores, 0.2) == 8.0  # ceil(10*0.8) = 8
    assert conformal.conformal_quantile(scores, 0.5) == 5.0
    assert math.isinf(conformal.conformal_quantile(scores, 0.05))  # ceil(9.5) = 10 > n
    assert math.isinf(conformal.conformal_quantile(torch.empty(0), 0.1))


def test_known_support_scores():
    z = torch.tensor([[2.0, 1.0, 0.0]] * 3)
    y = torch.tensor([0, 1, 2])
    assert conformal.support_scores(z, y, 2.0).tolist() == pytest.approx([0.0, 1.0, 3.0])
    # entmax-1.5: (α−1)·‖(z − z_y)_+‖₂
    assert conformal.support_scores(z, y, 1.5).tolist() == pytest.approx([0.0, 0.5, 0.5 * math.sqrt(5)])
    assert conformal.lac_scores(torch.tensor([[0.5, 0.3, 0.2]]), torch.tensor([1])).item() == pytest.approx(0.7)
    assert conformal.aps_scores(torch.tensor([[0.5, 0.3, 0.2]]), torch.tensor([1])).item() == pytest.approx(0.8)
    assert conformal.aps_set_sizes(torch.tensor([[0.5, 0.3, 0.2]]), 0.85).tolist() == [2]
    # randomized: mass above y + u·p_y; zero-probability classes score the full mass
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0]])
    u = torch.tensor([0.5])
    assert conformal.aps_scores(p, torch.tensor([1]), u).item() == pytest.approx(0.65)
    assert conformal.aps_scores(p, torch.tensor([3]), u).item() == pytest.approx(1.0)
    assert conformal.aps_set_sizes(p, 0.64, u=u).tolist() == [1]   # scores 0.25, 0.65, 0.9, 1.0
    assert conformal.aps_set_sizes(p, 0.95, u=u).tolist() == [3]
    assert conformal.lac_set_sizes(torch.tensor([[0.5, 0.3, 0.2]]), 0.75).tolist() == [2]


@pytest.mark.parametrize("alpha", [2.0, 1.5, 1.25])
def test_support_score_is_the_smallest_temperature_that_includes_the_label(alpha):
    g = torch.Generator().manual_seed(1)
    z = torch.randn(64, 9, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, 9, (64,), generator=g)
    s = conformal.support_scores(z, y, alpha)
    positive = s > 1e-6
    above = _oracle_support(z[positive], alpha, s[positive].view(-1, 1) * (1 + 1e-3))
    below = _oracle_support(z[positive], alpha, s[positive].view(-1, 1) * (1 - 1e-3))
    idx = y[positive].view(-1, 1)
    assert above.gather(1, idx).all()
    assert not below.gather(1, idx).any()


@pytest.mark.parametrize("alpha", [2.0, 1.5, 1.25])
def test_set_sizes_equal_head_support_at_calibrated_temperature(alpha):
    g = torch.Generator().manual_seed(2)
    z = torch.randn(50, 12, generator=g, dtype=torch.float64) * 3
    for q in (0.05, 0.7, 2.0, 9.0):
        sizes = conformal.support_set_sizes(z, alpha, q)
        oracle = _oracle_support(z, alpha, torch.tensor(q * (1 + 1e-7))).sum(1)
        assert sizes.tolist() == oracle.tolist()
    assert conformal.support_set_sizes(z, alpha, math.inf).tolist() == [12] * 50


def _exchangeable(n, k, seed):
    """Logits of a noisy 'model' and labels drawn from a related distribution: i.i.d. samples."""
    g = torch.Generator().manual_seed(seed)
    true_logits = torch.randn(n, k, generator=g) * 2.5
    labels = torch.multinomial(torch.softmax(true_logits, 1), 1, generator=g).squeeze(1)
    model_logits = true_logits + torch.randn(n, k, generator=g)
    return model_logits, labels


def _split(logits, labels, n_cal, probs_fn):
    cal = {"logits": logits[:n_cal], "labels": labels[:n_cal], "probs": probs_fn(logits[:n_cal])}
    ev = {"logits": logits[n_cal:], "labels": labels[n_cal:], "probs": probs_fn(logits[n_cal:])}
    return cal, ev


@pytest.mark.parametrize("head,alpha", [("softmax", None), ("sparsemax", 2.0), ("entmax15", 1.5),
                                        ("entmax_bisect", 1.3)])
def test_coverage_on_exchangeable_data_and_monotone_sets(head, alpha):
    probs_fn = {
        "softmax": lambda z: torch.softmax(z, 1),
        "sparsemax": lambda z: entmax.sparsemax(z, 1),
        "entmax15": lambda z: entmax.entmax15(z, 1),
        "entmax_bisect": lambda z: entmax.entmax_bisect(z, alpha=1.3, dim=1),
    }[head]
    n_cal, n_eval, k = 1000, 4000, 10
    coverages = {0.1: [], 0.05: []}
    for seed in range(3):
        logits, labels = _exchangeable(n_cal + n_eval, k, seed)
        cal, ev = _split(logits, labels, n_cal, probs_fn)
        report = conformal.prediction_sets(head, alpha, cal, ev)
        assert set(report) == set(conformal.methods_for_head(head))
        for method, res in report.items():
            r10, r05 = res["eps"]["0.1"], res["eps"]["0.05"]
            # smaller ε → larger threshold → larger sets (elementwise, so also on average)
            assert r05["threshold"] >= r10["threshold"]
            assert r05["mean_set_size"] >= r10["mean_set_size"]
            for eps, r in ((0.1, r10), (0.05, r05)):
                # per split: within 4 binomial standard deviations of the guarantee
                slack = 4 * math.sqrt(eps * (1 - eps) / n_eval) + 4 * math.sqrt(eps * (1 - eps) / n_cal)
                assert r["coverage"] >= 1 - eps - slack, (method, eps, r)
                coverages[eps].append(r["coverage"])
            curve = res["curve"]
            sizes = [c["mean_set_size"] for c in curve]  # ε decreasing along the curve
            assert sizes == sorted(sizes)
    for eps, values in coverages.items():
        assert sum(values) / len(values) >= 1 - eps - 0.01


def test_sparse_support_sets_grow_exactly_with_temperature():
    logits, labels = _exchangeable(600, 8, 5)
    sizes_prev = None
    for q in (0.1, 0.5, 1.0, 3.0, 10.0):
        sizes = conformal.support_set_sizes(logits, 2.0, q)
        if sizes_prev is not None:
            assert (sizes >= sizes_prev).all()
        sizes_prev = sizes


def test_too_few_calibration_samples_give_full_sets():
    logits, labels = _exchangeable(30, 6, 3)
    cal = {"logits": logits[:5], "labels": labels[:5], "probs": torch.softmax(logits[:5], 1)}
    ev = {"logits": logits[5:], "labels": labels[5:], "probs": torch.softmax(logits[5:], 1)}
    res = conformal.evaluate_method("lac", cal, ev, epsilons=(0.05,))
    r = res["eps"]["0.05"]
    assert math.isinf(r["threshold"]) and r["coverage"] == 1.0 and r["mean_set_size"] == 6


@pytest.mark.parametrize("name,alpha", [("sparsemax", 2.0), ("entmax15", 1.5), ("entmax_bisect", 1.3)])
def test_scores_match_the_projects_own_heads(name, alpha):
    """Same entmax convention as models.heads: the score is where the head's support gains y."""
    from models.heads import OutputHead

    head = OutputHead(name, alpha=alpha)
    g = torch.Generator().manual_seed(3)
    z = torch.randn(40, 7, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, 7, (40,), generator=g)
    s = conformal.support_scores(z, y, float(head.alpha))
    keep = s > 1e-3
    z, y, s = z[keep], y[keep].view(-1, 1), s[keep].view(-1, 1)
    assert (head(z / (s * 1.01)).gather(1, y) > 0).all()
    assert (head(z / (s * 0.99)).gather(1, y) == 0).all()


def test_aps_uniforms_are_drawn_per_seed():
    """Two runs (seeds) draw different uniforms; one seed always draws the same; calibration and
    evaluation streams differ."""
    a, b = conformal.aps_uniforms(500, 1, seed=0), conformal.aps_uniforms(500, 1, seed=1)
    assert not torch.equal(a, b) and (a - b).abs().mean() > 0.1
    assert torch.equal(a, conformal.aps_uniforms(500, 1, seed=0))
    assert not torch.equal(a, conformal.aps_uniforms(500, 2, seed=0))
    assert a.min() >= 0 and a.max() < 1 and abs(a.mean().item() - 0.5) < 0.05
    # ...and the APS results of one calibration split follow the seed
    logits, labels = _exchangeable(400, 6, 7)
    cal, ev = _split(logits, labels, 200, lambda z: torch.softmax(z, 1))
    runs = [conformal.evaluate_method("aps", cal, ev, epsilons=(0.1,), aps_seed=s)["eps"]["0.1"] for s in (0, 1, 0)]
    assert runs[0] == runs[2] and runs[0]["threshold"] != runs[1]["threshold"]


def test_empty_set_fraction_and_degenerate_temperature():
    """LAC's empty sets are counted (brute force: no class reaches p >= 1 - q); a calibration split whose
    true class is always on top calibrates the support to T = 0, flagged as degenerate."""
    logits, labels = _exchangeable(600, 5, 9)
    probs = torch.softmax(logits * 0.3, 1)  # flat: at large ε many rows have no class above 1 - q
    cal = {"logits": logits[:300], "labels": labels[:300], "probs": probs[:300]}
    ev = {"logits": logits[300:], "labels": labels[300:], "probs": probs[300:]}
    res = conformal.evaluate_method("lac", cal, ev, epsilons=(0.4,))["eps"]["0.4"]
    q = res["threshold"]
    brute = ((1.0 - probs[300:].double()) <= q).sum(1)
    assert res["empty_frac"] == pytest.approx((brute == 0).double().mean().item()) and res["empty_frac"] > 0
    assert res["degenerate"] is False
    z = torch.randn(200, 5, generator=torch.Generator().manual_seed(4))
    y = z.argmax(1)  # the true class is always the top logit: every support score is 0
    part = {"logits": z, "labels": y, "probs": entmax.sparsemax(z, 1)}
    r = conformal.evaluate_method("support", part, part, alpha=2.0, epsilons=(0.1,))["eps"]["0.1"]
    assert r["threshold"] == 0.0 and r["degenerate"] is True
    assert r["mean_set_size"] == 1.0 and r["coverage"] == 1.0 and r["empty_frac"] == 0.0
