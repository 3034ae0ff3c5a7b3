"""Swappable output heads: a named probability mapping plus its Fenchel-Young loss.

The mappings live in models/mappings.py and the losses in models/losses.py; everything public is
re-exported here so callers only need `from models.heads import ...`.

`OutputHead` holds no classifier weights (the model's `head` Linear produces the logits); it maps
logits to probabilities, computes the matching loss for hard or soft targets, and reports the
support. With `learn_alpha=True` (entmax_bisect only) alpha = 1 + sigmoid(alpha_logit) is a
parameter, so it stays in (1, 2) by construction (Correia et al. 2019 learn it the same way).

Heads from the wider literature, each with its own training loss (one module each):
normmax (gamma-normmax, models/normmax.py), sparse_softmax (top-k softmax, models/topk_softmax.py),
taylor_softmax (models/taylor_softmax.py) and am_softmax (additive-margin softmax,
models/am_softmax.py). am_softmax also needs a cosine classifier: `prepare_classifier(model)`
swaps the model's final Linear for a CosineLinear (models.create_classifier calls it).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor, nn

from common.errors import UserError

from .am_softmax import am_softmax_loss, check_margin, check_scale, install_cosine_classifier
from .losses import (
    REDUCTIONS,
    entmax15_loss,
    entmax_bisect_loss,
    softmax_loss,
    sparsemax_loss,
)
from .mappings import entmax15, entmax_bisect, softmax, sparsemax
from .normmax import check_gamma, normmax, normmax_loss
from .taylor_softmax import check_order, taylor_softmax, taylor_softmax_loss
from .topk_softmax import check_k, topk_softmax, topk_softmax_loss

HEAD_NAMES = ("softmax", "sparsemax", "entmax15", "entmax_bisect",
              "normmax", "sparse_softmax", "taylor_softmax", "am_softmax")
# Heads whose probabilities have exact zeros: their support is a prediction set.
SPARSE_HEAD_NAMES = ("sparsemax", "entmax15", "entmax_bisect", "normmax", "sparse_softmax")
# The entmax family, whose support has a closed-form conformal score (evaluation/conformal.py).
ENTMAX_HEAD_NAMES = ("sparsemax", "entmax15", "entmax_bisect")

_FIXED_ALPHA = {"softmax": 1.0, "sparsemax": 2.0, "entmax15": 1.5}
_MAPPINGS = {"softmax": softmax, "sparsemax": sparsemax, "entmax15": entmax15}
_LOSSES = {"softmax": softmax_loss, "sparsemax": sparsemax_loss, "entmax15": entmax15_loss}


class OutputHead(nn.Module):
    """logits -> probabilities with the named mapping, and its Fenchel-Young loss."""

    def __init__(self, name: str = "softmax", alpha: float = 1.5, learn_alpha: bool = False,
                 gamma: float = 2.0, k: int = 5, order: int = 2, scale: float = 30.0, margin: float = 0.35):
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
        # Only the selected head's own hyperparameters are checked (and kept).
        self.gamma = check_gamma(gamma) if name == "normmax" else None
        self.k = check_k(k) if name == "sparse_softmax" else None
        self.order = check_order(order) if name == "taylor_softmax" else None
        self.scale = check_scale(scale) if name == "am_softmax" else None
        self.margin = check_margin(margin) if name == "am_softmax" else None

    @property
    def alpha(self) -> Tensor:
        """Current alpha as a float tensor (differentiable when learned); NaN for the heads
        outside the entmax family (normmax, sparse_softmax, taylor_softmax, am_softmax)."""
        if self.learn_alpha:
            return 1.0 + torch.sigmoid(self.alpha_logit)
        return torch.tensor(float("nan") if self._fixed_alpha is None else self._fixed_alpha)

    def hparams(self) -> dict:
        """The selected head's own hyperparameters, e.g. {"gamma": 2.0} for normmax."""
        if self.name == "entmax_bisect":
            return {"alpha": float(self.alpha.detach()), "learn_alpha": self.learn_alpha}
        keys = {"normmax": ("gamma",), "sparse_softmax": ("k",), "taylor_softmax": ("order",),
                "am_softmax": ("scale", "margin")}.get(self.name, ())
        return {key: getattr(self, key) for key in keys}

    def prepare_classifier(self, model: nn.Module) -> nn.Module:
        """Fit the model's classifier to this head (called once by models.create_classifier).

        am_softmax: the final Linear `model.head` becomes a CosineLinear returning scale * cos
        (normalised features and weights). sparse_softmax: checks head.k against the classes.
        Other heads: nothing to do."""
        if self.name == "am_softmax":
            install_cosine_classifier(model, self.scale)
        elif self.name == "sparse_softmax" and getattr(model, "num_classes", None):
            check_k(self.k, int(model.num_classes))
        return model

    def _alpha_arg(self):
        return 1.0 + torch.sigmoid(self.alpha_logit) if self.learn_alpha else self._fixed_alpha

    def forward(self, logits: Tensor, dim: int = -1) -> Tensor:
        if self.name in _MAPPINGS:
            return _MAPPINGS[self.name](logits, dim)
        if self.name == "normmax":
            return normmax(logits, self.gamma, dim)
        if self.name == "sparse_softmax":
            return topk_softmax(logits, self.k, dim)
        if self.name == "taylor_softmax":
            return taylor_softmax(logits, self.order, dim)
        if self.name == "am_softmax":  # the margin belongs to the training loss only
            return softmax(logits, dim)
        return entmax_bisect(logits, self._alpha_arg(), dim)

    def loss(self, logits: Tensor, target: Tensor, label_smoothing: float = 0.0,
             ignore_index: int = -100, reduction: str = "mean") -> Tensor:
        """The head's training loss (its Fenchel-Young loss where it has one); target is int64
        classes (B,) or float probability rows (B, K). am_softmax's margin applies in training
        mode only (`self.training`), so evaluation reports the margin-free cross-entropy."""
        kw = dict(label_smoothing=label_smoothing, ignore_index=ignore_index, reduction=reduction)
        if self.name in _LOSSES:
            return _LOSSES[self.name](logits, target, **kw)
        if self.name == "normmax":
            return normmax_loss(logits, target, self.gamma, **kw)
        if self.name == "sparse_softmax":
            return topk_softmax_loss(logits, target, self.k, **kw)
        if self.name == "taylor_softmax":
            return taylor_softmax_loss(logits, target, self.order, **kw)
        if self.name == "am_softmax":
            return am_softmax_loss(logits, target, self.scale, self.margin if self.training else 0.0, **kw)
        return entmax_bisect_loss(logits, target, alpha=self._alpha_arg(), **kw)

    @staticmethod
    def support(probs: Tensor) -> Tensor:
        return probs > 0

    @staticmethod
    def support_size(probs: Tensor) -> Tensor:
        return (probs > 0).sum(-1)

    def extra_repr(self) -> str:
        if self.name == "entmax_bisect":
            return f"name={self.name}, alpha={float(self.alpha.detach()):.4g}, learn_alpha={self.learn_alpha}"
        return ", ".join([f"name={self.name}"] + [f"{k}={v:g}" for k, v in self.hparams().items()])


def build_output_head(name: str, alpha: float = 1.5, learn_alpha: bool = False, gamma: float = 2.0,
                      k: int = 5, order: int = 2, scale: float = 30.0, margin: float = 0.35) -> OutputHead:
    return OutputHead(name, alpha=alpha, learn_alpha=learn_alpha, gamma=gamma, k=k, order=order,
                      scale=scale, margin=margin)


__all__ = [
    "HEAD_NAMES", "SPARSE_HEAD_NAMES", "ENTMAX_HEAD_NAMES", "OutputHead", "build_output_head", "REDUCTIONS",
    "softmax", "sparsemax", "entmax15", "entmax_bisect",
    "softmax_loss", "sparsemax_loss", "entmax15_loss", "entmax_bisect_loss",
    "normmax", "normmax_loss", "topk_softmax", "topk_softmax_loss",
    "taylor_softmax", "taylor_softmax_loss", "am_softmax_loss",
]
