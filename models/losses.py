"""Fenchel-Young losses of the output-head mappings (Blondel, Martins & Niculae 2020,
"Learning with Fenchel-Young Losses").

    L(z; q) = Omega(q) + Omega*(z) - <z, q>,   grad_z L = p(z) - q,   Omega*(z) = <z, p> - Omega(p)

with Omega(p) = sum p log p for softmax (L is then cross-entropy minus the entropy of q, i.e. plain
cross-entropy for one-hot targets) and the Tsallis entropy Omega(p) = (sum p^alpha - 1) /
(alpha (alpha - 1)) for alpha-entmax (sparsemax: alpha = 2, (|p|^2 - 1)/2), the convention of
the `entmax` package. For a learnable alpha the envelope theorem gives
dL/dalpha = dOmega_alpha(q)/dalpha - dOmega_alpha(p)/dalpha.

Targets are class indices (N,) or probability rows (N, K) (Mixup/CutMix); label smoothing mixes
the target with the uniform distribution over the row's finite (non -inf) classes; rows whose
class index equals `ignore_index` contribute 0 and are left out of the mean (an all-ignored batch
gives 0, not NaN). Logits are (N, K) or (..., K) with classes last.

-inf logits: the loss stays finite while q puts no mass on -inf classes; if it does, the loss is
+inf (as for cross-entropy: the target is impossible) and the gradient stays the finite p - q.

The forward computes the mapping once and the backward saves only p - q (and dL/dalpha).

Like the mappings (models/mappings.py), the losses take the device path for non-CPU logits and
under torch.compile: no host read anywhere in forward or backward (ignored rows and alpha close
to 1 are handled with torch.where, not with a branch on their presence). CPU logits take the CPU
path, which checks on the host whether such rows exist and skips their ops when none do.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor, nn

from common.errors import UserError

from .head_targets import REDUCTIONS, dense_target, reduce_rows
from .mappings import (
    SOFTMAX_BELOW,
    _check_alpha_value,
    _check_n_iter,
    _compute_dtype,
    _threads_for,
    entmax15_kernel,
    entmax_alpha_kernel,
    sparsemax_kernel,
    uses_device_path,
)



def _tsallis_sum(p: Tensor, alpha) -> Tensor:
    if isinstance(alpha, float):
        if alpha == 2.0:
            return (p * p).sum(-1)
        if alpha == 1.5:
            return (p * p.sqrt()).sum(-1)
    return torch.where(p > 0, p.pow(alpha), torch.zeros_like(p)).sum(-1)


def _tsallis_alpha_derivative(p: Tensor, a: Tensor) -> Tensor:
    """d/dalpha of (sum p^alpha - 1) / (alpha (alpha - 1)) at fixed p, per row; a is (N, 1)."""
    pa = torch.where(p > 0, p.pow(a), torch.zeros_like(p))
    s = pa.sum(-1)
    s_prime = torch.where(p > 0, pa * p.clamp(min=torch.finfo(p.dtype).tiny).log(),
                          torch.zeros_like(p)).sum(-1)
    a = a.squeeze(-1)
    c = a * (a - 1.0)
    return s_prime / c - (s - 1.0) * (2.0 * a - 1.0) / (c * c)


_ALPHA_OF = {"sparsemax": 2.0, "entmax15": 1.5}


def _omega_q_minus_p(q: Tensor, p: Tensor, a) -> Tensor:
    """Omega(q) - Omega(p) for the Tsallis entropy, same formula on both (exact 0 when p == q)."""
    return (_tsallis_sum(q, a) - _tsallis_sum(p, a)) / (a * (a - 1.0) if isinstance(a, float)
                                                       else (a * (a - 1.0)).squeeze(-1))


class _FenchelYoungLoss(torch.autograd.Function):
    """Per-row loss for logits z (N, K) and either class indices y (N,) or a dense target q (N, K).

    kind in {"softmax", "sparsemax", "entmax15", "alpha"}; alpha (kind "alpha" only) is a float
    > 1 + SOFTMAX_BELOW or a tensor (scalar or per row). Saves only p - q (and dL/dalpha).
    """

    @staticmethod
    def forward(ctx, z: Tensor, y: Optional[Tensor], q: Optional[Tensor], alpha: Union[None, float, Tensor],
                kind: str, n_iter: Optional[int], device_path: bool):
        # (one CPU thread for small work: _fy_loss runs this under _threads_for)
        zf = _compute_dtype(z)
        # An all -inf row: m = lowest finite value keeps z - m = -inf there (not NaN); one op.
        m = zf.amax(-1, keepdim=True).clamp_(min=torch.finfo(zf.dtype).min)
        d_alpha = None
        near_one = None
        if kind == "alpha" and isinstance(alpha, Tensor):
            a = alpha.to(zf.dtype).reshape(-1, 1).expand(zf.size(0), 1)
            # alpha within SOFTMAX_BELOW of 1: softmax rows (see mappings.SOFTMAX_BELOW). The
            # device path always takes the where; the CPU path only when such rows exist.
            near_one = a <= 1.0 + SOFTMAX_BELOW
            if device_path or bool(near_one.any()):
                a = torch.where(near_one, torch.full_like(a, 1.5), a)
            else:
                near_one = None
        elif kind == "alpha":
            a = float(alpha)  # a float near 1 was sent to the softmax loss by the caller
        else:
            a = _ALPHA_OF.get(kind)
        if kind == "softmax":
            zc = zf - m
            e = zc.exp()
            se = e.sum(-1, keepdim=True)
            conj = se.log().squeeze(-1)  # Omega*(zc) = logsumexp; -inf for an all -inf row
            p = e.div_(torch.where(se > 0, se, torch.ones_like(se)))
        else:
            want_log = kind == "alpha" and ctx.needs_input_grad[3]
            if kind == "sparsemax":
                p, d, tau = sparsemax_kernel(zf, -1, device_path)
                spd = torch.linalg.vecdot(p, d).unsqueeze(-1)
            elif kind == "entmax15":
                p, d, tau = entmax15_kernel(zf, -1, device_path)
                spd = torch.linalg.vecdot(p, d).unsqueeze(-1)
            else:
                p, spd, tau, splogp = entmax_alpha_kernel(zf, a, -1, n_iter, need_log=want_log,
                                                          device_path=device_path)
            if near_one is not None:
                e = (zf - m).exp_()
                se = e.sum(-1, keepdim=True)
                p = torch.where(near_one, e.div_(torch.where(se > 0, se, torch.ones_like(se))), p)
            if y is not None:
                # Omega*(zc) = <zc, p> - Omega(p). On the support zs = d + tau = (alpha-1) zc, so
                # <zc, p> = (sum p d + tau) / (alpha-1), and sum p^alpha = sum p d = spd.
                am1 = a - 1.0
                conj = ((spd + tau) / am1 - (spd - 1.0) / (a * am1)).squeeze(-1)
                if near_one is not None:
                    conj = torch.where(near_one.squeeze(-1), se.log().squeeze(-1), conj)
            if want_log:
                # dOmega(p)/dalpha from S = sum p^alpha and S' = sum p^alpha log p
                c = a * (a - 1.0)
                d_alpha = -(splogp / c - (spd - 1.0) * (2.0 * a - 1.0) / (c * c)).squeeze(-1)
                if q is not None:
                    d_alpha = d_alpha + _tsallis_alpha_derivative(q, a)
                if near_one is not None:
                    d_alpha = torch.where(near_one.squeeze(-1), torch.zeros_like(d_alpha), d_alpha)
        if y is not None:
            # one-hot target: Omega(e_y) = 0 and <zc, e_y> = zc_y (-inf -> +inf loss).
            loss = conj - (zf.gather(1, y.unsqueeze(1)) - m).squeeze(1)
            diff = p.scatter_add_(1, y.unsqueeze(1), torch.full_like(p[:, :1], -1.0))
        else:
            q = q.to(zf.dtype)
            zc = zf - m
            # Omega(q) - Omega(p) + <zc, p - q>, the same formula on q and p: exactly 0 at p == q.
            if kind == "softmax":
                omega = (torch.special.xlogy(q, q) - torch.special.xlogy(p, p)).sum(-1)
            else:
                omega = _omega_q_minus_p(q, p, a)
                if near_one is not None:
                    shannon = (torch.special.xlogy(q, q) - torch.special.xlogy(p, p)).sum(-1)
                    omega = torch.where(near_one.squeeze(-1), shannon, omega)
            diff0 = p - q
            # <zc, p - q> where 0 * (-inf) counts as 0 (masked class with no target mass)
            loss = omega + torch.where(diff0 != 0, zc * diff0, torch.zeros_like(diff0)).sum(-1)
            diff = p.sub_(q)
        # inf - inf (all -inf row with target mass) means an impossible target: +inf like CE.
        loss = torch.nan_to_num(loss, nan=float("inf"), posinf=float("inf")).clamp_(min=0.0)
        ctx.alpha_shape = alpha.shape if isinstance(alpha, Tensor) else None
        ctx.save_for_backward(diff, d_alpha)
        ctx.z_dtype = z.dtype
        return loss

    @staticmethod
    def backward(ctx, g: Tensor):
        diff, d_alpha = ctx.saved_tensors
        with _threads_for(diff):
            g = g.to(diff.dtype)
            dz = (diff * g.unsqueeze(-1)).to(ctx.z_dtype) if ctx.needs_input_grad[0] else None
            da = None
            if ctx.needs_input_grad[3] and d_alpha is not None:
                da = g * d_alpha
                shape = ctx.alpha_shape
                da = (da.sum() if shape.numel() == 1 else da).reshape(shape)
        return dz, None, None, da, None, None, None


def _dense_target(zf: Tensor, target: Tensor, label_smoothing: float, ignore_index: int):
    """q (N, K) in zf's dtype and the mask of rows that count (None: all rows); shapes checked here,
    the target itself built as for every head (models/head_targets.py)."""
    N, K = zf.shape
    if target.dtype.is_floating_point and target.shape != zf.shape:
        raise UserError(f"soft targets must have the logits' shape {tuple(zf.shape)}, got {tuple(target.shape)}")
    if not target.dtype.is_floating_point and target.shape != (N,):
        raise UserError(f"class-index targets must have shape {(N,)}, got {tuple(target.shape)}")
    return dense_target(zf, target, label_smoothing, ignore_index)


def _fy_loss(kind: str, logits: Tensor, target: Tensor, alpha=None, label_smoothing: float = 0.0,
             ignore_index: int = -100, reduction: str = "mean", n_iter: Optional[int] = None) -> Tensor:
    if reduction not in REDUCTIONS:
        raise UserError(f"unknown reduction '{reduction}'; valid: {', '.join(REDUCTIONS)}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise UserError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    device_path = uses_device_path(logits)
    with _threads_for(logits):
        return _fy_loss_body(kind, logits, target, alpha, label_smoothing, ignore_index, reduction,
                             n_iter, device_path)


def _fy_loss_body(kind, logits, target, alpha, label_smoothing, ignore_index, reduction, n_iter,
                  device_path):
    lead = logits.shape[:-1]
    K = logits.shape[-1]
    z = logits.reshape(-1, K)
    if target.dtype.is_floating_point:
        target = target.reshape(-1, K)
    else:
        target = target.reshape(-1)
    if isinstance(alpha, Tensor) and alpha.dim() > 0 and alpha.numel() > 1:
        alpha = alpha.reshape(-1)
    y = q = valid = None
    if target.dtype.is_floating_point or label_smoothing > 0:
        with torch.no_grad():
            q, valid = _dense_target(_compute_dtype(z.detach()), target, label_smoothing, ignore_index)
    else:
        if target.shape != (z.size(0),):
            raise UserError(f"class-index targets must have shape {(z.size(0),)}, got {tuple(target.shape)}")
        valid = target != ignore_index
        if not device_path and bool(valid.all()):
            y, valid = target, None  # nothing ignored (the usual case): skip the masking ops
        else:
            y = torch.where(valid, target, torch.zeros_like(target))
    loss = _FenchelYoungLoss.apply(z, y, q, alpha, kind, n_iter, device_path)
    return reduce_rows(loss, valid, reduction, lead)


def softmax_loss(logits, target, label_smoothing=0.0, ignore_index=-100, reduction="mean"):
    """Fenchel-Young loss of softmax: cross-entropy minus the target's entropy (= CE for one-hot)."""
    return _fy_loss("softmax", logits, target, None, label_smoothing, ignore_index, reduction)


def sparsemax_loss(logits, target, label_smoothing=0.0, ignore_index=-100, reduction="mean"):
    """Sparsemax loss (Martins & Astudillo 2016), the Fenchel-Young loss of sparsemax."""
    return _fy_loss("sparsemax", logits, target, None, label_smoothing, ignore_index, reduction)


def entmax15_loss(logits, target, label_smoothing=0.0, ignore_index=-100, reduction="mean"):
    """Fenchel-Young loss of 1.5-entmax (Peters et al. 2019)."""
    return _fy_loss("entmax15", logits, target, None, label_smoothing, ignore_index, reduction)


def entmax_bisect_loss(logits, target, alpha: Union[float, Tensor] = 1.5, label_smoothing=0.0,
                       ignore_index=-100, reduction="mean", n_iter: Optional[int] = None):
    """Fenchel-Young loss of alpha-entmax; a tensor alpha (scalar or per row) gets a gradient.

    A float alpha of 1, 1.5 or 2 dispatches to the softmax, 1.5-entmax or sparsemax loss (and one
    within SOFTMAX_BELOW of 1 to the softmax loss); other floats stay Python numbers (no tensor
    made from host data on every call).
    """
    _check_n_iter(n_iter)
    if not isinstance(alpha, Tensor):
        alpha = _check_alpha_value(alpha)
        kind = "softmax" if alpha - 1.0 <= SOFTMAX_BELOW else {1.5: "entmax15", 2.0: "sparsemax"}.get(alpha)
        if kind is not None:
            return _fy_loss(kind, logits, target, None, label_smoothing, ignore_index, reduction)
    return _fy_loss("alpha", logits, target, alpha, label_smoothing, ignore_index, reduction, n_iter)


class _LossModule(nn.Module):
    def __init__(self, label_smoothing: float = 0.0, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__()
        if reduction not in REDUCTIONS:
            raise UserError(f"unknown reduction '{reduction}'; valid: {', '.join(REDUCTIONS)}")
        self.label_smoothing = label_smoothing
        self.ignore_index = ignore_index
        self.reduction = reduction

    def _kw(self):
        return dict(label_smoothing=self.label_smoothing, ignore_index=self.ignore_index,
                    reduction=self.reduction)


class SoftmaxLoss(_LossModule):
    def forward(self, logits, target):
        return softmax_loss(logits, target, **self._kw())


class SparsemaxLoss(_LossModule):
    def forward(self, logits, target):
        return sparsemax_loss(logits, target, **self._kw())


class Entmax15Loss(_LossModule):
    def forward(self, logits, target):
        return entmax15_loss(logits, target, **self._kw())


class EntmaxBisectLoss(_LossModule):
    def __init__(self, alpha: Union[float, Tensor] = 1.5, n_iter: Optional[int] = None, **kwargs):
        super().__init__(**kwargs)
        self.alpha = alpha
        self.n_iter = n_iter

    def forward(self, logits, target):
        return entmax_bisect_loss(logits, target, alpha=self.alpha, n_iter=self.n_iter, **self._kw())


__all__ = ["softmax_loss", "sparsemax_loss", "entmax15_loss", "entmax_bisect_loss",
           "SoftmaxLoss", "SparsemaxLoss", "Entmax15Loss", "EntmaxBisectLoss", "REDUCTIONS"]
