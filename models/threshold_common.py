"""What the two threshold paths (thresholds_device.py, thresholds_cpu.py) share: the input
convention and the Tsallis power.

Every threshold routine takes scaled, shifted, clamped logits z = clamp((alpha - 1)(x - max),
FLOOR): the maximum of each slice is 0, so the threshold tau of p = [z - tau]_+^(1/(alpha-1))
lies in [-1, 0] and only entries above -1 can be in the support. Clamping at FLOOR makes -inf and
huge negative logits harmless (no inf - inf, no overflow when raised to a power) without changing
any output.
"""
from __future__ import annotations

import torch
from torch import Tensor

FLOOR = -1.5


def positions(n: int, like: Tensor, dim: int) -> Tensor:
    """1..n in like's dtype and device, shaped to broadcast along `dim` of `like`."""
    shape = [1] * like.dim()
    shape[dim] = n
    return torch.arange(1, n + 1, dtype=like.dtype, device=like.device).view(shape)


def tsallis_power(d: Tensor, beta):
    """d ** beta and d ** (beta - 1) on the support, both exactly 0 where d == 0, for any beta > 0.

    beta = 1 / (alpha - 1) is a float or a tensor broadcastable to d. The float cases 2 (alpha =
    1.5) and 1 (alpha = 2) avoid a pow, the costly op on CPU. Otherwise d ** (beta - 1) is taken
    as d ** beta / d, with 0 / tiny = 0 off the support: a plain pow would give 0 ** 0 = 1 there
    at beta = 1 (overestimating f' in the Newton steps, so they stop short of the root) and
    0 ** (beta - 1) = inf at beta < 1 (alpha > 2), then inf * 0 = NaN.
    """
    if isinstance(beta, float) and beta == 2.0:
        return d * d, d
    if isinstance(beta, float) and beta == 1.0:
        return d, d.ceil()
    u = d.pow(beta)
    return u, u / d.clamp(min=torch.finfo(d.dtype).tiny)


def tsallis_mass(d: Tensor, beta) -> Tensor:
    """d ** beta for d >= 0 (only the first output of tsallis_power: one op less)."""
    if isinstance(beta, float) and beta == 2.0:
        return d * d
    if isinstance(beta, float) and beta == 1.0:
        return d
    return d.pow(beta)
