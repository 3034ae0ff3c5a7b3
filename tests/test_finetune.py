"""Starting from pretrained weights: fine-tuning with a new head (model.pretrained), the linear
probe (model.freeze=backbone), layer-wise lr decay (optim.layer_decay) and distillation
(train.distill), with their bad values refused in one line (configs/finetune_checks.py, training/finetune.py,
training/freeze.py, training/distill.py).

The source is a tiny run trained here on builtin10 (BatchNorm, so the probe can check frozen
running statistics); the fine-tunes train on builtin100 with another head."""
import json
import os

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from common.errors import UserError
from test_train_helpers import reset_accelerate_state, run_inprocess, tiny_cfg

FAST = ["optim.epochs=1", "train.ema=false", "train.save_every=1000"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _is_backbone(key):
    return not key.startswith(("head.", "output_head."))


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A builtin10 run (BatchNorm backbone): the pretrained weights of the tests below."""
    run_dir = str(tmp_path_factory.mktemp("src") / "run")
    assert run_inprocess(tiny_cfg(run_dir, "model.norm=batchnorm", *FAST)) == 0
    return run_dir


def _setup(cfg):
    from training.run import setup

    reset_accelerate_state()
    run = setup(cfg, resume=None, overwrite=False)
    run.lock.release()
    return run


def _one_line(err):
    text = str(err.value)
    assert "\n" not in text and text
    return text


# ----------------------------------------------------------------------------- model.pretrained
def test_fine_tune_starts_from_the_source_backbone_with_a_new_head(tmp_path, source, capsys):
    cfg = tiny_cfg(str(tmp_path / "ft"), "model.norm=batchnorm", "data.dataset=builtin100", "head.name=sparsemax",
                   f"model.pretrained={source}", *FAST)
    run = _setup(cfg)
    src, got = load_file(os.path.join(source, "model.safetensors")), run.learner.raw_model.state_dict()
    backbone = [k for k in got if _is_backbone(k)]
    assert backbone and all(torch.equal(got[k], src[k]) for k in backbone)  # bit-identical at step 0
    assert any(k.endswith("running_var") for k in backbone)  # BN buffers travel with the backbone
    assert got["head.weight"].shape == (100, 128) and src["head.weight"].shape == (10, 128)
    out = capsys.readouterr().out
    line = [ln for ln in out.splitlines() if "not loaded" in ln]
    assert len(line) == 1 and "head.weight, head.bias (10 classes in the weights, 100 here: re-initialised)" in line[0]
    # recorded: config.yaml (the resume fingerprint reads the same config) holds path and sha256
    saved = yaml.safe_load(open(tmp_path / "ft" / "config.yaml"))
    from training.checkpoint.files import file_sha256

    assert saved["model"]["pretrained"] == source
    assert saved["model"]["pretrained_sha256"] == file_sha256(os.path.join(source, "model.safetensors"))
    assert run.fingerprint["model.pretrained_sha256"] == saved["model"]["pretrained_sha256"]


def test_same_classes_and_head_kind_load_the_classifier_too_am_softmax_needs_its_own(tmp_path, source, capsys):
    run = _setup(tiny_cfg(str(tmp_path / "a"), "model.norm=batchnorm", f"model.pretrained={source}", *FAST))
    src = load_file(os.path.join(source, "model.safetensors"))
    assert torch.equal(run.learner.raw_model.state_dict()["head.weight"], src["head.weight"])
    assert "everything loaded" in capsys.readouterr().out
    run = _setup(tiny_cfg(str(tmp_path / "b"), "model.norm=batchnorm", "head.name=am_softmax",
                             f"model.pretrained={source}", *FAST))
    assert not torch.equal(run.learner.raw_model.state_dict()["head.weight"], src["head.weight"])
    assert "am_softmax needs a cosine classifier" in capsys.readouterr().out


def _project_weights(tmp_path):
    """A fresh affine-norm tiny model's weights (the formats below cover the affine ResMLP)."""
    from configs.schema import HeadConfig, ModelConfig
    from models import create_classifier

    torch.manual_seed(3)
    model = create_classifier(ModelConfig(name="resmlp_tiny"), HeadConfig(), 10, img_size=16)
    return {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("output_head.")}


def _to_timm(sd):
    """timm's resmlp_* names, written out here (independently of models/convert.py)."""
    out = {}
    for k, v in sd.items():
        k2 = k.replace(".cross_patch.", ".linear_tokens.").replace(".mlp.", ".mlp_channels.")
        out[k2] = v.reshape(1, 1, -1) if k2.endswith((".alpha", ".beta")) else v
    return out


def _to_fb(sd):
    """The original FB/DeiT resmlp_models.py names."""
    return {k.replace("stem.", "patch_embed.").replace(".cross_patch.", ".attn.").replace(".ls1", ".gamma_1")
            .replace(".ls2", ".gamma_2"): v for k, v in sd.items()}


@pytest.mark.parametrize("fmt", ["timm.pth", "timm.safetensors", "fb.pth", "fb.safetensors"])
def test_timm_and_fb_weight_files_load_the_same_way(tmp_path, fmt):
    sd = _project_weights(tmp_path)
    kind, ext = fmt.split(".")
    converted = (_to_timm if kind == "timm" else _to_fb)(sd)
    assert set(converted) != set(sd)
    path = str(tmp_path / f"w.{ext}")
    if ext == "pth":
        torch.save({"model": converted}, path)  # the FB/DeiT release wraps its state dict as {"model": ...}
    else:
        save_file(converted, path)
    run = _setup(tiny_cfg(str(tmp_path / "run"), "data.dataset=builtin100", f"model.pretrained={path}", *FAST))
    got = run.learner.raw_model.state_dict()
    assert all(torch.equal(got[k], sd[k]) for k in sd if _is_backbone(k))
    assert got["head.weight"].shape == (100, 128)


def test_the_weights_image_size_is_kept_and_said(tmp_path, source, capsys):
    cfg = tiny_cfg(str(tmp_path / "run"), "model.norm=batchnorm", "data.image_size=32",
                   f"model.pretrained={source}", *FAST)
    run = _setup(cfg)
    assert run.cfg.data.image_size == 16 and run.learner.raw_model.img_size == 16
    images, _ = next(iter(run.train_loader(0, 0)))
    assert images.shape[-1] == 16  # the data pipeline resizes to the weights' size
    out = capsys.readouterr().out
    assert "trained at 16 px" in out and "the config had 32" in out


def test_mismatches_are_refused_in_one_line_naming_the_key(tmp_path, source):
    sd = load_file(os.path.join(source, "model.safetensors"))
    cases = {
        "extra": ({**sd, "blocks.0.gate.weight": torch.zeros(3)}, "blocks.0.gate.weight"),
        "missing": ({k: v for k, v in sd.items() if k != "blocks.1.ls2"}, "blocks.1.ls2"),
        "shape": ({**sd, "blocks.2.mlp.fc1.weight": torch.zeros(7, 128)}, "blocks.2.mlp.fc1.weight"),
    }
    for name, (bad, key) in cases.items():
        path = str(tmp_path / f"{name}.safetensors")
        save_file(bad, path)
        with pytest.raises(UserError) as err:
            _setup(tiny_cfg(str(tmp_path / name), "model.norm=batchnorm", f"model.pretrained={path}", *FAST))
        assert key in _one_line(err)
    with pytest.raises(UserError) as err:  # another norm: the BatchNorm weights do not fit an affine model
        _setup(tiny_cfg(str(tmp_path / "norm"), f"model.pretrained={source}", *FAST))
    assert "model.norm" in _one_line(err)


def test_bad_files_and_pins_are_refused_in_one_line(tmp_path, source):
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk.pth").write_bytes(b"not a pickle")
    cases = [
        (f"model.pretrained={tmp_path / 'nowhere.pth'}", "does not exist"),
        (f"model.pretrained={tmp_path / 'empty'}", "without model.safetensors"),
        (f"model.pretrained={tmp_path / 'junk.pth'}", "weights_only=True"),
    ]
    for override, words in cases:
        with pytest.raises(UserError) as err:
            _setup(tiny_cfg(str(tmp_path / "run"), override, *FAST))
        assert words in _one_line(err)
    with pytest.raises(UserError) as err:
        _setup(tiny_cfg(str(tmp_path / "pin"), "model.norm=batchnorm", f"model.pretrained={source}",
                        "model.pretrained_sha256=" + "f" * 64, *FAST))
    assert "the file changed" in _one_line(err)


def test_resume_keeps_the_pretrained_weights_frozen_in_the_fingerprint(tmp_path, source):
    run_dir = str(tmp_path / "ft")
    base = ["model.norm=batchnorm", "data.dataset=builtin100", *FAST]
    assert run_inprocess(tiny_cfg(run_dir, f"model.pretrained={source}", *base)) == 0
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    assert summary["pretrained"]["path"] == source and len(summary["pretrained"]["sha256"]) == 64
    other = str(tmp_path / "copy.safetensors")
    save_file(load_file(os.path.join(source, "model.safetensors")), other, metadata={"copy": "1"})
    with pytest.raises(UserError) as err:
        run_inprocess(tiny_cfg(run_dir, f"model.pretrained={other}", *base, "optim.epochs=2"),
                      resume="auto", accept_changes=True)
    assert "model.pretrained" in _one_line(err)


# ----------------------------------------------------------------------------- model.freeze=backbone
def test_probe_trains_only_the_head_backbone_and_bn_buffers_bit_identical(tmp_path, source):
    run_dir = str(tmp_path / "probe")
    cfg = tiny_cfg(run_dir, "model.norm=batchnorm", "data.dataset=builtin100", "head.name=entmax_bisect",
                   "head.learn_alpha=true", "model.drop_path=0.2", "model.freeze=backbone",
                   f"model.pretrained={source}", "optim.lr=5e-2", *FAST)
    run = _setup(cfg)
    trainable = {n for n, p in run.learner.raw_model.named_parameters() if p.requires_grad}
    assert trainable == {"head.weight", "head.bias", "output_head.alpha_logit"}
    held = {id(p) for g in run.learner.optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for n, p in run.learner.raw_model.named_parameters() if n in trainable}
    run.learner.raw_model.train()
    assert not run.learner.raw_model.blocks.training and run.learner.raw_model.head.training
    reset_accelerate_state()
    assert run_inprocess(cfg, overwrite=True) == 0
    src, got = (load_file(os.path.join(source, "model.safetensors")),
                load_file(os.path.join(run_dir, "model.safetensors")))
    backbone = [k for k in got if _is_backbone(k)]
    assert all(torch.equal(got[k], src[k]) for k in backbone), [k for k in backbone if not torch.equal(got[k], src[k])]
    init = run.learner.raw_model.state_dict()  # the step-0 head of the same seed
    assert not torch.equal(got["head.weight"], init["head.weight"])
    assert not torch.equal(got["output_head.alpha_logit"], init["output_head.alpha_logit"])


# ----------------------------------------------------------------------------- optim.layer_decay
def test_layer_decay_scales_each_blocks_lr_by_depth(tmp_path):
    run = _setup(tiny_cfg(str(tmp_path / "run"), "optim.layer_decay=0.5", *FAST))
    run.learner.scheduler.step_update(3)
    names = {id(p): n for n, p in run.learner.raw_model.named_parameters()}
    lr_of = {names[id(p)]: g["lr"] for g in run.learner.optimizer.param_groups for p in g["params"]}
    top = lr_of["head.weight"]
    assert top > 0 and lr_of["norm.alpha"] == pytest.approx(top * 0.5)  # 4 blocks: block 3 (and norm) at 0.5
    for i in range(4):
        assert lr_of[f"blocks.{i}.mlp.fc1.weight"] == pytest.approx(top * 0.5 ** (4 - i))
    assert lr_of["stem.proj.weight"] == pytest.approx(top * 0.5 ** 5)


# ----------------------------------------------------------------------------- bad config values
@pytest.mark.parametrize("override, words", [
    ("model.freeze=all", "model.freeze"),
    ("model.freeze=backbone", "needs|set model.pretrained"),
    ("model.pretrained=", "model.pretrained' is empty"),
    ("model.pretrained_sha256=abc", "model.pretrained_sha256"),
    ("train.distill=kd", "train.distill"),
    ("train.distill=soft", "needs a teacher"),
    ("train.teacher=x", "train.distill=none would ignore"),
    ("train.teacher_sha256=xyz", "train.teacher_sha256"),
    ("train.distill_alpha=1.5", "train.distill_alpha"),
    ("train.distill_alpha=-0.1", "train.distill_alpha"),
    ("train.distill_tau=0", "train.distill_tau"),
    ("train.distill_tau=nan", "train.distill_tau"),
    ("optim.layer_decay=0", "optim.layer_decay"),
    ("optim.layer_decay=1.5", "optim.layer_decay"),
    ("optim.layer_decay=fast", "optim.layer_decay"),
])
def test_every_new_key_refuses_bad_values_in_one_line(tmp_path, override, words):
    import re

    with pytest.raises(UserError) as err:
        tiny_cfg(str(tmp_path / "run"), override)
    assert re.search(words, _one_line(err))


def test_teacher_weights_without_a_teacher_is_refused(tmp_path):
    with pytest.raises(UserError) as err:
        tiny_cfg(str(tmp_path / "run"), "train.distill=hard", "train.teacher_weights=w.pth")
    assert "needs a teacher" in _one_line(err) or "train.teacher_weights" in _one_line(err)


def test_train_py_turns_a_bad_pretrained_path_into_one_line_and_exit_2(tmp_path, one_line_error):
    from test_train_helpers import write_cfg

    cfg = write_cfg(tiny_cfg(str(tmp_path / "run"), *FAST), tmp_path / "c.yaml")
    line = one_line_error("train", ["--config", cfg, f"model.pretrained={tmp_path / 'missing.pth'}"])
    assert "model.pretrained" in line and "does not exist" in line
