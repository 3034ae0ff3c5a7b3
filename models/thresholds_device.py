"""Thresholds for GPUs and other accelerators (and torch.compile): fixed shapes, no branches on
data, no host reads.

Every routine here issues the same ops whatever the values are, so on CUDA the host only
launches kernels and never waits for the device (no `.item()`, `bool(tensor)`, `nonzero`,
`masked_select` or data-dependent loop), and torch.compile traces each as one graph.

* sparsemax: the exact threshold from the values sorted in descending order (Martins &
  Astudillo 2016, "From Softmax to Sparsemax", Algorithm 1).
* 1.5-entmax: the exact threshold from sorted values (Peters, Niculae & Martins 2019, "Sparse
  Sequence-to-Sequence Models", Algorithm 2), then one closed-form step on the support it found:
  that step recomputes tau from plain row sums, which the cumulative sums of the sort-based
  formula cannot match in float32 at large K.
* alpha-entmax: a fixed number of bisection steps, then Newton steps (Correia, Niculae & Martins
  2019, "Adaptively Sparse Transformers", section 3.2 for the bisection). f(tau) =
  sum [z - tau]_+^beta - 1 is convex and decreasing and bisection keeps tau left of the root, so
  Newton approaches the root monotonically (never overshoots) and converges quadratically.

Inputs follow threshold_common: z = clamp((alpha - 1)(x - max), FLOOR), so tau is in [-1, 0].
The CPU fast path (thresholds_cpu.py) computes the same thresholds with iterative, sort-free
algorithms that read values on the host to stop early.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .threshold_common import positions, tsallis_mass, tsallis_power

# Newton steps after the bisection: quadratic convergence from a bracket of width 2^-n_iter
# reaches rounding level in 2-3 steps; the fourth is a margin for alpha close to 1.
N_NEWTON = 4


def default_n_iter(dtype: torch.dtype, beta=None) -> int:
    """Bisection steps before the Newton polish: enough for quadratic convergence to the dtype.

    For beta < 1 (alpha > 2) an entry entering the support has an infinite slope, which stalls
    Newton; there the bisection alone reaches the dtype's rounding (24 steps in fp32, 52 in fp64).
    That is the count for a float beta < 1 and for any tensor beta (the device path cannot read it
    to know); a float beta >= 1 takes 12 / 20."""
    if isinstance(beta, float) and beta >= 1.0:
        return 20 if dtype == torch.float64 else 12
    if beta is None:
        return 20 if dtype == torch.float64 else 12
    return 52 if dtype == torch.float64 else 24


def sparsemax_tau_sorted(zs: Tensor, dim: int) -> Tensor:
    """Exact sparsemax threshold from values sorted in descending order (Martins & Astudillo)."""
    r = positions(zs.size(dim), zs, dim)
    cs = zs.cumsum(dim).sub_(1.0)
    k_star = (r * zs > cs).sum(dim, keepdim=True)
    return cs.gather(dim, k_star - 1) / k_star.to(zs.dtype)


def entmax15_tau_sorted(zs: Tensor, dim: int) -> Tensor:
    """Peters et al. 2019, Algorithm 2: exact threshold for p = [z - tau]_+^2 (sorted input)."""
    r = positions(zs.size(dim), zs, dim)
    mean = zs.cumsum(dim).div_(r)
    mean_sq = (zs * zs).cumsum(dim).div_(r)
    delta = (1.0 - r * (mean_sq - mean * mean)).div_(r).clamp_(min=0.0)
    tau = mean.sub_(delta.sqrt_())
    k_star = (tau <= zs).sum(dim, keepdim=True)
    return tau.gather(dim, k_star - 1)


def entmax15_closed_form_step(z: Tensor, tau: Tensor, dim: int) -> Tensor:
    """The root of sum_{i in S} (z_i - t)^2 = 1 for the support S = {z > tau}.

    With d = [z - tau]_+, A = sum d, Q = sum d^2 and k = |S| the root is
    tau + (A - sqrt(A^2 - k (Q - 1))) / k: exact when S is the support, computed from row sums
    of values near 0 (no cancellation between large cumulative sums)."""
    d = (z - tau).clamp_(min=0.0)
    k = d.ceil().sum(dim, keepdim=True)  # d is in [0, 1]: ceil is the support indicator
    a = d.sum(dim, keepdim=True)
    q = (d * d).sum(dim, keepdim=True).sub_(1.0)
    return tau + (a - torch.addcmul(a * a, k, q, value=-1.0).clamp_(min=0.0).sqrt_()) / k


def tsallis_tau_fixed(z: Tensor, beta, dim: int, n_iter: int, n_newton: int = N_NEWTON) -> Tensor:
    """Root of f(tau) = sum [z - tau]_+^beta - 1 with a fixed number of steps.

    beta = 1 / (alpha - 1), a float or a tensor broadcastable to z with size 1 along dim.
    Bisection keeps the bracket [lo, hi] (f(lo) >= 0 > f(hi); f(-1) >= 0 since max z = 0). For
    beta >= 1 (alpha <= 2) f is convex, so Newton from lo moves right and stops at the root,
    quadratically. For beta < 1 (alpha > 2) f is not convex and a step may overshoot: every
    Newton step updates the bracket and one that leaves it is replaced by the bracket's middle
    (safeguarded Newton), so the iterate never leaves the bracket."""
    lo = torch.full_like(z.narrow(dim, 0, 1), -1.0)
    width = 1.0
    for _ in range(n_iter):
        width *= 0.5
        mid = lo + width
        f = tsallis_mass((z - mid).clamp_(min=0.0), beta).sum(dim, keepdim=True)
        lo = torch.where(f >= 1.0, mid, lo)
    hi = lo + width
    tau = lo
    for _ in range(n_newton):
        p, d_bm1 = tsallis_power((z - tau).clamp_(min=0.0), beta)
        f = p.sum(dim, keepdim=True) - 1.0
        left = f >= 0.0
        lo, hi = torch.where(left, tau, lo), torch.where(left, hi, tau)
        step = tau + f / (d_bm1.sum(dim, keepdim=True) * beta)
        tau = torch.where((step >= lo) & (step <= hi), step, 0.5 * (lo + hi))
    return tau


def sparsemax_threshold(z: Tensor) -> Tensor:
    """tau (R, 1) of rows z (R, K): the sort-based exact threshold."""
    return sparsemax_tau_sorted(z.sort(-1, descending=True).values, -1)


def entmax15_threshold(z: Tensor) -> Tensor:
    """tau (R, 1) of rows z (R, K): sort-based, then the closed-form step on its support."""
    return entmax15_closed_form_step(z, entmax15_tau_sorted(z.sort(-1, descending=True).values, -1), -1)


def tsallis_threshold(z: Tensor, beta, n_iter: Optional[int] = None) -> Tensor:
    """tau (R, 1) of rows z (R, K) of alpha-entmax: n_iter bisection steps (default_n_iter if None)
    then N_NEWTON safeguarded Newton steps."""
    return tsallis_tau_fixed(z, beta, -1, default_n_iter(z.dtype, beta) if n_iter is None else n_iter)


def ksubset_closed_form(z: Tensor, t: Tensor, k: float) -> Tensor:
    """The threshold of the k-subset projection for the sets that t puts each entry in: with
    U = {z - 1 >= t} (weight 1) and F = {z - 1 < t < z} (free), sum_i clip(z_i - tau, 0, 1) = k
    gives tau = (sum_F z + |U| - k) / |F|, exact when those are the solution's sets; t itself
    where F is empty (the flat piece at |U| = k: any tau there gives the same weights)."""
    ones = (z - 1.0 >= t).to(z.dtype)
    free = (z > t).to(z.dtype) - ones
    n_free = free.sum(-1, keepdim=True)
    total = (free * z).sum(-1, keepdim=True) + ones.sum(-1, keepdim=True) - k
    return torch.where(n_free > 0, total / n_free.clamp(min=1.0), t)


def ksubset_threshold(z: Tensor, k: int) -> Tensor:
    """tau (R, 1) of the k-subset projection mu = clip(z - tau, 0, 1), sum mu = k, of rows z (R, N)
    (shifted by their k-th largest value and clamped to [-2, 2], so tau is in [-1, 0)).

    g(tau) = sum_i clip(z_i - tau, 0, 1) is piecewise linear and non-increasing, with breakpoints
    at z_i (entry i becomes free below it) and z_i - 1 (entry i reaches 1). With the 2N breakpoints
    sorted in descending order, the slope on each piece is the running count of free entries
    (+1 at z_i, -1 at z_i - 1), so g at every breakpoint is one cumulative sum; the piece where g
    crosses k is found by a count, and tau by the closed form on the sets at its midpoint."""
    b, order = torch.cat([z, z - 1.0], -1).sort(-1, descending=True)
    tags = torch.cat([torch.ones_like(z), -torch.ones_like(z)], -1).gather(-1, order)
    free = tags.cumsum(-1)
    g = torch.cat([torch.zeros_like(z[:, :1]), (free[:, :-1] * (b[:, :-1] - b[:, 1:])).cumsum(-1)], -1)
    j = (g < k).sum(-1, keepdim=True).clamp_(min=1, max=b.size(-1) - 1)  # g(b_0) = 0 < k <= g(b_last)
    mid = 0.5 * (b.gather(-1, j) + b.gather(-1, j - 1))
    return ksubset_closed_form(z, mid, float(k))
