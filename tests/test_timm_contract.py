"""timm's model contract for our ResMLP: TorchScript, torch.fx, features_only,
forward_intermediates / prune_intermediate_layers and gradient checkpointing, for every variant
and every norm.

Every variant runs with its own image size, patch size and LayerScale init, but with depth 2 and
16 channels so that scripting and running all of them stays fast; resmlp_tiny runs at full size,
and every variant at full size is traced by fx on the meta device.
"""
import warnings

import pytest
import timm
import torch
import torch.fx
import torch.nn as nn

from common.errors import UserError
from models.heads import HEAD_NAMES
from models.resmlp import MODEL_NAMES, NORMS, VARIANTS, create_resmlp

SHRUNK = dict(depth=3, embed_dim=16)


@pytest.fixture(autouse=True)
def _quiet_jit():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.script.*deprecated", category=FutureWarning)
        yield


@torch.no_grad()
def perturb(model, seed=0):
    """Move every parameter and BatchNorm statistic away from its init, so norms and LayerScale matter."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():  # 1-D: α, β, LayerScale, biases, norm weights
        p.add_((0.2 if p.dim() == 1 else 0.02) * torch.randn(p.shape, generator=g))
    for name, b in model.named_buffers():
        if name.endswith("running_mean"):
            b.copy_(0.1 * torch.randn(b.shape, generator=g))
        elif name.endswith("running_var"):
            b.copy_(1 + 0.3 * torch.rand(b.shape, generator=g))
    return model


def small(name, norm="affine", **kwargs):
    """Variant `name` (its image size, patch size, init) shrunk to 3 blocks × 16 channels."""
    return perturb(create_resmlp(name, num_classes=7, norm=norm, **{**SHRUNK, **kwargs}))


def images(model, batch, seed=1):
    return torch.randn(batch, 3, model.img_size, model.img_size, generator=torch.Generator().manual_seed(seed))


def blocks_by_hand(model, x):
    """The block outputs, computed from the submodules directly (the reference for intermediates)."""
    tokens = model.patch_embed(x)
    outs = []
    for blk in model.blocks:
        tokens = blk(tokens)
        outs.append(tokens)
    return outs


# --- TorchScript and torch.fx ----------------------------------------------------------------------

@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_script_and_fx_match_eager(name, norm):
    model = small(name, norm).eval()
    scripted, traced = torch.jit.script(model), torch.fx.symbolic_trace(model)
    for batch in (1, 3):  # the batch dimension stays free in both
        x = images(model, batch)
        with torch.no_grad():
            want = model(x)
            assert want.shape == (batch, 7) and torch.isfinite(want).all()
            torch.testing.assert_close(traced(x), want, atol=0, rtol=0)
            if batch == 3:  # (each new shape re-optimises the scripted graph: one is enough here)
                torch.testing.assert_close(scripted(x), want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("norm", NORMS)
def test_full_size_tiny_script_and_fx_in_training_mode(norm):
    # Training mode: BatchNorm uses batch statistics and updates its running ones; the scripted and
    # traced copies must do both as eager does (outputs, gradients and buffers).
    base = perturb(create_resmlp("resmlp_tiny", num_classes=5, norm=norm)).train()
    copies = [create_resmlp("resmlp_tiny", num_classes=5, norm=norm).train() for _ in range(2)]
    for c in copies:
        c.load_state_dict(base.state_dict())
    before = {n: b.clone() for n, b in base.named_buffers()}
    runs = {"eager": base, "script": torch.jit.script(copies[0]), "fx": torch.fx.symbolic_trace(copies[1])}
    for n, b in copies[1].named_buffers():  # tracing itself updates nothing
        assert torch.equal(b, before[n]), n
    x, y = images(base, 4), torch.tensor([0, 1, 2, 4])
    results = {}
    for key, module in runs.items():
        out = module(x)
        nn.functional.cross_entropy(out, y).backward()
        results[key] = (out.detach(), {n: p.grad for n, p in module.named_parameters()}, dict(module.named_buffers()))
    want_out, want_grads, want_buffers = results["eager"]
    for key in ("script", "fx"):
        out, grads, buffers = results[key]
        torch.testing.assert_close(out, want_out, atol=1e-6, rtol=1e-5, msg=key)
        assert set(grads) == set(want_grads), key
        for n, g in want_grads.items():
            torch.testing.assert_close(grads[n], g, atol=1e-6, rtol=1e-4, msg=f"{key} {n}")
        for n, b in want_buffers.items():
            torch.testing.assert_close(buffers[n], b, msg=f"{key} {n}")
    if norm == "batchnorm":  # the running statistics really moved, by one update
        assert int(want_buffers["blocks.0.norm1.num_batches_tracked"]) == 1
        assert not torch.allclose(want_buffers["blocks.0.norm1.running_mean"], before["blocks.0.norm1.running_mean"])


def test_token_batchnorm_is_batchnorm1d_over_tokens():
    # The written-out forward against nn.BatchNorm1d itself on the (B·N, d) view, train then eval.
    from models.resmlp import TokenBatchNorm

    ours, ref = TokenBatchNorm(6), nn.BatchNorm1d(6)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5), ours.bias.uniform_(-1, 1)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(3, 5, 6) * 2 + 1
    for train in (True, True, False):
        ours.train(train), ref.train(train)
        torch.testing.assert_close(ours(x), ref(x.reshape(-1, 6)).view(3, 5, 6), atol=1e-6, rtol=1e-6)
        for key, value in ref.state_dict().items():
            torch.testing.assert_close(ours.state_dict()[key], value, msg=key)
    assert int(ours.num_batches_tracked) == 2


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_full_size_variant_traces_on_meta(name):
    with torch.device("meta"):
        model = create_resmlp(name, num_classes=3)
        traced = torch.fx.symbolic_trace(model)
        size = VARIANTS[name]["img_size"]
        out = traced(torch.empty(2, 3, size, size))
    assert out.shape == (2, 3)
    assert sum(n.target == "check_input_shape" or getattr(n.target, "__name__", "") == "check_input_shape"
               for n in traced.graph.nodes) == 1  # the size check is one call node, not traced control flow


def test_wrong_input_size_is_one_line_in_eager_fx_and_script():
    model = small("resmlp_tiny").eval()
    expected = r"input of shape \[1, 3, 64, 64\] does not match the model: expected \(B, 3, 32, 32\)"
    for module in (model, torch.fx.symbolic_trace(model)):
        with pytest.raises(UserError, match=expected) as e:
            module(torch.randn(1, 3, 64, 64))
        assert "\n" not in str(e.value) and "img_size" in str(e.value)
    with pytest.raises(UserError, match=r"input of shape \[2, 1, 32, 32\]"):
        model(torch.randn(2, 1, 32, 32))  # wrong channel count
    with pytest.raises(torch.jit.Error, match=expected):  # TorchScript re-raises under its own class
        torch.jit.script(model)(torch.randn(1, 3, 64, 64))


def test_fx_feature_extraction_through_timm():
    # timm's fx feature extractor (what features_only with feature_cls="fx" uses) keeps the size
    # check as one call and returns the requested blocks.
    model = small("resmlp_tiny").eval()
    from timm.models._features_fx import FeatureGraphNet  # what features_only, feature_cls="fx" builds

    built = timm.create_model("resmlp_tiny", features_only=True, feature_cls="fx", out_indices=(0, 2), **SHRUNK)
    assert built.feature_info.module_name() == ["blocks.0", "blocks.2"]
    fx_features = FeatureGraphNet(model, out_indices=(0, 2))
    x = images(model, 2)
    with torch.no_grad():
        want = blocks_by_hand(model, x)
        got = fx_features(x)
        assert len(got) == 2 and len(built(x)) == 2
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[2])


# --- features_only, forward_intermediates, prune_intermediate_layers ---------------------------------

@pytest.mark.parametrize("name", MODEL_NAMES)
def test_features_only_for_every_variant(name):
    cfg = VARIANTS[name]
    grid = cfg["img_size"] // cfg["patch_size"]
    model = small(name).eval()
    features = timm.create_model(name, features_only=True, out_indices=(0, -1), **SHRUNK).eval()
    assert features.feature_info.channels() == [16, 16]
    assert features.feature_info.reduction() == [cfg["patch_size"]] * 2
    assert features.feature_info.module_name() == ["blocks.0", "blocks.2"]
    assert not hasattr(features.model, "head") or isinstance(features.model.head, nn.Identity)
    missing = features.model.load_state_dict(model.state_dict(), strict=False).missing_keys
    assert missing == []
    x = images(model, 2)
    with torch.no_grad():
        got = features(x)
        want = blocks_by_hand(model, x)
    assert [tuple(t.shape) for t in got] == [(2, 16, grid, grid)] * 2
    for g, w in zip(got, (want[0], want[2])):  # NCHW: channel c at grid cell (i, j) is token i·grid + j
        torch.testing.assert_close(g.flatten(2).transpose(1, 2), w)
    default = timm.create_model(name, features_only=True, **SHRUNK)
    assert default.feature_info.module_name() == ["blocks.0", "blocks.1", "blocks.2"]  # the last 3, as timm's Mixer


class EarlyFinal(nn.Module):
    """The final features after block 1 with stop_early (forward_intermediates compiled by script)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        out = self.model.forward_intermediates(x, indices=[1], stop_early=True, output_fmt="NLC")
        assert isinstance(out, tuple)
        return out[0]


# every variant, and every norm across them (scripting compiles the norm's module; sizes do not matter to it)
@pytest.mark.parametrize("name,norm", [(name, NORMS[i % len(NORMS)]) for i, name in enumerate(MODEL_NAMES)])
def test_features_only_scripts_and_traces(name, norm):
    """A features_only model goes through torch.jit.script and torch.fx as timm's own Mixer does,
    and stop_early holds in a scripted forward_intermediates."""
    model = small(name, norm).eval()
    features = timm.create_model(name, features_only=True, out_indices=(0, -1), norm=norm, **SHRUNK).eval()
    features.model.load_state_dict(model.state_dict(), strict=False)
    x = images(model, 2)
    with torch.no_grad():
        want = features(x)
        for built in (torch.jit.script(features), torch.fx.symbolic_trace(features)):
            got = built(x)
            assert len(got) == 2
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)
        early = torch.jit.script(EarlyFinal(model))(x)
        torch.testing.assert_close(early, model.norm(blocks_by_hand(model, x)[1]), atol=1e-6, rtol=1e-6)


def test_forward_intermediates_against_the_blocks():
    model = small("resmlp_tiny", norm="layernorm").eval()
    x = images(model, 2)
    with torch.no_grad():
        want = blocks_by_hand(model, x)
        final, inter = model.forward_intermediates(x, output_fmt="NLC")
        torch.testing.assert_close(final, model.forward_features(x))
        assert len(inter) == 3
        for got, ref in zip(inter, want):
            torch.testing.assert_close(got, ref)
        nchw = model.forward_intermediates(x, indices=[0, -1], intermediates_only=True)
        assert [tuple(t.shape) for t in nchw] == [(2, 16, 8, 8)] * 2
        torch.testing.assert_close(nchw[1][:, :, 2, 5], want[2][:, 2 * 8 + 5])  # row-major patch grid
        normed = model.forward_intermediates(x, indices=1, norm=True, output_fmt="NLC", intermediates_only=True)
        assert len(normed) == 1
        torch.testing.assert_close(normed[0], model.norm(want[2]))
        early_final, early = model.forward_intermediates(x, indices=[1], stop_early=True, output_fmt="NLC")
        torch.testing.assert_close(early[0], want[1])
        torch.testing.assert_close(early_final, model.norm(want[1]))  # stopped after block 1
    with pytest.raises(UserError, match="output_fmt 'NHWC'"):
        model.forward_intermediates(x, output_fmt="NHWC")
    with pytest.raises(AssertionError, match="out of range"):
        model.forward_intermediates(x, indices=[3])


@pytest.mark.parametrize("norm", NORMS)
def test_prune_intermediate_layers_keeps_the_features(norm):
    model = small("resmlp_cifar_s12", norm).eval()
    x = images(model, 2)
    with torch.no_grad():
        want = model.forward_intermediates(x, indices=[0, 1], intermediates_only=True)
    assert model.prune_intermediate_layers([0, -2], prune_norm=True) == [0, 1]
    assert len(model.blocks) == 2 and len(model.feature_info) == 2
    assert isinstance(model.head, nn.Identity) and isinstance(model.norm, nn.Identity) and model.global_pool == ""
    with torch.no_grad():
        got = model.forward_intermediates(x, indices=[0, 1], intermediates_only=True)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
        assert model(x).shape == (2, model.num_patches, 16)  # no pooling, no head: the tokens


def test_features_only_with_local_weights(tmp_path):
    from safetensors.torch import save_file

    model = perturb(create_resmlp("resmlp_tiny", num_classes=10)).eval()
    save_file(model.state_dict(), str(tmp_path / "w.safetensors"))
    features = timm.create_model("resmlp_tiny", pretrained=True, num_classes=10, features_only=True,
                                 out_indices=[1], pretrained_cfg_overlay=dict(file=str(tmp_path / "w.safetensors")))
    x = images(model, 2)
    with torch.no_grad():
        (got,) = features(x)
        torch.testing.assert_close(got.flatten(2).transpose(1, 2), blocks_by_hand(model, x)[1])
    assert len(features.model.blocks) == 2
    with pytest.raises(UserError, match="num_classes"):  # the file is still checked against the model
        timm.create_model("resmlp_tiny", pretrained=True, num_classes=5, features_only=True,
                          pretrained_cfg_overlay=dict(file=str(tmp_path / "w.safetensors")))


# --- gradient checkpointing ----------------------------------------------------------------------------

@pytest.mark.parametrize("norm", NORMS)
def test_grad_checkpointing_matches_plain(norm):
    # Same weights and seed, drop path on: checkpointing recomputes each block with the same random
    # masks (the RNG state is restored), so outputs and every gradient agree with the plain model.
    plain = small("resmlp_tiny", norm, drop_path_rate=0.2).train()
    ckpt = create_resmlp("resmlp_tiny", num_classes=7, norm=norm, drop_path_rate=0.2, **SHRUNK).train()
    ckpt.load_state_dict(plain.state_dict())
    ckpt.set_grad_checkpointing()
    assert ckpt.grad_checkpointing and not plain.grad_checkpointing
    x, y = images(plain, 4).requires_grad_(), torch.tensor([0, 1, 2, 6])
    outs, grads = [], []
    for model in (plain, ckpt):
        torch.manual_seed(5)
        out = model(x)
        (dx,) = torch.autograd.grad(nn.functional.cross_entropy(out, y), x, retain_graph=True)
        nn.functional.cross_entropy(out, y).backward()
        outs.append(out.detach())
        grads.append({"input": dx, **{n: p.grad for n, p in model.named_parameters()}})
    torch.testing.assert_close(outs[1], outs[0], atol=1e-6, rtol=1e-6)
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, atol=1e-6, rtol=1e-5, msg=n)
    for (n, b), ref in zip(ckpt.named_buffers(), plain.buffers()):  # BatchNorm updated once per forward
        torch.testing.assert_close(b, ref, msg=n)
    # forward_intermediates checkpoints too, with the same result
    ckpt.eval(), plain.eval()
    with torch.no_grad():
        for a, b in zip(ckpt.forward_intermediates(x, intermediates_only=True),
                        plain.forward_intermediates(x, intermediates_only=True)):
            torch.testing.assert_close(a, b)
        assert not torch.allclose(plain(x), outs[0])  # drop path did draw masks in training


@pytest.mark.parametrize("head", HEAD_NAMES)
def test_every_heads_classifier_scripts_and_traces(head):
    # models.create_classifier swaps the final Linear for some heads (am_softmax: a cosine
    # classifier run in fp32 under autocast); the network without its output head stays scriptable
    # and traceable. (The OutputHead itself is applied on the logits: scripts/export.py traces it.)
    from configs.schema import HeadConfig, ModelConfig
    from models import create_classifier

    model = create_classifier(ModelConfig(), HeadConfig(name=head), 10, img_size=32).eval()
    del model.output_head
    x = images(model, 2)
    with torch.no_grad():
        want = model(x)
        torch.testing.assert_close(torch.jit.script(model)(x), want, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(torch.fx.symbolic_trace(model)(x), want, atol=0, rtol=0)
