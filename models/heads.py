"""Swappable output heads: a named probability mapping plus its training loss.

Each head is one declaration in models/registry.py (mapping, loss, hyperparameters, flags): softmax,
sparsemax, entmax15, entmax_bisect, normmax, sparse_softmax, taylor_softmax, am_softmax and
perturbmax. The mappings live in models/mappings.py and models/<head>.py, the entmax family's
losses in models/losses.py. Everything public is re-exported here so callers only need
`from models.heads import ...`.

`OutputHead` holds no classifier weights (the model's `head` Linear produces the logits); it maps
logits to probabilities, computes the head's loss for hard or soft targets, and reports the
support. With `learn_alpha=True` (entmax_bisect only) alpha = 1 + sigmoid(alpha_logit) is a
parameter, so it stays in (1, 2) by construction (Correia et al. 2019 learn it the same way).
A head flagged `cosine_classifier` (am_softmax) swaps the model's final Linear for a
CosineLinear in `prepare_classifier(model)` (models.create_classifier calls it).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from .am_softmax import am_softmax_loss, install_cosine_classifier
from .head_targets import REDUCTIONS
from .losses import entmax15_loss, entmax_bisect_loss, softmax_loss, sparsemax_loss
from .mappings import entmax15, entmax_bisect, softmax, sparsemax
from .normmax import normmax, normmax_loss
from .perturbmax import EVAL_SEED, perturbmax, perturbmax_loss
from .registry import (
    ENTMAX_HEAD_NAMES,
    HEAD_NAMES,
    HPARAMS,
    SPARSE_HEAD_NAMES,
    check_settings,
    head_spec,
    learned_alpha_logit,
    load_implementations,
)
from .taylor_softmax import taylor_softmax, taylor_softmax_loss
from .topk_softmax import topk_softmax, topk_softmax_loss

load_implementations()  # the head calls them inside compiled code: no module left to load there


class OutputHead(nn.Module):
    """logits -> probabilities with the named head's mapping, and its loss.

    `settings` are the head settings by name (models.registry.HPARAMS, defaults from there); only
    the selected head's own are checked and kept (the others read as None)."""

    def __init__(self, name: str = "softmax", **settings):
        super().__init__()
        self.spec = head_spec(name)
        self.name = name
        self.settings = check_settings(name, settings)
        for key in HPARAMS:  # head.gamma etc. as attributes (alpha is the property below)
            if key != "alpha":
                setattr(self, key, self.settings.get(key))
        self.learn_alpha = bool(self.settings.get("learn_alpha", False))
        if self.learn_alpha:
            self.alpha_logit = nn.Parameter(torch.tensor(learned_alpha_logit(self.settings["alpha"])))
        # A random head's noise in training: draw (torch's current seed, calls since it was set).
        # train.py reseeds torch before every micro-batch from (run seed, update, micro-batch, rank),
        # so the draws follow the update, not this process's history: a resumed run draws what an
        # uninterrupted one does, and ranks draw independently. Eval mode keys each row's noise by
        # (EVAL_SEED, its id): the `ids` the caller passes (the evaluation loop: each example's index
        # in its split), else the row's position in this call; every evaluation sees the same noise.
        self.draw_seed, self.draw_step = torch.initial_seed(), 0

    @property
    def alpha(self) -> Tensor:
        """The one reader of alpha (alpha_value, hparams, learned_alpha and the forward go through it).
        Current alpha as a float tensor (differentiable when learned); NaN for the heads
        outside the entmax family (normmax, sparse_softmax, taylor_softmax, am_softmax)."""
        if self.learn_alpha:
            return 1.0 + torch.sigmoid(self.alpha_logit)
        alpha = self.spec.alpha
        return torch.tensor(float("nan") if alpha is None else float(self.settings.get(alpha, alpha)))

    def alpha_value(self):
        """The entmax alpha as a float (a learned one's current value), None for a head outside the
        entmax family: what HeadSpec.alpha says, read once here for reports and prediction sets."""
        return None if self.spec.alpha is None else float(self.alpha.detach())

    def hparams(self) -> dict:
        """The selected head's own hyperparameters, e.g. {"gamma": 2.0} for normmax."""
        out = dict(self.settings)
        if "alpha" in out:
            out["alpha"] = self.alpha_value()
        return out

    def learned_alpha(self):
        """The learned alpha as a float (head.learn_alpha), None for a fixed one: for logs and reports
        (a host read: never inside a training step)."""
        return self.alpha_value() if self.learn_alpha else None

    def prepare_classifier(self, model: nn.Module) -> nn.Module:
        """Fit the model's classifier to this head (called once by models.create_classifier):
        a cosine classifier where the head needs one, and the head's checks against the classes."""
        if self.spec.cosine_classifier:
            install_cosine_classifier(model, self.settings["scale"])
        if self.spec.check_classes is not None and getattr(model, "num_classes", None):
            self.spec.check_classes(self.settings, int(model.num_classes))
        return model

    def _live_settings(self, logits: Tensor, dim: int, ids) -> dict:
        settings = self.settings
        if self.learn_alpha:
            settings = {**settings, "alpha": self.alpha}
        if self.spec.draws:
            if self.training:
                draw = (self.draw_seed, self.draw_step)
            else:
                rows = logits.numel() // max(logits.shape[dim], 1)
                draw = (EVAL_SEED, 0, ids if ids is not None else torch.arange(rows, device=logits.device))
            settings = {**settings, "draw": draw}
        return settings

    def forward(self, logits: Tensor, dim: int = -1, ids: Optional[Tensor] = None) -> Tensor:
        """Probabilities along `dim`. `ids` (a random head in eval mode): one integer identity per row
        (e.g. the examples' dataset indices), which its noise follows; ignored by the other heads."""
        return self.spec.mapping(logits, dim, self._live_settings(logits, dim, ids))

    def loss(self, logits: Tensor, target: Tensor, label_smoothing: float = 0.0,
             ignore_index: int = -100, reduction: str = "mean", ids: Optional[Tensor] = None) -> Tensor:
        """The head's training loss (its Fenchel-Young loss where it has one); target is int64
        classes (B,) or float probability rows (B, K). am_softmax's margin applies in training
        mode only (`self.training`), so evaluation reports the margin-free cross-entropy. `ids`:
        as in `forward` (eval mode only: training draws follow the run seed and step)."""
        if self.spec.draws and self.training:
            seed = torch.initial_seed()  # host integers only: no device read
            if seed != self.draw_seed:
                self.draw_seed, self.draw_step = seed, 0
            self.draw_step += 1
        return self.spec.loss(logits, target, self._live_settings(logits, -1, ids), self.training,
                              label_smoothing=label_smoothing,
                              ignore_index=ignore_index, reduction=reduction)

    @staticmethod
    def support_size(probs: Tensor) -> Tensor:
        return (probs > 0).sum(-1)

    def extra_repr(self) -> str:
        return ", ".join([f"name={self.name}"] + [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                  for k, v in self.hparams().items()])


__all__ = [
    "HEAD_NAMES", "SPARSE_HEAD_NAMES", "ENTMAX_HEAD_NAMES", "OutputHead", "REDUCTIONS",
    "softmax", "sparsemax", "entmax15", "entmax_bisect",
    "softmax_loss", "sparsemax_loss", "entmax15_loss", "entmax_bisect_loss",
    "normmax", "normmax_loss", "topk_softmax", "topk_softmax_loss",
    "taylor_softmax", "taylor_softmax_loss", "am_softmax_loss", "perturbmax", "perturbmax_loss",
]
