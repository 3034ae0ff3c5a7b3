"""ResMLP: feedforward networks for image classification with data-efficient training.

Touvron et al. 2021, arXiv:2105.03404. For image patches X (N patches × d channels) each
residual block computes (paper, Eq. 1-2)

    Z = X + Aff( (A · Aff(X)ᵀ)ᵀ )                 # cross-patch:   A ∈ R^{N×N}, shared by channels
    Y = Z + Aff( C · GELU(B · Aff(Z)) )           # cross-channel: B ∈ R^{4d×d}, C ∈ R^{d×4d}

with Aff(x) = α ⊙ x + β per channel. The outer Aff of each branch is the LayerScale vector
(ls1, ls2; CaiT, arXiv:2103.17239), initialised by depth: 0.1 up to 18 blocks, 1e-5 up to 24,
1e-6 beyond. `norm="layernorm"` is the paper's LayerNorm baseline, `norm="batchnorm"` a
BatchNorm over the channels of the (B, N, d) tokens.

Efficiency. `ResMLPBlock.forward_reference` is the equation above, literally. The default path
(`ResMLPBlock.forward_folded`, for the Affine model) computes exactly the same function with fewer
passes over the activations: the cross-patch linear map is one batched matmul over the patch axis
(A @ X for X of shape (B, N, d): no transposed copies), and every Affine and LayerScale is folded
into the adjacent matmul's weights and biases. The folded weights are recomputed from the
parameters at every call (they are tiny next to the activations), so training is unchanged and
autograd still delivers gradients to α, β and the LayerScales.
"""
from __future__ import annotations

import contextlib


import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import DropPath, trunc_normal_
from timm.models import register_model

from common.errors import UserError

NORMS = ("affine", "layernorm", "batchnorm")


def layerscale_init(depth: int) -> float:
    """LayerScale initial value by depth, as in CaiT and the ResMLP paper (DeiT uses 0.1 for S12)."""
    if depth <= 18:
        return 0.1
    if depth <= 24:
        return 1e-5
    return 1e-6


class Affine(nn.Module):
    """Aff(x) = α ⊙ x + β over the last (channel) axis; α = 1, β = 0 at init."""

    def __init__(self, dim: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return torch.addcmul(self.beta, self.alpha, x)


class TokenBatchNorm(nn.BatchNorm1d):
    """BatchNorm over the channels of (B, N, d) tokens: statistics over batch and patches."""

    def forward(self, x):
        return super().forward(x.reshape(-1, x.shape[-1])).view(x.shape)


def make_norm(norm: str, dim: int) -> nn.Module:
    if norm == "affine":
        return Affine(dim)
    if norm == "layernorm":
        return nn.LayerNorm(dim, eps=1e-6)
    if norm == "batchnorm":
        return TokenBatchNorm(dim)
    raise UserError(f"unknown norm '{norm}'; valid norms: {', '.join(NORMS)}")


class Mlp(nn.Module):
    """Cross-channel MLP: Linear(d, 4d) → GELU → Linear(4d, d)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def _autocast_off(device_type: str):
    """Disable autocast where it is on (folding tiny weights in fp32 adds no rounding)."""
    if device_type in ("cpu", "cuda", "xpu", "mps") and torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type=device_type, enabled=False)
    return contextlib.nullcontext()


def _sample_mask(x, rate: float):
    """Per-sample stochastic-depth multiplier (B, 1, 1): 0 or 1/keep."""
    keep = 1.0 - rate
    return x.new_empty(x.shape[0], 1, 1, dtype=torch.float32).bernoulli_(keep).div_(keep)


def _compute_dtype(x):
    """The dtype autocast would run a matmul on x in (x's own dtype when autocast is off)."""
    dev = x.device.type
    if dev in ("cpu", "cuda", "xpu", "mps") and torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return x.dtype


class FoldedCrossPatch(torch.autograd.Function):
    """Z = X + s ⊙ (A @ X) + C for X (B, N, d), A (N, N), s (d,), C (N, d): the folded cross-patch
    residual branch, with a hand-written backward that needs fewer passes over the activations.

    With G = ∂L/∂Z and U = Aᵀ @ G (one batched matmul):
        ∂L/∂X = G + s ⊙ U            (one fused addcmul; autograd would add a cast and an add)
        ∂L/∂s = Σ_{b,n} X ⊙ U        (since Σ G ⊙ (A@X) = Σ (AᵀG) ⊙ X: reuses U)
        ∂L/∂A = Σ_b G_b (X_b ⊙ s)ᵀ,   ∂L/∂C = Σ_b G_b
    Matmuls run in autocast's dtype when autocast is on (as an autocast bmm would); the residual
    stream X, Z stays in its own dtype (fp32), exactly as in the reference computation.
    """

    @staticmethod
    def forward(ctx, x, A, s, C, cdt):
        B, N, _ = x.shape
        xc = x.to(cdt)
        Ax = torch.bmm(A.to(cdt).expand(B, N, N), xc)
        ctx.save_for_backward(xc, A, s)
        return torch.addcmul(x + C, Ax, s)

    @staticmethod
    def backward(ctx, g):
        xc, A, s = ctx.saved_tensors
        B, N, _ = xc.shape
        gc = g.to(xc.dtype)
        U = torch.bmm(A.to(xc.dtype).t().expand(B, N, N), gc)                       # Aᵀ G
        gx = torch.addcmul(g, U, s.to(g.dtype)) if ctx.needs_input_grad[0] else None
        gs = (xc * U).sum((0, 1), dtype=torch.float32).to(s.dtype) if ctx.needs_input_grad[2] else None
        gA = None
        if ctx.needs_input_grad[1]:
            xs = xc * s.to(xc.dtype)
            gA = torch.bmm(gc, xs.transpose(1, 2)).sum(0, dtype=torch.float32).to(A.dtype)
        gC = g.sum(0) if ctx.needs_input_grad[3] else None
        return gx, gA, gs, gC, None


class FoldedChannelMLP(torch.autograd.Function):
    """Y = Z + GELU(Z @ W1ᵀ + b1) @ W2ᵀ: the folded cross-channel residual branch.

    Same math as autograd would run, but in mixed precision the gradient reaching Z through the
    MLP is added to the residual gradient in one mixed-dtype pass (autograd: cast, then add).
    """

    @staticmethod
    def forward(ctx, z, W1, b1, W2, cdt):
        zc = z.to(cdt)
        W1c, W2c = W1.to(cdt), W2.to(cdt)
        h0 = torch.addmm(b1.to(cdt), zc.flatten(0, 1), W1c.t())
        h = F.gelu(h0)
        ctx.save_for_backward(zc, h0, h, W1c, W2c)
        ctx.dtypes = (W1.dtype, b1.dtype, W2.dtype)
        return z + torch.mm(h, W2c.t()).view(z.shape)

    @staticmethod
    def backward(ctx, g):
        zc, h0, h, W1c, W2c = ctx.saved_tensors
        dt_W1, dt_b1, dt_W2 = ctx.dtypes
        gc = g.to(zc.dtype).flatten(0, 1)
        gW2 = torch.mm(gc.t(), h).to(dt_W2)
        dh0 = torch.ops.aten.gelu_backward(torch.mm(gc, W2c), h0)
        gb1 = dh0.sum(0, dtype=torch.float32).to(dt_b1)
        gW1 = torch.mm(dh0.t(), zc.flatten(0, 1)).to(dt_W1)
        gz = torch.add(g, torch.mm(dh0, W1c).view(g.shape))  # one mixed-dtype pass
        return gz, gW1, gb1, gW2, None


class ResMLPBlock(nn.Module):
    """One ResMLP block (paper Eq. 1-2); see the module docstring."""

    def __init__(self, dim, num_patches, mlp_ratio=4.0, norm="affine", init_values=0.1, drop_path=0.0):
        super().__init__()
        self.norm1 = make_norm(norm, dim)
        self.cross_patch = nn.Linear(num_patches, num_patches)  # A (N×N) and its bias, over patches
        self.ls1 = nn.Parameter(torch.full((dim,), float(init_values)))
        self.norm2 = make_norm(norm, dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.ls2 = nn.Parameter(torch.full((dim,), float(init_values)))
        self.drop_path_rate = float(drop_path)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.fold_affine = True  # False → forward_reference (the same function, unfolded)

    def forward(self, x):
        if self.fold_affine and isinstance(self.norm1, Affine):
            return self.forward_folded(x)
        return self.forward_reference(x)

    def mix_patches(self, y):
        """A · y over the patch axis for y (B, N, d): one batched matmul, bias per patch row."""
        B, N, _ = y.shape
        w, b = self.cross_patch.weight, self.cross_patch.bias
        return torch.baddbmm(b.to(y.dtype)[:, None], w.to(y.dtype).expand(B, N, N), y)

    def forward_reference(self, x):
        """The paper's equations, one operation per symbol."""
        x = x + self.drop_path(self.ls1 * self.mix_patches(self.norm1(x)))  # Z = X + Aff((A Aff(X)ᵀ)ᵀ)
        x = x + self.drop_path(self.ls2 * self.mlp(self.norm2(x)))          # Y = Z + Aff(C GELU(B Aff(Z)))
        return x

    def forward_folded(self, x):
        """Exactly forward_reference for Affine norms, with every Aff/LayerScale folded away.

        Cross-patch branch, with Aff1(x) = α1⊙x + β1 and ls1:
            ls1 ⊙ (A @ (α1⊙x + β1) + a) = s1 ⊙ (A @ x) + C1,
            s1 = ls1⊙α1 (d,),   C1 = ls1 ⊙ (rowsum(A) ⊗ β1 + a ⊗ 1) (N×d, batch-independent)
        so Z = addcmul(x + C1, A @ x, s1): one matmul and one fused elementwise pass
        (FoldedCrossPatch, whose backward also reuses Aᵀ@G for the gradients of x and s1).

        Cross-channel branch, with Aff2(z) = α2⊙z + β2:
            fc1(α2⊙z + β2) = z @ (W1·diag(α2))ᵀ + (W1 β2 + b1)
            ls2 ⊙ fc2(h)   = h @ (diag(ls2)·W2)ᵀ + ls2⊙b2
        Without drop path, fc2's folded bias ls2⊙b2 is added early, inside Z's pass (which is
        free: C1 is broadcast anyway), and subtracted again inside fc1's bias, so the second
        residual add needs no separate bias pass: Y = Z' + h @ W2sᵀ with Z' = Z + ls2⊙b2.
        """
        B, N, D = x.shape
        a1, be1 = self.norm1.alpha, self.norm1.beta
        a2, be2 = self.norm2.alpha, self.norm2.beta
        A, a = self.cross_patch.weight, self.cross_patch.bias
        W1, b1 = self.mlp.fc1.weight, self.mlp.fc1.bias
        W2, b2 = self.mlp.fc2.weight, self.mlp.fc2.bias

        # Folded weights: O(N² + d²) work, negligible next to the O(B·N·d) activations; kept in
        # fp32 (autocast off) so the folding itself adds no rounding, autocast casts them at use.
        with _autocast_off(x.device.type):
            s1 = self.ls1 * a1                                                  # (d,)
            C1 = self.ls1 * torch.addcmul(a[:, None], A.sum(1)[:, None], be1)   # (N, d)
            W1f = W1 * a2                                                       # W1·diag(α2)
            W2f = W2 * self.ls2[:, None]                                        # diag(ls2)·W2
            b2f = self.ls2 * b2                                                 # ls2⊙b2
            if self.training and self.drop_path_rate > 0:
                b1f = torch.addmv(b1, W1, be2)                                  # W1β2 + b1
            else:
                b1f = torch.addmv(b1, W1, be2 - a2 * b2f)                       # … − W1(α2⊙ls2⊙b2)
                C1 = C1 + b2f                                                   # Z' = Z + ls2⊙b2

        if self.training and self.drop_path_rate > 0:
            Ax = torch.bmm(A.to(x.dtype).expand(B, N, N), x)  # A @ X over patches, no transposes
            # Stochastic depth: each branch is scaled per sample by m ∈ {0, 1/keep}; the scale
            # rides on the small operands (C1, s1, and fc2's output) so no extra pass is needed.
            m1, m2 = _sample_mask(x, self.drop_path_rate), _sample_mask(x, self.drop_path_rate)
            z = torch.addcmul(torch.addcmul(x, m1, C1), Ax, s1 * m1)          # Z = X + m1⊙(…)
            h = F.gelu(F.linear(z, W1f, b1f))
            return torch.addcmul(z, F.linear(h, W2f, b2f), m2)                # Y = Z + m2⊙(…)
        z = FoldedCrossPatch.apply(x, A, s1, C1, _compute_dtype(x))  # Z' = X + s1⊙(A@X) + C1 (+ ls2⊙b2)
        # Y = Z + ls2⊙(C·GELU(B·Aff(Z)) + c), Aff folded into B, ls2 into C (c rides in Z')
        return FoldedChannelMLP.apply(z, W1f, b1f, W2f, _compute_dtype(z))


class ResMLP(nn.Module):
    """ResMLP image classifier (Touvron et al. 2021, arXiv:2105.03404) with a timm-style interface.

    stem (conv, kernel = stride = patch) → depth × ResMLPBlock → norm → mean over patches → head.
    `head` is a plain nn.Linear producing logits (nn.Identity when num_classes=0); the output
    mapping (softmax / sparsemax / entmax) is attached separately by models.create_classifier.
    """

    def __init__(self, img_size=224, patch_size=16, in_chans=3, num_classes=1000, embed_dim=384,
                 depth=12, mlp_ratio=4.0, norm="affine", init_values=None, drop_rate=0.0,
                 drop_path_rate=0.0, global_pool="avg", fold_affine=True):
        super().__init__()
        if norm not in NORMS:
            raise UserError(f"unknown norm '{norm}'; valid norms: {', '.join(NORMS)}")
        if global_pool not in ("avg", ""):
            raise UserError(f"unknown global_pool '{global_pool}'; valid: 'avg', ''")
        if int(img_size) <= 0 or int(img_size) % int(patch_size):
            raise UserError(
                f"image size {img_size} is not divisible by patch size {patch_size}; "
                f"use a multiple of {patch_size} (e.g. {max(1, round(int(img_size) / int(patch_size))) * int(patch_size)})")
        self.img_size, self.patch_size, self.in_chans = int(img_size), int(patch_size), in_chans
        self.grid = self.img_size // self.patch_size
        self.num_patches = self.grid ** 2
        self.num_classes = num_classes
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.global_pool = global_pool
        self.norm_name = norm
        self.init_values = layerscale_init(depth) if init_values is None else float(init_values)

        self.stem = nn.Module()
        self.stem.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.blocks = nn.Sequential(*[
            ResMLPBlock(embed_dim, self.num_patches, mlp_ratio, norm, self.init_values, drop_path_rate)
            for _ in range(depth)])  # uniform drop-path rate across blocks, as in the paper
        self.norm = make_norm(norm, embed_dim)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.apply(self._init_weights)
        self.set_fold_affine(fold_affine)

    @staticmethod
    def _init_weights(m):
        # DeiT's ResMLP init: truncated normal (std 0.02) for linear maps, zero biases.
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def set_fold_affine(self, enabled: bool = True):
        """Switch every block between the folded (fast) and the literal reference computation."""
        for blk in self.blocks:
            blk.fold_affine = bool(enabled)
        return self

    # --- timm interface -------------------------------------------------------------------
    def get_classifier(self):
        return self.head

    def reset_classifier(self, num_classes: int, global_pool=None):
        self.num_classes = num_classes
        if global_pool is not None:
            if global_pool not in ("avg", ""):
                raise UserError(f"unknown global_pool '{global_pool}'; valid: 'avg', ''")
            self.global_pool = global_pool
        p = next(self.parameters())
        self.head = (nn.Linear(self.embed_dim, num_classes, device=p.device, dtype=p.dtype)
                     if num_classes > 0 else nn.Identity())
        if num_classes > 0:
            self._init_weights(self.head)

    def patch_embed(self, x):
        """Conv with kernel = stride = patch, written as one matmul on the patch pixels so the
        tokens come out as a contiguous (B, N, d) tensor (a conv + flatten + transpose would
        leave a transposed layout for the first block to copy)."""
        B, C, H, W = x.shape
        if (H, W) != (self.img_size, self.img_size) or C != self.in_chans:
            raise UserError(
                f"input of shape {tuple(x.shape)} does not match the model: expected "
                f"(B, {self.in_chans}, {self.img_size}, {self.img_size}); set the model's img_size "
                f"to the data's image size")
        p, g = self.patch_size, self.grid
        patches = x.reshape(B, C, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(B, g * g, C * p * p)
        w, b = self.stem.proj.weight, self.stem.proj.bias
        return F.linear(patches, w.reshape(w.shape[0], -1), b)

    def forward_blocks(self, x):
        return self.blocks(self.patch_embed(x))

    def forward_features(self, x):
        """Images (B, C, H, W) → normalised patch features (B, N, d)."""
        return self.norm(self.forward_blocks(x))

    def forward_head(self, x, pre_logits: bool = False):
        if self.global_pool == "avg":
            x = x.mean(dim=1)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x):
        x = self.forward_blocks(x)
        if self.global_pool == "avg" and isinstance(self.norm, Affine):
            # mean_N(α⊙x + β) = α⊙mean_N(x) + β: apply the final Aff after pooling (exact).
            return self.forward_head(self.norm(x.mean(dim=1, keepdim=True)))
        return self.forward_head(self.norm(x))


# --- named variants ---------------------------------------------------------------------------
VARIANTS = {
    "resmlp_tiny": dict(img_size=32, patch_size=4, embed_dim=128, depth=4),
    "resmlp_cifar_s12": dict(img_size=32, patch_size=4, embed_dim=384, depth=12),
    "resmlp_cifar_s24": dict(img_size=32, patch_size=4, embed_dim=384, depth=24),
    "resmlp_s12": dict(img_size=224, patch_size=16, embed_dim=384, depth=12),
    "resmlp_s24": dict(img_size=224, patch_size=16, embed_dim=384, depth=24),
    "resmlp_s36": dict(img_size=224, patch_size=16, embed_dim=384, depth=36),
    # DeiT's resmlpB_24 (and timm's resmlp_big_24) start LayerScale at 1e-6, below the depth rule.
    "resmlp_b24": dict(img_size=224, patch_size=8, embed_dim=768, depth=24, init_values=1e-6),
}
MODEL_NAMES = tuple(VARIANTS)


def create_resmlp(name: str, **kwargs) -> ResMLP:
    """Build a named variant; keyword arguments override its defaults (e.g. num_classes, norm)."""
    if name not in VARIANTS:
        raise UserError(f"unknown model '{name}'; valid names: {', '.join(MODEL_NAMES)}")
    kwargs = {k: v for k, v in kwargs.items() if v is not None}  # None: the variant's default
    if kwargs.pop("pretrained", False):
        raise UserError(f"no pretrained weights are bundled for '{name}'; load them with "
                        "models.convert.load_pretrained(model, path)")
    for k in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):  # timm plumbing, unused
        kwargs.pop(k, None)
    return ResMLP(**{**VARIANTS[name], **kwargs})


def _register(name):
    def constructor(pretrained=False, **kwargs):
        return create_resmlp(name, pretrained=pretrained, **kwargs)
    constructor.__name__ = constructor.__qualname__ = name
    constructor.__doc__ = f"ResMLP variant {name}: {VARIANTS[name]} (arXiv:2105.03404)."
    constructor.__module__ = __name__
    globals()[name] = register_model(constructor)


for _name in MODEL_NAMES:
    _register(_name)
