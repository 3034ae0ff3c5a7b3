"""Top-k "sparse softmax" and its loss (Sun, Zhang, Huang, Lei, Su, Pan & Cao 2021,
"Sparse-softmax: A Simpler and Faster Alternative Softmax Transformation", arXiv:2112.12433).

    p_i = exp(z_i) / sum_{j in T_k} exp(z_j)  for i in T_k (the k largest logits),  0 elsewhere;
    L(z; y) = logsumexp_{j in T_k}(z_j) - z_y .

For a true class inside the top k, L is exactly the cross-entropy of the truncated distribution,
-log p_y. For a true class outside the top k, -log p_y would be +inf; the paper's formula above
stays finite (it is >= max z - z_y > 0) and is what is used here, so that class is pulled up
until it enters the top k. We do NOT add the target to the support: the loss is then the
generalized Fenchel-Young loss of this very mapping (logsumexp over the top k is the conjugate
of the negative Shannon entropy restricted to k-sparse distributions), and its gradient is
exactly p - q. Soft targets (Mixup, label smoothing) use the same form,
L = sum_i q_i (logsumexp_{T_k}(z) - z_i) = logsumexp_{T_k}(z) - <z, q>, gradient p - q.

Gradients: the mapping's Jacobian is diag(p) - p p^T, which is ZERO for every logit outside the
top k: those logits get no gradient through the probabilities. Through the loss, a class outside
the top k gets only -q_i (its target mass); a non-target logit outside the top k gets none.

Ties: the top k is whatever `torch.topk` returns; among logits tied at the k-th value it picks
an implementation-defined subset, so exactly k entries are kept (never more), but which tied
entries win may differ between devices and versions. Rows with fewer than k finite logits keep
only their finite ones (-inf logits get probability 0); an all -inf row maps to zeros.
No host reads: topk, softmax and scatter only (GPU-safe).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .head_checks import check_k
from .head_targets import RowGradientLoss, compute_dtype, finish_rows, masked_dot, row_loss
from .mappings import rows_backward, rows_forward


def topk_softmax_kernel(x: Tensor, k: int):
    """Rows x (R, K) fp32/fp64 -> (p, lse): p the top-k softmax, lse = logsumexp over the top k
    (-inf for an all -inf row)."""
    check_k(k, x.shape[-1])
    vals, idx = x.topk(k, dim=-1, sorted=False)
    m = vals.amax(-1, keepdim=True).clamp(min=torch.finfo(x.dtype).min)  # all -inf row: finite m
    e = (vals - m).exp()
    s = e.sum(-1, keepdim=True)
    pk = e / torch.where(s > 0, s, torch.ones_like(s))
    p = torch.zeros_like(x).scatter_(-1, idx, pk)
    return p, (m + s.log()).squeeze(-1)


def _topk_softmax_rows(rows: Tensor, k: int):
    p = topk_softmax_kernel(rows, k)[0]
    return p, (p,)


def _topk_softmax_backward(p: Tensor, g: Tensor) -> Tensor:
    pg = p * g
    return pg - p * pg.sum(-1, keepdim=True)  # softmax's Jacobian with p = 0 outside the top k


class TopkSoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, k: int, dim: int):
        return rows_forward(ctx, x, dim, lambda rows: _topk_softmax_rows(rows, k))

    @staticmethod
    def backward(ctx, g: Tensor):
        return rows_backward(ctx, g, _topk_softmax_backward), None, None


def topk_softmax(x: Tensor, k: int, dim: int = -1) -> Tensor:
    """Softmax over the k largest entries along `dim`, exact zeros elsewhere (Sun et al. 2021)."""
    return TopkSoftmaxFunction.apply(x, check_k(k), dim)


class _TopkSoftmaxLossFunction(RowGradientLoss):
    @staticmethod
    def forward(ctx, z: Tensor, q: Tensor, k: int):
        zf = compute_dtype(z)
        p, lse = topk_softmax_kernel(zf, k)
        m = zf.amax(-1, keepdim=True).clamp(min=torch.finfo(zf.dtype).min)
        # lse - <z, q> with sum q = 1, computed on z - m (no cancellation of large logits)
        loss = finish_rows((lse - m.squeeze(-1)) * q.sum(-1) - masked_dot(zf - m, q))
        RowGradientLoss.save_row_gradient(ctx, p - q, z)  # out of place, as models/losses.py
        return loss


def topk_softmax_loss(logits: Tensor, target: Tensor, k: int, label_smoothing: float = 0.0,
                      ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """Sparse-softmax loss logsumexp_{top k}(z) - <z, q> (classes last); gradient p - q."""
    return row_loss(_TopkSoftmaxLossFunction, logits, target, label_smoothing, ignore_index, reduction, check_k(k))


__all__ = ["topk_softmax", "topk_softmax_loss", "topk_softmax_kernel", "check_k", "TopkSoftmaxFunction"]
