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
from typing import Callable, Dict, Optional, Tuple

from common.errors import UserError
from common.lazy import DeferredModule, load_deferred

# the implementations, imported on first use: this table is read without torch (the config loader)
ksubset = DeferredModule("models.ksubset")
mappings = DeferredModule("models.mappings")


@dataclass(frozen=True)
class MappingSpec:
    name: str
    apply: Callable
    sparse: bool  # exact zeros: its support is a set
    pool: bool
    doc: str
    needs: Tuple[str, ...] = ()
    sums_to_k: bool = False


MAPPINGS: Dict[str, MappingSpec] = {}


def _declare(spec: MappingSpec) -> None:
    if spec.name in MAPPINGS:
        raise ValueError(f"mapping '{spec.name}' declared twice")
    MAPPINGS[spec.name] = spec


_declare(MappingSpec("softmax", lambda x, dim, s: mappings.softmax(x, dim), sparse=False, pool=True,
                     doc="softmax (dense retrieval)"))
_declare(MappingSpec("sparsemax", lambda x, dim, s: mappings.sparsemax(x, dim), sparse=True, pool=True,
                     doc="sparsemax, the Euclidean projection onto the simplex"))
_declare(MappingSpec("entmax15", lambda x, dim, s: mappings.entmax15(x, dim), sparse=True, pool=True,
                     doc="1.5-entmax"))
_declare(MappingSpec("entmax_bisect",
                     lambda x, dim, s: mappings.entmax_bisect(x, s["alpha"], dim,
                                                              n_iter=mappings.entmax_bisect_steps(x, s)),
                     sparse=True, pool=True, doc="alpha-entmax, alpha fixed or learned", needs=("alpha",)))
_declare(MappingSpec("ksubset", lambda x, dim, s: ksubset.ksubset(x, s["k"], dim), sparse=True, pool=True,
                     doc="k-subset SparseMAP: weights in [0, 1] summing to k (structured retrieval)",
                     needs=("k",), sums_to_k=True))

POOL_MAPPINGS = tuple(name for name, spec in MAPPINGS.items() if spec.pool)



def check_pool_k(mapping: str, k: Optional[int], num_patches: Optional[int] = None) -> None:
    """model.pool_k belongs to the mappings that need a k (ksubset): required there, refused elsewhere."""
    needs_k = "k" in MAPPINGS[mapping].needs
    if not needs_k:
        if k is not None:
            takers = [name for name, spec in MAPPINGS.items() if spec.pool and "k" in spec.needs]
            raise UserError(f"model.pool_k={k} is read by model.pool_mapping {' or '.join(takers)} only (got "
                            f"'{mapping}'); set model.pool_mapping={takers[0]} or drop model.pool_k")
        return
    if k is None or isinstance(k, bool) or not isinstance(k, int) or k < 1 or (num_patches is not None
                                                                                and k > num_patches):
        limit = f"in 1..{num_patches} (the number of patches)" if num_patches is not None else ">= 1"
        raise UserError(f"model.pool_mapping={mapping} retrieves exactly model.pool_k patches: set model.pool_k "
                        f"to an integer {limit}, got {k!r}")


def load_implementations() -> None:
    """Import the mappings now: torch.compile must not meet a module that is still to load."""
    load_deferred(globals())


__all__ = ["load_implementations", "MappingSpec", "MAPPINGS", "POOL_MAPPINGS", "check_pool_k"]
