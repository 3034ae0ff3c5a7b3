"""The one weight writer and reader: safetensors through common.io's atomic writer, and state dicts
read from safetensors or torch files (torch.load with weights_only=True: no pickle code runs).

Used by train.py (exported weights, checkpoints, resume), eval.py, the comparison's per-example
records and the scripts. A damaged file is one line (UserError) naming it, never a traceback.
"""
import os

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from .errors import UserError
from .io import atomic_write


def first_line(err):
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def tensors_nbytes(obj):
    """Rough serialised size of a (nested) state: the bytes of its tensors plus a little overhead."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size() + 64
    if isinstance(obj, dict):
        return sum(tensors_nbytes(v) for v in obj.values()) + 16 * len(obj)
    if isinstance(obj, (list, tuple)):
        return sum(tensors_nbytes(v) for v in obj) + 8 * len(obj)
    return 16


def _cpu_copies(state_dict):
    # a copy per tensor: safetensors refuses tensors that share storage (tied weights, views)
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in state_dict.items()}


def safetensors_writer(state_dict, metadata=None):
    """A `write(path)` for common.io (save_file reports a failed write as '(os error N)')."""
    tensors = _cpu_copies(state_dict)
    return lambda path: save_file(tensors, path, metadata=metadata)


def save_safetensors(state_dict, path, metadata=None, **describe):
    """Atomic safetensors file; WriteError (one line) on failure, the previous `path` intact."""
    atomic_write(path, safetensors_writer(state_dict, metadata), needed=tensors_nbytes(state_dict), **describe)


def read_safetensors(path):
    """The tensors of a safetensors file; UserError naming it when missing, truncated or corrupt."""
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise UserError(f"weights file {path} is truncated or corrupt: {first_line(err)}") from None


def read_safetensors_metadata(path):
    with safe_open(path, framework="pt") as f:
        return f.metadata() or {}


def read_torch(path):
    """A torch file's object (weights_only=True); UserError naming it when damaged."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means a damaged file
        raise UserError(f"file {path} is truncated or corrupt: {first_line(err)}") from None


def read_state_dict(path):
    """Tensors of a .safetensors or torch (.pth/.pt/.bin) weights file; a top-level 'model' or
    'state_dict' wrapper (timm / FB checkpoints) is unwrapped."""
    if not os.path.isfile(path):
        raise UserError(f"weights file not found: {path}")
    if path.endswith(".safetensors"):
        return read_safetensors(path)
    state = read_torch(path)
    for wrapper in ("model", "state_dict"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    return state


def load_into(module, state_dict, source):
    """module.load_state_dict(strict=True); a mismatch is one line naming `source` and the first difference."""
    try:
        module.load_state_dict(state_dict, strict=True)
    except RuntimeError as err:
        lines = str(err).splitlines()
        first = lines[1].strip() if len(lines) > 1 else str(err)
        raise UserError(f"{source} does not match the model: {first}") from None
    return module
