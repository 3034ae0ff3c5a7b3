"""k-subset SparseMAP (models/ksubset.py): the projection onto {mu in [0, 1]^N : sum mu = k} against
float64 references written from its definition (an exhaustive KKT search over active sets and
scipy's generic QP solver), on both threshold paths; its gradient, masks and limits; its
Fenchel-Young loss; and Hopfield pooling with it (weights, selection, TorchScript / fx)."""
import itertools

import numpy as np
import pytest
import torch

from common.errors import UserError
from models.hopfield_pool import HopfieldPooling
from models.ksubset import k_hot, ksubset, ksubset_loss
from models.mappings import threshold_path
from models.resmlp import create_resmlp

PATHS = ("cpu", "device")
entmax_pkg = pytest.importorskip("entmax")


def kkt_reference(theta, k):
    """Exhaustive: every split of the finite items into {0, free, 1}; the one whose threshold
    satisfies the KKT conditions of min 1/2 ||mu - theta||^2 over the polytope (numpy float64)."""
    theta = np.asarray(theta, dtype=np.float64)
    finite = np.isfinite(theta)
    best = None
    for labels in itertools.product((0, 1, 2), repeat=int(finite.sum())):  # 0: at 0, 1: free, 2: at 1
        lab = np.full(theta.size, 0)
        lab[finite] = labels
        free, ones = lab == 1, lab == 2
        if free.any():
            tau = (theta[free].sum() + ones.sum() - k) / free.sum()
        elif ones.sum() == k:
            lo = max(theta[finite & ~ones].max(initial=-np.inf), -np.inf)
            tau = lo  # any tau between the largest 0 and the smallest 1 - 1
        else:
            continue
        mu = np.where(ones, 1.0, np.where(free, theta - tau, 0.0))
        tol = 1e-9
        ok = (np.all(theta[lab == 0] <= tau + tol) and np.all(theta[ones] >= tau + 1 - tol)
              and np.all((mu[free] > -tol) & (mu[free] < 1 + tol)) and abs(mu.sum() - k) < 1e-9)
        if ok:
            best = mu
            break
    assert best is not None
    return best


def qp_reference(theta, k):
    """scipy's generic solver on min 1/2 ||mu - theta||^2, 0 <= mu <= 1, sum mu = k."""
    from scipy.optimize import minimize

    theta = np.asarray(theta, dtype=np.float64)
    res = minimize(lambda m: 0.5 * np.sum((m - theta) ** 2), np.full(theta.size, k / theta.size),
                   jac=lambda m: m - theta, bounds=[(0, 1)] * theta.size, method="SLSQP",
                   constraints=[{"type": "eq", "fun": lambda m: m.sum() - k, "jac": lambda m: np.ones_like(m)}],
                   options={"ftol": 1e-14, "maxiter": 500})
    assert res.status in (0, 8), res.message  # 8: no descent direction left (converged to rounding)
    return res.x


QP_X = torch.randn(3, 12, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 1.5
QP_KS = (1, 4, 12)


@pytest.fixture(scope="module")
def qp_solutions():
    return {k: np.stack([qp_reference(r.numpy(), k) for r in QP_X]) for k in QP_KS}


@pytest.mark.parametrize("path", PATHS)
def test_projection_against_the_exhaustive_kkt_search(path):
    g = torch.Generator().manual_seed(0)
    rows = [torch.randn(6, generator=g, dtype=torch.float64) * s for s in (0.3, 1.0, 3.0)]
    rows.append(torch.tensor([0.5, 0.5, 0.5, 0.2, 0.2, -1.0], dtype=torch.float64))  # ties
    rows.append(torch.tensor([1.0, float("-inf"), 0.3, float("-inf"), 0.9, 0.1], dtype=torch.float64))  # masked
    x = torch.stack(rows)
    for k in range(1, 5):
        with threshold_path(path):
            mu = ksubset(x, k)
        want = np.stack([kkt_reference(r.numpy(), k) for r in x])
        np.testing.assert_allclose(mu.numpy(), want, atol=1e-12, rtol=0)
        assert torch.equal(mu[4][torch.isinf(x[4])], torch.zeros(2, dtype=torch.float64))  # -inf: weight 0


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_projection_against_a_generic_qp_solver(path, dtype, qp_solutions):
    for k in QP_KS:
        with threshold_path(path):
            mu = ksubset(QP_X.to(dtype), k)
        assert mu.dtype == dtype
        np.testing.assert_allclose(mu.double().numpy(), qp_solutions[k], atol=1e-6, rtol=0)
        torch.testing.assert_close(mu.sum(-1), torch.full((3,), float(k), dtype=dtype), atol=1e-5, rtol=0)


@pytest.mark.parametrize("path", PATHS)
def test_huge_magnitudes_and_shifts(path):
    x = torch.randn(4, 10, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with threshold_path(path):
        base = ksubset(x, 3)
        torch.testing.assert_close(ksubset(x + 1e8, 3), base, atol=1e-7, rtol=0)  # shift-invariant
        big = ksubset(x * 1e30, 3)  # far apart: a k-hot row, the 3 largest
        f32 = ksubset((x * 1e30).float(), 3)
    top = torch.zeros_like(x).scatter_(1, x.topk(3, -1).indices, 1.0)
    assert torch.equal(big, top) and torch.equal(f32.double(), top)


@pytest.mark.parametrize("path", PATHS)
def test_k1_is_sparsemax_and_k_n_is_all_ones(path):
    x = torch.randn(5, 9, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    x[0, 2] = float("-inf")
    with threshold_path(path):
        torch.testing.assert_close(ksubset(x, 1), entmax_pkg.sparsemax(x, -1), atol=1e-12, rtol=0)
        assert torch.equal(ksubset(x[1:], 9), torch.ones(4, 9, dtype=torch.float64))


@pytest.mark.parametrize("path", PATHS)
def test_fewer_finite_scores_than_k_keep_them_all_with_zero_gradient(path):
    x = torch.tensor([[0.3, float("-inf"), -2.0, float("-inf")], [float("-inf")] * 4], requires_grad=True)
    with threshold_path(path):
        mu = ksubset(x, 3)
        mu.mul(torch.arange(4.0)).sum().backward()
    assert torch.equal(mu.detach(), torch.tensor([[1.0, 0, 1, 0], [0, 0, 0, 0]]))
    assert torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.parametrize("path", PATHS)
def test_gradcheck_and_the_free_coordinate_jacobian(path):
    x = torch.randn(3, 7, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 2
    with threshold_path(path):
        assert torch.autograd.gradcheck(lambda t: ksubset(t, 3), (x.clone().requires_grad_(),), eps=1e-7, atol=1e-7)
        assert torch.autograd.gradcheck(lambda t: ksubset(t, 2, dim=0), (x.clone().requires_grad_(),), eps=1e-7,
                                        atol=1e-7)
        xr = x[0].clone().requires_grad_()
        mu = ksubset(xr, 3)
        jac = torch.stack([torch.autograd.grad(mu[i], xr, retain_graph=True)[0] for i in range(7)])
    free = ((mu > 0) & (mu < 1)).double()
    want = (torch.diag(free) - torch.outer(free, free) / free.sum())
    torch.testing.assert_close(jac, want, atol=1e-12, rtol=0)


def test_bad_k_is_one_line():
    for k in (0, 8, 1.5, True):
        with pytest.raises(UserError, match=r"k must be an integer in \[1, 7\]"):
            ksubset(torch.randn(2, 7), k)


# ------------------------------------------------------------------------------- the loss
@pytest.mark.parametrize("path", PATHS)
def test_loss_is_zero_at_its_own_prediction_and_its_gradient_is_mu_minus_y(path):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    with threshold_path(path):
        mu = ksubset(x, 3)
        torch.testing.assert_close(ksubset_loss(x, mu, 3, reduction="none"), torch.zeros(4, dtype=torch.float64),
                                   atol=1e-12, rtol=0)
        idx = torch.tensor([[0, 1, 2], [3, 4, 5], [5, 6, 7], [0, 4, 7]])
        y = k_hot(idx, 8, torch.float64)
        xr = x.clone().requires_grad_()
        loss = ksubset_loss(xr, idx, 3, reduction="sum")
        loss.backward()
        torch.testing.assert_close(xr.grad, mu - y, atol=1e-12, rtol=0)
        torch.testing.assert_close(ksubset_loss(x, y, 3), loss / 4, atol=1e-12, rtol=0)  # indices = k-hot rows
        frac = 0.5 * y + 0.5 * k_hot(torch.tensor([[5, 6, 7]] * 4), 8, torch.float64)  # fractional, in M_k
        lf = ksubset_loss(x + 100.0, frac, 3, reduction="none")
    # the definition, in numpy: 1/2||y||^2 - 1/2||mu||^2 + <theta, mu - y> (>= 0), shift-invariant on M_k
    xn, mn, fn = x.numpy(), mu.numpy(), frac.numpy()
    want = 0.5 * (fn ** 2).sum(1) - 0.5 * (mn ** 2).sum(1) + (xn * (mn - fn)).sum(1)
    np.testing.assert_allclose(lf.numpy(), want, atol=1e-10)
    assert (lf > 0).all() and float(loss.detach()) > 0


def test_loss_refuses_targets_outside_the_polytope():
    x = torch.randn(2, 5)
    for bad in (torch.ones(2, 5), torch.full((2, 5), 0.3)):
        with pytest.raises(UserError, match="k-subset polytope"):
            ksubset_loss(x, bad, 2)
    with pytest.raises(UserError, match="shape"):
        ksubset_loss(x, torch.zeros(2, 3, dtype=torch.long), 2)


# ------------------------------------------------------------------------------- pooling
def test_pooling_weights_sum_to_k_in_unit_range_and_pool_x_mu_over_k():
    pool = HopfieldPooling(8, heads=2, mapping="ksubset", beta=3.0, k=5)
    with torch.no_grad():
        pool.query.normal_(0, 1, generator=torch.Generator().manual_seed(7))
        x = torch.randn(3, 16, 8, generator=torch.Generator().manual_seed(8))
        w = pool.weights(x)
        mu = w * 5
        assert ((mu >= 0) & (mu <= 1 + 1e-6)).all()
        torch.testing.assert_close(mu.sum(-1), torch.full((3, 2), 5.0), atol=1e-5, rtol=0)
        xh = x.double().view(3, 16, 2, 4)
        want = torch.einsum("bhn,bnhc->bhc", mu.double(), xh).reshape(3, 8) / 5
        torch.testing.assert_close(pool(x).double(), want, atol=1e-5, rtol=1e-5)


def test_well_separated_scores_select_exactly_k_patches():
    pool = HopfieldPooling(8, mapping="ksubset", beta=1.0, k=3)
    with torch.no_grad():
        pool.query.copy_(torch.ones(1, 8))
        x = 0.05 * torch.randn(2, 16, 8, generator=torch.Generator().manual_seed(9))
        x[:, [2, 9, 11]] += 2.0
        w = pool.weights(x) * 3
    want = torch.zeros(2, 1, 16)
    want[:, :, [2, 9, 11]] = 1.0
    assert torch.equal(w, want)


def test_ksubset_pooled_model_uses_at_least_k_patches_and_trains():
    # TorchScript, fx, every norm, gradients and the sync guard: tests/test_hopfield_pool.py (all pool mappings)
    model = create_resmlp("resmlp_tiny", num_classes=5, depth=2, embed_dim=16, global_pool="hopfield",
                          pool_mapping="ksubset", pool_k=6).eval()
    with torch.no_grad():
        model.pool.query.normal_(0, 2, generator=torch.Generator().manual_seed(10))
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        support = (model.pooling_weights(x) > 0).sum(-1)
    assert (support >= 6).all()
    model.train()(x).sum().backward()
    assert model.pool.query.grad.abs().sum() > 0


def test_pool_k_is_required_by_ksubset_and_refused_elsewhere():
    from configs.loader import config_from_dict
    from models import create_classifier

    cfg = config_from_dict({"model": {"pool": "hopfield", "pool_mapping": "ksubset", "pool_k": 5}})
    assert create_classifier(cfg.model, cfg.head, 10, img_size=32).pool.k == 5
    for bad, match in (({"pool_mapping": "ksubset"}, "set model.pool_k"),
                       ({"pool_k": 3}, "read by model.pool_mapping ksubset only"),
                       ({"pool_mapping": "ksubset", "pool_k": 0}, "pool_k")):
        with pytest.raises(UserError, match=match) as e:
            config_from_dict({"model": {"pool": "hopfield", **bad}})
        assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="model.pool is 'avg'"):
        config_from_dict({"model": {"pool_k": 3}})
    too_many = config_from_dict({"model": {"pool": "hopfield", "pool_mapping": "ksubset", "pool_k": 65}})
    with pytest.raises(UserError, match=r"1\.\.64 \(the number of patches\)"):
        create_classifier(too_many.model, too_many.head, 10, img_size=32)


def test_a_target_on_a_minus_inf_score_is_an_infinite_loss():
    """L(z; y) = Ω(y) + Ω*(z) − ⟨z, y⟩ with ⟨z, y⟩ = −∞ when y puts mass on a −∞ score: +∞ (as
    cross-entropy of an impossible class), never the largest finite float, so a batch mean with such a
    row is +∞ too."""
    for dtype in (torch.float32, torch.float64):
        z = torch.tensor([[0.5, float("-inf"), 1.0, 0.0], [0.5, 0.2, 1.0, 0.0]], dtype=dtype)
        y = torch.tensor([[1, 2], [0, 2]])  # row 0: item 1 has score -inf
        rows = ksubset_loss(z, y, 2, reduction="none")
        assert rows[0].item() == float("inf") and torch.isfinite(rows[1])
        assert ksubset_loss(z, y, 2).item() == float("inf") and \
            ksubset_loss(z, y, 2, reduction="sum").item() == float("inf")
