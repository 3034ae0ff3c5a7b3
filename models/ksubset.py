"""k-subset SparseMAP: the structured member of the sparse mappings, and its Fenchel-Young loss.

The marginal polytope of the k-subsets of N items is M_k = {mu in [0, 1]^N : sum mu = k}, and
SparseMAP (Niculae et al., ICML 2018) with Omega(mu) = 1/2 ||mu||^2 on it is the Euclidean
projection of the scores theta onto M_k:

    mu_i = clip(theta_i - tau, 0, 1)   with tau such that sum_i mu_i = k.

Well-separated scores give a k-hot mu (exactly k items at 1, a k-subset); k = 1 is sparsemax
(the simplex). This is the structured retrieval of Hopfield-Fenchel-Young networks (Santos et al.,
JMLR 2025): a retrieval step that returns an association of exactly k patterns (models/hopfield_pool.py).

Backward: on the free coordinates F = {0 < mu_i < 1} the Jacobian is I - 11^T / |F|, zero
elsewhere (an entry at 0 or 1 does not move with theta). -inf scores are masked (weight 0, no
influence); a slice with fewer than k finite entries cannot reach sum k: it gets weight 1 on each
finite entry (the largest association it has) and a zero gradient.

The threshold has two paths, picked by the mappings' seam (models/mappings.uses_device_path): the
device path (thresholds_device.ksubset_threshold: a sort of the 2N breakpoints, fixed shape, no
host read) and the CPU path (thresholds_cpu.ksubset_threshold: sort-free bisection with an exact
closed-form finish, stopping when done). Both are exact up to rounding.

The loss L(theta; y) = Omega(y) + Omega*(theta) - <theta, y> with Omega*(theta) = <theta, mu> -
Omega(mu), i.e. 1/2 ||y||^2 - 1/2 ||mu||^2 + <theta, mu - y>, for targets y in M_k (k-hot rows, or
fractional ones; k item indices per row are turned into k-hot rows); its gradient is mu - y and it
is 0 at y = mu.
"""
from __future__ import annotations

import torch
from torch import Tensor

from common.errors import UserError

from . import thresholds_cpu, thresholds_device
from .head_targets import RowGradientLoss, check_loss_args, finish_rows, masked_dot, reduce_rows
from .mappings import rows_backward, rows_forward, threads_for, uses_device_path
from .rows import compute_dtype


def check_k(k, n: int, what: str = "k") -> int:
    """k as an int in [1, n] or a one-line UserError naming `what`."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise UserError(f"{what} must be an integer in [1, {n}] (the items a k-subset holds), got {k!r}")
    return k


def ksubset_kernel(rows: Tensor, k: int) -> Tensor:
    """mu (R, N) of rows (R, N) in fp32/fp64: the projection onto {mu in [0, 1]^N, sum mu = k}."""
    check_k(k, rows.size(-1))
    ref = rows.topk(k, -1).values[:, -1:]  # the k-th largest score: tau lies in [ref - 1, ref)
    short = ref == float("-inf")  # fewer than k finite scores
    # Shifted by ref and clamped to [-2, 2]: an entry above ref + 1 is at 1 whatever tau in
    # [ref - 1, ref) is, one below ref - 1 at 0, so the clamp changes no weight; it makes -inf and
    # huge magnitudes harmless. Short rows get a constant stand-in (their weights are set below).
    z = (rows - ref.masked_fill(short, 0.0)).clamp_(-2.0, 2.0).masked_fill_(short, 0.0)
    if uses_device_path(z):
        tau = thresholds_device.ksubset_threshold(z, k)
    else:
        tau = thresholds_cpu.ksubset_threshold(z, k)
    mu = (z - tau).clamp_(0.0, 1.0)
    return torch.where(short, (rows > float("-inf")).to(rows.dtype), mu)


def ksubset_backward(mu: Tensor, g: Tensor) -> Tensor:
    """(I - 11^T / |F|) g on the free coordinates F = {0 < mu < 1}, zero elsewhere."""
    free = ((mu > 0) & (mu < 1)).to(g.dtype)
    gf = g * free
    mean = gf.sum(-1, keepdim=True) / free.sum(-1, keepdim=True).clamp_(min=1.0)
    return gf.sub_(free * mean)


def _ksubset_rows(rows: Tensor, k: int):
    mu = ksubset_kernel(rows, k)
    return mu, (mu,)


class KSubsetFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, k: int, dim: int):
        return rows_forward(ctx, x, dim, lambda rows: _ksubset_rows(rows, k))

    @staticmethod
    def backward(ctx, g: Tensor):
        return rows_backward(ctx, g, ksubset_backward), None, None


def ksubset(x: Tensor, k: int, dim: int = -1) -> Tensor:
    """k-subset SparseMAP of x along dim: weights in [0, 1] summing to k (module docstring)."""
    return KSubsetFunction.apply(x, k, dim)


def k_hot(indices: Tensor, n: int, dtype=torch.float32) -> Tensor:
    """(..., k) item indices -> (..., n) rows with 1 at those items (distinct indices: sum = k)."""
    return torch.zeros(indices.shape[:-1] + (n,), dtype=dtype, device=indices.device).scatter_(-1, indices, 1.0)


def _check_target(y: Tensor, k: int) -> None:
    """On the CPU path (reading is free there): targets must lie in the polytope."""
    if uses_device_path(y):
        return
    tol = 1e-4 * max(k, 1)
    if not bool(((y >= 0) & (y <= 1)).all()) or not bool(((y.sum(-1) - k).abs() <= tol).all()):
        raise UserError(f"k-subset targets must lie in the k-subset polytope (entries in [0, 1] summing to "
                        f"k = {k}), e.g. k-hot rows; pass k item indices per row or fix the target rows")


class KSubsetLossFunction(RowGradientLoss):
    """Per-row SparseMAP loss and its gradient mu - y, on the heads' shared loss pipeline."""

    @staticmethod
    def forward(ctx, z: Tensor, y: Tensor, k: int):
        with threads_for(z):
            mu = ksubset_kernel(z, k)
            ref = z.topk(k, -1).values[:, -1:]
            zs = z - ref.masked_fill(ref == float("-inf"), 0.0)  # the loss is shift-invariant on M_k
            diff = mu - y
            loss = 0.5 * ((y * y).sum(-1) - (mu * mu).sum(-1)) + masked_dot(zs, diff)
        RowGradientLoss.save_row_gradient(ctx, diff, z)
        return finish_rows(loss)  # +inf (never the largest float) where the target has mass on a -inf score


def ksubset_loss(logits: Tensor, target: Tensor, k: int, reduction: str = "mean") -> Tensor:
    """SparseMAP Fenchel-Young loss of the k-subset polytope along the last dim.

    target: rows (..., N) in the polytope (k-hot or fractional), or (..., k) item indices
    (int64), which mean the k-hot row of those items. Gradient mu - y; 0 where y = mu."""
    check_loss_args(reduction, 0.0)
    n = logits.shape[-1]
    check_k(k, n)
    zf = compute_dtype(logits)
    if not target.dtype.is_floating_point:
        if target.shape != logits.shape[:-1] + (k,):
            raise UserError(f"k-subset index targets must have shape {tuple(logits.shape[:-1]) + (k,)}, "
                            f"got {tuple(target.shape)}")
        target = k_hot(target, n, zf.dtype)
    elif target.shape != logits.shape:
        raise UserError(f"k-subset target rows must have the logits' shape {tuple(logits.shape)}, "
                        f"got {tuple(target.shape)}")
    y = target.to(zf.dtype).reshape(-1, n)
    _check_target(y, k)
    loss = KSubsetLossFunction.apply(zf.reshape(-1, n), y, k)
    return reduce_rows(loss, None, reduction, logits.shape[:-1]).to(logits.dtype)


__all__ = ["ksubset", "ksubset_loss", "k_hot", "check_k"]
