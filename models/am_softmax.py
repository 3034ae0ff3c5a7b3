"""Additive-margin softmax (Wang, Cheng, Liu & Liu 2018, IEEE Signal Processing Letters,
"Additive Margin Softmax for Face Verification"; the same loss as CosFace, Wang et al. CVPR 2018).

    cos_j = <W_j / ||W_j||, x / ||x||>,     logits = s cos,
    L(x; y) = -log( e^{s (cos_y - m)} / (e^{s (cos_y - m)} + sum_{j != y} e^{s cos_j}) ).

The paper uses s = 30 and m = 0.35 (its best margin); those are the defaults here.

Split of the work:
* `CosineLinear` replaces the model's final Linear (no bias, as in the paper): it L2-normalises
  the features and the class weights and returns s * cos, which are the model's logits. It computes
  in fp32 even under autocast: cosines in bf16 carry ~3 significant digits, an error of ~0.1 in a
  logit once multiplied by s = 30, at a negligible cost (one K x D matmul per image).
* the head's probabilities are the plain softmax of those logits (no margin, in any mode);
* the margin is part of the loss only, and only in training mode: `am_softmax_loss` subtracts
  s * m from the true class's logit, then takes the softmax cross-entropy (for soft targets minus
  the target's entropy, as the softmax head's loss). For soft targets
  (Mixup/CutMix) each class's logit is lowered by s * m * q_i (its target mass), the natural
  extension; label smoothing is applied by the cross-entropy after the margin, which stays on the
  hard class only.
"""
from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F
from timm.layers import register_notrace_function
from torch import Tensor, nn

from common.errors import UserError

from .head_checks import check_margin, check_scale
from .head_targets import (
    RowGradientLoss,
    check_loss_args,
    compute_dtype,
    dense_target,
    finish_rows,
    flatten,
    masked_dot,
    reduce_rows,
)


def scaled_cosine(x: Tensor, weight: Tensor, scale: float) -> Tensor:
    """scale * cos(x, W_j), in fp32 (fp64 stays fp64)."""
    xf = x.float() if x.dtype != torch.float64 else x
    cos = F.linear(F.normalize(xf, dim=-1), F.normalize(weight.to(xf.dtype), dim=-1))
    return cos * scale


def scaled_cosine_fp32(x: Tensor, weight: Tensor, scale: float) -> Tensor:
    """scaled_cosine with autocast off. torch.fx records it as one call: it cannot trace autocast's
    device argument (x.device.type)."""
    with torch.autocast(device_type=x.device.type, enabled=False):
        return scaled_cosine(x, weight, scale)


torch.fx.wrap("scaled_cosine_fp32")
register_notrace_function(scaled_cosine_fp32)  # the same for timm's fx feature extraction


class CosineLinear(nn.Module):
    """x -> scale * cos(x, W_j) for every class j: normalised features and weights, no bias."""

    def __init__(self, in_features: int, out_features: int, scale: float = 30.0,
                 weight: Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.scale = check_scale(scale)
        like = {} if weight is None else dict(dtype=weight.dtype, device=weight.device)
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **like))
        with torch.no_grad():
            if weight is not None:
                self.weight.copy_(weight)
            else:
                nn.init.trunc_normal_(self.weight, std=0.02)

    def forward(self, x: Tensor) -> Tensor:
        if torch.jit.is_scripting():  # TorchScript needs autocast's device as a constant (and runs none)
            return scaled_cosine(x, self.weight, self.scale)
        return scaled_cosine_fp32(x, self.weight, self.scale)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, scale={self.scale:g}"


def install_cosine_classifier(model: nn.Module, scale: float) -> nn.Module:
    """Replace `model.head` (an nn.Linear) by a CosineLinear with the same weights (bias dropped)."""
    head = getattr(model, "head", None)
    if isinstance(head, CosineLinear):
        head.scale = check_scale(scale)
        return model
    if not isinstance(head, nn.Linear):
        raise UserError(f"head.name=am_softmax needs a model whose classifier `head` is a Linear layer, "
                        f"got {type(head).__name__}; is num_classes > 0?")
    model.head = CosineLinear(head.in_features, head.out_features, scale, weight=head.weight.detach())
    return model


class _MarginCrossEntropy(RowGradientLoss):
    """Per-row softmax cross-entropy minus the target's entropy (the softmax head's Fenchel-Young
    loss, plain CE for one-hot targets) of z - margin_rows; saves only the gradient p - q."""

    @staticmethod
    def forward(ctx, z: Tensor, q: Tensor, margin_rows: Tensor):
        zm = compute_dtype(z) - margin_rows
        m = zm.amax(-1, keepdim=True).clamp(min=torch.finfo(zm.dtype).min)
        e = (zm - m).exp()
        s = e.sum(-1, keepdim=True)
        p = e / torch.where(s > 0, s, torch.ones_like(s))
        qs = q.sum(-1)
        # logsumexp(zm) sum(q) - <zm, q> + sum q log q, on zm - m (no cancellation)
        loss = finish_rows(s.squeeze(-1).log() * qs - masked_dot(zm - m, q)
                           + torch.special.xlogy(q, q).sum(-1))
        RowGradientLoss.save_row_gradient(ctx, p * qs.unsqueeze(-1) - q, z)
        return loss


def am_softmax_loss(logits: Tensor, target: Tensor, scale: float = 30.0, margin: float = 0.35,
                    label_smoothing: float = 0.0, ignore_index: int = -100,
                    reduction: str = "mean") -> Tensor:
    """Softmax cross-entropy of the logits (= s cos) with s * margin taken off the target's logit.

    Pass margin=0 for the margin-free loss (what OutputHead does in eval mode). Classes last;
    target: class indices or probability rows. Gradient p_margin - q."""
    check_loss_args(reduction, label_smoothing)
    shift = check_scale(scale) * check_margin(margin)
    z, t, lead = flatten(logits, target)
    with torch.no_grad():
        zf = compute_dtype(z.detach())
        hard, valid = dense_target(zf, t, 0.0, ignore_index)  # the margin stays on the true class
        q = dense_target(zf, t, label_smoothing, ignore_index)[0] if label_smoothing > 0 else hard
    loss = _MarginCrossEntropy.apply(z, q, hard * shift)
    return reduce_rows(loss, valid, reduction, lead)


__all__ = ["CosineLinear", "install_cosine_classifier", "am_softmax_loss", "check_scale", "check_margin"]
