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

import contextlib
from typing import List, Optional, Tuple, Union

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import DropPath, Mlp, register_notrace_function, trunc_normal_
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._features import feature_take_indices  # as timm.models.mlp_mixer imports it

from common.errors import UserError

from .convert import load_pretrained
from .hopfield_pool import HopfieldPooling, check_pool
from .names import MODEL_NAMES, NORMS, POOLS, VARIANTS  # noqa: F401  (MODEL_NAMES: re-exported)


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


class Recomputation:
    """Entered while torch.utils.checkpoint re-runs a block in the backward pass (see checkpointed):
    BatchNorm must then not update its running statistics a second time. A class, not a generator,
    because checkpoint may enter the same context more than once."""
    active = False

    def __enter__(self):
        self.previous, Recomputation.active = Recomputation.active, True

    def __exit__(self, *exc):
        Recomputation.active = self.previous


def checkpointed(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """block(x) without keeping its activations: recomputed in the backward pass with the same
    random state (the same drop-path masks) and without a second BatchNorm statistics update, so
    outputs, gradients and running statistics equal the plain forward's."""
    return torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False,
                                             context_fn=lambda: (contextlib.nullcontext(), Recomputation()))


@register_notrace_function  # timm's fx feature extraction: one call node, as torch.fx.wrap below
def count_batch(counter: torch.Tensor, batch: torch.Tensor) -> None:
    """counter += 1, BatchNorm's num_batches_tracked update. It takes the batch only so that torch.fx
    records the update as a call: fx does not trace a buffer on its own, so a bare `add_` would run
    once while tracing instead of at every training step."""
    counter.add_(1)


torch.fx.wrap("count_batch")


class TokenBatchNorm(nn.BatchNorm1d):
    """BatchNorm over the channels of (B, N, d) tokens: statistics over batch and patches.

    nn.BatchNorm1d's forward (default settings: affine, running statistics, momentum 0.1) on the
    (B·N, d) view, written out with F.batch_norm because TorchScript cannot call super().forward.
    The parameters and buffers are BatchNorm1d's, so state dicts are unchanged.
    """

    def __init__(self, dim: int):
        super().__init__(dim)

    def forward(self, x):
        momentum = self.momentum
        if momentum is None:  # never for make_norm's norms; refines Optional[float] for TorchScript
            momentum = 0.1
        update = self.training
        if not torch.jit.is_scripting():  # (scripted modules are never checkpointed)
            update = update and not Recomputation.active
        counter = self.num_batches_tracked
        if update and counter is not None:
            count_batch(counter, x)
        running_mean, running_var = self.running_mean, self.running_var
        if self.training and not update and running_mean is not None and running_var is not None:
            # A checkpoint's recomputation: the same computation (checkpoint checks that it saves the
            # same tensors), on copies of the statistics, so the buffers are updated only once.
            running_mean, running_var = running_mean.clone(), running_var.clone()
        tokens = F.batch_norm(x.reshape(-1, x.shape[-1]), running_mean, running_var, self.weight,
                              self.bias, self.training, momentum, self.eps)
        return tokens.view(x.shape)


def make_norm(norm: str, dim: int) -> nn.Module:
    if norm == "affine":
        return Affine(dim)
    if norm == "layernorm":
        return nn.LayerNorm(dim, eps=1e-6)
    if norm == "batchnorm":
        return TokenBatchNorm(dim)
    raise UserError(f"unknown norm '{norm}'; valid norms: {', '.join(NORMS)}")


@register_notrace_function  # timm's fx feature extraction keeps it as one call node
def check_input_shape(x: torch.Tensor, in_chans: int, img_size: int) -> None:
    """One clear line when images do not match the model. A function, so that torch.fx records one
    call instead of tracing the shape comparison (which it cannot: a traced value in an `if`);
    TorchScript compiles it as it stands, and eager and traced modules raise UserError."""
    shape: List[int] = list(x.shape)
    if len(shape) != 4 or shape[1] != in_chans or shape[2] != img_size or shape[3] != img_size:
        raise UserError(f"input of shape {shape} does not match the model: expected (B, {in_chans}, {img_size}, "
                        f"{img_size}): the model's img_size is {img_size} and its token-mixing layers fix the patch "
                        f"grid, so resize the images to {img_size} px (train.py and eval.py resize to data.image_size)")


torch.fx.wrap("check_input_shape")  # plain torch.fx.symbolic_trace: the same call node


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
    global_pool="hopfield" pools with models/hopfield_pool.py (pool_mapping, pool_beta, pool_heads, pool_k).
    """

    __jit_unused_properties__ = ["has_hopfield_pool"]  # (TorchScript would compile the property)

    def __init__(self, img_size=224, patch_size=16, in_chans=3, num_classes=1000, embed_dim=384,
                 depth=12, mlp_ratio=4.0, norm="affine", init_values=None, drop_rate=0.0,
                 drop_path_rate=0.0, global_pool="avg", pool_mapping="softmax", pool_beta=None, pool_heads=1,
                 pool_k=None):
        super().__init__()
        if global_pool not in POOLS + ("",):
            raise UserError(f"unknown global_pool '{global_pool}'; valid: {', '.join(POOLS)} or ''")
        check_pool(global_pool or "avg", pool_mapping, int(pool_heads), embed_dim, pool_beta, pool_k,
                   (int(img_size) // int(patch_size)) ** 2)
        if int(img_size) <= 0 or int(img_size) % int(patch_size):
            raise UserError(
                f"image size {img_size} is not divisible by patch size {patch_size}; "
                f"use a multiple of {patch_size} "
                f"(e.g. {max(1, round(int(img_size) / int(patch_size))) * int(patch_size)})")
        self.img_size, self.patch_size, self.in_chans = int(img_size), int(patch_size), in_chans
        self.grid = self.img_size // self.patch_size
        self.num_patches = self.grid ** 2
        self.num_classes = num_classes
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.global_pool = global_pool
        self.grad_checkpointing = False
        self.init_values = layerscale_init(depth) if init_values is None else float(init_values)

        self.stem = nn.Module()
        self.stem.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.blocks = nn.Sequential(*[
            ResMLPBlock(embed_dim, self.num_patches, mlp_ratio, norm, self.init_values, drop_path_rate)
            for _ in range(depth)])  # uniform drop-path rate across blocks, as in the paper
        # timm's feature metadata: every block's tokens, d channels on the patch grid (stride = patch)
        self.feature_info = [dict(module=f"blocks.{i}", num_chs=embed_dim, reduction=self.patch_size)
                             for i in range(depth)]
        self.norm = make_norm(norm, embed_dim)
        # Hopfield pooling (models/hopfield_pool.py) has its own query; average pooling has nothing.
        self.pool = (HopfieldPooling(embed_dim, int(pool_heads), pool_mapping, pool_beta, pool_k, self.num_patches)
                     if global_pool == "hopfield" else nn.Identity())
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
    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True):
        """Recompute each block in the backward pass instead of keeping its activations."""
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self):
        return self.head

    def reset_classifier(self, num_classes: int, global_pool=None):
        self.num_classes = num_classes
        if global_pool is not None:
            if global_pool not in ("avg", "") and not (global_pool == "hopfield" and self.has_hopfield_pool):
                raise UserError(f"global_pool '{global_pool}' cannot be set here; valid: 'avg', ''"
                                + (", 'hopfield'" if self.has_hopfield_pool else " (hopfield: build with it)"))
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
        check_input_shape(x, self.in_chans, self.img_size)
        B, C, H, W = x.shape
        p, g = self.patch_size, self.grid
        patches = x.reshape(B, C, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(B, g * g, C * p * p)
        w, b = self.stem.proj.weight, self.stem.proj.bias
        return F.linear(patches, w.reshape(w.shape[0], -1), b)

    def forward_features(self, x):
        """Images (B, C, H, W) → normalised patch features (B, N, d)."""
        x = self.patch_embed(x)
        if self.grad_checkpointing and not torch.jit.is_scripting():
            for blk in self.blocks:
                x = checkpointed(blk, x)
        else:
            x = self.blocks(x)
        return self.norm(x)

    def forward_intermediates(
            self,
            x: torch.Tensor,
            indices: Optional[Union[int, List[int]]] = None,
            norm: bool = False,
            stop_early: bool = False,
            output_fmt: str = "NCHW",
            intermediates_only: bool = False,
    ) -> Union[List[torch.Tensor], Tuple[torch.Tensor, List[torch.Tensor]]]:
        """Block outputs, as timm's MLP-Mixer family gives them (features_only builds on this).

        indices: the last n blocks (int), the listed blocks (negative from the end) or all (None).
        norm: pass each intermediate through the final norm. stop_early: skip the blocks after the
        last one taken. output_fmt: "NCHW" (B, d, grid, grid) or "NLC" (B, N, d) tokens.
        Returns the intermediates, or (final normalised features, intermediates).
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise UserError(f"unknown output_fmt '{output_fmt}'; valid: 'NCHW', 'NLC'")
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        x = self.patch_embed(x)
        intermediates = []
        # A condition in the loop, not a slice: TorchScript can neither slice a Sequential nor
        # choose between two containers in an expression, nor `break` a loop over modules. So
        # stop_early holds in scripted modules too.
        for i, blk in enumerate(self.blocks):
            if not stop_early or i <= max_index:
                if self.grad_checkpointing and not torch.jit.is_scripting():
                    x = checkpointed(blk, x)
                else:
                    x = blk(x)
                if i in take_indices:
                    intermediates.append(self.norm(x) if norm else x)
        if output_fmt == "NCHW":  # tokens are patches in row-major order on the grid
            B, g = x.shape[0], self.grid
            intermediates = [y.reshape(B, g, g, -1).permute(0, 3, 1, 2).contiguous() for y in intermediates]
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates

    def prune_intermediate_layers(self, indices: Union[int, List[int]] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """Drop the blocks after the last one `indices` takes (and the norm / head); returns the
        kept indices, counted from the first block."""
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[:max_index + 1]
        self.feature_info = self.feature_info[:max_index + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return take_indices

    @property
    def has_hopfield_pool(self) -> bool:
        return isinstance(self.pool, HopfieldPooling)

    @torch.jit.ignore
    def pooling_weights(self, x):
        """Images (B, C, H, W) -> Hopfield pooling weights (B, heads, N) over the patches (row-major
        on the grid; > 0 marks a patch the image's feature uses). Average pooling: 1/N everywhere."""
        tokens = self.forward_features(x)
        if self.has_hopfield_pool:
            return self.pool.weights(tokens)
        return tokens.new_full((tokens.shape[0], 1, tokens.shape[1]), 1.0 / tokens.shape[1])

    def forward_head(self, x, pre_logits: bool = False):
        if self.global_pool == "avg":
            x = x.mean(dim=1)
        elif self.global_pool == "hopfield":
            x = self.pool(x)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x):
        return self.forward_head(self.forward_features(x))


# --- named variants (models/names.py's VARIANTS), registered with timm -------------------------
# timm's own model of the same architecture (timm.models.mlp_mixer), for the paper's variants with
# the Affine norm; models/convert.py maps the weights both ways.
TIMM_ARCHITECTURES = {"resmlp_s12": "resmlp_12_224", "resmlp_s24": "resmlp_24_224", "resmlp_s36": "resmlp_36_224",
                      "resmlp_b24": "resmlp_big_24_224"}


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
    if pretrained and kwargs.get("features_only"):
        return _pretrained_features(name, kwargs)
    # features_only=True wraps the model in timm's FeatureGetterNet, which calls forward_intermediates
    # for out_indices (as timm's MLP-Mixer: the last 3 blocks by default).
    feature_cfg = dict(out_indices=kwargs.pop("out_indices", 3), feature_cls="getter")
    model = build_model_with_cfg(ResMLP, name, pretrained=False, feature_cfg=feature_cfg,
                                 **{**VARIANTS[name], **kwargs})
    if pretrained:
        path = model.pretrained_cfg.get("file")
        if not path:
            raise UserError(f"no pretrained weights are bundled for '{name}'; pass a local file: "
                            f"timm.create_model('{name}', pretrained=True, pretrained_cfg_overlay=dict(file=PATH)) "
                            "(this project's, timm's or FB/DeiT weights, .safetensors or .pth)")
        load_pretrained(model, str(path))  # a pathlib.Path works too
    return model


def _pretrained_features(name: str, kwargs: dict) -> nn.Module:
    """features_only with local weights: load them into the whole model (so the file is checked
    against it, head included), then copy the blocks the feature extractor kept."""
    if kwargs.get("feature_cls", "getter") != "getter":
        raise UserError("features_only with pretrained weights supports feature_cls='getter' only; "
                        "build the model with pretrained=True and wrap it yourself for other extractors")
    full = create_resmlp(name, True, **{k: v for k, v in kwargs.items()
                                         if k not in ("features_only", "out_indices", "feature_cls")})
    features = create_resmlp(name, False, **kwargs)
    missing = features.model.load_state_dict(full.state_dict(), strict=False).missing_keys
    if missing:  # cannot happen for the kept blocks; guards a future extractor that adds parameters
        raise UserError(f"pretrained weights lack '{missing[0]}' of the feature extractor")
    return features


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
