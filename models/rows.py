"""Rows: the layout every head kernel works in (classes last, flattened to (R, K)), and the
compute dtype of the heads (fp16/bf16 in fp32)."""
from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor


def compute_dtype(x: Tensor) -> Tensor:
    """fp16/bf16 are computed in fp32 (their range and precision are too small for the sums)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def to_rows(x: Tensor, dim: int) -> Tuple[Tensor, torch.Size]:
    """x with `dim` moved last and flattened to (R, K), and the moved shape to restore it."""
    moved = x.movedim(dim, -1)
    return moved.reshape(-1, moved.shape[-1]), moved.shape


def from_rows(rows: Tensor, moved_shape: torch.Size, dim: int) -> Tensor:
    return rows.reshape(moved_shape).movedim(-1, dim)
