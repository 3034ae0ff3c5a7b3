"""The heads from the wider literature: normmax, sparse_softmax (top-k), taylor_softmax, am_softmax.

References are independent float64 computations written here (numpy bisection, sorting, the
polynomial and the AM-softmax formula spelled out); the `entmax` package's normmax_bisect and
NormmaxBisectLoss are the oracle for normmax.
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from common.errors import UserError
from configs import config_from_dict
from models import create_classifier
from models.am_softmax import CosineLinear, am_softmax_loss
from models.heads import HEAD_NAMES, OutputHead
from models.normmax import normmax, normmax_loss
from models.taylor_softmax import taylor_softmax, taylor_softmax_loss
from models.topk_softmax import topk_softmax, topk_softmax_loss
from training.optim import build_optimizer

entmax_pkg = pytest.importorskip("entmax")

NEW_HEADS = ("normmax", "sparse_softmax", "taylor_softmax", "am_softmax")
NEG_INF = float("-inf")


def _x(shape, scale=2.0, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype) * scale


def _y(n, k, seed=1):
    return torch.randint(0, k, (n,), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------- references
def ref_normmax(x, gamma):
    """gamma-normmax by 200 float64 bisection steps on sum [x - tau]_+^(gamma/(gamma-1)) = 1."""
    x = np.asarray(x, dtype=np.float64)
    out = np.zeros_like(x)
    for i, row in enumerate(x.reshape(-1, x.shape[-1])):
        lo, hi = row.max() - 1.0, row.max()
        for _ in range(200):
            mid = (lo + hi) / 2
            if (np.maximum(row - mid, 0) ** (gamma / (gamma - 1))).sum() >= 1:
                lo = mid
            else:
                hi = mid
        u = np.maximum(row - lo, 0) ** (1 / (gamma - 1))
        out.reshape(-1, x.shape[-1])[i] = u / u.sum()
    return out


def ref_topk_softmax(x, k):
    x = np.asarray(x, dtype=np.float64)
    out = np.zeros_like(x)
    for i, row in enumerate(x.reshape(-1, x.shape[-1])):
        keep = np.argsort(-row, kind="stable")[:k]
        e = np.exp(row[keep] - row[keep].max())
        out.reshape(-1, x.shape[-1])[i, keep] = e / e.sum()
    return out


def ref_taylor(x, order):
    x = np.asarray(x, dtype=np.float64)
    f = sum(x ** j / math.factorial(j) for j in range(order + 1))
    return f / f.sum(-1, keepdims=True)


def ref_am_softmax_loss(feats, weight, y, s, m):
    """-log(e^{s(cos_y - m)} / (e^{s(cos_y - m)} + sum_{j != y} e^{s cos_j})), float64 numpy."""
    f = feats / np.linalg.norm(feats, axis=1, keepdims=True)
    w = weight / np.linalg.norm(weight, axis=1, keepdims=True)
    cos = f @ w.T
    out = []
    for i, t in enumerate(y):
        logits = s * cos[i].copy()
        logits[t] -= s * m
        out.append(np.log(np.exp(logits - logits.max()).sum()) + logits.max() - logits[t])
    return np.array(out)


MAPPINGS = {
    "normmax": lambda x, dim=-1: normmax(x, 2.0, dim),
    "normmax_g1.5": lambda x, dim=-1: normmax(x, 1.5, dim),
    "normmax_g3": lambda x, dim=-1: normmax(x, 3.0, dim),
    "sparse_softmax": lambda x, dim=-1: topk_softmax(x, 3, dim),
    "taylor_softmax": lambda x, dim=-1: taylor_softmax(x, 2, dim),
    "taylor_4": lambda x, dim=-1: taylor_softmax(x, 4, dim),
}
LOSSES = {
    "normmax": lambda z, t, **kw: normmax_loss(z, t, 2.0, **kw),
    "normmax_g3": lambda z, t, **kw: normmax_loss(z, t, 3.0, **kw),
    "sparse_softmax": lambda z, t, **kw: topk_softmax_loss(z, t, 3, **kw),
    "taylor_softmax": lambda z, t, **kw: taylor_softmax_loss(z, t, 2, **kw),
    "am_softmax": lambda z, t, **kw: am_softmax_loss(z, t, 30.0, 0.35, **kw),
}


# ------------------------------------------------------------------------------- normmax
@pytest.mark.parametrize("K", [2, 7, 100, 3000])
@pytest.mark.parametrize("gamma", [1.25, 1.5, 2.0, 3.0, 6.0])
def test_normmax_matches_float64_bisection(K, gamma):
    x = _x((5, K), 3.0, seed=K)
    np.testing.assert_allclose(normmax(x, gamma).numpy(), ref_normmax(x.numpy(), gamma), atol=1e-11)


@pytest.mark.parametrize("gamma", [1.5, 2.0, 4.0])
def test_normmax_values_and_gradients_match_entmax_package(gamma):
    x = _x((8, 40), 2.0, seed=3).requires_grad_()
    w = _x((8, 40), 1.0, seed=4)
    p1, p2 = normmax(x, gamma), entmax_pkg.normmax_bisect(x, alpha=gamma, n_iter=80)
    torch.testing.assert_close(p1, p2, atol=1e-12, rtol=0)
    g1, = torch.autograd.grad((p1 * w).sum(), x)
    g2, = torch.autograd.grad((p2 * w).sum(), x)
    torch.testing.assert_close(g1, g2, atol=1e-9, rtol=1e-9)
    y = _y(8, 40)
    l1 = normmax_loss(x, y, gamma, reduction="none")
    l2 = entmax_pkg.normmax_bisect_loss(x, y, alpha=gamma, n_iter=80)
    torch.testing.assert_close(l1, l2, atol=1e-12, rtol=0)
    torch.testing.assert_close(normmax_loss(x, y, gamma), entmax_pkg.NormmaxBisectLoss(alpha=gamma, n_iter=80)(x, y),
                               atol=1e-12, rtol=0)
    g1, = torch.autograd.grad(l1.sum(), x)
    g2, = torch.autograd.grad(l2.sum(), x)
    torch.testing.assert_close(g1, g2, atol=1e-12, rtol=0)


def test_normmax_maximises_its_objective_and_gamma2_is_sqrt_of_entmax15():
    """Brute-force optimality: <z, p> - ||p||_gamma at our p beats 20000 random simplex points;
    and for gamma = 2 the KKT system is 1.5-entmax's at 2z: p = sqrt(entmax15(2z)) normalised."""
    torch.manual_seed(0)
    z = _x((1, 6), 1.5, seed=9)[0]
    gen = torch.Generator().manual_seed(0)
    for gamma in (1.5, 2.0, 3.0):
        p = normmax(z, gamma)
        best = (z * p).sum() - torch.linalg.vector_norm(p, ord=gamma)
        cand = torch.distributions.Dirichlet(torch.full((6,), 0.3, dtype=z.dtype)).sample((20000,))
        cand = cand[torch.randperm(20000, generator=gen)]
        vals = cand @ z - torch.linalg.vector_norm(cand, ord=gamma, dim=1)
        assert float(vals.max()) <= float(best) + 1e-12
    r = entmax_pkg.entmax15(2 * _x((4, 30), 1.0, seed=2)).sqrt()
    torch.testing.assert_close(normmax(_x((4, 30), 1.0, seed=2), 2.0), r / r.sum(-1, keepdim=True),
                               atol=1e-12, rtol=0)


# ------------------------------------------------------------------------------- references for the rest
@pytest.mark.parametrize("K,k", [(5, 1), (10, 3), (10, 10), (1000, 5)])
def test_topk_softmax_matches_reference_and_keeps_exactly_k(K, k):
    x = _x((6, K), 2.0, seed=K + k)
    p = topk_softmax(x, k)
    np.testing.assert_allclose(p.numpy(), ref_topk_softmax(x.numpy(), k), atol=1e-14)
    assert ((p > 0).sum(-1) == k).all()
    # the kept entries are the k largest: every kept logit >= every dropped one
    kept_min = torch.where(p > 0, x, torch.full_like(x, math.inf)).amin(-1)
    dropped_max = torch.where(p > 0, torch.full_like(x, -math.inf), x).amax(-1)
    assert (kept_min >= dropped_max).all()


def test_topk_softmax_ties_still_keep_exactly_k():
    x = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.0], [3.0, 3.0, 3.0, 3.0, 3.0]], dtype=torch.float64)
    p = topk_softmax(x, 2)
    assert (p > 0).sum(-1).tolist() == [2, 2]
    torch.testing.assert_close(p.sum(-1), torch.ones(2, dtype=x.dtype))
    assert torch.all(p[0, [0, 4]] == 0) and torch.allclose(p[p > 0], torch.full((4,), 0.5, dtype=x.dtype))


def test_topk_softmax_loss_is_the_papers_formula():
    """logsumexp over the top k minus z_y: -log p_y inside the top k, finite and > 0 outside it."""
    x = _x((50, 12), 2.0, seed=5)
    y = _y(50, 12)
    loss = topk_softmax_loss(x, y, 4, reduction="none")
    top = x.topk(4, -1).values
    ref = torch.logsumexp(top, -1) - x.gather(1, y[:, None]).squeeze(1)
    torch.testing.assert_close(loss, ref, atol=1e-13, rtol=0)
    p = topk_softmax(x, 4)
    inside = p.gather(1, y[:, None]).squeeze(1) > 0
    assert inside.any() and (~inside).any()
    torch.testing.assert_close(loss[inside], -p.gather(1, y[:, None]).squeeze(1)[inside].log())
    assert torch.isfinite(loss).all() and (loss[~inside] > 0).all()


@pytest.mark.parametrize("order", [2, 4, 6])
def test_taylor_softmax_matches_polynomial_reference(order):
    x = _x((7, 13), 3.0, seed=order)
    np.testing.assert_allclose(taylor_softmax(x, order).numpy(), ref_taylor(x.numpy(), order), rtol=1e-13)
    y = _y(7, 13)
    ref = -np.log(ref_taylor(x.numpy(), order)[np.arange(7), y.numpy()])
    np.testing.assert_allclose(taylor_softmax_loss(x, y, order, reduction="none").numpy(), ref, rtol=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, allow_nan=False), min_size=1, max_size=12), st.sampled_from([2, 4, 6, 8]))
def test_taylor_softmax_is_positive_for_any_input(values, order):
    x = torch.tensor(values, dtype=torch.float32)
    p = taylor_softmax(x, order)
    assert torch.isfinite(p).all() and (p > 0).all()
    torch.testing.assert_close(p.sum(), torch.tensor(1.0), atol=1e-5, rtol=0)


def test_am_softmax_loss_matches_paper_formula_with_cosine_classifier():
    torch.manual_seed(0)
    feats = _x((9, 16), 1.0, seed=1)
    lin = CosineLinear(16, 7, scale=30.0).double()
    y = _y(9, 7)
    logits = lin(feats)
    assert logits.dtype == torch.float64 and float(logits.detach().abs().max()) <= 30.0 + 1e-9
    ref = ref_am_softmax_loss(feats.numpy(), lin.weight.detach().numpy(), y.numpy(), 30.0, 0.35)
    got = am_softmax_loss(logits, y, 30.0, 0.35, reduction="none")
    np.testing.assert_allclose(got.detach().numpy(), ref, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(am_softmax_loss(logits, y, 30.0, 0.0, reduction="none").detach().numpy(),
                               ref_am_softmax_loss(feats.numpy(), lin.weight.detach().numpy(), y.numpy(), 30.0, 0.0),
                               rtol=1e-12, atol=1e-13)
    # scale-invariant in features and weights: only directions matter
    torch.testing.assert_close(CosineLinear(16, 7, 30.0, weight=3 * lin.weight.detach()).double()(5 * feats), logits)


def test_am_softmax_margin_applies_in_training_mode_only():
    head = OutputHead("am_softmax", scale=30.0, margin=0.35)
    z = _x((20, 10), 8.0, seed=4)
    y = _y(20, 10)
    head.train()
    p_train, l_train = head(z), head.loss(z, y)
    head.eval()
    p_eval, l_eval = head(z), head.loss(z, y)
    # probabilities never include the margin: plain softmax of the logits in both modes
    torch.testing.assert_close(p_train, torch.softmax(z, -1), atol=1e-15, rtol=0)
    torch.testing.assert_close(p_eval, p_train, atol=0, rtol=0)
    # eval loss = plain cross-entropy; training loss = CE with s*m off the true logit (larger)
    torch.testing.assert_close(l_eval, F.cross_entropy(z, y))
    margin_z = z.clone()
    margin_z[torch.arange(20), y] -= 30.0 * 0.35
    torch.testing.assert_close(l_train, F.cross_entropy(margin_z, y))
    assert float(l_train) > float(l_eval) + 1.0


# ------------------------------------------------------------------------------- gradcheck
@pytest.mark.parametrize("name", list(MAPPINGS))
@pytest.mark.parametrize("dim", [-1, 0])
def test_mapping_gradcheck(name, dim):
    x = _x((4, 6), 1.5, seed=11).requires_grad_()
    assert torch.autograd.gradcheck(lambda v: MAPPINGS[name](v, dim), (x,), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("soft", [False, True])
def test_loss_gradcheck(name, soft):
    x = _x((5, 6), 1.5, seed=12).requires_grad_()
    if soft:
        t = torch.softmax(_x((5, 6), 1.0, seed=13), -1)
    else:
        t = _y(5, 6)
    assert torch.autograd.gradcheck(lambda v: LOSSES[name](v, t, reduction="none", label_smoothing=0.1),
                                    (x,), eps=1e-6, atol=1e-7)


# ------------------------------------------------------------------------------- properties
@pytest.mark.parametrize("name", list(MAPPINGS))
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_sums_to_one_along_any_dim(name, dim):
    x = _x((5, 7, 9), 2.0, seed=2, dtype=torch.float32)
    p = MAPPINGS[name](x, dim)
    torch.testing.assert_close(p.sum(dim), torch.ones(()).expand_as(p.sum(dim)), atol=1e-5, rtol=0)
    assert (p >= 0).all()
    torch.testing.assert_close(p, MAPPINGS[name](x.movedim(dim, -1)).movedim(-1, dim), atol=1e-6, rtol=0)


@pytest.mark.parametrize("gamma", [1.5, 2.0, 3.0])
def test_normmax_is_sparse_with_exact_zeros(gamma):
    x = _x((30, 50), 4.0, seed=6)
    p = normmax(x, gamma)
    ref = ref_normmax(x.numpy(), gamma)
    zero = torch.from_numpy(ref) == 0  # the float64 reference's zeros (strictly below tau)
    assert zero.sum() > 30 * 25  # a sparse head on spread logits
    assert (p[zero] == 0).all() and (p[~zero] > 0).all()
    # entries more than 1 below the max are always outside the support
    far = x < x.amax(-1, keepdim=True) - 1.0
    assert (p[far] == 0).all()


@pytest.mark.parametrize("name", list(LOSSES))
def test_loss_gradient_and_soft_targets(name):
    z = _x((6, 8), 2.0, seed=7).requires_grad_()
    y = _y(6, 8)
    onehot = F.one_hot(y, 8).double()
    # a one-hot probability row is the same target as its class index
    torch.testing.assert_close(LOSSES[name](z, onehot, reduction="none"), LOSSES[name](z, y, reduction="none"))
    # Mixup-style soft rows: finite, >= 0 and 0 at the head's own prediction (FY heads)
    lam = 0.7
    q = lam * onehot + (1 - lam) * onehot.roll(1, 0)
    loss = LOSSES[name](z, q, reduction="none")
    assert torch.isfinite(loss).all() and (loss >= 0).all()
    if name.startswith("normmax"):
        gamma = 3.0 if name == "normmax_g3" else 2.0
        p = normmax(z.detach(), gamma)
        g, = torch.autograd.grad(loss.sum(), z)
        torch.testing.assert_close(g, p - q, atol=1e-12, rtol=0)  # gradient p - q
        torch.testing.assert_close(LOSSES[name](z.detach(), p, reduction="none"), torch.zeros(6, dtype=z.dtype),
                                   atol=1e-12, rtol=0)
    if name == "sparse_softmax":
        g, = torch.autograd.grad(loss.sum(), z)
        torch.testing.assert_close(g, topk_softmax(z.detach(), 3) - q, atol=1e-14, rtol=0)


def test_topk_logits_outside_the_top_k_get_no_gradient():
    z = _x((4, 10), 2.0, seed=8).requires_grad_()
    p = topk_softmax(z, 3)
    g, = torch.autograd.grad((p * _x((4, 10), 1.0, seed=9)).sum(), z)
    assert (g[p == 0] == 0).all() and (g[p > 0] != 0).any()
    # through the loss, only the target class (target mass -1) gets a gradient outside the top k
    y = torch.where(p == 0)[1].reshape(4, -1)[:, 0]  # a class outside the top k per row
    g, = torch.autograd.grad(topk_softmax_loss(z, y, 3, reduction="sum"), z)
    outside = (p == 0)
    outside[torch.arange(4), y] = False
    assert (g[outside] == 0).all() and (g[torch.arange(4), y] == -1).all()


def test_taylor_gradient_matches_autograd_of_log_formula():
    z = _x((5, 9), 2.0, seed=10).requires_grad_()
    q = torch.softmax(_x((5, 9), 1.0, seed=11), -1)
    g, = torch.autograd.grad(taylor_softmax_loss(z, q, 4, reduction="sum"), z)
    z2 = z.detach().clone().requires_grad_()
    f = sum(z2 ** j / math.factorial(j) for j in range(5))
    ref = (q * q.log()).sum() - (q * (f / f.sum(-1, keepdim=True)).log()).sum()
    g2, = torch.autograd.grad(ref, z2)
    torch.testing.assert_close(g, g2, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", list(MAPPINGS))
def test_minus_inf_masks(name):
    x = _x((3, 8), 2.0, seed=3)
    x[0, [1, 5]] = NEG_INF
    x[2] = NEG_INF  # a fully masked row
    x.requires_grad_()
    p = MAPPINGS[name](x)
    assert not torch.isnan(p).any()
    assert (p[0, [1, 5]] == 0).all() and (p[2] == 0).all()
    torch.testing.assert_close(p[:2].sum(-1), torch.ones(2, dtype=x.dtype))
    # masked logits do not influence the others
    torch.testing.assert_close(p[0, [0, 2, 3, 4, 6, 7]], MAPPINGS[name](x.detach()[0, [0, 2, 3, 4, 6, 7]]))
    g, = torch.autograd.grad((p * _x((3, 8), 1.0, seed=4)).sum(), x)
    assert torch.isfinite(g).all() and (g[0, [1, 5]] == 0).all() and (g[2] == 0).all()


@pytest.mark.parametrize("name", list(LOSSES))
def test_minus_inf_masks_in_the_loss(name):
    z = _x((3, 8), 2.0, seed=5)
    z[:, 6:] = NEG_INF
    z.requires_grad_()
    y = torch.tensor([0, 3, 7])  # the last target is a masked class: impossible, +inf like CE
    loss = LOSSES[name](z, y, reduction="none", label_smoothing=0.1)
    assert torch.isfinite(loss[:2]).all() and loss[2] == math.inf
    g, = torch.autograd.grad(loss[:2].sum(), z)
    assert torch.isfinite(g).all() and (g[:, 6:] == 0).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(MAPPINGS))
def test_half_precision_inputs_are_computed_in_fp32(name, dtype):
    x32 = _x((4, 20), 2.0, seed=6, dtype=torch.float32)
    x = x32.to(dtype).requires_grad_()
    p = MAPPINGS[name](x)
    assert p.dtype == dtype
    torch.testing.assert_close(p.float(), MAPPINGS[name](x.detach().float()), atol=1e-2, rtol=0)
    g, = torch.autograd.grad(p.float().pow(2).sum(), x)
    assert g.dtype == dtype and torch.isfinite(g).all()


@pytest.mark.parametrize("name", list(LOSSES))
def test_half_precision_losses(name):
    z32 = _x((4, 20), 2.0, seed=7, dtype=torch.float32)
    z = z32.to(torch.bfloat16).requires_grad_()
    y = _y(4, 20)
    loss = LOSSES[name](z, y)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, LOSSES[name](z.detach().float(), y), atol=1e-5, rtol=0)
    g, = torch.autograd.grad(loss, z)
    assert g.dtype == torch.bfloat16 and torch.isfinite(g.float()).all()


@pytest.mark.parametrize("name", list(LOSSES))
def test_ignore_index_reductions_and_leading_dims(name):
    z = _x((2, 3, 6), 2.0, seed=8)
    y = torch.tensor([[0, -100, 2], [5, 1, -100]])
    per = LOSSES[name](z, y, reduction="none")
    assert per.shape == (2, 3) and per[0, 1] == 0 and per[1, 2] == 0
    kept = y != -100
    torch.testing.assert_close(LOSSES[name](z, y), per[kept].mean())
    torch.testing.assert_close(LOSSES[name](z, y, reduction="sum"), per.sum())
    flat = LOSSES[name](z[kept], y[kept], reduction="none")
    torch.testing.assert_close(per[kept], flat)
    all_ignored = LOSSES[name](z, torch.full_like(y, -100))
    assert all_ignored == 0


# ------------------------------------------------------------------------------- no host reads
class _HostReads(TorchDispatchMode):
    """Records ops that read a tensor's value on the host (.item(), bool(), nonzero, ...)."""
    SYNCING = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.is_nonzero",
               "aten.equal", "aten.unique")

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if any(name.startswith(s) for s in self.SYNCING):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", NEW_HEADS)
@pytest.mark.parametrize("soft", [False, True])
def test_forward_and_backward_do_no_host_reads(name, soft):
    head = OutputHead(name, k=3)
    z = _x((6, 10), 2.0, seed=9, dtype=torch.float32)
    z[0, 4] = NEG_INF
    z.requires_grad_()
    y = torch.tensor([0, 1, 2, 3, -100, 9])
    t = torch.softmax(_x((6, 10), 1.0, seed=2, dtype=torch.float32), -1) if soft else y
    with _HostReads() as mode:
        p = head(z)
        loss = head.loss(z, t, label_smoothing=0.1)
        (loss + (p * p).sum()).backward()
    assert mode.seen == []
    assert torch.isfinite(z.grad).all()


def test_torch_compile_fullgraph_no_graph_breaks():
    heads = [OutputHead(name, k=3) for name in NEW_HEADS]

    def fn(x, y):
        return sum((h(x) ** 2).sum() + h.loss(x, y, label_smoothing=0.1) for h in heads)

    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    x = _x((4, 12), 2.0, seed=3, dtype=torch.float32).requires_grad_()
    y = _y(4, 12)
    out = compiled(x, y)
    gx, = torch.autograd.grad(out, x)
    ref = fn(x, y)
    g_ref, = torch.autograd.grad(ref, x)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gx, g_ref, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------- OutputHead, config, model
@pytest.mark.parametrize("name", NEW_HEADS)
def test_output_head_api_and_support(name):
    assert name in HEAD_NAMES
    head = OutputHead(name, k=3)
    z = _x((8, 10), 2.0, seed=1)
    p = head(z)
    torch.testing.assert_close(p.sum(-1), torch.ones(8, dtype=z.dtype))
    size = head.support_size(p)
    if name == "sparse_softmax":
        assert (size == 3).all()
    elif name == "normmax":
        assert (size < 10).any() and (size >= 1).all()
    else:
        assert (size == 10).all()
    assert torch.isfinite(head.loss(z, _y(8, 10))) and head.hparams()
    assert math.isnan(float(head.alpha))  # not an entmax head: eval.py reports it as null
    assert name in repr(head)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(name="normmax", gamma=1.0), "head.gamma"),
    (dict(name="normmax", gamma="two"), "head.gamma"),
    (dict(name="sparse_softmax", k=0), "head.k"),
    (dict(name="sparse_softmax", k=2.5), "head.k"),
    (dict(name="taylor_softmax", order=3), "head.order"),
    (dict(name="taylor_softmax", order=0), "head.order"),
    (dict(name="am_softmax", scale=0.0), "head.scale"),
    (dict(name="am_softmax", margin=-0.1), "head.margin"),
])
def test_bad_head_values_are_one_line_user_errors(kwargs, needle):
    with pytest.raises(UserError) as err:
        OutputHead(**kwargs)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_k_larger_than_the_classes_is_a_user_error_at_first_use():
    head = OutputHead("sparse_softmax", k=12)
    with pytest.raises(UserError, match="head.k=12 exceeds the number of classes"):
        head(torch.zeros(2, 10))
    with pytest.raises(UserError, match="head.k=12"):
        head.loss(torch.zeros(2, 10), torch.zeros(2, dtype=torch.long))


def _tiny_cfg(*overrides):
    from test_train_helpers import TINY, tiny_cfg
    assert TINY["data"]["image_size"] == 16
    return tiny_cfg("unused", *overrides)


@pytest.mark.parametrize("override,needle", [
    ("head.gamma=0.5", "head.gamma"), ("head.k=0", "head.k"), ("head.order=3", "head.order"),
    ("head.scale=-1", "head.scale"), ("head.margin=-0.2", "head.margin"), ("head.name=normax", "head.name"),
    ("head.gama=2", "head.gamma"),
])
def test_config_rejects_bad_head_values(override, needle):
    with pytest.raises(UserError) as err:
        _tiny_cfg(override)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_config_defaults_and_create_classifier_checks_k():
    cfg = config_from_dict({})
    assert (cfg.head.gamma, cfg.head.k, cfg.head.order, cfg.head.scale, cfg.head.margin) == (2.0, 5, 2, 30.0, 0.35)
    cfg = _tiny_cfg("head.name=sparse_softmax", "head.k=11")
    with pytest.raises(UserError, match="exceeds the number of classes"):
        create_classifier(cfg.model, cfg.head, 10, img_size=cfg.data.image_size)


@pytest.mark.parametrize("name", NEW_HEADS)
def test_create_classifier_and_one_training_step(name):
    torch.manual_seed(0)
    cfg = _tiny_cfg(f"head.name={name}", "head.k=3", "head.order=4")
    model = create_classifier(cfg.model, cfg.head, 10, img_size=cfg.data.image_size)
    assert isinstance(model.head, CosineLinear) == (name == "am_softmax")
    opt = build_optimizer(model, cfg.optim, global_batch=8)
    images = torch.randn(8, 3, 16, 16)
    target = torch.softmax(torch.randn(8, 10), -1)  # Mixup-like soft rows
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(images)
    loss = model.output_head.loss(logits.float(), target)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert model.head.weight.grad is not None and model.head.weight.grad.abs().sum() > 0
    opt.step()
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    model.eval()
    with torch.no_grad():
        logits = model(images)
        probs = model.output_head(logits)
    torch.testing.assert_close(probs.sum(-1), torch.ones(8))
    if name == "am_softmax":
        assert float(logits.abs().max()) <= cfg.head.scale + 1e-4
    # the weights reload strictly into a freshly built classifier of the same config
    again = create_classifier(cfg.model, cfg.head, 10, img_size=cfg.data.image_size)
    again.load_state_dict(model.state_dict(), strict=True)
