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
    """d ** beta and d ** (beta - 1) for d >= 0 (the latter zero where d == 0 when beta > 1).

    beta = 1 / (alpha - 1) is a float or a tensor broadcastable to d. The float cases 2 (alpha =
    1.5) and 1 (alpha = 2) avoid a pow, the costly op on CPU. A tensor beta equal to 1 gets
    d ** 0 = 1 off the support too: that only overestimates f' in the Newton steps, which then
    still never overshoot.
    """
    if isinstance(beta, float) and beta == 2.0:
        return d * d, d
    if isinstance(beta, float) and beta == 1.0:
        return d, d.ceil()
    d_bm1 = d.pow(beta - 1.0)
    return d_bm1 * d, d_bm1
