"""The loss pipeline of every head (row_loss, RowGradientLoss): targets, label smoothing,
ignore_index and reductions, with these conventions:

* logits are (N, K) or (..., K) with classes last; targets are class indices (...) or probability
  rows (..., K) (Mixup/CutMix);
* label smoothing mixes the target with the uniform distribution over the row's finite (non -inf)
  classes, so a masked class stays impossible;
* rows whose class index equals `ignore_index` give 0 and are left out of the mean (an all-ignored
  batch gives 0, not NaN);
* everything is tensor arithmetic: no host reads, no data-dependent branches (GPU-safe); the one
  exception is the CPU path's check that no row is ignored (mappings.all_rows_count), which
  drops the row mask there.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from common.errors import UserError

from .mappings import all_rows_count
from .rows import compute_dtype, from_rows, to_rows  # noqa: F401  (the heads import them from here)

REDUCTIONS = ("mean", "sum", "none")


def check_loss_args(reduction: str, label_smoothing: float) -> None:
    if reduction not in REDUCTIONS:
        raise UserError(f"unknown reduction '{reduction}'; valid: {', '.join(REDUCTIONS)}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise UserError(f"label_smoothing must be in [0, 1], got {label_smoothing}")


def flatten(logits: Tensor, target: Tensor) -> Tuple[Tensor, Tensor, torch.Size]:
    """(N, K) logits, flat target ((N,) indices or (N, K) rows) and the leading shape."""
    K = logits.shape[-1]
    lead = logits.shape[:-1]
    z = logits.reshape(-1, K)
    if target.dtype.is_floating_point:
        if target.shape != logits.shape:
            raise UserError(f"soft targets must have the logits' shape {tuple(logits.shape)}, "
                            f"got {tuple(target.shape)}")
        return z, target.reshape(-1, K), lead
    if target.shape != lead:
        raise UserError(f"class-index targets must have shape {tuple(lead)}, got {tuple(target.shape)}")
    return z, target.reshape(-1), lead


def dense_target(zf: Tensor, target: Tensor, label_smoothing: float = 0.0,
                 ignore_index: int = -100) -> Tuple[Tensor, Optional[Tensor]]:
    """q (N, K) in zf's dtype and the mask of rows that count (None: all rows count)."""
    if target.dtype.is_floating_point:
        q = target.to(zf.dtype)
        valid = None
    else:
        valid = target != ignore_index
        safe = torch.where(valid, target, torch.zeros_like(target))
        q = torch.zeros_like(zf).scatter_(1, safe.unsqueeze(1), 1.0)
    if label_smoothing > 0:
        finite = (zf > float("-inf")).to(zf.dtype)
        n = finite.sum(-1, keepdim=True).clamp_(min=1.0)
        q = q * (1.0 - label_smoothing) + finite * (label_smoothing / n)
    return q, valid


def masked_dot(z: Tensor, w: Tensor) -> Tensor:
    """Row sums of z * w where 0 * (-inf) counts as 0 (a masked class with no weight)."""
    return torch.where(w != 0, z * w, torch.zeros_like(w)).sum(-1)


def finite_or_inf(loss: Tensor) -> Tensor:
    """inf - inf (a target on a masked class) is an impossible target: +inf, as cross-entropy."""
    return torch.nan_to_num(loss, nan=float("inf"), posinf=float("inf"))


def finish_rows(loss: Tensor) -> Tensor:
    """finite_or_inf, then clamped at 0: an exact loss >= 0 whose rounding went just below it. Not
    for a Monte-Carlo estimate (perturbmax), whose negative draws the mean needs."""
    return finite_or_inf(loss).clamp_(min=0.0)


def reduce_rows(loss: Tensor, valid: Optional[Tensor], reduction: str, lead: torch.Size) -> Tensor:
    if valid is not None:
        loss = torch.where(valid, loss, torch.zeros_like(loss))
    if reduction == "none":
        return loss.reshape(lead)
    if reduction == "sum":
        return loss.sum()
    if valid is None:  # a Python count: no tensor made from host data (a copy, a sync on CUDA)
        return loss.sum() / max(loss.numel(), 1)
    return loss.sum() / valid.sum().to(loss.dtype).clamp(min=1.0)


def hard_or_dense_target(z: Tensor, t: Tensor, label_smoothing: float, ignore_index: int,
                         class_indices: bool) -> Tuple[Tensor, Optional[Tensor]]:
    """The per-row target of a loss Function and the mask of rows that count (None: all).

    With `class_indices` (losses with a one-hot fast path: the entmax family) a class-index target
    without label smoothing stays indices (N,) (ignored rows point at class 0 and are masked by
    the reduction); everything else becomes the dense q (N, K)."""
    if class_indices and not t.dtype.is_floating_point and label_smoothing == 0:
        valid = t != ignore_index
        if all_rows_count(valid):
            return t, None
        return torch.where(valid, t, torch.zeros_like(t)), valid
    with torch.no_grad():
        return dense_target(compute_dtype(z.detach()), t, label_smoothing, ignore_index)


def row_loss(function, logits: Tensor, target: Tensor, label_smoothing: float, ignore_index: int, reduction: str,
             *args, class_indices: bool = False) -> Tensor:
    """The loss pipeline of every head: rows of logits (classes last), the per-row target (the
    dense q, or class indices with `class_indices`), `function.apply(z, target, *args)` per row,
    then ignore_index and the reduction."""
    check_loss_args(reduction, label_smoothing)
    z, t, lead = flatten(logits, target)
    rows_target, valid = hard_or_dense_target(z, t, label_smoothing, ignore_index, class_indices)
    return reduce_rows(function.apply(z, rows_target, *args), valid, reduction, lead)


class RowGradientLoss(torch.autograd.Function):
    """Base of the per-row loss Functions of the heads: `forward` computes each row's loss and its
    gradient with respect to the logits (p - q, or the head's own), keeps only that gradient with
    `save_row_gradient`, and the shared `backward` scales it by the incoming per-row gradient.
    A Function with one more differentiable input (the learned entmax alpha, argument `index`)
    passes its per-row gradient as `extra=(index, per_row, shape)`; the others get None."""

    @staticmethod
    def save_row_gradient(ctx, grad: Tensor, z: Tensor, extra=None) -> None:
        index, per_row, shape = extra if extra is not None else (None, None, None)
        ctx.save_for_backward(grad, per_row)
        ctx.z_dtype, ctx.extra_index, ctx.extra_shape = z.dtype, index, shape

    @staticmethod
    def backward(ctx, g: Tensor):
        grad, per_row = ctx.saved_tensors
        g = g.to(grad.dtype)
        out = [None] * len(ctx.needs_input_grad)
        out[0] = (grad * g.unsqueeze(-1)).to(ctx.z_dtype)
        if per_row is not None and ctx.needs_input_grad[ctx.extra_index]:
            total = g * per_row
            shape = ctx.extra_shape
            out[ctx.extra_index] = (total.sum() if shape.numel() == 1 else total).reshape(shape)
        return tuple(out)
