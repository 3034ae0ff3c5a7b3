"""Output heads: mappings, Fenchel-Young losses and OutputHead (models/heads.py).

References are independent float64 numpy implementations (sort-based simplex projection,
bisection for alpha-entmax); the `entmax` package is used as an oracle where it is correct.
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.errors import UserError
from models.heads import (
    HEAD_NAMES,
    OutputHead,
    entmax15,
    entmax15_loss,
    entmax_bisect,
    entmax_bisect_loss,
    softmax,
    softmax_loss,
    sparsemax,
    sparsemax_loss,
)

entmax_pkg = pytest.importorskip("entmax")

NEG_INF = float("-inf")


# ------------------------------------------------------------------------------- references
def ref_sparsemax(x):
    """Euclidean projection onto the simplex (Held et al. / Duchi et al.), float64 numpy."""
    x = np.asarray(x, dtype=np.float64)
    out = np.zeros_like(x)
    for i, row in enumerate(x.reshape(-1, x.shape[-1])):
        u = np.sort(row)[::-1]
        css = np.cumsum(u)
        k = np.arange(1, len(u) + 1)
        rho = k[u - (css - 1) / k > 0][-1]
        tau = (css[rho - 1] - 1) / rho
        out.reshape(-1, x.shape[-1])[i] = np.maximum(row - tau, 0)
    return out


def ref_entmax(x, alpha):
    """alpha-entmax by 200 float64 bisection steps on sum [(a-1)x - tau]_+^(1/(a-1)) = 1."""
    x = np.asarray(x, dtype=np.float64) * (alpha - 1)
    out = np.zeros_like(x)
    flat = x.reshape(-1, x.shape[-1])
    for i, row in enumerate(flat):
        lo, hi = row.max() - 1.0, row.max()
        for _ in range(200):
            mid = (lo + hi) / 2
            if (np.maximum(row - mid, 0) ** (1 / (alpha - 1))).sum() >= 1:
                lo = mid
            else:
                hi = mid
        p = np.maximum(row - lo, 0) ** (1 / (alpha - 1))
        out.reshape(-1, x.shape[-1])[i] = p / p.sum()
    return out


MAPPINGS = {
    "softmax": lambda x, dim=-1: softmax(x, dim),
    "sparsemax": lambda x, dim=-1: sparsemax(x, dim),
    "entmax15": lambda x, dim=-1: entmax15(x, dim),
    "entmax_1.3": lambda x, dim=-1: entmax_bisect(x, 1.3, dim),
    "entmax_t1.7": lambda x, dim=-1: entmax_bisect(x, torch.tensor(1.7, dtype=x.dtype), dim),
}
SPARSE = [k for k in MAPPINGS if k != "softmax"]
# Entries more than this below the max are exactly zero: tau >= (a-1) max - 1.
GAP = {"sparsemax": 1.0, "entmax15": 2.0, "entmax_1.3": 1 / 0.3, "entmax_t1.7": 1 / 0.7}


def _x(shape, scale=2.0, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype) * scale


# ------------------------------------------------------------------------------- correctness
@pytest.mark.parametrize("K", [2, 7, 16, 17, 100, 5000])
@pytest.mark.parametrize("scale", [0.1, 2.0, 30.0])
def test_sparsemax_matches_simplex_projection(K, scale):
    x = _x((6, K), scale, seed=K)
    np.testing.assert_allclose(sparsemax(x).numpy(), ref_sparsemax(x.numpy()), atol=1e-12)


@pytest.mark.parametrize("K", [3, 50, 300, 5000])
@pytest.mark.parametrize("alpha", [1.05, 1.3, 1.5, 1.7, 1.95])
def test_entmax_matches_bisection_reference(K, alpha):
    x = _x((4, K), 2.0, seed=K)
    ref = ref_entmax(x.numpy(), alpha)
    np.testing.assert_allclose(entmax_bisect(x, alpha).numpy(), ref, atol=1e-10)
    np.testing.assert_allclose(entmax_bisect(x, torch.full((4, 1), alpha, dtype=x.dtype)).numpy(),
                               ref, atol=1e-10)
    if alpha == 1.5:
        np.testing.assert_allclose(entmax15(x).numpy(), ref, atol=1e-10)


def test_alpha_one_and_two_dispatch_to_softmax_and_sparsemax():
    x = _x((5, 30))
    torch.testing.assert_close(entmax_bisect(x, 1.0), torch.softmax(x, -1), rtol=0, atol=1e-15)
    torch.testing.assert_close(entmax_bisect(x, 2.0), sparsemax(x), rtol=0, atol=0)
    a = torch.tensor([[1.0], [2.0], [1.5], [1.0], [1.2]], dtype=x.dtype)
    p = entmax_bisect(x, a)
    torch.testing.assert_close(p[0], torch.softmax(x[0], -1), atol=1e-14, rtol=0)
    torch.testing.assert_close(p[1], sparsemax(x[1]), atol=1e-12, rtol=0)
    torch.testing.assert_close(p[2], entmax15(x[2]), atol=1e-12, rtol=0)
    with pytest.raises(UserError):
        entmax_bisect(x, 0.5)


@pytest.mark.parametrize("K", [10, 500, 6000])
def test_values_and_gradients_match_entmax_package(K):
    x = _x((8, K), 2.0, seed=3).requires_grad_()
    w = _x((8, K), 1.0, seed=4)
    pairs = [(sparsemax, entmax_pkg.sparsemax), (entmax15, entmax_pkg.entmax15),
             (lambda v: entmax_bisect(v, 1.3), lambda v: entmax_pkg.entmax_bisect(v, 1.3, n_iter=100))]
    for ours, theirs in pairs:
        p1, p2 = ours(x), theirs(x)
        g1, = torch.autograd.grad((p1 * w).sum(), x)
        g2, = torch.autograd.grad((p2 * w).sum(), x)
        torch.testing.assert_close(p1, p2, atol=1e-12, rtol=0)
        torch.testing.assert_close(g1, g2, atol=1e-10, rtol=0)
    y = torch.randint(0, K, (8,), generator=torch.Generator().manual_seed(0))
    for ours, theirs in [(sparsemax_loss, entmax_pkg.sparsemax_loss), (entmax15_loss, entmax_pkg.entmax15_loss),
                         (lambda v, t, **k: entmax_bisect_loss(v, t, 1.3, **k),
                          lambda v, t: entmax_pkg.entmax_bisect_loss(v, t, 1.3, n_iter=100))]:
        l1, l2 = ours(x, y, reduction="none"), theirs(x, y)
        torch.testing.assert_close(l1, l2, atol=1e-10, rtol=0)
        g1, = torch.autograd.grad(l1.sum(), x)
        g2, = torch.autograd.grad(l2.sum(), x)
        torch.testing.assert_close(g1, g2, atol=1e-10, rtol=0)


def test_alpha_gradient_matches_entmax_package():
    x = _x((4, 12), 1.5, seed=5)
    w = _x((4, 12), 1.0, seed=6)
    a1 = torch.full((4, 1), 1.4, dtype=x.dtype, requires_grad=True)
    a2 = torch.full((4, 1), 1.4, dtype=x.dtype, requires_grad=True)
    g1, = torch.autograd.grad((entmax_bisect(x, a1) * w).sum(), a1)
    g2, = torch.autograd.grad((entmax_pkg.entmax_bisect(x, a2, n_iter=100) * w).sum(), a2)
    torch.testing.assert_close(g1, g2, atol=1e-8, rtol=1e-6)


# ------------------------------------------------------------------------------- gradcheck
@pytest.mark.parametrize("name", list(MAPPINGS))
def test_gradcheck_mappings_any_dim(name):
    x = _x((2, 5, 3), 1.5, seed=1).requires_grad_()
    assert torch.autograd.gradcheck(lambda v: MAPPINGS[name](v, 1), (x,))
    x2 = _x((3, 40), 1.5, seed=2).requires_grad_()
    assert torch.autograd.gradcheck(lambda v: MAPPINGS[name](v, -1), (x2,))


def test_gradcheck_alpha_per_row_and_scalar():
    x = _x((3, 6), 1.5, seed=7).requires_grad_()
    a = torch.tensor([[1.2], [1.5], [1.8]], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v, t: entmax_bisect(v, t), (x, a))
    s = torch.tensor(1.35, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v, t: entmax_bisect(v, t), (x, s))
    x3 = _x((2, 4, 3), 1.5, seed=8).requires_grad_()
    a3 = torch.tensor([[[1.3, 1.6, 1.9]], [[1.4, 1.5, 1.1]]], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v, t: entmax_bisect(v, t, dim=1), (x3, a3))


LOSSES = {
    "softmax": softmax_loss,
    "sparsemax": sparsemax_loss,
    "entmax15": entmax15_loss,
    "entmax_1.3": lambda z, t, **k: entmax_bisect_loss(z, t, 1.3, **k),
}
LOSS_MAPPING = {"softmax": "softmax", "sparsemax": "sparsemax", "entmax15": "entmax15", "entmax_1.3": "entmax_1.3"}


@pytest.mark.parametrize("name", list(LOSSES))
def test_gradcheck_losses(name):
    z = _x((4, 7), 1.5, seed=9).requires_grad_()
    y = torch.tensor([0, 3, 6, 2])
    q = torch.softmax(_x((4, 7), 1.0, seed=10), -1)
    f = LOSSES[name]
    assert torch.autograd.gradcheck(lambda v: f(v, y), (z,))
    assert torch.autograd.gradcheck(lambda v: f(v, q, reduction="none"), (z,))
    assert torch.autograd.gradcheck(lambda v: f(v, y, label_smoothing=0.2, reduction="sum"), (z,))


def test_gradcheck_alpha_loss():
    z = _x((4, 7), 1.5, seed=11).requires_grad_()
    y = torch.tensor([0, 3, 6, 2])
    q = torch.softmax(_x((4, 7), 1.0, seed=12), -1)
    a = torch.tensor(1.4, dtype=torch.float64, requires_grad=True)
    ar = torch.tensor([1.2, 1.5, 1.7, 1.9], dtype=torch.float64, requires_grad=True)
    for t in (y, q):
        assert torch.autograd.gradcheck(lambda v, s: entmax_bisect_loss(v, t, s), (z, a))
        assert torch.autograd.gradcheck(lambda v, s: entmax_bisect_loss(v, t, s, reduction="none"), (z, ar))
    zl = _x((3, 300), 1.5, seed=13).requires_grad_()  # candidate-block path (K > 64)
    yl = torch.tensor([1, 50, 299])
    assert torch.autograd.gradcheck(lambda s: entmax_bisect_loss(zl, yl, s), (a,))


# ------------------------------------------------------------------------------- properties
def _adversarial_rows(draw, K):
    kind = draw(st.sampled_from(["random", "ties", "huge", "constant", "onehot", "masked", "tiny"]))
    if kind == "random":
        row = draw(st.lists(st.floats(-10, 10), min_size=K, max_size=K))
    elif kind == "ties":
        vals = draw(st.lists(st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0]), min_size=K, max_size=K))
        row = vals
    elif kind == "huge":
        row = draw(st.lists(st.floats(-1e6, 1e6), min_size=K, max_size=K))
    elif kind == "constant":
        row = [draw(st.floats(-1e6, 1e6))] * K
    elif kind == "onehot":
        i = draw(st.integers(0, K - 1))
        row = [0.0] * K
        row[i] = draw(st.floats(5, 1e4))
    elif kind == "tiny":
        row = draw(st.lists(st.floats(-1e-6, 1e-6), min_size=K, max_size=K))
    else:
        row = draw(st.lists(st.floats(-5, 5), min_size=K, max_size=K))
        masked = draw(st.lists(st.booleans(), min_size=K, max_size=K))
        row = [NEG_INF if m else v for v, m in zip(row, masked)]
    return row


@st.composite
def logit_batches(draw):
    K = draw(st.integers(1, 24))
    B = draw(st.integers(1, 4))
    return torch.tensor([_adversarial_rows(draw, K) for _ in range(B)], dtype=torch.float64)


@settings(max_examples=50, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=logit_batches(), name=st.sampled_from(list(MAPPINGS)), seed=st.integers(0, 10))
def test_mapping_properties(x, name, seed):
    f = MAPPINGS[name]
    p = f(x)
    dead = torch.isinf(x).all(-1) & (x < 0).all(-1)
    assert torch.isfinite(p).all() and (p >= 0).all()
    sums = p.sum(-1)
    torch.testing.assert_close(sums[~dead], torch.ones_like(sums[~dead]), atol=1e-9, rtol=0)
    assert (p[dead] == 0).all()
    assert (p[torch.isinf(x)] == 0).all()  # masked entries are exact zeros
    # permutation equivariance
    perm = torch.randperm(x.size(-1), generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(f(x[:, perm]), p[:, perm], atol=1e-9, rtol=0)
    # shift invariance (for moderate magnitudes: fp64 keeps x + c exact enough)
    fin = x[torch.isfinite(x)]
    if fin.numel() == 0 or float(fin.abs().max()) < 100:
        torch.testing.assert_close(f(x + 3.25), p, atol=1e-9, rtol=0)
    # order preserving: x_i > x_j => p_i >= p_j
    xi, xj = x.unsqueeze(-1), x.unsqueeze(-2)
    pi, pj = p.unsqueeze(-1), p.unsqueeze(-2)
    assert ((xi > xj) <= (pi >= pj - 1e-12)).all()
    if name in GAP:  # exact zeros far below the max
        m = x.amax(-1, keepdim=True)
        far = (x < m - GAP[name] - 1e-9) & ~dead.unsqueeze(-1)
        assert (p[far] == 0).all()
    # gradient is finite everywhere (masked entries and all -inf rows included)
    xr = x.clone().requires_grad_()
    g, = torch.autograd.grad((f(xr) * torch.arange(x.size(-1), dtype=x.dtype)).sum(), xr)
    assert torch.isfinite(g).all()
    assert (g[torch.isinf(x)] == 0).all()


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=logit_batches(), name=st.sampled_from(list(LOSSES)), seed=st.integers(0, 100))
def test_loss_properties(x, name, seed):
    f, m = LOSSES[name], MAPPINGS[LOSS_MAPPING[name]]
    finite = torch.isfinite(x)
    live = finite.any(-1)
    x = x[live]
    if x.numel() == 0:
        return
    finite = torch.isfinite(x)
    g = torch.Generator().manual_seed(seed)
    # soft target on the finite classes only
    q = torch.rand(x.shape, generator=g, dtype=x.dtype) * finite
    q = q / q.sum(-1, keepdim=True)
    xr = x.clone().requires_grad_()
    loss = f(xr, q, reduction="none")
    assert torch.isfinite(loss).all() and (loss >= 0).all()
    grad, = torch.autograd.grad(loss.sum(), xr)
    torch.testing.assert_close(grad, m(x) - q, atol=1e-9, rtol=0)  # gradient is p - q
    # zero exactly at q = p(z)
    assert (f(x, m(x), reduction="none") == 0).all()
    # hard targets on finite classes agree with one-hot rows
    y = torch.multinomial(finite.to(x.dtype), 1, generator=g).squeeze(1)
    oh = F.one_hot(y, x.size(-1)).to(x.dtype)
    torch.testing.assert_close(f(x, y, reduction="none"), f(x, oh, reduction="none"), atol=1e-9, rtol=1e-9)


def test_three_d_dim1_matches_transposed():
    x = _x((3, 9, 4), 2.0, seed=14)
    for f in MAPPINGS.values():
        torch.testing.assert_close(f(x, 1), f(x.transpose(1, 2), -1).transpose(1, 2), atol=1e-12, rtol=0)


def test_masked_entries_do_not_affect_the_rest():
    x = _x((4, 300), 2.0, seed=15)
    mask = torch.rand(4, 300, generator=torch.Generator().manual_seed(1)) < 0.5
    xm = x.masked_fill(mask, NEG_INF)
    for f in MAPPINGS.values():
        p = f(xm)
        assert (p[mask] == 0).all()
        for i in range(4):
            torch.testing.assert_close(p[i][~mask[i]], f(x[i][~mask[i]].unsqueeze(0))[0], atol=1e-12, rtol=0)


def test_all_neg_inf_rows_give_zeros_without_nan():
    x = _x((3, 8), 1.0, seed=16)
    x[1] = NEG_INF
    for f in MAPPINGS.values():
        xr = x.clone().requires_grad_()
        p = f(xr)
        assert (p[1] == 0).all() and torch.isfinite(p).all()
        g, = torch.autograd.grad((p * torch.arange(8.0, dtype=x.dtype)).sum(), xr)
        assert torch.isfinite(g).all() and (g[1] == 0).all()
    a = torch.full((3, 1), 1.4, dtype=x.dtype, requires_grad=True)
    ga, = torch.autograd.grad(entmax_bisect(x, a).pow(2).sum(), a)
    assert torch.isfinite(ga).all()


def test_all_neg_inf_row_does_not_stall_the_eager_iterations(monkeypatch):
    # A dead row once gave the sort-free solvers an empty support (0/0 steps): the whole batch
    # then ran _MAX_STEPS passes and fell back to the (very slow on CPU) sort. Forbid both.
    from models import thresholds_cpu

    def no_sort(*args, **kwargs):
        raise AssertionError("sort fallback reached")

    monkeypatch.setattr(thresholds_cpu, "sparsemax_tau_sorted", no_sort)
    monkeypatch.setattr(thresholds_cpu, "entmax15_tau_sorted", no_sort)
    monkeypatch.setattr(thresholds_cpu, "MAX_STEPS", 30)
    x = _x((6, 100), 2.0, seed=30, dtype=torch.float32)
    x[2] = NEG_INF
    x[4, :60] = NEG_INF
    for f in (sparsemax, entmax15, lambda v: entmax_bisect(v, torch.tensor(1.3))):
        p = f(x)
        assert (p[2] == 0).all() and torch.isfinite(p).all()
        torch.testing.assert_close(p[[0, 1, 3, 4, 5]].sum(-1), torch.ones(5), atol=1e-5, rtol=0)
        torch.testing.assert_close(p[4:5], f(x[4:5]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("K", [5, 100, 5000])
def test_large_magnitudes(K):
    x = _x((3, K), 1e30, seed=17, dtype=torch.float32)
    for f in MAPPINGS.values():
        p = f(x)
        assert torch.isfinite(p).all()
        torch.testing.assert_close(p.sum(-1), torch.ones(3), atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------- losses
@pytest.mark.parametrize("name", list(LOSSES))
def test_ignore_index_and_reductions(name):
    f = LOSSES[name]
    z = _x((5, 6), 1.0, seed=18)
    y = torch.tensor([1, -100, 3, 0, -100])
    none = f(z, y, reduction="none")
    assert none.shape == (5,) and (none[[1, 4]] == 0).all()
    keep = torch.tensor([0, 2, 3])
    torch.testing.assert_close(f(z, y), f(z[keep], y[keep]))
    torch.testing.assert_close(f(z, y, reduction="sum"), none.sum())
    zr = z.clone().requires_grad_()
    g, = torch.autograd.grad(f(zr, y), zr)
    assert (g[[1, 4]] == 0).all()
    assert f(z, torch.full((5,), -100)) == 0  # all ignored: 0, not NaN
    assert torch.isfinite(f(z, torch.tensor([1, 7, 3, 0, 2]), ignore_index=7))
    with pytest.raises(UserError):
        f(z, y, reduction="avg")


def test_softmax_loss_is_cross_entropy():
    z = _x((6, 10), 2.0, seed=19)
    y = torch.randint(0, 10, (6,), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(softmax_loss(z, y), F.cross_entropy(z, y))
    q = torch.softmax(_x((6, 10), 1.0, seed=20), -1)
    entropy = -(q * q.log()).sum(-1).mean()
    torch.testing.assert_close(softmax_loss(z, q), F.cross_entropy(z, q) - entropy)
    torch.testing.assert_close(softmax_loss(z, y, label_smoothing=0.1),
                               F.cross_entropy(z, y, label_smoothing=0.1) - _entropy_smoothed(0.1, 10))


def _entropy_smoothed(eps, K):
    hi, lo = 1 - eps + eps / K, eps / K
    return -(hi * math.log(hi) + (K - 1) * lo * math.log(lo))


@pytest.mark.parametrize("name", list(LOSSES))
def test_label_smoothing_equals_dense_smoothed_target(name):
    f = LOSSES[name]
    z = _x((4, 8), 2.0, seed=21)
    z[0, 2] = NEG_INF
    y = torch.tensor([1, 2, 7, 0])
    finite = torch.isfinite(z).to(z.dtype)
    q = 0.8 * F.one_hot(y, 8).to(z.dtype) + 0.2 * finite / finite.sum(-1, keepdim=True)
    torch.testing.assert_close(f(z, y, label_smoothing=0.2, reduction="none"), f(z, q, reduction="none"))
    assert torch.isfinite(f(z, y, label_smoothing=0.2)).all()


@pytest.mark.parametrize("name", list(LOSSES))
def test_neg_inf_logits(name):
    f = LOSSES[name]
    z = _x((3, 6), 2.0, seed=22)
    z[:, 4] = NEG_INF
    y = torch.tensor([0, 1, 5])
    zr = z.clone().requires_grad_()
    loss = f(zr, y)
    g, = torch.autograd.grad(loss, zr)
    assert torch.isfinite(loss) and torch.isfinite(g).all() and (g[:, 4] == 0).all()
    # a target on a masked class is impossible: +inf like cross-entropy, gradient still finite
    bad = f(z, torch.tensor([4, 1, 5]), reduction="none")
    assert bad[0] == float("inf") and torch.isfinite(bad[1:]).all()


def test_loss_backward_saves_no_logits_copy():
    z = _x((4, 50), 2.0, seed=24).requires_grad_()
    y = torch.tensor([1, 2, 3, 4])
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        sparsemax_loss(z, y)
    big = [t for t in saved if t.numel() >= z.numel()]
    assert len(big) == 1  # only p - q


# ------------------------------------------------------------------------------- dtypes, amp, compile
@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 1e-2), (torch.float16, 2e-3)])
@pytest.mark.parametrize("K", [10, 300])
def test_half_precision_agrees_with_fp32(dtype, tol, K):
    x32 = _x((8, K), 2.0, seed=25, dtype=torch.float32)
    xh = x32.to(dtype)
    for name, f in MAPPINGS.items():
        ph = f(xh)
        assert ph.dtype == dtype
        torch.testing.assert_close(ph.float(), f(xh.float()), atol=tol, rtol=0)
        torch.testing.assert_close(ph.float().sum(-1), torch.ones(8), atol=tol * 2, rtol=0)
        xr = xh.clone().requires_grad_()
        g, = torch.autograd.grad(f(xr).float().pow(2).sum(), xr)
        assert g.dtype == dtype and torch.isfinite(g.float()).all()
    y = torch.arange(8) % K
    for f in LOSSES.values():
        torch.testing.assert_close(f(xh, y).float(), f(xh.float(), y), atol=tol * 5, rtol=tol)


def test_autocast_bf16():
    lin = torch.nn.Linear(16, 20)
    x = torch.randn(6, 16)
    y = torch.randint(0, 20, (6,))
    for name in HEAD_NAMES:
        head = OutputHead(name, alpha=1.3, learn_alpha=name == "entmax_bisect")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = lin(x)
            p = head(logits)
            loss = head.loss(logits, y)
        assert p.dtype == logits.dtype and torch.isfinite(loss)
        loss.backward()
        assert torch.isfinite(lin.weight.grad).all()
        lin.zero_grad()


def test_torch_compile_fullgraph_no_graph_breaks():
    a = torch.tensor(1.3, requires_grad=True)

    def fn(x, y):
        return (sparsemax(x).sum() + (entmax15(x) ** 2).sum() + (entmax_bisect(x, a) ** 2).sum()
                + sparsemax_loss(x, y) + entmax_bisect_loss(x, y, a) + softmax(x)[:, 0].sum())

    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    x = torch.randn(4, 12, requires_grad=True)
    y = torch.randint(0, 12, (4,))
    out = compiled(x, y)
    out.backward()
    gx, ga = x.grad.clone(), a.grad.clone()
    x.grad = None
    a.grad = None
    ref = fn(x, y)
    ref.backward()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gx, x.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ga, a.grad, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------- OutputHead
def test_output_head_names_and_errors():
    assert HEAD_NAMES[:4] == ("softmax", "sparsemax", "entmax15", "entmax_bisect")  # + the heads of test_new_heads.py
    with pytest.raises(UserError, match="softmax, sparsemax, entmax15, entmax_bisect"):
        OutputHead("sparsmax")
    with pytest.raises(UserError):
        OutputHead("softmax", learn_alpha=True)
    with pytest.raises(UserError):
        OutputHead("entmax_bisect", alpha=2.5)
    with pytest.raises(UserError):
        OutputHead("entmax_bisect", alpha=2.0, learn_alpha=True)
    for name, alpha in [("softmax", 1.0), ("sparsemax", 2.0), ("entmax15", 1.5)]:
        h = OutputHead(name)
        assert h.name == name and float(h.alpha) == alpha and len(list(h.parameters())) == 0
    assert float(OutputHead("entmax_bisect", alpha=1.25).alpha) == 1.25


def test_output_head_forward_loss_support():
    z = _x((5, 12), 2.0, seed=26, dtype=torch.float32)
    y = torch.randint(0, 12, (5,), generator=torch.Generator().manual_seed(3))
    for name, f, lf in [("softmax", softmax, softmax_loss), ("sparsemax", sparsemax, sparsemax_loss),
                        ("entmax15", entmax15, entmax15_loss)]:
        h = OutputHead(name)
        p = h(z)
        torch.testing.assert_close(p, f(z))
        torch.testing.assert_close(h.loss(z, y, label_smoothing=0.1), lf(z, y, label_smoothing=0.1))
        assert h.support_size(p).dtype == torch.long and torch.equal(h.support_size(p), (p > 0).sum(-1))
    assert (OutputHead("softmax").support_size(softmax(z)) == 12).all()
    assert (OutputHead("sparsemax").support_size(sparsemax(z)) < 12).any()
    h = OutputHead("entmax_bisect", alpha=1.3)
    torch.testing.assert_close(h(z), entmax_bisect(z, 1.3))
    q = torch.softmax(z, -1)
    torch.testing.assert_close(h.loss(z, q), entmax_bisect_loss(z, q, 1.3))


def test_learned_alpha():
    h = OutputHead("entmax_bisect", alpha=1.3, learn_alpha=True)
    assert [n for n, _ in h.named_parameters()] == ["alpha_logit"]
    assert "alpha_logit" in h.state_dict()
    torch.testing.assert_close(h.alpha.detach(), torch.tensor(1.3))
    z = _x((6, 15), 2.0, seed=27, dtype=torch.float32)
    y = torch.randint(0, 15, (6,), generator=torch.Generator().manual_seed(4))
    h.loss(z, y).backward()
    assert h.alpha_logit.grad is not None and torch.isfinite(h.alpha_logit.grad)
    h.zero_grad()
    h(z).pow(2).sum().backward()
    assert torch.isfinite(h.alpha_logit.grad)
    with torch.no_grad():  # alpha stays in (1, 2) by construction
        h.alpha_logit.fill_(50.0)
        assert 1.0 < float(h.alpha) <= 2.0
        h.alpha_logit.fill_(-50.0)
        assert 1.0 <= float(h.alpha) < 2.0
        assert torch.isfinite(h(z)).all() and torch.isfinite(h.loss(z, y))


# ------------------------------------------------------------------------------- device path
# The fixed-shape path that GPUs and torch.compile take (models/thresholds_device.py), forced on
# CPU tensors: the same values and gradients as the CPU path, the float64 references and the
# `entmax` package. tests/test_no_sync.py proves that it never reads on the host.
from models import mappings, thresholds_cpu  # noqa: E402
from models.mappings import THRESHOLD_PATHS, set_threshold_path, threshold_path, uses_device_path  # noqa: E402


def _ref_on_finite(ref, x):
    """A numpy reference applied row by row to the finite entries (zeros elsewhere)."""
    out = np.zeros(tuple(x.shape))
    for i, row in enumerate(x.numpy()):
        keep = np.isfinite(row)
        if keep.any():
            out[i, keep] = ref(row[keep][None])[0]
    return out


def _both_paths(fn, *args):
    with threshold_path("cpu"):
        cpu = fn(*args)
    with threshold_path("device"):
        dev = fn(*args)
    return cpu, dev


@pytest.mark.parametrize("K", [2, 7, 17, 100, 1000, 5000])
def test_device_path_matches_references_and_cpu_path(K):
    x = _x((6, K), 2.0, seed=40 + K)
    x[1, : K // 2] = NEG_INF
    x[2] = NEG_INF
    w = _x((6, K), 1.0, seed=41)
    with threshold_path("device"):
        np.testing.assert_allclose(sparsemax(x).numpy(), _ref_on_finite(ref_sparsemax, x), atol=1e-12)
        for alpha in (1.05, 1.3, 1.5, 1.95):
            ref = _ref_on_finite(lambda v: ref_entmax(v, alpha), x)
            np.testing.assert_allclose(entmax_bisect(x, alpha).numpy(), ref, atol=1e-10)
            np.testing.assert_allclose(entmax_bisect(x, torch.full((6, 1), alpha, dtype=x.dtype)).numpy(),
                                       ref, atol=1e-10)
        np.testing.assert_allclose(entmax15(x).numpy(), _ref_on_finite(lambda v: ref_entmax(v, 1.5), x), atol=1e-12)
    for name, f in MAPPINGS.items():
        def value_and_grad(v):
            v = v.clone().requires_grad_()
            p = f(v)
            return p, torch.autograd.grad((p * w).sum(), v)[0]
        (p_cpu, g_cpu), (p_dev, g_dev) = _both_paths(value_and_grad, x)
        torch.testing.assert_close(p_dev, p_cpu, atol=1e-12, rtol=0, msg=name)
        torch.testing.assert_close(g_dev, g_cpu, atol=1e-10, rtol=0, msg=name)


@pytest.mark.parametrize("K", [10, 500, 6000])
def test_device_path_matches_entmax_package(K):
    with threshold_path("device"):
        test_values_and_gradients_match_entmax_package(K)
        test_alpha_gradient_matches_entmax_package()


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("K", [6, 300, 2000])
def test_device_path_losses_match_cpu_path(name, K):
    f = LOSSES[name]
    z = _x((5, K), 2.0, seed=42 + K)
    z[0, : K // 2] = NEG_INF
    y = torch.tensor([K - 1, 1, -100, 0, 2])
    q = torch.softmax(_x((5, K), 1.0, seed=43), -1) * torch.isfinite(z)
    q = q / q.sum(-1, keepdim=True)
    for target, kw in [(y, {}), (y, {"label_smoothing": 0.2}), (q, {}), (q, {"reduction": "none"})]:
        def value_and_grad(v):
            v = v.clone().requires_grad_()
            loss = f(v, target, **kw)
            return loss, torch.autograd.grad(loss.sum(), v)[0]
        (l_cpu, g_cpu), (l_dev, g_dev) = _both_paths(value_and_grad, z)
        torch.testing.assert_close(l_dev, l_cpu, atol=1e-10, rtol=1e-12)
        torch.testing.assert_close(g_dev, g_cpu, atol=1e-10, rtol=0)


def test_device_path_alpha_gradients_match_cpu_path():
    x = _x((4, 300), 1.5, seed=44)
    x[3] = NEG_INF
    y = torch.tensor([0, 5, 299, 7])
    w = _x((4, 300), 1.0, seed=45)
    for alpha in (torch.tensor(1.4), torch.tensor([[1.2], [1.0], [1.7], [1.5]]), torch.tensor([1.3, 1.6, 1.0005, 1.9])):
        alpha = alpha.double()

        def grads(a):
            a = a.clone().requires_grad_()
            if a.dim() == 1:
                return torch.autograd.grad(entmax_bisect_loss(x, y, a, reduction="sum"), a)[0]
            g_map = torch.autograd.grad((entmax_bisect(x, a) * w).sum(), a)[0]
            g_loss = torch.autograd.grad(entmax_bisect_loss(x, y, a.reshape(-1) if a.dim() else a), a)[0]
            return g_map, g_loss
        cpu, dev = _both_paths(grads, alpha)
        torch.testing.assert_close(dev, cpu, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("name", list(MAPPINGS))
def test_device_path_gradcheck(name):
    x = _x((2, 5, 3), 1.5, seed=46).requires_grad_()
    with threshold_path("device"):
        assert torch.autograd.gradcheck(lambda v: MAPPINGS[name](v, 1), (x,))
        if name in LOSSES:
            z = _x((4, 7), 1.5, seed=47).requires_grad_()
            y = torch.tensor([0, 3, -100, 2])
            assert torch.autograd.gradcheck(lambda v: LOSSES[name](v, y, label_smoothing=0.1), (z,))
    a = torch.tensor([[1.2], [1.5], [1.8]], dtype=torch.float64, requires_grad=True)
    xa = _x((3, 6), 1.5, seed=48).requires_grad_()
    with threshold_path("device"):
        assert torch.autograd.gradcheck(lambda v, t: entmax_bisect(v, t), (xa, a))
        y3 = torch.tensor([1, 2, 3])
        assert torch.autograd.gradcheck(lambda v, t: entmax_bisect_loss(v, y3, t.view(-1)), (xa, a))


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=logit_batches(), name=st.sampled_from(list(MAPPINGS)))
def test_device_path_agrees_on_adversarial_rows(x, name):
    (p_cpu, p_dev) = _both_paths(MAPPINGS[name], x)
    torch.testing.assert_close(p_dev, p_cpu, atol=1e-9, rtol=0)


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 1e-2), (torch.float16, 2e-3)])
def test_device_path_half_precision(dtype, tol):
    x32 = _x((8, 300), 2.0, seed=49, dtype=torch.float32)
    y = torch.arange(8) * 7
    with threshold_path("device"):
        for f in MAPPINGS.values():
            xr = x32.to(dtype).requires_grad_()
            p = f(xr)
            assert p.dtype == dtype
            torch.testing.assert_close(p.float(), f(x32.to(dtype).float()), atol=tol, rtol=0)
            g, = torch.autograd.grad(p.float().pow(2).sum(), xr)
            assert g.dtype == dtype and torch.isfinite(g.float()).all()
        for f in LOSSES.values():
            torch.testing.assert_close(f(x32.to(dtype), y).float(), f(x32.to(dtype).float(), y), atol=tol * 5, rtol=tol)


def test_device_path_any_dim():
    x = _x((3, 9, 4), 2.0, seed=50)
    a = torch.tensor([[[1.3, 1.6, 1.9, 1.2]], [[1.4, 1.5, 1.1, 1.8]], [[1.7, 1.3, 1.5, 1.05]]], dtype=x.dtype)
    with threshold_path("device"):
        for f in MAPPINGS.values():
            torch.testing.assert_close(f(x, 1), f(x.transpose(1, 2), -1).transpose(1, 2), atol=1e-12, rtol=0)
        torch.testing.assert_close(entmax_bisect(x, a, dim=1),
                                   entmax_bisect(x.transpose(1, 2), a.transpose(1, 2), dim=-1).transpose(1, 2),
                                   atol=1e-12, rtol=0)


def test_device_path_compiles_fullgraph_with_autograd():
    # aot_eager traces forward and backward with fake tensors: a host read or data-dependent
    # shape anywhere in either would break the graph (inductor on CPU works too, but takes ~1 min).
    a = torch.tensor(1.3, requires_grad=True)

    def fn(x, y, q):
        return (sparsemax(x).pow(2).sum() + entmax15(x).pow(2).sum() + entmax_bisect(x, a).pow(2).sum()
                + entmax_bisect(x, 1.7).pow(2).sum() + sparsemax_loss(x, y) + entmax15_loss(x, q)
                + entmax_bisect_loss(x, y, a, label_smoothing=0.1) + softmax_loss(x, y))

    x = torch.randn(4, 12)
    x[1, :5] = NEG_INF
    y = torch.tensor([0, 7, -100, 11])
    q = torch.softmax(torch.randn(4, 12), -1)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    xc = x.clone().requires_grad_()
    compiled(xc, y, q).backward()
    gx, ga = xc.grad, a.grad.clone()
    a.grad = None
    xr = x.clone().requires_grad_()
    with threshold_path("device"):
        fn(xr, y, q).backward()
    torch.testing.assert_close(gx, xr.grad, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ga, a.grad, atol=1e-5, rtol=1e-5)


def test_auto_path_picks_by_device_and_meta_tensors_run_it():
    assert mappings._threshold_path == "auto"
    assert not uses_device_path(torch.zeros(2))
    meta = torch.zeros(4, 30, device="meta")
    assert uses_device_path(meta)
    # Meta tensors have no values: any host read would raise. Every head runs on them.
    x = torch.empty(4, 30, device="meta", requires_grad=True)
    y = torch.zeros(4, dtype=torch.long, device="meta")
    a = torch.empty(4, 1, device="meta", requires_grad=True)
    for out in (softmax(x), sparsemax(x), entmax15(x), entmax_bisect(x, 1.3), entmax_bisect(x, a)):
        assert out.shape == (4, 30) and out.device.type == "meta"
        out.sum().backward()
    for f in LOSSES.values():
        loss = f(x, y, label_smoothing=0.1)
        assert loss.device.type == "meta"
        loss.backward()
    entmax_bisect_loss(x, y, a.view(-1)).backward()
    assert x.grad.shape == x.shape and a.grad.shape == a.shape


def test_threshold_path_errors_and_restore():
    with pytest.raises(UserError, match="auto, device, cpu"):
        set_threshold_path("gpu")
    with pytest.raises(UserError):
        with threshold_path("GPU"):
            pass
    assert THRESHOLD_PATHS == ("auto", "device", "cpu")
    with pytest.raises(RuntimeError):
        with threshold_path("device"):
            assert mappings._threshold_path == "device"
            raise RuntimeError("boom")
    assert mappings._threshold_path == "auto"
    # forcing the CPU path where it would sync (a non-CPU tensor) or cannot compile: one line
    with threshold_path("cpu"):
        with pytest.raises(UserError, match="'cpu'.*meta"):
            sparsemax(torch.zeros(2, 5, device="meta"))
        # fullgraph=True wraps the UserError in dynamo's "Observed exception", message included
        with pytest.raises((UserError, RuntimeError), match="cannot be compiled"):
            torch.compile(lambda v: sparsemax(v), fullgraph=True, backend="eager")(torch.randn(2, 5))
        with pytest.raises(UserError, match="cannot be compiled"):
            torch.compile(lambda v: sparsemax(v) * 2, backend="eager")(torch.randn(2, 5))
    for bad in (0, -3, 2.5, True, "12"):
        with pytest.raises(UserError, match="n_iter"):
            entmax_bisect(_x((2, 5)), 1.3, n_iter=bad)
        with pytest.raises(UserError, match="n_iter"):
            entmax_bisect_loss(_x((2, 5)), torch.tensor([0, 1]), 1.3, n_iter=bad)


def test_cpu_path_runs_small_work_on_one_thread(monkeypatch):
    seen = []
    original = thresholds_cpu.michelot_tau

    def spy(c):
        seen.append(torch.get_num_threads())
        return original(c)

    monkeypatch.setattr(thresholds_cpu, "michelot_tau", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = _x((8, 100), 2.0, seed=51).requires_grad_()
        sparsemax(x).sum().backward()
        sparsemax_loss(x, torch.arange(8))
        assert seen == [1, 1]
        assert torch.get_num_threads() == 2  # restored
        monkeypatch.setattr(thresholds_cpu, "SERIAL_MAX_NUMEL", 10)
        with thresholds_cpu.one_thread_below(x.numel(), limit=10):
            assert torch.get_num_threads() == 2  # large work keeps the caller's threads
    finally:
        torch.set_num_threads(before)
