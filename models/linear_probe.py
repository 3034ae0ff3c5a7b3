"""A linear classifier on cached pre-logit features (data.dataset=features): the ResMLP's own
classifier without the backbone, so every output head (models/heads.py, am_softmax's cosine
classifier included) and eval.py see the interface they know: `head`, `head_drop`, `num_classes`,
`num_features`, `forward_features` (the identity: the features are cached), `forward_head`,
`get_classifier` / `reset_classifier`, and `output_head` attached by `create_linear_probe`.

Its state dict holds only `head.*` (and `output_head.*`): the keys of a ResMLP's classifier, so a
probe's weights are the image model's classifier, and the image model's classifier is a probe's.

Initialisation: a probe trained on cached features equals the frozen-backbone probe trained on the
images (model.pretrained + model.freeze=backbone) only if both classifiers start equal. The image
path draws the classifier's initial weights after the whole backbone's from the "init" RNG stream,
and then (models/pretrained.py `fit_pretrained`) keeps the source's classifier when it fits. So
`create_linear_probe(..., like=...)` builds the same full classifier under the caller's RNG state
and takes its classifier, then fits the source's classifier through the same `fit_pretrained`.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from common.errors import UserError

from .heads import OutputHead
from .pretrained import fit_pretrained


class LinearProbe(nn.Module):
    """features (B, D) -> logits (B, K) through `head` (nn.Linear, or the cosine classifier)."""

    def __init__(self, num_features: int, num_classes: int, drop_rate: float = 0.0, head: nn.Module = None):
        super().__init__()
        if int(num_features) < 1 or int(num_classes) < 1:
            raise UserError(f"a linear probe needs num_features >= 1 and num_classes >= 1, got "
                            f"{num_features} and {num_classes}")
        self.num_features = self.head_hidden_size = self.embed_dim = int(num_features)
        self.num_classes = int(num_classes)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = head if head is not None else nn.Linear(self.num_features, self.num_classes)

    @torch.jit.ignore
    def get_classifier(self):
        return self.head

    def reset_classifier(self, num_classes: int, global_pool=None):
        self.num_classes = int(num_classes)
        p = next(self.parameters())
        self.head = (nn.Linear(self.num_features, num_classes, device=p.device, dtype=p.dtype)
                     if num_classes > 0 else nn.Identity())

    def forward_features(self, x):
        if x.ndim != 2 or x.shape[1] != self.num_features:
            raise UserError(f"features of shape {list(x.shape)} do not match the probe: expected (B, "
                            f"{self.num_features})")
        return x

    def forward_head(self, x, pre_logits: bool = False):
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x):
        return self.forward_head(self.forward_features(x))


def _attach_head(probe, head_cfg):
    probe.output_head = OutputHead(
        head_cfg.name, alpha=head_cfg.alpha, learn_alpha=head_cfg.learn_alpha, gamma=head_cfg.gamma,
        k=head_cfg.k, order=head_cfg.order, scale=head_cfg.scale, margin=head_cfg.margin)
    probe.output_head.prepare_classifier(probe)  # am_softmax: the cosine classifier; sparse_softmax: checks k
    return probe


def create_linear_probe(num_features, num_classes, head_cfg, like=None, source_classifier=None):
    """A LinearProbe with its output head (as models.create_classifier attaches it).

    like: a classifier built by models.create_classifier for the features' source architecture
    under the caller's RNG state (the image path's): the probe takes its classifier and output
    head, so both paths start from the same weights. source_classifier: the source's head.* /
    output_head.* tensors, fitted as the image path fits them (kept when the class count and the
    classifier kind match); -> (probe, what was not loaded, each with its reason)."""
    if like is not None:
        if like.num_features != num_features:
            raise UserError(f"the features have dimension {num_features}, the source model {like.num_features}: "
                            f"features.json does not match the model it names")
        probe = LinearProbe(num_features, num_classes, head=like.head)
        probe.head_drop = like.head_drop
        probe.output_head = like.output_head
    else:
        probe = _attach_head(LinearProbe(num_features, num_classes), head_cfg)
    not_loaded = fit_pretrained(probe, source_classifier) if source_classifier else []
    return probe, not_loaded
