"""model.freeze=backbone: a linear probe. Only the classifier (`head`, with `head_drop` before it)
and the output head's state (a learned entmax alpha) train; the backbone's parameters stop
requiring gradients, so the optimizer (timm's param groups skip them) never holds them, and the
backbone runs in eval mode (BatchNorm statistics frozen, no drop path) under torch.no_grad whatever
`model.train()` is called with. The state dict is unchanged: checkpoints, EMA and eval.py see the
same keys as for any run.
"""
import torch

CLASSIFIER_MODULES = ("head", "head_drop", "output_head")


class FrozenBackboneMixin:
    """Mixed into the model's class by `freeze_backbone` (its methods first)."""

    def train(self, mode: bool = True):
        super().train(mode)
        for name, child in self.named_children():
            if name not in CLASSIFIER_MODULES:
                child.train(False)
        return self

    def forward_features(self, x):
        with torch.no_grad():
            return super().forward_features(x)


_FROZEN_CLASSES = {}


def _frozen_class(cls):
    if issubclass(cls, FrozenBackboneMixin):
        return cls
    if cls not in _FROZEN_CLASSES:
        _FROZEN_CLASSES[cls] = type(f"FrozenBackbone{cls.__name__}", (FrozenBackboneMixin, cls), {})
    return _FROZEN_CLASSES[cls]


def trainable(name):
    return name.split(".")[0] in CLASSIFIER_MODULES


def freeze_backbone(model):
    """Freeze everything but the classifier (see the module docstring); -> the model."""
    for name, param in model.named_parameters():
        param.requires_grad_(trainable(name))
    model.__class__ = _frozen_class(type(model))
    model.train(model.training)
    return model


def freeze_line(model, mode):
    """model.freeze=backbone: one line saying what trains and what is frozen; None otherwise."""
    if mode != "backbone":
        return None
    params = list(model.named_parameters())
    train = sum(p.numel() for _, p in params if p.requires_grad)
    total = sum(p.numel() for _, p in params)
    return (f"frozen: the backbone (model.freeze=backbone, a linear probe): {train:,} of {total:,} parameters train "
            f"(the classifier and the output head's own state), the rest stay as loaded")


def apply_freeze(model, mode):
    if mode == "backbone":
        freeze_backbone(model)
    return model
