"""The feature memory of a run for the feature-space OOD scores (evaluation/ood_scores.py): the
penultimate features of the training split (all of it, or a seeded subsample of --ood-memory N
images), with their labels and the model's predictions (SHE's correctly-classified patterns).

eval.py computes it once per run and weights and stores it in the run directory
(RUN/ood_memory.safetensors, ood_memory_ema.safetensors for the EMA weights; common/rundir.py),
atomically, with the sha256 of its own contents and the sha256 of the weights file it was computed
with. A stored memory is used only when both match and it was made for the same request (split,
size, seed, dataset): a memory of other weights, another request, or a damaged file is rebuilt and
replaced (a note says why), never used. For a weights file outside a run directory the memory is
built for the evaluation and not stored.

`FeatureProbe` is how the features come out of the one evaluation loop (evaluation/evaluate.py):
a forward pre-hook on the classifier keeps its input, the penultimate feature (after pooling and
the final norm; for a probe on cached features, the cached feature itself).
"""
from __future__ import annotations

import hashlib
import os

import numpy as np
import torch
from safetensors import SafetensorError

from common import rundir
from common.errors import UserError
from common.seeding import mix_seed
from common.weights import read_safetensors, read_safetensors_metadata, save_safetensors

FORMAT = "1"
ALL, NONE = "all", "none"
DEFAULT_SIZE = ALL


class FeatureProbe:
    """Forward pre-hook on `module.head` for one evaluation loop: `take()` after each forward keeps
    that batch's classifier input on the CPU; `features(d)` returns them all (N, d)."""

    def __init__(self, module):
        self.head = module.head
        self._pending, self._kept, self._handle = None, [], None

    def __enter__(self):
        self._handle = self.head.register_forward_pre_hook(self._hook)
        return self

    def __exit__(self, *exc):
        self._handle.remove()
        return False

    def _hook(self, module, inputs):
        self._pending = inputs[0].detach()

    def take(self):
        if self._pending is None:
            raise RuntimeError("the model's forward did not call model.head: no penultimate features to keep")
        self._kept.append(self._pending.float().cpu())
        self._pending = None

    def features(self, dim: int) -> torch.Tensor:
        return torch.cat(self._kept) if self._kept else torch.empty(0, int(dim))


def parse_size(value):
    """--ood-memory: 'all' (the whole training split), 'none' (no feature-memory scores) or N >= 1."""
    text = str(value).strip().lower()
    if text in (ALL, NONE):
        return text
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise UserError(f"--ood-memory must be 'all', 'none' or a number of training images >= 1, got {value!r}")
    return n


def memory_path(run_dir: str, weights_kind: str) -> str:
    return os.path.join(run_dir, rundir.ood_memory_name(weights_kind))


def sample_indices(n_train: int, size, seed: int):
    """Indices of the memory's training images: None for all of them, else `size` of them drawn
    without replacement by a generator seeded from the run's seed (sorted: the loader's order)."""
    if size == ALL or size >= n_train:
        return None
    g = torch.Generator().manual_seed(mix_seed(seed, "ood_memory"))
    return np.sort(torch.randperm(n_train, generator=g)[:size].numpy())


def content_sha256(memory: dict) -> str:
    h = hashlib.sha256()
    for key in ("features", "labels", "preds"):
        h.update(memory[key].contiguous().numpy().tobytes())
    return h.hexdigest()


def _request_metadata(request: dict) -> dict:
    return {key: str(value) for key, value in sorted(request.items())}


def save(path: str, memory: dict, weights_sha256: str, request: dict) -> None:
    """Atomic: the previous file stays intact when the write fails (WriteError, exit 74)."""
    metadata = {"format": FORMAT, "weights_sha256": weights_sha256, "sha256": content_sha256(memory),
                "num_classes": str(memory["num_classes"]), **_request_metadata(request)}
    tensors = {key: memory[key].contiguous() for key in ("features", "labels", "preds")}
    save_safetensors(tensors, path, metadata)


def load(path: str, weights_sha256: str, request: dict):
    """(memory, None) when the stored memory at path may be used, else (None, why not)."""
    try:
        meta = read_safetensors_metadata(path)
        tensors = read_safetensors(path)
    except (UserError, SafetensorError, OSError, ValueError, RuntimeError) as err:
        return None, f"unreadable ({str(err).splitlines()[0] if str(err) else type(err).__name__})"
    if meta.get("format") != FORMAT or not {"features", "labels", "preds"} <= set(tensors):
        return None, "of another format"
    if meta.get("weights_sha256") != weights_sha256:
        return None, "computed with other weights (their sha256 differs)"
    wanted = _request_metadata(request)
    changed = [key for key, value in wanted.items() if meta.get(key) != value]
    if changed:
        return None, f"made for another request ({', '.join(f'{k}={meta.get(k)}' for k in changed)})"
    memory = {**tensors, "num_classes": int(meta.get("num_classes", 0))}
    if content_sha256(memory) != meta.get("sha256"):
        return None, "damaged (its contents do not match their sha256)"
    return memory, None


def obtain(path, weights_sha256, request, build, *, write: bool, say):
    """The memory for this request: the stored one when valid, else `build()` (stored at `path`
    when one is given and `write`: the main process). Returns (memory, "stored" | "built")."""
    if path is not None and os.path.isfile(path):
        memory, why = load(path, weights_sha256, request)
        if memory is not None:
            return memory, "stored"
        say(f"note: the OOD feature memory {path} is {why}: rebuilding it")
    memory = build()
    if path is not None and write:
        save(path, memory, weights_sha256, request)
    return memory, "built"
