"""The mappings that more than one part of the model uses, declared once: the output heads
(models/registry.py reads a head's mapping here) and Hopfield pooling (models/hopfield_pool.py
lists and dispatches its mappings from here).

Calling convention: apply(x, dim, settings) -> weights along dim, where `settings` holds the
mapping's parameters by name: `alpha` (entmax_bisect: a float, or a tensor, with `learn_alpha`
true when it is a learned 1 + sigmoid in (1, 2)) and `k` (ksubset). `pool`: usable as the
pooling's mapping (model.pool_mapping); `needs`: the settings it reads; `sums_to_k`: its weights
sum to k rather than 1 (the pooling divides by k).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Tuple

import torch

from .ksubset import ksubset
from .mappings import default_n_iter, entmax15, entmax_bisect, softmax, sparsemax


@dataclass(frozen=True)
class MappingSpec:
    name: str
    apply: Callable
    sparse: bool  # exact zeros: its support is a set
    pool: bool
    doc: str
    needs: Tuple[str, ...] = ()
    sums_to_k: bool = False


def entmax_bisect_steps(z, settings):
    """Bisection steps for alpha-entmax: a learned alpha is a tensor in (1, 2) by construction
    (1 + sigmoid), so beta > 1 and the short count suffices; the device path cannot read a tensor
    alpha to know that and would otherwise take the long count meant for alpha > 2. None: the
    mapping's own choice (a float alpha, read on the host)."""
    if not settings.get("learn_alpha"):
        return None
    return default_n_iter(torch.float64 if z.dtype == torch.float64 else torch.float32, beta=1.0)


MAPPINGS: Dict[str, MappingSpec] = {}


def _declare(spec: MappingSpec) -> None:
    if spec.name in MAPPINGS:
        raise ValueError(f"mapping '{spec.name}' declared twice")
    MAPPINGS[spec.name] = spec


_declare(MappingSpec("softmax", lambda x, dim, s: softmax(x, dim), sparse=False, pool=True,
                     doc="softmax (dense retrieval)"))
_declare(MappingSpec("sparsemax", lambda x, dim, s: sparsemax(x, dim), sparse=True, pool=True,
                     doc="sparsemax, the Euclidean projection onto the simplex"))
_declare(MappingSpec("entmax15", lambda x, dim, s: entmax15(x, dim), sparse=True, pool=True,
                     doc="1.5-entmax"))
_declare(MappingSpec("entmax_bisect",
                     lambda x, dim, s: entmax_bisect(x, s["alpha"], dim, n_iter=entmax_bisect_steps(x, s)),
                     sparse=True, pool=True, doc="alpha-entmax, alpha fixed or learned", needs=("alpha",)))
_declare(MappingSpec("ksubset", lambda x, dim, s: ksubset(x, s["k"], dim), sparse=True, pool=True,
                     doc="k-subset SparseMAP: weights in [0, 1] summing to k (structured retrieval)",
                     needs=("k",), sums_to_k=True))

POOL_MAPPINGS = tuple(name for name, spec in MAPPINGS.items() if spec.pool)

__all__ = ["MappingSpec", "MAPPINGS", "POOL_MAPPINGS", "entmax_bisect_steps"]
