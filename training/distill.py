"""Knowledge distillation as DeiT's DistillationLoss (Touvron et al. 2021), for every output head.

    loss = (1 - alpha) * head.loss(student, labels)  +  alpha * distillation term
    hard:  head.loss(student, argmax teacher)
    soft:  tau^2 * head.loss(student / tau, q),   q = the teacher's distribution of teacher / tau

Both terms go through the student head's own loss and its soft-target support, so a sparsemax
student is trained with the sparsemax Fenchel-Young loss towards the teacher's distribution. The
teacher's distribution is its own head's mapping (a run directory's teacher: e.g. sparsemax), or
softmax for a weights file or a timm model. ResMLP has no distillation token (DeiT's second
classifier): the one classifier is distilled, so `hard` and `soft` change its target only.

Why tau^2: the gradient of a Fenchel-Young loss in the logits is (mapping(s / tau) - q) / tau, and
for large tau both mappings are close to linear in logits / tau, so the soft term's gradient
shrinks as 1 / tau^2 (Hinton et al. 2015); multiplying by tau^2 keeps its weight against the label
term independent of tau. DeiT does the same (its KL term times T * T). Unlike DeiT, which divides
the summed KL by batch x classes, the term here is the per-sample mean, as the label term is.

The teacher runs in eval mode (no drop path, frozen BatchNorm), without gradients, in the run's
precision (Accelerate's autocast), inside the training step with no host read; images are resized
on the device when the teacher takes another fixed size. It is deterministic, so a resumed run is
exact; it is not part of the checkpoint (its file's sha256 is in the config instead).
"""
import copy
import os

import timm
import torch
import torch.nn.functional as F

from common import rundir
from common.errors import UserError
from configs.loader import load_run_config
from configs.schema import HeadConfig
from data.classes import class_mismatch, class_names, load_class_names
from models import MODEL_NAMES, create_classifier
from models.convert import convert_state_dict
from models.heads import softmax
from models.pretrained import renamed_state_dict, weights_patch_grid
from training.finetune import hashed_weights


class Distiller:
    """The distillation loss of one run (see the module docstring)."""

    def __init__(self, teacher, mapping, mode, alpha, tau, autocast, input_size=None):
        self.teacher, self.mapping, self.mode = teacher, mapping, mode
        self.alpha, self.tau, self.autocast, self.input_size = float(alpha), float(tau), autocast, input_size

    def teacher_logits(self, images):
        with torch.no_grad(), self.autocast():
            if self.input_size is not None and tuple(images.shape[-2:]) != (self.input_size, self.input_size):
                images = F.interpolate(images, size=(self.input_size, self.input_size), mode="bicubic",
                                       align_corners=False)
            return self.teacher(images).float()

    def targets(self, teacher_logits):
        """The distillation target: class indices (hard) or probability rows at tau (soft)."""
        if self.mode == "hard":
            return teacher_logits.argmax(-1)
        return self.mapping(teacher_logits / self.tau).detach()

    def loss(self, head, logits, images, targets, label_smoothing=0.0):
        kd_target = self.targets(self.teacher_logits(images))
        if self.mode == "hard":
            kd = head.loss(logits, kd_target)
        else:
            kd = head.loss(logits / self.tau, kd_target) * (self.tau ** 2)
        if self.alpha == 1.0:  # a Python float: no label term to compute
            return kd
        return (1.0 - self.alpha) * head.loss(logits, targets, label_smoothing=label_smoothing) + self.alpha * kd


def _load_strict(model, state_dict, what):
    try:
        model.load_state_dict(state_dict, strict=True)
    except RuntimeError as err:
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        raise UserError(f"{what}: {lines[1] if len(lines) > 1 else lines[0]}") from None


def _converted(state_dict, model, what):
    """models.convert's strict renaming, its one-line error prefixed with which file it is about."""
    try:
        return convert_state_dict(state_dict, model)
    except UserError as err:
        raise UserError(f"{what}: {err}") from None


def _head_cfg(name):
    return HeadConfig(name=name)


def _run_dir_teacher(path, sd, data_cfg, num_classes):
    tcfg = load_run_config(path)
    saved = load_class_names(path)
    if saved is not None:
        diff = class_mismatch(saved, class_names(data_cfg))
        if diff:
            raise UserError(f"train.teacher: {path} was trained on other classes ({diff}); a teacher must predict "
                            f"this dataset's classes")
    elif len(class_names(data_cfg)) != num_classes:
        raise UserError(f"train.teacher: {path} has no classes list and another class count")
    teacher = create_classifier(tcfg.model, tcfg.head, num_classes, img_size=tcfg.data.image_size)
    _load_strict(teacher, _converted(sd, teacher, f"train.teacher {path}"), f"train.teacher {path}")
    return teacher, teacher.output_head, teacher.img_size


def _weights_teacher(file, sd, model_cfg, image_size, num_classes):
    """A weights file of the student's architecture (model.name, model.norm), at its own image size."""
    head = renamed_state_dict(sd).get("head.weight")
    if head is not None and head[1].shape[0] != num_classes:
        raise UserError(f"train.teacher {file}: its classifier ('{head[0]}') predicts {head[1].shape[0]} classes, the "
                        f"dataset has {num_classes}; a teacher must predict the dataset's classes")
    grid = weights_patch_grid(sd)
    tcfg = copy.copy(model_cfg)
    tcfg.drop_path = 0.0
    keys = set(renamed_state_dict(sd))  # a cosine classifier (am_softmax) has no bias
    teacher = create_classifier(tcfg, _head_cfg("softmax" if "head.bias" in keys else "am_softmax"), num_classes,
                                img_size=grid[0] if grid else image_size)
    _load_strict(teacher, _converted(sd, teacher, f"train.teacher {file}"), f"train.teacher {file}")
    return teacher, softmax, teacher.img_size


def _timm_teacher(name, weights, sd, num_classes):
    teacher = timm.create_model(name, num_classes=num_classes)
    if name in MODEL_NAMES:
        sd = _converted(sd, teacher, f"train.teacher_weights {weights} for {name} with {num_classes} classes")
    _load_strict(teacher, sd, f"train.teacher_weights {weights} for {name} with {num_classes} classes")
    cfg = getattr(teacher, "pretrained_cfg", {}) or {}
    size = cfg.get("input_size", (0, 0, 0))[-1] if cfg.get("fixed_input_size") else None
    return teacher, softmax, size


def teacher_line(cfg, distiller):
    """The run's teacher in one line: what it is, its file's hash, how its output enters the loss."""
    tc = cfg.train
    weights = f", weights {tc.teacher_weights}" if tc.teacher_weights else ""
    digest = f", sha256 {tc.teacher_sha256[:12]}..." if tc.teacher_sha256 else ""
    target = ("its argmax as the label" if tc.distill == "hard"
              else f"its probabilities at temperature τ = {tc.distill_tau:g}")
    return (f"teacher: {tc.teacher}{weights}{digest} ({type(distiller.teacher).__name__}, frozen); "
            f"train.distill={tc.distill}: loss = {1 - tc.distill_alpha:g} × the head's loss + "
            f"{tc.distill_alpha:g} × the loss towards {target}")


def build_distiller(cfg, num_classes, accelerator):
    """The run's Distiller (None for train.distill=none); records the teacher file's sha256 in
    cfg.train.teacher_sha256 (a pinned one must match). Call before the resume fingerprint."""
    tc = cfg.train
    if tc.distill == "none":
        return None
    spec = tc.teacher
    if os.path.isdir(spec) and os.path.isfile(os.path.join(spec, rundir.CONFIG)):
        if tc.teacher_weights is not None:
            raise UserError("train.teacher_weights goes with a timm model name; a run directory brings its weights")
        _, tc.teacher_sha256, sd = hashed_weights(spec, tc.teacher_sha256, "train.teacher")
        teacher, mapping, size = _run_dir_teacher(spec, sd, cfg.data, num_classes)
    elif os.path.exists(spec):
        if tc.teacher_weights is not None:
            raise UserError("train.teacher_weights goes with a timm model name; train.teacher is a file already")
        file, tc.teacher_sha256, sd = hashed_weights(spec, tc.teacher_sha256, "train.teacher")
        teacher, mapping, size = _weights_teacher(file, sd, cfg.model, cfg.data.image_size, num_classes)
    elif timm.is_model(spec):
        if tc.teacher_weights is None:
            raise UserError(f"train.teacher={spec} (a timm model) needs its weights: set train.teacher_weights=FILE "
                            f"(.safetensors or .pth; nothing is downloaded)")
        _, tc.teacher_sha256, sd = hashed_weights(tc.teacher_weights, tc.teacher_sha256, "train.teacher")
        teacher, mapping, size = _timm_teacher(spec, tc.teacher_weights, sd, num_classes)
    else:
        raise UserError(f"train.teacher {spec!r:.80} is neither a run directory, a weights file nor a timm model name")
    teacher.eval().requires_grad_(False).to(accelerator.device)
    if hasattr(mapping, "to"):
        mapping.to(accelerator.device)
    return Distiller(teacher, mapping, tc.distill, tc.distill_alpha, tc.distill_tau, accelerator.autocast,
                     input_size=size)
