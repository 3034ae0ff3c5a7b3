"""ResMLP: feedforward networks for image classification with data-efficient training.

Touvron et al. 2021, arXiv:2105.03404. For image patches X (N patches × d channels) each
residual block computes (paper, Eq. 1-2)

    Z = X + LS1 ⊙ (A · Aff1(X) + a)                  # cross-patch:   A ∈ R^{N×N}, shared by channels
    Y = Z + LS2 ⊙ (C · GELU(B · Aff2(Z) + b) + c)    # cross-channel: B ∈ R^{4d×d}, C ∈ R^{d×4d}

with Aff(x) = α ⊙ x + β per channel, and ResMLPBlock.forward writes exactly that, as DeiT's
resmlp_models.py does. LS1, LS2 are the LayerScale vectors (CaiT, arXiv:2103.17239), initialised
by depth: 0.1 up to 18 blocks, 1e-5 up to 24, 1e-6 beyond. `norm="layernorm"` is the paper's
LayerNorm baseline, `norm="batchnorm"` a BatchNorm over the channels of the (B, N, d) tokens.

The variants are timm models: importing this module registers them, so
`timm.create_model("resmlp_s12", num_classes=10)` builds one, and
`timm.create_model("resmlp_s12", pretrained=True, pretrained_cfg_overlay=dict(file=PATH))` loads
local weights in this project's, timm's or the original FB/DeiT format (models/convert.py).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import DropPath, Mlp, trunc_normal_
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model

from common.errors import UserError

from .convert import load_pretrained

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


class ResMLPBlock(nn.Module):
    """One ResMLP block (paper Eq. 1-2); see the module docstring."""

    def __init__(self, dim, num_patches, mlp_ratio=4.0, norm="affine", init_values=0.1, drop_path=0.0):
        super().__init__()
        self.norm1 = make_norm(norm, dim)
        self.cross_patch = nn.Linear(num_patches, num_patches)  # A (N×N) and its bias, over patches
        self.ls1 = nn.Parameter(torch.full((dim,), float(init_values)))
        self.norm2 = make_norm(norm, dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU)  # C · GELU(B · z + b) + c
        self.ls2 = nn.Parameter(torch.full((dim,), float(init_values)))
        # Stochastic depth (timm's DropPath): a fresh per-sample mask for each branch.
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def mix_patches(self, y):
        """A · y + a over the patch axis for y (B, N, d): one batched matmul on the (B, N, d)
        layout, where nn.Linear would need y transposed to (B, d, N) and back."""
        B, N, _ = y.shape
        w, b = self.cross_patch.weight, self.cross_patch.bias
        return torch.baddbmm(b.to(y.dtype)[:, None], w.to(y.dtype).expand(B, N, N), y)

    def forward(self, x):
        x = x + self.drop_path(self.ls1 * self.mix_patches(self.norm1(x)))  # Z = X + LS1·(A·Aff1(X) + a)
        x = x + self.drop_path(self.ls2 * self.mlp(self.norm2(x)))          # Y = Z + LS2·MLP(Aff2(Z))
        return x


class ResMLP(nn.Module):
    """ResMLP image classifier (Touvron et al. 2021, arXiv:2105.03404) with a timm-style interface.

    stem (conv, kernel = stride = patch) → depth × ResMLPBlock → norm → mean over patches → head.
    `head` is a plain nn.Linear producing logits (nn.Identity when num_classes=0); the output
    mapping (softmax / sparsemax / entmax) is attached separately by models.create_classifier.
    """

    def __init__(self, img_size=224, patch_size=16, in_chans=3, num_classes=1000, embed_dim=384,
                 depth=12, mlp_ratio=4.0, norm="affine", init_values=None, drop_rate=0.0,
                 drop_path_rate=0.0, global_pool="avg"):
        super().__init__()
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

    @staticmethod
    def _init_weights(m):
        # DeiT's ResMLP init: truncated normal (std 0.02) for linear maps, zero biases.
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

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

    def group_matcher(self, coarse: bool = False):
        """Parameter groups for timm's layer-wise lr decay (optim.layer_decay): the stem, one group
        per block, the final norm with the last block; the classifier is the top group (lr scale 1)."""
        return dict(stem=r"^stem", blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))])

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

    def forward_features(self, x):
        """Images (B, C, H, W) → normalised patch features (B, N, d)."""
        return self.norm(self.blocks(self.patch_embed(x)))

    def forward_head(self, x, pre_logits: bool = False):
        if self.global_pool == "avg":
            x = x.mean(dim=1)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x):
        return self.forward_head(self.forward_features(x))


# --- named variants, registered with timm ------------------------------------------------------
# The one table of variants: MODEL_NAMES, the pretrained configs and the constructors below all
# follow it (tests/test_model.py checks that every name here is registered, and nothing else).
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


def _pretrained_cfg(img_size: int) -> dict:
    """timm's pretrained config: no bundled weights (no url), a local `file` may be overlaid."""
    return dict(url="", num_classes=1000, input_size=(3, img_size, img_size), fixed_input_size=True,
                crop_pct=0.875 if img_size >= 224 else 1.0, interpolation="bicubic",
                mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD, first_conv="stem.proj",
                classifier="head", paper_ids="arXiv:2105.03404")


# timm's register_model reads the module-level `default_cfgs` when each constructor is registered.
default_cfgs = generate_default_cfgs({name: _pretrained_cfg(arch["img_size"]) for name, arch in VARIANTS.items()})


def create_resmlp(name: str, pretrained: bool = False, **kwargs) -> ResMLP:
    """Build a named variant, as timm.create_model(name, ...) does; keyword arguments override its
    defaults (e.g. num_classes, norm; None keeps the default). With pretrained=True the weights
    come from the file named by `pretrained_cfg_overlay=dict(file=PATH)` (or a `pretrained_cfg`
    with a `file`), in any format models/convert.py reads; no weights are bundled."""
    if name not in VARIANTS:
        raise UserError(f"unknown model '{name}'; valid names: {', '.join(MODEL_NAMES)}")
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    # timm resolves pretrained_cfg / pretrained_cfg_overlay and attaches model.pretrained_cfg.
    # Its own loader is not used: with a file whose class count differs from the config's it
    # would silently drop the head, where models.convert names the mismatch.
    model = build_model_with_cfg(ResMLP, name, pretrained=False, **{**VARIANTS[name], **kwargs})
    if pretrained:
        path = model.pretrained_cfg.get("file")
        if not path:
            raise UserError(f"no pretrained weights are bundled for '{name}'; pass a local file: "
                            f"timm.create_model('{name}', pretrained=True, pretrained_cfg_overlay=dict(file=PATH)) "
                            "(this project's, timm's or FB/DeiT weights, .safetensors or .pth)")
        load_pretrained(model, str(path))  # a pathlib.Path works too
    return model


@register_model
def resmlp_tiny(pretrained=False, **kwargs) -> ResMLP:
    """4 blocks × 128 channels on 32 px images in 4 px patches: a model for smoke tests."""
    return create_resmlp("resmlp_tiny", pretrained, **kwargs)


@register_model
def resmlp_cifar_s12(pretrained=False, **kwargs) -> ResMLP:
    """ResMLP-S12 (12 blocks × 384 channels) on 32 px images in 4 px patches."""
    return create_resmlp("resmlp_cifar_s12", pretrained, **kwargs)


@register_model
def resmlp_cifar_s24(pretrained=False, **kwargs) -> ResMLP:
    """ResMLP-S24 (24 blocks × 384 channels) on 32 px images in 4 px patches."""
    return create_resmlp("resmlp_cifar_s24", pretrained, **kwargs)


@register_model
def resmlp_s12(pretrained=False, **kwargs) -> ResMLP:
    """ResMLP-S12 (12 blocks × 384 channels) on 224 px images in 16 px patches; timm's resmlp_12_224."""
    return create_resmlp("resmlp_s12", pretrained, **kwargs)


@register_model
def resmlp_s24(pretrained=False, **kwargs) -> ResMLP:
    """ResMLP-S24 (24 blocks × 384 channels) on 224 px images in 16 px patches; timm's resmlp_24_224."""
    return create_resmlp("resmlp_s24", pretrained, **kwargs)


@register_model
def resmlp_s36(pretrained=False, **kwargs) -> ResMLP:
    """ResMLP-S36 (36 blocks × 384 channels) on 224 px images in 16 px patches; timm's resmlp_36_224."""
    return create_resmlp("resmlp_s36", pretrained, **kwargs)


@register_model
def resmlp_b24(pretrained=False, **kwargs) -> ResMLP:
    """ResMLP-B24 (24 blocks × 768 channels) on 224 px images in 8 px patches; timm's resmlp_big_24_224."""
    return create_resmlp("resmlp_b24", pretrained, **kwargs)
