"""The `entmax` package's numerical contract: alpha-entmax and its loss for every
alpha >= 1 (alpha > 2 too), float or tensor alpha, scalar or per row, on both threshold paths.

The reference is an independent float64 bisection written here (300 halvings of the bracket
[max - 1, max] of sum [(a-1) x - tau]_+^(1/(a-1)) = 1, far below float64 rounding), applied to the
finite entries of each row. fp32 runs are compared with the reference of the fp32-rounded input.
"""
import numpy as np
import pytest
import torch

from common.errors import UserError
from models.heads import entmax_bisect, entmax_bisect_loss, normmax, softmax, sparsemax
from models.mappings import threshold_path

ALPHAS = [1.01, 1.25, 1.5, 1.75, 2.0, 2.25, 3.0, 4.0]
PATHS = ["cpu", "device"]
NEG_INF = float("-inf")
# Largest |p - reference| allowed, by dtype. alpha = 4 in float64 is limited by the problem's own
# conditioning (p = d^(1/3) has an infinite slope where an entry enters the support), not by
# the solver: the reference's own bisection sees the same.
TOL = {torch.float64: 1e-10, torch.float32: 5e-6}


def reference(x: np.ndarray, alpha: float) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    out = np.zeros_like(x)
    for i, row in enumerate(x):
        keep = np.isfinite(row)
        if not keep.any():
            continue
        z = row[keep] * (alpha - 1.0)
        lo, hi = z.max() - 1.0, z.max()
        for _ in range(300):
            mid = 0.5 * (lo + hi)
            if (np.maximum(z - mid, 0.0) ** (1.0 / (alpha - 1.0))).sum() >= 1.0:
                lo = mid
            else:
                hi = mid
        p = np.maximum(z - lo, 0.0) ** (1.0 / (alpha - 1.0))
        out[i, keep] = p / p.sum()
    return out


def _logits(dtype, rows=12, K=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, K, generator=g, dtype=torch.float64) * 3.0
    x[1, : K // 2] = NEG_INF  # masked entries
    x[2, 5:] = NEG_INF
    x[3] = 0.25  # ties
    return x.to(dtype)


def _alpha_forms(alpha, rows, dtype):
    return {"float": alpha, "tensor scalar": torch.tensor(alpha, dtype=dtype),
            "tensor per row": torch.full((rows, 1), alpha, dtype=dtype)}


def largest_errors():
    """{(alpha, path, dtype name): largest |p - reference|} over the alpha forms (the report's table)."""
    out = {}
    for dtype in (torch.float64, torch.float32):
        x = _logits(dtype, rows=64, K=1000, seed=3)
        for alpha in ALPHAS:
            ref = reference(x.double().numpy(), alpha)
            for path in PATHS:
                with threshold_path(path):
                    errs = [np.abs(entmax_bisect(x, a).double().numpy() - ref).max()
                            for a in _alpha_forms(alpha, 64, dtype).values()]
                out[(alpha, path, str(dtype).split(".")[1])] = max(errs)
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("alpha", ALPHAS)
def test_matches_float64_reference_for_every_alpha(alpha, dtype, path):
    x = _logits(dtype)
    ref = reference(x.double().numpy(), alpha)
    with threshold_path(path):
        for form, a in _alpha_forms(alpha, x.size(0), dtype).items():
            p = entmax_bisect(x, a)
            assert torch.isfinite(p).all(), form
            np.testing.assert_allclose(p.double().numpy(), ref, atol=TOL[dtype], rtol=0, err_msg=form)
            assert (p[torch.isinf(x)] == 0).all(), form


@pytest.mark.parametrize("path", PATHS)
def test_per_row_alphas_across_two(path):
    x = _logits(torch.float64)
    a = torch.tensor(ALPHAS + [1.1, 2.5, 3.5, 6.0], dtype=torch.float64).view(-1, 1)
    with threshold_path(path):
        p = entmax_bisect(x, a)
    for i, alpha in enumerate(a.view(-1).tolist()):
        np.testing.assert_allclose(p[i].numpy(), reference(x[i:i + 1].numpy(), alpha)[0], atol=1e-10, rtol=0)


@pytest.mark.parametrize("path", PATHS)
def test_alpha_two_tensor_equals_sparsemax_to_rounding(path):
    x = _logits(torch.float64, rows=32, K=500, seed=1)
    with threshold_path(path):
        torch.testing.assert_close(entmax_bisect(x, torch.tensor(2.0, dtype=x.dtype)), sparsemax(x), atol=1e-15, rtol=0)
        torch.testing.assert_close(entmax_bisect(x, torch.full((32, 1), 2.0, dtype=x.dtype)), sparsemax(x),
                                   atol=1e-15, rtol=0)


@pytest.mark.parametrize("path", PATHS)
def test_alpha_to_one_is_softmax(path):
    x = _logits(torch.float64)
    with threshold_path(path):
        assert torch.equal(entmax_bisect(x, 1.0), softmax(x))
        torch.testing.assert_close(entmax_bisect(x, torch.ones(x.size(0), 1, dtype=x.dtype)), softmax(x),
                                   atol=1e-15, rtol=0)
        errs = [float((entmax_bisect(x, 1.0 + eps) - softmax(x)).abs().max()) for eps in (0.3, 0.1, 0.03, 0.01)]
    assert errs == sorted(errs, reverse=True) and errs[-1] < 0.02  # O(alpha - 1) towards softmax


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("alpha", ALPHAS)
def test_masked_entries_never_move_the_kept_probabilities(alpha, path):
    for dtype, tol in ((torch.float64, 1e-14), (torch.float32, 1e-6)):
        x = _logits(dtype, rows=6, K=40, seed=2)
        x[:, 0] = x[:, 1:].amax(1) + 0.5  # the top entry is kept whatever is masked
        keep = torch.ones(40, dtype=torch.bool)
        keep[10:25] = False
        masked = x.masked_fill(~keep, NEG_INF)
        with threshold_path(path):
            for form, a in _alpha_forms(alpha, 6, dtype).items():
                full = entmax_bisect(masked, a)
                alone = entmax_bisect(x[:, keep], a)
                assert (full[:, ~keep] == 0).all(), form
                torch.testing.assert_close(full[:, keep], alone, atol=tol, rtol=0, msg=form)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("alpha", ALPHAS)
def test_gradcheck_mapping_and_loss(alpha, path):
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(3, 7, generator=g, dtype=torch.float64) * 1.5).requires_grad_()
    x.data[1, 2] = NEG_INF
    a = torch.tensor([[alpha], [alpha + 0.05], [max(alpha - 0.05, 1.02)]], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 3, 6])
    with threshold_path(path):
        assert torch.autograd.gradcheck(lambda v, t: entmax_bisect(v, t), (x, a), atol=1e-6)
        assert torch.autograd.gradcheck(lambda v, t: entmax_bisect_loss(v, y, t.view(-1), reduction="none"), (x, a),
                                        atol=1e-6)
        if alpha != 2.0 and alpha != 1.5:  # (those floats dispatch to the exact mappings, checked elsewhere)
            assert torch.autograd.gradcheck(lambda v: entmax_bisect(v, alpha), (x,), atol=1e-6)


def _reference_loss(z: np.ndarray, y: np.ndarray, alpha: float) -> np.ndarray:
    """Omega(e_y) - Omega(p) + <z, p - e_y> with the Tsallis Omega and the reference p."""
    p = reference(z, alpha)
    omega_p = ((p ** alpha).sum(-1) - 1.0) / (alpha * (alpha - 1.0))
    zs = np.where(np.isfinite(z), z, 0.0)
    return -omega_p + (zs * p).sum(-1) - zs[np.arange(len(y)), y]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("alpha", ALPHAS)
def test_loss_matches_reference_for_every_alpha(alpha, path):
    x = _logits(torch.float64)
    y = torch.tensor([0, 40, 1, 7, 9, 3, 5, 2, 8, 11, 13, 17])
    ref = _reference_loss(x.numpy(), y.numpy(), alpha)
    with threshold_path(path):
        for form, a in _alpha_forms(alpha, x.size(0), torch.float64).items():
            a = a.view(-1) if isinstance(a, torch.Tensor) and a.dim() else a
            loss = entmax_bisect_loss(x, y, a, reduction="none")
            assert torch.isfinite(loss).all(), form
            np.testing.assert_allclose(loss.numpy(), ref, atol=1e-9, rtol=1e-9, err_msg=form)


@pytest.mark.parametrize("bad", [0.5, 0.999, -1.0])
def test_alpha_below_one_is_refused_alike_for_float_and_tensor(bad):
    x = _logits(torch.float64)
    y = torch.zeros(x.size(0), dtype=torch.long)
    messages = []
    for a in (bad, torch.tensor(bad), torch.tensor([[1.5]] * 11 + [[bad]], dtype=torch.float64)):
        with pytest.raises(UserError) as err:
            entmax_bisect(x, a)
        messages.append(str(err.value))
        with pytest.raises(UserError, match="alpha must be >= 1"):
            entmax_bisect_loss(x, y, a.view(-1) if isinstance(a, torch.Tensor) and a.dim() else a)
    assert all("alpha must be >= 1" in m and "\n" not in m for m in messages)
    assert len({m.split("got")[0] for m in messages}) == 1  # the same line for float and tensor


def test_device_path_marks_alpha_below_one_as_nan_without_reading():
    x = _logits(torch.float64)
    a = torch.tensor([[1.5]] * 11 + [[0.5]], dtype=torch.float64)
    with threshold_path("device"):
        p = entmax_bisect(x, a)
        loss = entmax_bisect_loss(x, x.argmax(1), a.view(-1), reduction="none")
    assert torch.isnan(p[11]).all() and torch.isfinite(p[:11]).all()
    assert torch.isnan(loss[11]) or torch.isinf(loss[11])
    assert torch.isfinite(loss[:11]).all()


def test_learned_alpha_head_keeps_its_open_interval():
    from models.heads import OutputHead
    h = OutputHead("entmax_bisect", alpha=1.5, learn_alpha=True)
    with torch.no_grad():
        for logit in (-30.0, 0.0, 30.0):
            h.alpha_logit.fill_(logit)
            assert 1.0 <= float(h.alpha) <= 2.0
    with pytest.raises(UserError):
        OutputHead("entmax_bisect", alpha=2.5, learn_alpha=True)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_learned_alpha_head_takes_the_short_search_and_stays_exact(dtype, path, monkeypatch):
    """A learned alpha is a tensor in (1, 2): the head asks for the short bisection (12 / 20 steps),
    which the device path could not choose alone, and the result still meets the reference."""
    from models import mappings
    from models.heads import OutputHead
    from models.thresholds_device import default_n_iter

    asked = []
    real = mappings.entmax_bisect_steps  # the mapping's and the loss's one choice of the step count
    monkeypatch.setattr(mappings, "entmax_bisect_steps", lambda z, s: asked.append(real(z, s)) or asked[-1])
    h = OutputHead("entmax_bisect", alpha=1.3, learn_alpha=True).to(dtype)
    x = _logits(dtype)
    with threshold_path(path):
        p = h(x)
        loss = h.loss(x, x.argmax(-1))  # a kept class: a masked one would give an infinite loss
    assert asked == [default_n_iter(dtype, beta=1.0)] * 2 and asked[0] < default_n_iter(dtype, beta=torch.tensor(1.0))
    np.testing.assert_allclose(p.detach().double().numpy(), reference(x.double().numpy(), float(h.alpha)),
                               atol=TOL[dtype], rtol=0)
    assert torch.isfinite(loss)


@pytest.mark.parametrize("gamma", [1.5, 2.0, 3.0])
def test_normmax_takes_gamma_per_row(gamma):
    x = _logits(torch.float64, rows=4, K=30)
    g = torch.tensor([[gamma], [1.25], [2.0], [4.0]], dtype=torch.float64)
    per_row = normmax(x, g)
    for i, gi in enumerate(g.view(-1).tolist()):
        torch.testing.assert_close(per_row[i], normmax(x[i:i + 1], gi)[0], atol=1e-12, rtol=0)
    torch.testing.assert_close(normmax(x, torch.tensor(gamma, dtype=x.dtype)), normmax(x, gamma), atol=1e-12, rtol=0)
