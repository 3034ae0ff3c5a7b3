"""Keyed noise: standard Gumbel or Gaussian draws that are a pure function of (seed, row key, draw,
class), so a row's noise does not depend on the other rows of the tensor it is drawn in.

A torch.Generator fills a tensor in order, so the noise of row r depends on r's position, the batch
size and the world size. Evaluation needs each example's noise to follow the example (its index in
the split) instead: here every element is a counter-based hash (Salmon et al. 2011, "Parallel random
numbers: as easy as 1, 2, 3", the idea; the 32-bit mixer is Wellons' "lowbias32") of its key, drawn
with integer tensor arithmetic on the keys' device (the seed's share on the host, with the same
operations on Python integers): no host read, fixed shapes, and the same integers on every
device (the float transforms after them round as any float op does).
Values are kept in [0, 2^32) in int64 and every product is split into 16-bit halves,
so no integer operation overflows.

Resolution: a uniform carries 24 random bits in float32 (as torch.rand) and 32 in float64.
"""
from __future__ import annotations

import torch
from torch import Tensor

_M32 = 0xFFFFFFFF


def _mul32(x, c: int):
    """(x * c) mod 2^32 for x in [0, 2^32) without int64 overflow (x: an int64 tensor or a Python int)."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def mix32(x):
    """A bijective 32-bit integer hash with full avalanche (lowbias32) of x in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _fold(key):
    """A non-negative int64 key to 32 bits, both halves mixed in."""
    return mix32((key & _M32) ^ mix32((key >> 32) & _M32))


def row_keys(seed: int, ids: Tensor) -> Tensor:
    """(R,) 32-bit keys of rows with non-negative int64 identities `ids` under host integer `seed`."""
    seed_key = _fold(int(seed) % (1 << 63))  # host arithmetic: no tensor made from host data
    return mix32(_fold(ids.long()) ^ seed_key)


def keyed_uniform(keys: Tensor, samples: int, classes: int, stream: int, dtype: torch.dtype) -> Tensor:
    """(samples, R, classes) uniforms in (0, 1): element (m, r, k) a hash of (keys[r], stream, m, k)."""
    counter = torch.arange(samples * classes, dtype=torch.int64, device=keys.device).view(samples, 1, classes)
    counter = _fold(counter + int(stream) * samples * classes)
    bits = 24 if dtype != torch.float64 else 32
    h = mix32((keys.view(1, -1, 1) + counter) & _M32) >> (32 - bits)
    u = (h.to(dtype) + 0.5) * 2.0 ** -bits
    return u.clamp_(min=torch.finfo(dtype).tiny, max=1.0 - torch.finfo(dtype).eps)


def keyed_noise(keys: Tensor, samples: int, classes: int, noise: str, dtype: torch.dtype) -> Tensor:
    """(samples, R, classes) standard Gumbel or Gaussian (Box-Muller) noise of row keys (R,)."""
    u = keyed_uniform(keys, samples, classes, 0, dtype)
    if noise == "gumbel":
        return -torch.log(-torch.log(u))
    angle = keyed_uniform(keys, samples, classes, 1, dtype).mul_(2 * torch.pi)
    return torch.sqrt(-2.0 * torch.log(u)) * torch.cos(angle)


__all__ = ["mix32", "row_keys", "keyed_uniform", "keyed_noise"]
