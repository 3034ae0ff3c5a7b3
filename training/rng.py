"""Step-keyed random state: every random draw of a training step is a pure function of
(seed, step, micro-batch, rank), so a resumed run replays exactly what the original would have.

timm's Mixup draws from numpy's global RNG, drop path from torch's, RandAugment-style code from
Python's `random`; all three are reseeded before each micro-batch. The states are also captured
(JSON, no pickle) into each checkpoint per rank, as a record and for code that draws between steps.
"""
import base64
import random

import numpy as np
import torch

from common.seeding import mix_seed


def reseed(*parts):
    """Seed Python's, numpy's and torch's global RNGs from common.seeding.mix_seed(*parts)."""
    seed = mix_seed(*parts)
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    torch.manual_seed(seed)  # also seeds every CUDA device
    return seed


def capture_rng_state():
    state = {
        "python": _jsonable(random.getstate()),
        "numpy": _jsonable(np.random.get_state()),
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state):
    random.setstate(_tuplify(state["python"]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(
            [torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8) for s in state["cuda"]]
        )


def _jsonable(x):
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (tuple, list)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def _tuplify(x):
    return tuple(_tuplify(v) for v in x) if isinstance(x, list) else x
