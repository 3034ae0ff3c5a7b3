"""gamma-normmax and its Fenchel-Young loss (Santos, Niculae, McNamee & Martins, ICML 2024,
"Sparse and Structured Hopfield Networks"; Blondel, Martins & Niculae 2020 for the loss).

    normmax_gamma(z) = argmax_{p in simplex} <z, p> - Omega(p),   Omega(p) = -1 + ||p||_gamma,

for gamma > 1 (gamma = 2 by default). The KKT conditions give, with d = [z - tau]_+,

    p = d^(1/(gamma-1)) / sum d^(1/(gamma-1)),   tau the root of  f(tau) = sum d^(gamma/(gamma-1)) - 1,

so the support is {z_i > tau} (exact zeros elsewhere) and ||p||_gamma = 1 / sum d^(1/(gamma-1)).
f is convex and decreasing in tau, and tau lies in [max z - 1, max z - K^(-(gamma-1)/gamma)].

The threshold is found with a FIXED number of bisection steps, then Newton steps from the left
(monotone for a convex decreasing f, quadratic near the root): no data-dependent loop, no host
read, so the same code runs on every device and under torch.compile. The `entmax` package's
`normmax_bisect` (50 plain bisection steps) is the test oracle.

Backward (implicit differentiation of the KKT system; the same Jacobian as the entmax package):
with w_i = p_i / ((gamma-1) d_i) on the support (0 elsewhere), W = sum w,

    J = diag(w) - w p^T - p w^T + W p p^T    (symmetric),   J^T g = w (g - <p,g>) - p (<w,g> - W <p,g>).

The loss L(z; q) = Omega(q) - Omega(p) + <z, p - q> = ||q||_gamma - ||p||_gamma + <z, p - q> has
gradient p - q (Danskin), saved in the forward; it is 0 at p = q and +inf for a target on a -inf
(masked) class. Conventions as the other heads: any `dim` for the mapping (classes last for the
loss), -inf logits get exact zeros, an all -inf slice maps to zeros with a zero gradient,
fp16/bf16 are computed in fp32.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .head_checks import check_gamma_value
from .head_targets import RowGradientLoss, compute_dtype, finish_rows, masked_dot, row_loss
from .mappings import param_rows, rows_backward, rows_forward, uses_device_path

# In shifted units (z - max) the threshold is >= -1, so entries below -1 are never in the
# support; clamping there makes -inf and huge negative logits harmless without changing p.
_FLOOR = -1.5

def check_gamma(gamma) -> float:
    """A float gamma > 1. A tensor gamma (per slice) is checked where reading it is free (the CPU
    path); on the device path a gamma <= 1 gives NaN."""
    if isinstance(gamma, Tensor):
        if not uses_device_path(gamma):
            check_gamma_value(float(gamma.detach().min()))
        return gamma
    return check_gamma_value(gamma)


def default_steps(dtype: torch.dtype):
    """(bisection, Newton) steps: the bisection leaves a bracket of 2^-n, Newton's quadratic
    convergence takes it to the dtype's rounding level (checked in tests against the oracle)."""
    return (20, 5) if dtype == torch.float64 else (12, 4)


def _powers(d: Tensor, gamma):
    """(d^(1/(gamma-1)), d^(gamma/(gamma-1))) for d >= 0; a float gamma = 2 needs no pow."""
    if isinstance(gamma, float) and gamma == 2.0:
        return d, d * d
    u = d.pow(1.0 / (gamma - 1.0))
    return u, u * d


def normmax_kernel(x: Tensor, gamma, n_bisect: Optional[int] = None,
                   n_newton: Optional[int] = None):
    """Rows of x (R, K) in fp32/fp64 -> (p, d): p = normmax(x), d = [x - max - tau]_+ .
    gamma: a float or a tensor (R, 1) (per row) or scalar."""
    if n_bisect is None or n_newton is None:
        b, n = default_steps(x.dtype)
        n_bisect = b if n_bisect is None else n_bisect
        n_newton = n if n_newton is None else n_newton
    K = x.shape[-1]
    m = x.amax(-1, keepdim=True)
    dead = m == float("-inf")  # an all -inf row: computed as a constant row, zeroed at the end
    zs = (x - m.clamp(min=torch.finfo(x.dtype).min)).clamp_(min=_FLOOR)
    zs = torch.where(dead, torch.zeros_like(zs), zs)
    beta = gamma / (gamma - 1.0)
    lo = torch.full_like(zs[:, :1], -1.0)  # f(lo) >= 0 throughout: the max entry alone gives 1
    width = 1.0 - K ** (-1.0 / beta)  # root <= -K^(-1/beta): there f <= K (K^(-1/beta))^beta = 1
    for _ in range(n_bisect):
        width = width * 0.5
        mid = lo + width
        f = _powers((zs - mid).clamp_(min=0.0), gamma)[1].sum(-1, keepdim=True)
        lo = torch.where(f >= 1.0, mid, lo)
    for _ in range(n_newton):
        u, ud = _powers((zs - lo).clamp_(min=0.0), gamma)
        # f' = -beta sum u < 0; u includes the max entry (d = -lo > 0), so no division by 0
        lo = lo + (ud.sum(-1, keepdim=True) - 1.0) / (beta * u.sum(-1, keepdim=True))
    d = (zs - lo).clamp_(min=0.0)
    u = _powers(d, gamma)[0]
    p = u / u.sum(-1, keepdim=True)
    p = torch.where(dead, torch.zeros_like(p), p)
    return p, d


def _skew(p: Tensor, d: Tensor, gamma: float) -> Tensor:
    """w = p / ((gamma - 1) d) on the support, 0 elsewhere (0 / tiny = 0)."""
    return p / d.clamp(min=torch.finfo(d.dtype).tiny) / (gamma - 1.0)


def _normmax_backward(p: Tensor, w: Tensor, g: Tensor) -> Tensor:
    pg = (p * g).sum(-1, keepdim=True)
    wg = (w * g).sum(-1, keepdim=True)
    W = w.sum(-1, keepdim=True)
    return w * (g - pg) - p * (wg - W * pg)


class NormmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, gamma, dim: int, n_bisect: Optional[int], n_newton: Optional[int]):
        if isinstance(gamma, Tensor):
            gamma = param_rows(gamma, compute_dtype(x), dim)[0]

        def forward_rows(rows):
            p, d = normmax_kernel(rows, gamma, n_bisect, n_newton)
            return p, (p, _skew(p, d, gamma))
        return rows_forward(ctx, x, dim, forward_rows)

    @staticmethod
    def backward(ctx, g: Tensor):
        return rows_backward(ctx, g, _normmax_backward), None, None, None, None


def normmax(x: Tensor, gamma=2.0, dim: int = -1, n_bisect: Optional[int] = None,
            n_newton: Optional[int] = None) -> Tensor:
    """gamma-normmax along `dim` (Santos et al. 2024); sparse, sums to 1 (all -inf slice: zeros).
    gamma: a float > 1, or a tensor broadcastable to x with size 1 along dim (per slice, as the
    `entmax` package's normmax_bisect takes it; no gradient for it)."""
    return NormmaxFunction.apply(x, check_gamma(gamma), dim, n_bisect, n_newton)


class _NormmaxLossFunction(RowGradientLoss):
    """Per-row FY loss for logits (N, K) and a dense target q (N, K); saves only p - q."""

    @staticmethod
    def forward(ctx, z: Tensor, q: Tensor, gamma: float, n_bisect: Optional[int], n_newton: Optional[int]):
        zf = compute_dtype(z)
        p, _ = normmax_kernel(zf, gamma, n_bisect, n_newton)
        zc = zf - zf.amax(-1, keepdim=True).clamp(min=torch.finfo(zf.dtype).min)
        diff = p - q
        omega = (torch.linalg.vector_norm(q, ord=gamma, dim=-1)
                 - torch.linalg.vector_norm(p, ord=gamma, dim=-1))
        loss = finish_rows(omega + masked_dot(zc, diff))
        RowGradientLoss.save_row_gradient(ctx, diff, z)
        return loss


def normmax_loss(logits: Tensor, target: Tensor, gamma: float = 2.0, label_smoothing: float = 0.0,
                 ignore_index: int = -100, reduction: str = "mean", n_bisect: Optional[int] = None,
                 n_newton: Optional[int] = None) -> Tensor:
    """Fenchel-Young loss of gamma-normmax: ||q||_g - ||p||_g + <z, p - q>; gradient p - q.

    target: class indices (...) or probability rows (..., K); classes last."""
    return row_loss(_NormmaxLossFunction, logits, target, label_smoothing, ignore_index, reduction,
                    check_gamma(gamma), n_bisect, n_newton)


__all__ = ["normmax", "normmax_loss", "normmax_kernel", "check_gamma", "check_gamma_value", "NormmaxFunction"]
