"""Hopfield pooling: the final patch tokens pooled by one retrieval step of a (sparse) Hopfield network.

With the N patch tokens X (N × d) as stored patterns and a learned query ξ, one update of the
Hopfield–Fenchel–Young network (Santos et al., ICML 2024 / JMLR 2025; Ramsauer et al. 2021 for
softmax) is

    ξ ← Xᵀ entmax(β X ξ)

an attention pooling whose weights p = entmax(β X ξ) say which patches the image's feature is
retrieved from: with sparsemax or entmax they have exact zeros, and the support is the set of
patches used. With several heads the channels split into groups, each with its own query (as in
multi-head attention without projections), so the pooled feature keeps d channels. β defaults to
1/√(d / heads), attention's scale; β → 0 gives equal weights, i.e. average pooling (ResMLP's).

Mappings: the pooling ones of models/mapping_table.py: softmax | sparsemax | entmax15 |
entmax_bisect (α learned in (1, 2) as 1 + sigmoid, starting at 1.5: adaptively sparse pooling,
Correia et al. 2019) | ksubset (structured retrieval, models/ksubset.py: weights μ in [0, 1]
summing to k = model.pool_k, exactly k patches at 1 when the scores are well separated; the pooled
feature is Xᵀμ / k, so the reported weights μ / k sum to 1 as for the others). The query starts
near zero, so the pooling starts near average pooling.

TorchScript and torch.fx: softmax is plain torch. The sparse mappings are autograd Functions,
called through `sparse_pool_weights`, which fx records as one call and TorchScript runs as a Python
call (@torch.jit.ignore: such a scripted module runs but cannot be saved by torch.jit.save; ONNX
export traces it). On accelerators they take the fixed-shape device threshold path (no host reads).
"""

import math
from typing import Optional

import torch
import torch.fx
from timm.layers import register_notrace_function, trunc_normal_
from torch import Tensor, nn

from common.errors import UserError

from .mapping_table import MAPPINGS, POOL_MAPPINGS, check_pool_k, load_implementations
from .names import POOLS

load_implementations()  # the pooling calls them inside compiled and scripted code


@torch.jit.ignore
def sparse_pool_weights(scores: Tensor, mapping: str, alpha_logit: Optional[Tensor], k: int) -> Tensor:
    """The sparse mapping of the pooling scores over the patch axis (last), rows summing to 1."""
    spec = MAPPINGS[mapping]
    settings = {"k": k}
    if alpha_logit is not None:  # entmax_bisect: a learned alpha, 1 + sigmoid in (1, 2)
        settings.update(alpha=1.0 + torch.sigmoid(alpha_logit), learn_alpha=True)
    weights = spec.apply(scores, -1, settings)
    return weights / k if spec.sums_to_k else weights


def pool_softmax(scores: Tensor) -> Tensor:
    """Softmax over the patch axis in the scores' dtype, fp16/bf16 in fp32 (a dtype test: one fx call)."""
    if scores.dtype == torch.float16 or scores.dtype == torch.bfloat16:
        return torch.softmax(scores.float(), -1).to(scores.dtype)
    return torch.softmax(scores, -1)


torch.fx.wrap("pool_softmax")  # its dtype branch is no fx control flow; TorchScript compiles it
register_notrace_function(pool_softmax)
torch.fx.wrap("sparse_pool_weights")  # one call node for torch.fx (an autograd Function inside)
register_notrace_function(sparse_pool_weights)  # and for timm's fx feature extraction


def check_pool(pool: str, mapping: str, heads: int, dim: int, beta: Optional[float], k: Optional[int] = None,
               num_patches: Optional[int] = None) -> None:
    if pool not in POOLS:
        raise UserError(f"unknown model.pool '{pool}'; valid: {', '.join(POOLS)}")
    if mapping not in POOL_MAPPINGS:
        raise UserError(f"unknown model.pool_mapping '{mapping}'; valid: {', '.join(POOL_MAPPINGS)}")
    check_pool_k(mapping, k, num_patches)
    if heads < 1 or dim % heads:
        raise UserError(f"pooling heads must divide the {dim} channels, got {heads}")
    if beta is not None and not (math.isfinite(beta) and beta >= 0):
        raise UserError(f"model.pool_beta must be a finite number >= 0 (or null for 1/sqrt(d/heads)), got {beta}")


class HopfieldPooling(nn.Module):
    """(B, N, d) tokens -> (B, d): ξ = Xᵀ entmax(β X q) per head (see the module docstring)."""

    def __init__(self, dim: int, heads: int = 1, mapping: str = "softmax", beta: Optional[float] = None,
                 k: Optional[int] = None, num_patches: Optional[int] = None):
        super().__init__()
        check_pool("hopfield", mapping, heads, dim, beta, k, num_patches)
        self.heads, self.head_dim, self.mapping = heads, dim // heads, mapping
        self.k = int(k) if k is not None else 0  # ksubset's subset size (0: unused; an int for TorchScript)
        self.beta = float(self.head_dim ** -0.5 if beta is None else beta)
        self.query = nn.Parameter(torch.empty(heads, self.head_dim))
        trunc_normal_(self.query, std=0.02)  # near zero: close to average pooling, heads distinct
        if mapping == "entmax_bisect":
            self.alpha_logit = nn.Parameter(torch.zeros(()))  # α = 1 + sigmoid(0) = 1.5
        else:
            self.register_parameter("alpha_logit", None)

    def weights(self, x: Tensor) -> Tensor:
        """Pooling weights (B, heads, N) of tokens x (B, N, d): each row sums to 1."""
        B, N, _ = x.shape
        scores = torch.einsum("bnhc,hc->bhn", x.reshape(B, N, self.heads, self.head_dim),
                              self.query.to(x.dtype)) * self.beta
        if self.mapping == "softmax":
            return pool_softmax(scores)
        return sparse_pool_weights(scores, self.mapping, self.alpha_logit, self.k)

    def forward(self, x: Tensor) -> Tensor:
        B, N, D = x.shape
        p = self.weights(x).to(x.dtype)
        pooled = torch.einsum("bhn,bnhc->bhc", p, x.reshape(B, N, self.heads, self.head_dim))
        return pooled.reshape(B, D)

    def extra_repr(self) -> str:
        k = f", k={self.k}" if self.k else ""
        return f"heads={self.heads}, mapping={self.mapping}{k}, beta={self.beta:.4g}"
