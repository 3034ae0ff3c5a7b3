"""ResMLP model (models/resmlp.py) and weight interop (models/convert.py)."""
from functools import partial

import pytest
import timm
import torch
import torch.nn as nn
from timm.models.mlp_mixer import Affine as TimmAffine
from timm.models.mlp_mixer import MlpMixer, ResBlock

from common.errors import UserError
from models.convert import convert_state_dict, load_pretrained
from models.resmlp import MODEL_NAMES, VARIANTS, Affine, ResMLP, create_resmlp

TIMM_TWIN = {"resmlp_s12": "resmlp_12_224", "resmlp_s24": "resmlp_24_224",
             "resmlp_s36": "resmlp_36_224", "resmlp_b24": "resmlp_big_24_224"}


def timm_resmlp(name, num_classes=10, norm_layer=TimmAffine):
    """timm's MlpMixer/ResBlock with the same configuration as our variant `name`."""
    cfg = VARIANTS[name]
    return MlpMixer(num_classes=num_classes, img_size=cfg["img_size"], patch_size=cfg["patch_size"],
                    num_blocks=cfg["depth"], embed_dim=cfg["embed_dim"], mlp_ratio=4,
                    block_layer=ResBlock, norm_layer=norm_layer)


@torch.no_grad()
def randomize(model, seed=0):
    """Perturb every parameter (weights, biases, α, β, LayerScale) away from its init value."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g)
        if name.endswith(("alpha", "beta", "ls1", "ls2")) or ".ls" in name:
            p.add_(0.2 * noise)
        else:
            p.add_(0.02 * noise)
    return model


def random_model(build, seed=0):
    """`build()` on the meta device, then materialised with random values (skips slow init)."""
    with torch.device("meta"):
        model = build()
    model = model.to_empty(device="cpu")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("alpha"):
                p.copy_(1 + 0.2 * noise)
            elif name.endswith(("beta", "ls1", "ls2")):
                p.copy_(0.2 * noise)
            else:
                p.copy_(0.02 * noise)
    return model


def fb_state_dict_from_timm(sd):
    """Inverse of timm's checkpoint_filter_fn: the original FB/DeiT key layout."""
    out = {}
    for k, v in sd.items():
        k = k.replace("stem.", "patch_embed.").replace("linear_tokens.", "attn.")
        k = k.replace("mlp_channels.", "mlp.").replace(".ls1", ".gamma_1").replace(".ls2", ".gamma_2")
        if k.endswith((".alpha", ".beta")):
            v = v.reshape(-1)
        out[k] = v
    return out


def images(model, batch, seed=0):
    return torch.randn(batch, 3, model.img_size, model.img_size, generator=torch.Generator().manual_seed(seed))


# --- construction and shapes -------------------------------------------------------------------

@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_variant_shapes_on_meta(name):
    with torch.device("meta"):
        model = create_resmlp(name, num_classes=7)
        x = torch.empty(2, 3, VARIANTS[name]["img_size"], VARIANTS[name]["img_size"])
        feats = model.forward_features(x)
        logits = model(x)
    n = (VARIANTS[name]["img_size"] // VARIANTS[name]["patch_size"]) ** 2
    assert feats.shape == (2, n, VARIANTS[name]["embed_dim"])
    assert model.forward_head(feats, pre_logits=True).shape == (2, VARIANTS[name]["embed_dim"])
    assert logits.shape == (2, 7)
    assert model.num_features == VARIANTS[name]["embed_dim"] and model.num_classes == 7
    if name in TIMM_TWIN:  # same architecture ⇒ same parameter count as timm's model
        with torch.device("meta"):
            twin = timm.create_model(TIMM_TWIN[name], num_classes=7)
        assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in twin.parameters())


def test_real_forward_shapes():  # the other variants run for real in the timm-equivalence tests
    model = create_resmlp("resmlp_tiny", num_classes=5).eval()
    x = images(model, 3)
    assert model.forward_features(x).shape == (3, 64, 128)
    assert model(x).shape == (3, 5)


def test_timm_create_model_by_name_and_reset_classifier():
    for name in MODEL_NAMES:
        assert name in timm.list_models("resmlp_*")
    model = timm.create_model("resmlp_tiny", num_classes=7, norm="layernorm", drop_path_rate=0.1)
    assert isinstance(model, ResMLP) and model.num_classes == 7
    assert isinstance(model.blocks[0].norm1, nn.LayerNorm)
    model.reset_classifier(3)
    assert model(images(model, 2)).shape == (2, 3)
    model.reset_classifier(0)
    assert isinstance(model.head, nn.Identity) and model(images(model, 2)).shape == (2, 128)


def test_unknown_variant_lists_valid_names():
    with pytest.raises(UserError) as e:
        create_resmlp("resmlp_s13")
    msg = str(e.value)
    assert "resmlp_s13" in msg and all(n in msg for n in MODEL_NAMES) and "\n" not in msg
    with pytest.raises(UserError, match="layernorm"):
        create_resmlp("resmlp_tiny", norm="groupnorm")


def test_bad_image_size_is_a_clear_error():
    with pytest.raises(UserError, match="not divisible by patch size 4") as e:
        create_resmlp("resmlp_tiny", img_size=30)
    assert "\n" not in str(e.value)
    model = create_resmlp("resmlp_tiny")
    with pytest.raises(UserError, match="img_size"):
        model(torch.randn(1, 3, 64, 64))


# --- initialisation, gradients, drop path ----------------------------------------------------------

def test_init_values():
    model = create_resmlp("resmlp_tiny")
    for blk in model.blocks:
        for norm in (blk.norm1, blk.norm2):
            assert isinstance(norm, Affine)
            assert torch.equal(norm.alpha, torch.ones(128)) and torch.equal(norm.beta, torch.zeros(128))
        assert torch.allclose(blk.ls1, torch.full((128,), 0.1)) and torch.allclose(blk.ls2, blk.ls1)
    assert torch.equal(model.norm.alpha, torch.ones(128))
    small = dict(img_size=8, patch_size=4, embed_dim=8)
    for depth, want in ((12, 0.1), (18, 0.1), (19, 1e-5), (24, 1e-5), (25, 1e-6), (36, 1e-6)):
        m = ResMLP(depth=depth, **small)
        assert torch.allclose(m.blocks[-1].ls1, torch.full((8,), want)), depth
    m = ResMLP(depth=36, init_values=0.5, **small)
    assert torch.allclose(m.blocks[0].ls2, torch.full((8,), 0.5))
    # Named variants follow the paper's code: S12/S24/S36 by the depth rule, B24 at 1e-6 (DeiT's
    # resmlpB_24); init_values=None keeps the variant's value, a number overrides it.
    for name, want in (("resmlp_s24", 1e-5), ("resmlp_s36", 1e-6), ("resmlp_b24", 1e-6)):
        with torch.device("meta"):
            assert create_resmlp(name, init_values=None).init_values == want, name
            assert create_resmlp(name, init_values=0.01).init_values == 0.01, name


@pytest.mark.parametrize("norm", ["affine", "layernorm", "batchnorm"])
def test_every_parameter_gets_a_gradient(norm):
    model = randomize(create_resmlp("resmlp_tiny", num_classes=4, norm=norm, drop_path_rate=0.1)).train()
    nn.functional.cross_entropy(model(images(model, 4)), torch.tensor([0, 1, 2, 3])).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_drop_path_inactive_in_eval_active_in_train():
    model = randomize(create_resmlp("resmlp_tiny", num_classes=4, drop_path_rate=0.5))
    plain = create_resmlp("resmlp_tiny", num_classes=4)
    plain.load_state_dict(model.state_dict())
    x = images(model, 8)
    model.eval(), plain.eval()
    assert torch.equal(model(x), model(x))
    torch.testing.assert_close(model(x), plain(x), atol=1e-6, rtol=1e-6)
    model.train()
    torch.manual_seed(0)
    a = model(x)
    assert not torch.allclose(a, model(x))  # fresh masks each call
    assert not torch.allclose(a, plain.train()(x))


def test_drop_path_in_training_matches_timm():
    # Same weights, same seed: timm's ResBlock draws its DropPath masks in the same order (cross-patch
    # branch, then cross-channel branch, block by block), so the training-mode outputs agree.
    ref = random_model(lambda: MlpMixer(num_classes=10, img_size=32, patch_size=4, num_blocks=4, embed_dim=128,
                                        mlp_ratio=4, block_layer=ResBlock, norm_layer=TimmAffine,
                                        drop_path_rate=0.5), seed=8)
    ours = create_resmlp("resmlp_tiny", num_classes=10, drop_path_rate=0.5)
    ours.load_state_dict(convert_state_dict(ref.state_dict(), ours))
    x = images(ours, 8)
    outs = []
    for model in (ours.train(), ref.train()):
        torch.manual_seed(3)
        outs.append(model(x))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        assert not torch.allclose(outs[0], ours.eval()(x), atol=1e-3)  # masks were really drawn


# --- equivalence with timm and the FB checkpoints ---------------------------------------------

def assert_same_logits(ours, ref, batch=2):
    ours.eval(), ref.eval()
    x = images(ours, batch)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x), atol=1e-5, rtol=1e-5)


def test_timm_s12_224_equivalence():
    ref = random_model(lambda: timm.create_model("resmlp_12_224", num_classes=10))
    with torch.device("meta"):
        ours = create_resmlp("resmlp_s12", num_classes=10)
    ours.load_state_dict(convert_state_dict(ref.state_dict(), ours), assign=True)
    assert_same_logits(ours, ref, batch=1)


@pytest.mark.parametrize("name", ["resmlp_tiny", "resmlp_cifar_s12"])
def test_timm_cifar_equivalence(name):
    ref = random_model(lambda: timm_resmlp(name), seed=5)
    with torch.device("meta"):
        ours = create_resmlp(name, num_classes=10)
    ours.load_state_dict(convert_state_dict(ref.state_dict(), ours), assign=True)
    assert_same_logits(ours, ref)


@pytest.mark.parametrize("train", [False, True])
def test_timm_equivalence_with_gradients(train):
    # The block's backward is autograd's: every parameter's gradient must match timm's model's.
    ref = random_model(lambda: timm_resmlp("resmlp_tiny", num_classes=6), seed=3)
    ours = create_resmlp("resmlp_tiny", num_classes=6)
    ours.load_state_dict(convert_state_dict(ref.state_dict(), ours))
    x, y = images(ours, 4), torch.tensor([0, 1, 2, 5])
    logits = []
    for model in (ours.train(train), ref.train(train)):
        out = model(x)
        nn.functional.cross_entropy(out, y).backward()
        logits.append(out.detach())
    torch.testing.assert_close(logits[0], logits[1], atol=1e-5, rtol=1e-5)
    ref_grads = convert_state_dict({n: p.grad for n, p in ref.named_parameters()}, ours)  # timm → our names
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    assert {"blocks.0.norm1.alpha", "blocks.0.norm2.beta", "blocks.0.ls1", "blocks.3.ls2"} <= set(ref_grads)


def test_timm_layernorm_equivalence():
    ref = randomize(timm_resmlp("resmlp_tiny", norm_layer=partial(nn.LayerNorm, eps=1e-6)), seed=2)
    ours = create_resmlp("resmlp_tiny", num_classes=10, norm="layernorm")
    ours.load_state_dict(convert_state_dict(ref.state_dict(), ours))
    assert_same_logits(ours, ref)


def test_fb_checkpoint_equivalence(tmp_path):
    ref = randomize(timm_resmlp("resmlp_tiny"), seed=4)
    fb = fb_state_dict_from_timm(ref.state_dict())
    assert "blocks.0.attn.weight" in fb and fb["blocks.0.norm1.alpha"].shape == (128,) and "blocks.1.gamma_2" in fb
    torch.save({"model": fb}, tmp_path / "fb.pth")  # FB checkpoints wrap the weights in "model"
    ours = load_pretrained(create_resmlp("resmlp_tiny", num_classes=10), str(tmp_path / "fb.pth"))
    assert_same_logits(ours, ref)


def test_timm_weights_keep_attached_output_head():
    ref = randomize(timm_resmlp("resmlp_tiny"), seed=6)
    ours = create_resmlp("resmlp_tiny", num_classes=10)
    ours.output_head = nn.Module()
    ours.output_head.alpha_logit = nn.Parameter(torch.tensor(0.25))
    ours.load_state_dict(convert_state_dict(ref.state_dict(), ours), strict=True)
    assert ours.output_head.alpha_logit.item() == 0.25
    assert_same_logits(ours, ref)
    bare = create_resmlp("resmlp_tiny", num_classes=10)  # a run's weights into a bare model
    bare.load_state_dict(convert_state_dict(ours.state_dict(), bare), strict=True)
    assert_same_logits(bare, ref)


def test_state_dict_round_trip_safetensors(tmp_path):
    from safetensors.torch import save_file

    model = randomize(create_resmlp("resmlp_tiny", num_classes=3), seed=7)
    sd = model.state_dict()
    assert sd["blocks.0.norm1.alpha"].shape == (128,) and sd["blocks.0.cross_patch.weight"].shape == (64, 64)
    save_file(sd, str(tmp_path / "m.safetensors"))
    other = load_pretrained(create_resmlp("resmlp_tiny", num_classes=3), str(tmp_path / "m.safetensors"))
    for k, v in other.state_dict().items():
        assert torch.equal(v, sd[k]), k
    x = images(model, 2)
    assert torch.equal(model.eval()(x), other.eval()(x))


def test_mismatched_state_dict_names_first_key(tmp_path):
    # An MLP-Mixer shares `stem.proj` with ResMLP; its first foreign key is blocks.0.norm1.weight.
    mixer = MlpMixer(num_classes=10, img_size=32, patch_size=4, num_blocks=2, embed_dim=128)
    with pytest.raises(UserError) as e:
        convert_state_dict(mixer.state_dict(), create_resmlp("resmlp_tiny"))
    assert "'blocks.0.norm1.weight'" in str(e.value) and "\n" not in str(e.value)
    vit = {"cls_token": torch.zeros(1, 1, 8), "pos_embed": torch.zeros(1, 5, 8)}
    with pytest.raises(UserError, match="'cls_token'"):
        convert_state_dict(vit, create_resmlp("resmlp_tiny"))
    with pytest.raises(UserError, match="'stem.proj.weight'.*shape") as e:  # wrong variant
        convert_state_dict(create_resmlp("resmlp_tiny").state_dict(),
                           ResMLP(img_size=32, patch_size=4, embed_dim=64, depth=4))
    sd = create_resmlp("resmlp_tiny").state_dict()
    del sd["blocks.2.ls1"]
    with pytest.raises(UserError, match="missing 'blocks.2.ls1'"):
        convert_state_dict(sd, create_resmlp("resmlp_tiny"))
    with pytest.raises(UserError, match="not found"):
        load_pretrained(create_resmlp("resmlp_tiny"), str(tmp_path / "nope.safetensors"))


# --- timm registry and timm-native pretrained loading ---------------------------------------------

def test_variants_registered_explicitly_next_to_timms_own_resmlp():
    from timm.models import get_pretrained_cfg, model_entrypoint

    assert set(timm.list_models(module="resmlp")) == set(MODEL_NAMES)  # the table and the registry agree
    for name in MODEL_NAMES:
        assert model_entrypoint(name).__module__ == "models.resmlp", name
        cfg = get_pretrained_cfg(name)
        size = VARIANTS[name]["img_size"]
        assert cfg.architecture == name and cfg.input_size == (3, size, size) and not cfg.has_weights
    for name in TIMM_TWIN.values():  # timm's own ResMLP names still build timm's model
        assert model_entrypoint(name).__module__ == "timm.models.mlp_mixer" and name not in MODEL_NAMES
    model = timm.create_model("resmlp_tiny")
    assert timm.data.resolve_data_config({}, model=model)["input_size"] == (3, 32, 32)


def _saved_weights(tmp_path, fmt):
    """(file, reference model) for weights of resmlp_tiny (10 classes) saved in format `fmt`."""
    from safetensors.torch import save_file

    if fmt == "project":
        ref = randomize(create_resmlp("resmlp_tiny", num_classes=10), seed=9)
        save_file(ref.state_dict(), str(tmp_path / "w.safetensors"))
        return tmp_path / "w.safetensors", ref
    ref = randomize(timm_resmlp("resmlp_tiny"), seed=9)
    sd = ref.state_dict() if fmt == "timm" else {"model": fb_state_dict_from_timm(ref.state_dict())}
    torch.save(sd, tmp_path / "w.pth")
    return tmp_path / "w.pth", ref


@pytest.mark.parametrize("fmt", ["project", "timm", "fb"])
def test_timm_create_model_pretrained_from_local_file(tmp_path, fmt):
    path, ref = _saved_weights(tmp_path, fmt)
    file = path if fmt == "fb" else str(path)  # a pathlib.Path or a string
    model = timm.create_model("resmlp_tiny", pretrained=True, num_classes=10, pretrained_cfg_overlay=dict(file=file))
    assert isinstance(model, ResMLP) and str(model.pretrained_cfg["file"]) == str(path)
    direct = load_pretrained(create_resmlp("resmlp_tiny", num_classes=10), str(path))
    x = images(model, 2)
    with torch.no_grad():
        assert torch.equal(model.eval()(x), direct.eval()(x))  # same weights as the direct loader
        if fmt == "project":
            assert torch.equal(model(x), ref.eval()(x))
        else:
            torch.testing.assert_close(model(x), ref.eval()(x), atol=1e-5, rtol=1e-5)
    assert torch.equal(model.blocks[1].cross_patch.weight, direct.blocks[1].cross_patch.weight)


def test_pretrained_without_a_file_is_one_clear_error(tmp_path):
    for build in (lambda: timm.create_model("resmlp_s12", pretrained=True),
                  lambda: create_resmlp("resmlp_tiny", pretrained=True)):
        with pytest.raises(UserError, match="no pretrained weights are bundled") as e:
            build()
        assert "pretrained_cfg_overlay=dict(file=" in str(e.value) and "\n" not in str(e.value)
    path, _ = _saved_weights(tmp_path, "project")  # a file for another number of classes
    with pytest.raises(UserError, match=r"'head\.(weight|bias)'.*num_classes"):
        timm.create_model("resmlp_tiny", pretrained=True, num_classes=5, pretrained_cfg_overlay=dict(file=str(path)))
    with pytest.raises(UserError, match="not found"):
        timm.create_model("resmlp_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(tmp_path / "no.pth")))


# --- mixed precision and compile -------------------------------------------------------------------

def test_bf16_autocast_forward_and_backward():
    model = randomize(create_resmlp("resmlp_tiny", num_classes=4)).train()
    x = images(model, 4)
    with torch.no_grad():
        ref = model(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, torch.tensor([0, 1, 2, 3]))
    loss.backward()
    assert torch.isfinite(logits).all() and logits.shape == (4, 4)
    assert (logits.float() - ref).abs().max() < 0.05 * ref.abs().max() + 0.05
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_torch_compile_tiny_matches_eager():
    model = randomize(create_resmlp("resmlp_tiny", num_classes=4)).train()
    x = images(model, 1)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)  # no graph breaks allowed
    out = compiled(x)
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
    out.sum().backward()
    assert model.blocks[0].norm1.alpha.grad is not None
