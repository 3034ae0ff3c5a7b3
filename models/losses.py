"""Fenchel-Young losses of the entmax family (Blondel, Martins & Niculae 2020, "Learning with
Fenchel-Young Losses"), on the loss pipeline every head uses (models/head_targets.row_loss).

    L(z; q) = Omega(q) + Omega*(z) - <z, q>,   grad_z L = p(z) - q,   Omega*(z) = <z, p> - Omega(p)

Each loss is a regularizer Omega and its projection p = argmax <z, p> - Omega(p), as in the
`entmax` package's template: the Shannon negentropy Omega(p) = sum p log p (projection softmax;
L is cross-entropy minus the entropy of q, plain cross-entropy for one-hot targets) and the
Tsallis entropies Omega(p) = (sum p^alpha - 1) / (alpha (alpha - 1)) (projection alpha-entmax;
sparsemax: alpha = 2, 1.5-entmax: alpha = 1.5). `fenchel_young` holds the formula, once. For a
learnable alpha the envelope theorem gives dL/dalpha = dOmega_alpha(q)/dalpha - dOmega_alpha(p)/dalpha.

Targets are class indices (N,) or probability rows (N, K) (Mixup/CutMix); label smoothing mixes
the target with the uniform distribution over the row's finite (non -inf) classes; rows whose
class index equals `ignore_index` contribute 0 and are left out of the mean (an all-ignored batch
gives 0, not NaN). Logits are (N, K) or (..., K) with classes last. Class indices without label
smoothing skip the dense target: Omega(e_y) = 0 for every regularizer here and <z, e_y> = z_y.

-inf logits: the loss stays finite while q puts no mass on -inf classes; if it does, the loss is
+inf (as for cross-entropy: the target is impossible) and the gradient stays the finite p - q.

The forward computes the mapping once and the backward saves only p - q (and dL/dalpha). Which
threshold path runs is the mappings' seam's business (models/mappings.py): nothing here reads on
the host.
"""
from __future__ import annotations

from typing import Callable, Optional, Union

import torch
from torch import Tensor

from .head_targets import REDUCTIONS, RowGradientLoss, compute_dtype, finish_rows, masked_dot, row_loss
from .mappings import (
    ALPHA_OF,
    SOFTMAX_BELOW,
    alpha_rows,
    check_alpha_value,
    check_n_iter,
    entmax15_kernel,
    entmax_alpha_kernel,
    sparsemax_kernel,
    threads_for,
    with_softmax_rows,
)


def _nonzero(s: Tensor) -> Tensor:
    return torch.where(s > 0, s, torch.ones_like(s))


def shannon_omega(p: Tensor) -> Tensor:
    return torch.special.xlogy(p, p).sum(-1)


def tsallis_omega(p: Tensor, a) -> Tensor:
    """(sum p^alpha - 1) / (alpha (alpha - 1)) per row; a is a float or (N, 1)."""
    if isinstance(a, float) and a == 2.0:
        s = (p * p).sum(-1)
    elif isinstance(a, float) and a == 1.5:
        s = (p * p.sqrt()).sum(-1)
    else:
        s = torch.where(p > 0, p.pow(a), torch.zeros_like(p)).sum(-1)
    c = a * (a - 1.0)
    return (s - 1.0) / (c if isinstance(c, float) else c.squeeze(-1))


def tsallis_alpha_derivative(s: Tensor, s_log: Tensor, a: Tensor) -> Tensor:
    """d/dalpha of (S - 1) / (alpha (alpha - 1)) at fixed p, from S = sum p^alpha and
    S' = sum p^alpha log p (all (N, 1)); per row (N,)."""
    c = a * (a - 1.0)
    return (s_log / c - (s - 1.0) * (2.0 * a - 1.0) / (c * c)).squeeze(-1)


def _tsallis_alpha_derivative_of(q: Tensor, a: Tensor) -> Tensor:
    qa = torch.where(q > 0, q.pow(a), torch.zeros_like(q))
    q_log = torch.where(q > 0, qa * q.clamp(min=torch.finfo(q.dtype).tiny).log(), torch.zeros_like(q))
    return tsallis_alpha_derivative(qa.sum(-1, keepdim=True), q_log.sum(-1, keepdim=True), a)


class Projection:
    """What a regularizer's projection of z gives the loss: p, Omega*(z - max) per row, Omega
    itself (to evaluate it on a dense target and on p with the same formula) and, for a learned
    alpha, the per-row dL/dalpha given the target."""

    def __init__(self, p: Tensor, conjugate: Tensor, omega: Callable[[Tensor], Tensor],
                 alpha_grad: Optional[Callable[[Tensor], Tensor]] = None):
        self.p, self.conjugate, self.omega, self.alpha_grad = p, conjugate, omega, alpha_grad


def fenchel_young(proj: Projection, zf: Tensor, m: Tensor, target: Tensor) -> Tensor:
    """L(z; q) = Omega(q) + Omega*(z) - <z, q> per row, computed for z - m (m: the row max; L is
    shift-invariant, and Omega* is the projection's, of z - m)."""
    if not target.dtype.is_floating_point:
        # q = e_y: Omega(e_y) = 0 for every regularizer here, <z, e_y> = z_y (-inf -> +inf loss)
        return finish_rows(proj.conjugate - (zf.gather(1, target.unsqueeze(1)) - m).squeeze(1))
    # Omega*(z) = <z, p> - Omega(p): the same Omega on q and p makes L exactly 0 at q = p
    return finish_rows(proj.omega(target) - proj.omega(proj.p) + masked_dot(zf - m, proj.p - target))


class Shannon:
    """Omega(p) = sum p log p; projection: softmax, Omega*(z) = logsumexp(z)."""

    alpha = ALPHA_OF["softmax"]

    @staticmethod
    def project(zf: Tensor, m: Tensor, alpha, n_iter, need_alpha_grad: bool) -> Projection:
        e = (zf - m).exp_()
        se = e.sum(-1, keepdim=True)
        return Projection(e.div_(_nonzero(se)), se.log().squeeze(-1), shannon_omega)


class Tsallis:
    """Omega(p) = (sum p^alpha - 1) / (alpha (alpha - 1)); projection: alpha-entmax.

    With `kernel` (sparsemax, 1.5-entmax) alpha is fixed; without, it is the loss's argument: a
    float > 1 + SOFTMAX_BELOW or a tensor (scalar or (N, 1)), whose rows near 1 are Shannon's."""

    def __init__(self, kernel=None, alpha: Optional[float] = None):
        self.kernel, self.alpha = kernel, alpha

    def _solve(self, zf: Tensor, a, n_iter, need_log: bool):
        """(p, spd, tau, splogp): spd = sum p^alpha, splogp = sum p^alpha log p (need_log)."""
        if self.kernel is None:
            return entmax_alpha_kernel(zf, a, n_iter, need_log=need_log)[:4]
        p, d, tau = self.kernel(zf)
        return p, torch.linalg.vecdot(p, d).unsqueeze(-1), tau, None

    def project(self, zf: Tensor, m: Tensor, alpha, n_iter, need_alpha_grad: bool) -> Projection:
        a, near_one = self.alpha if self.kernel is not None else alpha, None
        if isinstance(a, Tensor):
            a, near_one = alpha_rows(a.to(zf.dtype).reshape(-1, 1).expand(zf.size(0), 1))
        p, spd, tau, splogp = self._solve(zf, a, n_iter, need_alpha_grad)
        # On the support zs = d + tau = (alpha-1) zc, so <zc, p> = (sum p d + tau) / (alpha-1),
        # and sum p^alpha = sum p d = spd: Omega*(zc) = <zc, p> - Omega(p) from row sums only.
        conjugate = ((spd + tau) / (a - 1.0) - (spd - 1.0) / (a * (a - 1.0))).squeeze(-1)
        omega = lambda t: tsallis_omega(t, a)  # noqa: E731
        alpha_grad = None
        if need_alpha_grad:
            of_p = tsallis_alpha_derivative(spd, splogp, a)
            alpha_grad = lambda t: (-of_p if not t.dtype.is_floating_point  # noqa: E731
                                    else _tsallis_alpha_derivative_of(t, a) - of_p)
        if near_one is None:
            return Projection(p, conjugate, omega, alpha_grad)
        return self._with_shannon_rows(Projection(p, conjugate, omega, alpha_grad), zf, m, a, near_one)

    @staticmethod
    def _with_shannon_rows(proj: Projection, zf: Tensor, m: Tensor, a: Tensor, near_one: Tensor) -> Projection:
        """Rows with alpha within SOFTMAX_BELOW of 1 are softmax rows: Shannon's p, Omega*, Omega."""
        shannon = Shannon.project(zf, m, None, None, False)
        rows = near_one.squeeze(-1)
        tsallis_omega_of, tsallis_grad = proj.omega, proj.alpha_grad
        proj.p = with_softmax_rows(proj.p, shannon.p, a, near_one)
        # (a * 0 + 1: NaN on rows whose alpha < 1, which the device path marks instead of refusing)
        proj.conjugate = torch.where(rows, shannon.conjugate * (a * 0.0 + 1.0).squeeze(-1), proj.conjugate)
        proj.omega = lambda t: torch.where(rows, shannon_omega(t), tsallis_omega_of(t))
        if tsallis_grad is not None:
            proj.alpha_grad = lambda t: tsallis_grad(t).masked_fill(rows, 0.0)
        return proj


SHANNON = Shannon()
SPARSEMAX = Tsallis(sparsemax_kernel, ALPHA_OF["sparsemax"])
ENTMAX15 = Tsallis(entmax15_kernel, ALPHA_OF["entmax15"])
ALPHA_ENTMAX = Tsallis()
_EXACT = {r.alpha: r for r in (SHANNON, ENTMAX15, SPARSEMAX)}


class FenchelYoungLoss(RowGradientLoss):
    """Per-row Fenchel-Young loss of `regularizer` for logits z (N, K) and class indices (N,) or a
    dense target q (N, K); alpha: the Tsallis alpha argument (None for fixed regularizers)."""

    @staticmethod
    def forward(ctx, z: Tensor, target: Tensor, alpha: Union[None, float, Tensor], regularizer,
                n_iter: Optional[int]):
        need_alpha_grad = isinstance(alpha, Tensor) and ctx.needs_input_grad[2]
        with threads_for(z):
            zf = compute_dtype(z)
            # An all -inf row: m = lowest finite value keeps z - m = -inf there (not NaN); one op.
            m = zf.amax(-1, keepdim=True).clamp_(min=torch.finfo(zf.dtype).min)
            proj = regularizer.project(zf, m, alpha, n_iter, need_alpha_grad)
            loss = fenchel_young(proj, zf, m, target)
            extra = (2, proj.alpha_grad(target), alpha.shape) if need_alpha_grad else None
            # p - q out of place: p (used by the loss above) is never mutated after its use, which
            # torch.compile's functionalization would otherwise have to order (see tests/test_cuda_heads.py)
            if target.dtype.is_floating_point:
                grad = proj.p - target
            else:
                grad = proj.p.scatter_add(1, target.unsqueeze(1), torch.full_like(proj.p[:, :1], -1.0))
            RowGradientLoss.save_row_gradient(ctx, grad, z, extra)
        return loss


def _fy_loss(regularizer, logits, target, alpha, label_smoothing, ignore_index, reduction, n_iter=None):
    if isinstance(alpha, Tensor) and alpha.numel() > 1:
        alpha = alpha.reshape(-1)
    return row_loss(FenchelYoungLoss, logits, target, label_smoothing, ignore_index, reduction,
                    alpha, regularizer, n_iter, class_indices=True)


def softmax_loss(logits, target, label_smoothing=0.0, ignore_index=-100, reduction="mean"):
    """Fenchel-Young loss of softmax: cross-entropy minus the target's entropy (= CE for one-hot)."""
    return _fy_loss(SHANNON, logits, target, None, label_smoothing, ignore_index, reduction)


def sparsemax_loss(logits, target, label_smoothing=0.0, ignore_index=-100, reduction="mean"):
    """Sparsemax loss (Martins & Astudillo 2016), the Fenchel-Young loss of sparsemax."""
    return _fy_loss(SPARSEMAX, logits, target, None, label_smoothing, ignore_index, reduction)


def entmax15_loss(logits, target, label_smoothing=0.0, ignore_index=-100, reduction="mean"):
    """Fenchel-Young loss of 1.5-entmax (Peters et al. 2019)."""
    return _fy_loss(ENTMAX15, logits, target, None, label_smoothing, ignore_index, reduction)


def entmax_bisect_loss(logits, target, alpha: Union[float, Tensor] = 1.5, label_smoothing=0.0,
                       ignore_index=-100, reduction="mean", n_iter: Optional[int] = None):
    """Fenchel-Young loss of alpha-entmax for any alpha >= 1; a tensor alpha (scalar or per row)
    gets a gradient. alpha < 1 raises UserError, as in entmax_bisect.

    A float alpha of 1, 1.5 or 2 takes the softmax, 1.5-entmax or sparsemax loss (and one within
    SOFTMAX_BELOW of 1 the softmax loss); other floats stay Python numbers (no tensor made from
    host data on every call).
    """
    check_n_iter(n_iter)
    if not isinstance(alpha, Tensor):
        alpha = check_alpha_value(alpha)
        exact = SHANNON if alpha - 1.0 <= SOFTMAX_BELOW else _EXACT.get(alpha)
        if exact is not None:
            return _fy_loss(exact, logits, target, None, label_smoothing, ignore_index, reduction)
    return _fy_loss(ALPHA_ENTMAX, logits, target, alpha, label_smoothing, ignore_index, reduction, n_iter)


__all__ = ["softmax_loss", "sparsemax_loss", "entmax15_loss", "entmax_bisect_loss", "fenchel_young",
           "FenchelYoungLoss", "Shannon", "Tsallis", "REDUCTIONS"]
