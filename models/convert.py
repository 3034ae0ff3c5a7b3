"""Weight interop for models.resmlp.ResMLP: this project's checkpoints, timm's and the original FB/DeiT ones.

Key mapping (i = block index; shapes for embed dim d, N patches, hidden 4d):

    this project                   timm resmlp_* (MlpMixer/ResBlock)   FB / DeiT resmlp_models.py
    stem.proj.{weight,bias}        stem.proj.*                         patch_embed.proj.*
    blocks.i.norm1.alpha (d,)      blocks.i.norm1.alpha (1,1,d)        blocks.i.norm1.alpha (d,)
    blocks.i.norm1.beta  (d,)      blocks.i.norm1.beta  (1,1,d)        blocks.i.norm1.beta  (d,)
    blocks.i.cross_patch.* (N,N)   blocks.i.linear_tokens.*            blocks.i.attn.*
    blocks.i.ls1 / ls2 (d,)        blocks.i.ls1 / ls2                  blocks.i.gamma_1 / gamma_2
    blocks.i.norm2.{alpha,beta}    blocks.i.norm2.* (1,1,d)            blocks.i.norm2.* (d,)
    blocks.i.mlp.fc1/fc2.*         blocks.i.mlp_channels.fc1/fc2.*     blocks.i.mlp.fc1/fc2.*
    norm.{alpha,beta} (d,)         norm.* (1,1,d)                      norm.* (d,)
    head.{weight,bias}             head.*                              head.*

LayerNorm/BatchNorm variants use weight/bias (and running stats) under the same module names.
Entries of the model's `output_head` (attached by models.create_classifier, e.g. a learned
`output_head.alpha_logit`) are kept from the model when the checkpoint has none, and a
checkpoint's output_head entries are ignored when loaded into a bare ResMLP.
"""
from __future__ import annotations

import torch

from common.errors import UserError
from common.weights import read_state_dict

_TIMM_RENAMES = ((".linear_tokens.", ".cross_patch."), (".mlp_channels.", ".mlp."))
_FB_RENAMES = (("patch_embed.", "stem."), (".attn.", ".cross_patch."), (".gamma_1", ".ls1"),
               (".gamma_2", ".ls2"))
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DDP / torch.compile wrappers


def detect_format(state_dict) -> str:
    """'timm', 'fb' or 'project' (the last also covers anything unrecognised)."""
    keys = list(state_dict)
    if any(k.startswith("patch_embed.") for k in keys) or any(".gamma_1" in k for k in keys):
        return "fb"
    if any(".linear_tokens." in k or ".mlp_channels." in k for k in keys):
        return "timm"
    return "project"


def _rename(key: str, fmt: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        while key.startswith(prefix):
            key = key[len(prefix):]
    renames = {"timm": _TIMM_RENAMES, "fb": _FB_RENAMES}.get(fmt, ())
    key = "." + key
    for old, new in renames:
        key = key.replace(old, new)
    return key[1:]


POOL_PREFIX = "pool."  # model.pool=hopfield's learned query (models/hopfield_pool.py); average pooling has none


def settings_behind(key):
    """The config keys that decide whether a model has tensor `key`: the pooling's own tensors come
    with model.pool, the others with model.name and model.norm."""
    return "model.pool (hopfield has a learned query, avg none)" if key.startswith(POOL_PREFIX) \
        else "model.name or model.norm"


def convert_state_dict(state_dict, model) -> dict:
    """Return `state_dict` (this project's, timm's or FB's) renamed and reshaped for `model`.

    Raises UserError naming the first key that does not fit (missing, unexpected or wrong shape).
    """
    if not isinstance(state_dict, dict) or not state_dict:
        raise UserError("checkpoint holds no state dict (expected a mapping of parameter names to tensors)")
    fmt = detect_format(state_dict)
    target = model.state_dict()
    out = {}
    for key, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            raise UserError(f"checkpoint entry '{key}' is not a tensor; is this a ResMLP state dict?")
        new_key = _rename(key, fmt)
        if new_key.startswith("output_head.") and new_key not in target:
            continue  # a run's output-head state, loaded into a bare ResMLP: not part of it
        if new_key not in target:
            raise UserError(f"checkpoint key '{key}' has no counterpart in {type(model).__name__} "
                            f"(detected {fmt} format); was it trained with another {settings_behind(new_key)}?")
        want = target[new_key].shape
        if value.shape != want and value.numel() == want.numel() and new_key.endswith((".alpha", ".beta")):
            value = value.reshape(want)  # timm stores Affine α/β as (1, 1, d)
        if value.shape != want:
            raise UserError(f"checkpoint key '{key}' has shape {tuple(value.shape)} but the model expects "
                            f"{tuple(want)} for '{new_key}'; check the variant, image size and num_classes")
        out[new_key] = value
    for key, value in target.items():
        if key in out:
            continue
        if key.startswith("output_head."):  # attached head state not in timm/FB checkpoints: keep ours
            out[key] = value
            continue
        raise UserError(f"checkpoint is missing '{key}' (detected {fmt} format); "
                        f"was it trained with another {settings_behind(key)}?")
    return out


def to_timm_state_dict(state_dict) -> dict:
    """This project's ResMLP state dict (Affine norm) in timm's names and shapes (the table above,
    read right to left): what timm's resmlp_* models load strictly. The output head's entries
    (a learned entmax alpha) have no place in timm's model and are left out."""
    out = {}
    for key, value in state_dict.items():
        if key.startswith("output_head."):
            continue
        key = "." + key
        for timm_name, ours in _TIMM_RENAMES:
            key = key.replace(ours, timm_name)
        key = key[1:]
        if key.endswith((".alpha", ".beta")) and value.dim() == 1:
            value = value.reshape(1, 1, -1)  # timm stores Affine α/β as (1, 1, d)
        out[key] = value
    return out


def load_pretrained(model, path: str):
    """Load weights from `path` (any supported format) into `model`, strictly; returns the model."""
    sd = convert_state_dict(read_state_dict(path), model)
    model.load_state_dict(sd, strict=True)
    return model
