"""train.distill (training/distill.py): DeiT's distillation loss through each head's own loss.

- hard, alpha = 1: the loss is the head's loss towards the teacher's argmax, not the labels;
- soft with a teacher equal to the student's initial weights: the loss is, in float64 from first
  principles, (1 - alpha) * label loss + alpha * tau^2 * FY(student / tau; softmax(teacher / tau))
  (0 for a softmax student; the sparsemax Fenchel-Young loss towards a dense target for sparsemax);
- a run stopped mid-epoch and resumed with a teacher (and a probe run) ends bit-identical;
- bad teachers are refused in one line."""
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from common.errors import UserError
from test_train_helpers import NO_AUG, KillAfter, Killed, reset_accelerate_state, run_inprocess, tiny_cfg

FAST = ["optim.epochs=1", "train.ema=false", "train.save_every=1000", *NO_AUG]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _setup(cfg):
    from training.run import setup

    reset_accelerate_state()
    run = setup(cfg, resume=None, overwrite=False)
    run.lock.release()
    return run


def _save_model(path, seed=0, num_classes=10, **model):
    from configs.schema import HeadConfig, ModelConfig
    from models import create_classifier

    torch.manual_seed(seed)
    net = create_classifier(ModelConfig(name="resmlp_tiny", **model), HeadConfig(), num_classes, img_size=16)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path))
    return net.eval()


def _batch(run):
    images, targets = next(iter(run.train_loader(0, 0)))
    return images, targets


def _sparsemax_fy64(theta, q):
    """Sparsemax Fenchel-Young loss in float64: <theta, p> - |p|^2/2 + |q|^2/2 - <theta, q>, p = sparsemax(theta)
    from the entmax package (the independent reference)."""
    from entmax import sparsemax

    p = sparsemax(theta, dim=-1)
    return ((theta * p).sum(-1) - 0.5 * (p * p).sum(-1) + 0.5 * (q * q).sum(-1) - (theta * q).sum(-1))


@pytest.mark.parametrize("head", ["softmax", "sparsemax"])
def test_soft_with_the_students_own_initial_weights_gives_the_expected_loss(tmp_path, head):
    alpha, tau = 0.3, 2.0
    base = tiny_cfg(str(tmp_path / "init"), f"head.name={head}", *FAST)
    student0 = _setup(base).learner.raw_model
    teacher_file = str(tmp_path / "init.safetensors")
    save_file({k: v.contiguous() for k, v in student0.state_dict().items()}, teacher_file)
    run = _setup(tiny_cfg(str(tmp_path / "kd"), f"head.name={head}", "train.distill=soft",
                          f"train.teacher={teacher_file}", f"train.distill_alpha={alpha}",
                          f"train.distill_tau={tau}", *FAST))
    student = run.learner.raw_model.state_dict()
    assert all(torch.equal(a, b) for a, b in zip(student.values(), student0.state_dict().values()))
    images, targets = _batch(run)
    run.learner.model.train()
    loss = run.learner.forward_loss(images, targets)
    with torch.no_grad():
        s = run.learner.model(images).double()
    q = torch.softmax(s / tau, -1)  # the teacher's distribution: its logits are the student's
    if head == "softmax":
        label = -torch.log_softmax(s, -1).gather(1, targets[:, None]).squeeze(1)
        kd = (q * (torch.log(q) - torch.log_softmax(s / tau, -1))).sum(-1)  # KL(q || p): 0 here
    else:
        label = _sparsemax_fy64(s, torch.nn.functional.one_hot(targets, 10).double())
        kd = _sparsemax_fy64(s / tau, q)
        assert kd.mean() > 1e-4  # a sparse student cannot reach a dense target: the term is not trivially 0
    expected = (1 - alpha) * label.mean() + alpha * tau ** 2 * kd.mean()
    torch.testing.assert_close(loss.double(), expected, rtol=2e-5, atol=2e-6)


def test_hard_with_alpha_one_trains_towards_the_teachers_argmax(tmp_path):
    teacher = _save_model(tmp_path / "t.safetensors", seed=7)
    run = _setup(tiny_cfg(str(tmp_path / "kd"), "head.name=entmax15", "train.distill=hard",
                          f"train.teacher={tmp_path / 't.safetensors'}", "train.distill_alpha=1", *FAST))
    images, targets = _batch(run)
    with torch.no_grad():
        teacher_labels = teacher(images).argmax(-1)
    assert (teacher_labels != targets).float().mean() > 0.5  # the teacher disagrees with the labels
    d = run.learner.distiller
    assert torch.equal(d.targets(d.teacher_logits(images)), teacher_labels)
    run.learner.model.train()
    loss = run.learner.forward_loss(images, targets)
    with torch.no_grad():
        logits = run.learner.model(images).float()
    head = run.learner.raw_model.output_head
    torch.testing.assert_close(loss, head.loss(logits, teacher_labels))
    assert not torch.allclose(loss, head.loss(logits, targets))
    # training with alpha = 1 lowers the loss towards the teacher's labels, not towards the data's
    kd0, label0 = head.loss(logits, teacher_labels), head.loss(logits, targets)
    for group in run.learner.optimizer.param_groups:
        group["lr"] = 5e-3  # the schedule's warmup would start at optim.warmup_lr
    for _ in range(8):
        run.learner.forward_loss(images, targets).backward()
        run.learner.optimizer.step()
        run.learner.optimizer.zero_grad()
    with torch.no_grad():
        logits = run.learner.model(images).float()
    kd, label = head.loss(logits, teacher_labels), head.loss(logits, targets)
    assert kd < kd0 - 0.05 and label - label0 > kd - kd0


def test_a_run_directory_teacher_uses_its_own_head_and_classes(tmp_path):
    teacher_run = str(tmp_path / "teacher")
    assert run_inprocess(tiny_cfg(teacher_run, "head.name=sparsemax", *FAST)) == 0
    run = _setup(tiny_cfg(str(tmp_path / "kd"), "train.distill=soft", f"train.teacher={teacher_run}",
                          "train.distill_tau=0.05", *FAST))
    d = run.learner.distiller
    assert d.mapping.name == "sparsemax" and not d.teacher.training
    assert not any(p.requires_grad for p in d.teacher.parameters())
    images, _ = _batch(run)
    logits = d.teacher_logits(images)
    q = d.targets(logits)
    from entmax import sparsemax

    torch.testing.assert_close(q, sparsemax(logits / 0.05, dim=-1))  # the teacher's own mapping, at tau
    assert (q == 0).any()
    with pytest.raises(UserError) as err:  # builtin100 has other classes
        _setup(tiny_cfg(str(tmp_path / "kd100"), "data.dataset=builtin100", "train.distill=soft",
                        f"train.teacher={teacher_run}", *FAST))
    assert "\n" not in str(err.value) and "other classes" in str(err.value)


@pytest.mark.parametrize("mode", ["distill", "probe"])
def test_killed_and_resumed_with_a_teacher_or_a_probe_ends_bit_identical(tmp_path, mode, capsys):
    weights_file = tmp_path / "w.safetensors"
    _save_model(weights_file, seed=5)
    extra = ([f"train.teacher={weights_file}", "train.distill=soft", "train.distill_tau=2"] if mode == "distill" else
             [f"model.pretrained={weights_file}", "model.freeze=backbone", "head.name=entmax_bisect",
              "head.learn_alpha=true"])
    recipe = ["optim.epochs=2", "data.mixup=0.8", "data.cutmix=1.0", "model.drop_path=0.1", "train.save_every=5",
              "train.ema_decay=0.9", *extra]
    ref, cut = str(tmp_path / "ref"), str(tmp_path / "cut")
    assert run_inprocess(tiny_cfg(ref, *recipe)) == 0
    said = capsys.readouterr().out  # the run says what teaches it or what is frozen
    if mode == "distill":
        assert f"teacher: {weights_file}, sha256 " in said and \
            "train.distill=soft: loss = 0.5 × the head's loss" in said
    else:
        assert "frozen: the backbone (model.freeze=backbone, a linear probe): " in said
    with pytest.raises(Killed):
        run_inprocess(tiny_cfg(cut, *recipe), hooks=KillAfter(12))  # last checkpoint: step 10
    assert run_inprocess(tiny_cfg(cut, *recipe), resume="auto") == 0
    for name in ("model.safetensors", "model_ema.safetensors"):
        a, b = load_file(os.path.join(ref, name)), load_file(os.path.join(cut, name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    if mode == "probe":
        _learned_alpha_is_reported(ref)


def _learned_alpha_is_reported(run_dir):
    """head.learn_alpha: the α the run ended with is in summary.json, epochs.csv and eval.json (and eval.py's
    table), the same number wherever it is read from the raw weights."""
    import csv
    import json

    import eval as eval_entry

    learned = json.load(open(os.path.join(run_dir, "summary.json")))["learned_alpha"]
    assert set(learned) == {"raw", "ema"} and all(1.0 < a < 2.0 for a in learned.values())
    rows = list(csv.DictReader(open(os.path.join(run_dir, "epochs.csv"))))
    assert float(rows[-1]["raw_alpha"]) == learned["raw"] and float(rows[-1]["ema_alpha"]) == learned["ema"]
    out = os.path.join(run_dir, "alpha_eval.json")
    reset_accelerate_state()
    assert eval_entry.main(["--checkpoint", run_dir, "--output", out]) in (0, None)
    result = json.load(open(out))
    assert result["learn_alpha"] is True and abs(result["alpha"] - learned["raw"]) < 1e-6
    from evaluation import tables

    row = next(line for line in tables.eval_table(result).splitlines() if line.startswith("α (learned)"))
    assert row.split()[-1] == f"{result['alpha']:.4f}"


def test_bad_teachers_are_refused_in_one_line(tmp_path):
    _save_model(tmp_path / "t100.safetensors", num_classes=100)
    cases = [
        (["train.teacher=" + str(tmp_path / "nowhere.pth")], "neither a run directory"),
        (["train.teacher=resmlp_tiny"], "needs its weights"),
        (["train.teacher=" + str(tmp_path / "t100.safetensors")], "predicts 100 classes, the dataset has 10"),
        (["train.teacher=resmlp_tiny", "train.teacher_weights=" + str(tmp_path / "t100.safetensors")], "10 classes"),
        (["train.teacher=" + str(tmp_path / "t100.safetensors"), "train.teacher_weights=x.pth"], "timm model name"),
        (["train.teacher=" + str(tmp_path / "t100.safetensors"), "train.teacher_sha256=" + "a" * 64], "file changed"),
    ]
    for overrides, words in cases:
        with pytest.raises(UserError) as err:
            _setup(tiny_cfg(str(tmp_path / "run"), "train.distill=hard", *overrides, *FAST))
        assert "\n" not in str(err.value) and words in str(err.value), str(err.value)


def test_a_timm_teacher_with_its_weights_file_and_a_teacher_at_another_image_size(tmp_path):
    """train.teacher=<timm name> + train.teacher_weights (a CNN, any input size), and a ResMLP
    weights file trained at 16 px teaching a 32 px student (images resized on the device)."""
    import timm
    import torch.nn.functional as F

    torch.manual_seed(2)
    cnn = timm.create_model("test_resnet", num_classes=10).eval()
    torch.save(cnn.state_dict(), tmp_path / "cnn.pth")
    run = _setup(tiny_cfg(str(tmp_path / "a"), "train.distill=hard", "train.teacher=test_resnet",
                          f"train.teacher_weights={tmp_path / 'cnn.pth'}", *FAST))
    images, _ = _batch(run)
    with torch.no_grad():
        torch.testing.assert_close(run.learner.distiller.teacher_logits(images), cnn(images))
    assert run.cfg.train.teacher_sha256 and run.fingerprint["train.teacher_sha256"] == run.cfg.train.teacher_sha256

    small = _save_model(tmp_path / "t16.safetensors", seed=4)  # 16 px: 4 x 4 patches
    run = _setup(tiny_cfg(str(tmp_path / "b"), "data.image_size=32", "train.distill=soft",
                          f"train.teacher={tmp_path / 't16.safetensors'}", *FAST))
    images, _ = _batch(run)
    assert images.shape[-1] == 32 and run.learner.distiller.input_size == 16
    with torch.no_grad():
        expected = small(F.interpolate(images, size=(16, 16), mode="bicubic", align_corners=False))
        torch.testing.assert_close(run.learner.distiller.teacher_logits(images), expected)
