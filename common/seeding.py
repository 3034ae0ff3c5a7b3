"""The one seed hash: stable 63-bit seeds from tuples of ints and strings.

Used for every derived seed: the training step RNGs (training/rng.py), the sample order and
per-sample augmentation seeds (data/samplers.py), the calibration hold-out and the built-in
dataset's generator (data/). A pure function of its arguments, identical across processes,
platforms and Python runs (no `hash()`, which is salted per process).

Each part is folded into a 64-bit state with the splitmix64 finaliser (Steele, Lea & Flood,
"Fast splittable pseudorandom number generators", OOPSLA 2014); a string enters as the 64-bit
BLAKE2b digest of its UTF-8 bytes, an int as its value modulo 2**64.
"""
import hashlib

import numpy as np

_MASK64 = (1 << 64) - 1
_MASK63 = (1 << 63) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _as_u64(part):
    if isinstance(part, str):
        return int.from_bytes(hashlib.blake2b(part.encode(), digest_size=8).digest(), "little")
    if isinstance(part, (int, np.integer)) and not isinstance(part, bool):
        return int(part) & _MASK64
    raise TypeError(f"seed parts are ints or strings, got {type(part).__name__}")


def _fold(h, v):
    h = (h ^ v) * _M1 & _MASK64
    h = (h ^ (h >> 31)) * _M2 & _MASK64
    return h ^ (h >> 29)


def _state(parts):
    h = _GOLDEN
    for part in parts:
        h = _fold(h, _as_u64(part))
    return h


def mix_seed(*parts):
    """A seed in [0, 2**63) from ints and strings."""
    return _state(parts) & _MASK63


def mix_seed_array(*parts, last):
    """mix_seed(*parts, p) for every p of the int64 numpy array `last` -> uint64 array (vectorised)."""
    with np.errstate(over="ignore"):
        h = np.uint64(_state(parts)) ^ last.astype(np.uint64)
        h = h * np.uint64(_M1)
        h ^= h >> np.uint64(31)
        h = h * np.uint64(_M2)
        h ^= h >> np.uint64(29)
    return h & np.uint64(_MASK63)
