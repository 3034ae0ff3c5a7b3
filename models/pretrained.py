"""Fit pretrained ResMLP weights (this project's, timm's or FB/DeiT's; models/convert.py) into a
classifier built for another task: the backbone strictly, the classifier only where it fits.

- Backbone (everything but `head.*` and `output_head.*`): every tensor must be present with the
  model's shape; any other mismatch is refused in one line naming the key (another variant, norm
  or image size).
- Classifier (`head.*`): loaded when the class count and the classifier kind match; else kept as
  initialised, with the reason: another class count, or another kind (head.name=am_softmax's
  cosine classifier has no bias, a Linear one has). The output head's state (a learned entmax
  alpha) is loaded only together with the classifier it was trained with.
- The weights' image size: the token-mixing layers are N x N for N patches, so a model built for
  another image size cannot take them (`weights_img_size` reads it from the weights).
"""
from __future__ import annotations

import math

import torch

from common.errors import UserError

from .convert import _rename, detect_format, settings_behind

CLASSIFIER_PREFIX = "head."
OUTPUT_HEAD_PREFIX = "output_head."


def renamed_state_dict(state_dict) -> dict:
    """{this project's key: (key in the file, tensor)} for any supported format."""
    if not isinstance(state_dict, dict) or not state_dict:
        raise UserError("the weights file holds no state dict (expected a mapping of parameter names to tensors)")
    fmt = detect_format(state_dict)
    out = {}
    for key, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            raise UserError(f"weights entry '{key}' is not a tensor; is this a ResMLP state dict?")
        out[_rename(key, fmt)] = (key, value)
    return out


def weights_patch_grid(state_dict):
    """(image size, patch size, patches per side) the weights were trained at, or None when they
    hold no ResMLP stem and first block (the strict load then names what is missing)."""
    renamed = renamed_state_dict(state_dict)
    stem, mix = renamed.get("stem.proj.weight"), renamed.get("blocks.0.cross_patch.weight")
    if stem is None or mix is None:
        return None
    patch, patches = int(stem[1].shape[-1]), int(mix[1].shape[0])
    grid = math.isqrt(patches)
    if grid * grid != patches:
        raise UserError(f"weights key '{mix[0]}' mixes {patches} patches, not a square grid: not a ResMLP")
    return grid * patch, patch, grid


def _classifier_mismatch(src, target):
    """Why the weights' classifier cannot be the model's (None when it can)."""
    if f"{CLASSIFIER_PREFIX}weight" not in src:
        return "the weights hold no classifier"
    src_w, tgt_w = src[f"{CLASSIFIER_PREFIX}weight"][1], target[f"{CLASSIFIER_PREFIX}weight"]
    if src_w.shape[1] != tgt_w.shape[1]:
        raise UserError(f"weights key '{src[CLASSIFIER_PREFIX + 'weight'][0]}' takes {src_w.shape[1]} features, the "
                        f"model {tgt_w.shape[1]}: another model variant (model.name)")
    if src_w.shape[0] != tgt_w.shape[0]:
        return f"{src_w.shape[0]} classes in the weights, {tgt_w.shape[0]} here"
    src_bias, tgt_bias = f"{CLASSIFIER_PREFIX}bias" in src, f"{CLASSIFIER_PREFIX}bias" in target
    if src_bias and not tgt_bias:
        return "head.name=am_softmax needs a cosine classifier, the weights hold a linear one"
    if tgt_bias and not src_bias:
        return "the weights hold a cosine classifier (am_softmax), this head needs a linear one"
    return None


def fit_pretrained(model, state_dict):
    """Load `state_dict` into `model` as the module docstring says; -> the list of what was not
    loaded, each with its reason (empty when everything was)."""
    src = renamed_state_dict(state_dict)
    target = model.state_dict()
    loaded, not_loaded = {}, []
    for key, want in target.items():
        if key.startswith((CLASSIFIER_PREFIX, OUTPUT_HEAD_PREFIX)):
            continue
        if key not in src:
            raise UserError(f"the weights lack '{key}' (found {len(src)} tensors); were they trained with another "
                            f"{settings_behind(key)}?")
        name, value = src[key]
        if value.shape != want.shape and value.numel() == want.numel() and key.endswith((".alpha", ".beta")):
            value = value.reshape(want.shape)  # timm stores Affine alpha/beta as (1, 1, d)
        if value.shape != want.shape:
            raise UserError(f"weights key '{name}' has shape {tuple(value.shape)}, the model expects "
                            f"{tuple(want.shape)} "
                            f"for '{key}'; check model.name, model.norm and the image size")
        loaded[key] = value
    for key, (name, _) in src.items():
        if key not in target and not key.startswith((CLASSIFIER_PREFIX, OUTPUT_HEAD_PREFIX)):
            raise UserError(f"weights key '{name}' has no counterpart in the model ('{key}'); were they trained with "
                            f"another {settings_behind(key)}?")
    reason = _classifier_mismatch(src, target)
    head_keys = [k for k in target if k.startswith(CLASSIFIER_PREFIX)]
    state_keys = [k for k in target if k.startswith(OUTPUT_HEAD_PREFIX)]
    if reason is None:
        loaded.update({k: src[k][1] for k in head_keys})
        for key in state_keys:
            if key in src and src[key][1].shape == target[key].shape:
                loaded[key] = src[key][1]
            else:
                not_loaded.append(f"{key} (not in the weights: from the config)")
    else:
        not_loaded.append(f"{', '.join(head_keys)} ({reason}: re-initialised)")
        not_loaded += [f"{k} (a new classifier: from the config)" for k in state_keys]
    with torch.no_grad():
        model.load_state_dict({**target, **loaded}, strict=True)
    return not_loaded
