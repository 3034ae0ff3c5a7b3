"""Taylor softmax and its negative log-likelihood (de Brebisson & Vincent, ICLR 2016,
"An Exploration of Softmax Alternatives Belonging to the Spherical Loss Family"; higher even
orders: Banerjee, Ranjan, Mishra et al. 2020, "Exploring Alternatives to Softmax Function").

    f_n(x) = sum_{j=0}^{n} x^j / j!   (n even),      p_i = f_n(z_i) / sum_j f_n(z_j).

For even n the truncated exponential series has no real root (its minimum is at the root of
f_n' = f_{n-1}, where f_n = x^n / n! > 0), so p > 0 for every finite input: a dense head.
Order 2 is f(x) = 1 + x + x^2/2. Unlike softmax, p is not invariant to shifting the logits.

Loss: the negative log of the head's probabilities, KL(q || p) = sum q log q - sum q log p (plain
-log p_y for a class index, as the softmax head's cross-entropy), with the closed-form gradient
sum(q) f'(z)/F - q f'(z)/f(z) (F = sum f), saved in the forward.
Backward of the mapping: J^T g = (f'(z)/F) (g - <p, g>).

-inf logits are masks: f := 0 there (probability 0, no gradient); an all -inf slice maps to
zeros. The polynomial is evaluated in fp32 (fp16/bf16 inputs): f_n overflows fp32 only for
|z| beyond ~(n! 3e38)^(1/n) (1.9e19 at order 2, ~2.5e5 at order 6).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .head_checks import check_order
from .head_targets import RowGradientLoss, compute_dtype, finish_rows, row_loss
from .mappings import rows_backward, rows_forward


def taylor_terms(x: Tensor, order: int):
    """(f, f') of the order-`order` truncated exponential series at x, both 0 where x = -inf."""
    finite = x > float("-inf")
    xs = torch.where(finite, x, torch.zeros_like(x))
    # Horner for f' = f_{n-1}; then f_n = f_{n-1} + x^n / n!
    df = torch.full_like(xs, 1.0 / math.factorial(order - 1))
    for j in range(order - 2, -1, -1):
        df = df * xs + 1.0 / math.factorial(j)
    f = df + xs.pow(order) / math.factorial(order)
    zero = torch.zeros_like(xs)
    return torch.where(finite, f, zero), torch.where(finite, df, zero)


def _normalizer(f: Tensor) -> Tensor:
    s = f.sum(-1, keepdim=True)
    return torch.where(s > 0, s, torch.ones_like(s))  # all -inf row: 0 / 1 = zeros


def _taylor_rows(rows: Tensor, order: int):
    f, df = taylor_terms(rows, order)
    F = _normalizer(f)
    p = f / F
    return p, (p, df / F)


def _taylor_backward(p: Tensor, r: Tensor, g: Tensor) -> Tensor:
    return r * (g - (p * g).sum(-1, keepdim=True))


class TaylorSoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, order: int, dim: int):
        return rows_forward(ctx, x, dim, lambda rows: _taylor_rows(rows, order))

    @staticmethod
    def backward(ctx, g: Tensor):
        return rows_backward(ctx, g, _taylor_backward), None, None


def taylor_softmax(x: Tensor, order: int = 2, dim: int = -1) -> Tensor:
    """Taylor softmax of even `order` along `dim` (order 2: f(x) = 1 + x + x^2/2, normalised)."""
    return TaylorSoftmaxFunction.apply(x, check_order(order), dim)


class _TaylorNLLFunction(RowGradientLoss):
    @staticmethod
    def forward(ctx, z: Tensor, q: Tensor, order: int):
        zf = compute_dtype(z)
        f, df = taylor_terms(zf, order)
        F = f.sum(-1, keepdim=True)
        qs = q.sum(-1)
        # KL(q || p) = sum q log q - sum q log f + sum(q) log F; q > 0 on a masked class -> +inf
        loss = finish_rows(torch.special.xlogy(q, q).sum(-1) - torch.special.xlogy(q, f).sum(-1)
                           + qs * F.squeeze(-1).log())
        safe_F = torch.where(F > 0, F, torch.ones_like(F))
        safe_f = torch.where(f > 0, f, torch.ones_like(f))
        grad = qs.unsqueeze(-1) * df / safe_F - q * df / safe_f
        RowGradientLoss.save_row_gradient(ctx, grad, z)
        return loss


def taylor_softmax_loss(logits: Tensor, target: Tensor, order: int = 2, label_smoothing: float = 0.0,
                        ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of Taylor softmax (KL(q || p) for soft targets); classes last."""
    return row_loss(_TaylorNLLFunction, logits, target, label_smoothing, ignore_index, reduction, check_order(order))


__all__ = ["taylor_softmax", "taylor_softmax_loss", "taylor_terms", "check_order", "TaylorSoftmaxFunction"]
