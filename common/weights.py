"""The one weight writer and reader: safetensors through common.io's atomic writer, and state dicts
read from safetensors or torch files (torch.load with weights_only=True: no pickle code runs).
Weights whose sha256 is recorded (model.pretrained, a teacher, an extraction's source) are read
once as bytes, hashed and deserialized from those same bytes (`read_hashed_state_dict`).

Used by train.py (exported weights, checkpoints, resume), eval.py, the comparison's per-example
records and the scripts. A damaged file is one line (UserError) naming it, never a traceback.
"""
import hashlib
import io
import os

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load as safetensors_load
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


def read_safetensors(path, what="weights file"):
    """The tensors of a safetensors file; UserError naming it (`what` it is) when missing, truncated or
    corrupt."""
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise UserError(f"{what} {path} is truncated or corrupt: {first_line(err)}") from None


def read_safetensors_metadata(path):
    with safe_open(path, framework="pt") as f:
        return f.metadata() or {}


def torch_load_reason(err):
    """Why torch.load(weights_only=True) refused a file, in one line, without torch's advice to
    retry with weights_only=False (which would run whatever code the file holds: never given)."""
    text = str(err).strip()
    if not text.startswith("Weights only load failed"):
        return first_line(err)
    lines = [ln.strip() for ln in text.splitlines()[1:] if ln.strip()]
    reasons = [ln for ln in lines if not ln.startswith(("Please file an issue", "Check the documentation",
                                                          "WeightsUnpickler error"))]
    reason = reasons[0] if reasons else "not a plain state dict"
    if "GLOBAL" in reason:
        return (f"it holds Python objects beyond tensors, whose loading could run code ({reason.rstrip('.')}); "
                f"use a .safetensors file or a plain state dict of tensors")
    return reason


def read_torch(path):
    """A torch file's object (weights_only=True); UserError naming it when damaged."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise UserError(f"file {path} is truncated or corrupt: {torch_load_reason(err)}") from None


def _unwrapped(state):
    """A top-level 'model' or 'state_dict' wrapper (timm / FB checkpoints) unwrapped."""
    for wrapper in ("model", "state_dict"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    return state


def state_dict_from_bytes(data, path):
    """The tensors of a weights file's bytes `data`: safetensors when `path` ends in .safetensors,
    else torch (weights_only=True, wrappers unwrapped); UserError naming `path` when unreadable."""
    if path.endswith(".safetensors"):
        try:
            return safetensors_load(data)
        except Exception as err:
            raise UserError(f"cannot read {path} as safetensors (truncated or corrupt): {first_line(err)}") from None
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:
        raise UserError(f"cannot read {path} as a torch weights file (weights_only=True): "
                        f"{torch_load_reason(err)}") from None
    return _unwrapped(state)


def read_weights_bytes(path):
    """(bytes, sha256) of a weights file, read once: what is hashed is what gets loaded, even when
    the file is replaced meanwhile (a source run exporting while it trains)."""
    if not os.path.isfile(path):
        raise UserError(f"weights file not found: {path}")
    with open(path, "rb") as f:
        data = f.read()
    return data, hashlib.sha256(data).hexdigest()


def read_hashed_state_dict(path):
    """(state dict, sha256 of the very bytes it was read from) of a .safetensors or torch
    (.pth/.pt/.bin) weights file; see `state_dict_from_bytes`."""
    data, sha = read_weights_bytes(path)
    return state_dict_from_bytes(data, path), sha


def read_state_dict(path):
    """Tensors of a .safetensors or torch (.pth/.pt/.bin) weights file; a top-level 'model' or
    'state_dict' wrapper (timm / FB checkpoints) is unwrapped."""
    return read_hashed_state_dict(path)[0]


def load_into(module, state_dict, source):
    """module.load_state_dict(strict=True); a mismatch is one line naming `source` and the first difference."""
    try:
        module.load_state_dict(state_dict, strict=True)
    except RuntimeError as err:
        lines = str(err).splitlines()
        first = lines[1].strip() if len(lines) > 1 else str(err)
        raise UserError(f"{source} does not match the model: {first}") from None
    return module
