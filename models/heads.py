"""Swappable output heads: a named probability mapping plus its Fenchel-Young loss.

The mappings live in models/mappings.py and the losses in models/losses.py; everything public is
re-exported here so callers only need `from models.heads import ...`.

`OutputHead` holds no classifier weights (the model's `head` Linear produces the logits); it maps
logits to probabilities, computes the matching loss for hard or soft targets, and reports the
support. With `learn_alpha=True` (entmax_bisect only) alpha = 1 + sigmoid(alpha_logit) is a
parameter, so it stays in (1, 2) by construction (Correia et al. 2019 learn it the same way).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor, nn

from common.errors import UserError
from .losses import (
    REDUCTIONS,
    Entmax15Loss,
    EntmaxBisectLoss,
    SoftmaxLoss,
    SparsemaxLoss,
    entmax15_loss,
    entmax_bisect_loss,
    softmax_loss,
    sparsemax_loss,
)
from .mappings import entmax15, entmax_bisect, softmax, sparsemax

HEAD_NAMES = ("softmax", "sparsemax", "entmax15", "entmax_bisect")
# Heads whose probabilities have exact zeros: their support is a prediction set.
SPARSE_HEAD_NAMES = ("sparsemax", "entmax15", "entmax_bisect")

_FIXED_ALPHA = {"softmax": 1.0, "sparsemax": 2.0, "entmax15": 1.5}
_MAPPINGS = {"softmax": softmax, "sparsemax": sparsemax, "entmax15": entmax15}
_LOSSES = {"softmax": softmax_loss, "sparsemax": sparsemax_loss, "entmax15": entmax15_loss}


class OutputHead(nn.Module):
    """logits -> probabilities with the named mapping, and its Fenchel-Young loss."""

    def __init__(self, name: str = "softmax", alpha: float = 1.5, learn_alpha: bool = False):
        super().__init__()
        if name not in HEAD_NAMES:
            raise UserError(f"unknown output head '{name}'; valid names: {', '.join(HEAD_NAMES)}")
        if learn_alpha and name != "entmax_bisect":
            raise UserError(f"learn_alpha=True needs head 'entmax_bisect' (got '{name}'); "
                            f"set head.name=entmax_bisect or head.learn_alpha=false")
        self.name = name
        self.learn_alpha = bool(learn_alpha)
        self._fixed_alpha: Optional[float] = _FIXED_ALPHA.get(name)
        if name == "entmax_bisect":
            try:
                alpha = float(alpha)
            except (TypeError, ValueError):
                raise UserError(f"head alpha must be a number, got {alpha!r}") from None
            if learn_alpha:
                if not 1.0 < alpha < 2.0:
                    raise UserError(f"a learned alpha starts strictly inside (1, 2), got {alpha}; "
                                    f"e.g. head.alpha=1.5")
                # alpha = 1 + sigmoid(alpha_logit)  =>  alpha_logit = logit(alpha - 1)
                self.alpha_logit = nn.Parameter(torch.tensor(math.log((alpha - 1.0) / (2.0 - alpha))))
            else:
                if not 1.0 <= alpha <= 2.0:
                    raise UserError(f"entmax_bisect alpha must be in [1, 2] (1 = softmax, "
                                    f"2 = sparsemax), got {alpha}")
                self._fixed_alpha = alpha

    @property
    def alpha(self) -> Tensor:
        """Current alpha as a float tensor (differentiable when learned)."""
        if self.learn_alpha:
            return 1.0 + torch.sigmoid(self.alpha_logit)
        return torch.tensor(self._fixed_alpha)

    def _alpha_arg(self):
        return 1.0 + torch.sigmoid(self.alpha_logit) if self.learn_alpha else self._fixed_alpha

    def forward(self, logits: Tensor, dim: int = -1) -> Tensor:
        if self.name in _MAPPINGS:
            return _MAPPINGS[self.name](logits, dim)
        return entmax_bisect(logits, self._alpha_arg(), dim)

    def loss(self, logits: Tensor, target: Tensor, label_smoothing: float = 0.0,
             ignore_index: int = -100, reduction: str = "mean") -> Tensor:
        """Fenchel-Young loss; target is int64 classes (B,) or float probability rows (B, K)."""
        kw = dict(label_smoothing=label_smoothing, ignore_index=ignore_index, reduction=reduction)
        if self.name in _LOSSES:
            return _LOSSES[self.name](logits, target, **kw)
        return entmax_bisect_loss(logits, target, alpha=self._alpha_arg(), **kw)

    @staticmethod
    def support(probs: Tensor) -> Tensor:
        return probs > 0

    @staticmethod
    def support_size(probs: Tensor) -> Tensor:
        return (probs > 0).sum(-1)

    def extra_repr(self) -> str:
        if self.name != "entmax_bisect":
            return f"name={self.name}"
        return f"name={self.name}, alpha={float(self.alpha.detach()):.4g}, learn_alpha={self.learn_alpha}"


def build_output_head(name: str, alpha: float = 1.5, learn_alpha: bool = False) -> OutputHead:
    return OutputHead(name, alpha=alpha, learn_alpha=learn_alpha)


__all__ = [
    "HEAD_NAMES", "SPARSE_HEAD_NAMES", "OutputHead", "build_output_head", "REDUCTIONS",
    "softmax", "sparsemax", "entmax15", "entmax_bisect",
    "softmax_loss", "sparsemax_loss", "entmax15_loss", "entmax_bisect_loss",
    "SoftmaxLoss", "SparsemaxLoss", "Entmax15Loss", "EntmaxBisectLoss",
]
