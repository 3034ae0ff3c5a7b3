"""Targets, label smoothing, ignore_index and reductions for the losses of the extra heads
(normmax, top-k softmax, Taylor softmax, AM-softmax), with the conventions of models/losses.py:

* logits are (N, K) or (..., K) with classes last; targets are class indices (...) or probability
  rows (..., K) (Mixup/CutMix);
* label smoothing mixes the target with the uniform distribution over the row's finite (non -inf)
  classes, so a masked class stays impossible;
* rows whose class index equals `ignore_index` give 0 and are left out of the mean (an all-ignored
  batch gives 0, not NaN);
* everything is tensor arithmetic: no host reads, no data-dependent branches (GPU-safe).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from common.errors import UserError

REDUCTIONS = ("mean", "sum", "none")


def compute_dtype(x: Tensor) -> Tensor:
    """fp16/bf16 are computed in fp32 (their range and precision are too small for the sums)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


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


def finish_rows(loss: Tensor) -> Tensor:
    """inf - inf (a target on a masked class) is an impossible target: +inf, as cross-entropy."""
    return torch.nan_to_num(loss, nan=float("inf"), posinf=float("inf")).clamp_(min=0.0)


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


def to_rows(x: Tensor, dim: int) -> Tuple[Tensor, torch.Size]:
    """x with `dim` moved last and flattened to (R, K), and the moved shape to restore it."""
    moved = x.movedim(dim, -1)
    return moved.reshape(-1, moved.shape[-1]), moved.shape


def from_rows(rows: Tensor, moved_shape: torch.Size, dim: int) -> Tensor:
    return rows.reshape(moved_shape).movedim(-1, dim)


def row_loss(function, logits: Tensor, target: Tensor, label_smoothing: float, ignore_index: int, reduction: str,
             *args) -> Tensor:
    """The loss pipeline of a head: rows of logits (classes last), the dense target q,
    `function.apply(z, q, *args)` per row, then ignore_index and the reduction."""
    check_loss_args(reduction, label_smoothing)
    z, t, lead = flatten(logits, target)
    with torch.no_grad():
        q, valid = dense_target(compute_dtype(z.detach()), t, label_smoothing, ignore_index)
    return reduce_rows(function.apply(z, q, *args), valid, reduction, lead)


class RowGradientLoss(torch.autograd.Function):
    """Base of the per-row loss Functions of the heads: `forward` computes each row's loss and its
    gradient with respect to the logits (p - q, or the head's own), keeps only that gradient with
    `save_row_gradient`, and the shared `backward` scales it by the incoming per-row gradient (no
    gradient for the other inputs)."""

    @staticmethod
    def save_row_gradient(ctx, grad: Tensor, z: Tensor) -> None:
        ctx.save_for_backward(grad)
        ctx.z_dtype = z.dtype

    @staticmethod
    def backward(ctx, g: Tensor):
        (grad,) = ctx.saved_tensors
        dz = (grad * g.to(grad.dtype).unsqueeze(-1)).to(ctx.z_dtype)
        return (dz,) + (None,) * (len(ctx.needs_input_grad) - 1)
