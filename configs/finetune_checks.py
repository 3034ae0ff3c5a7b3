"""Cross-key checks of the fine-tuning, probe and distillation settings (model.pretrained,
model.freeze, train.distill, train.teacher...); the files themselves are read by training/finetune.py
and training/distill.py when a run starts, so a config stays loadable after they moved (eval.py)."""
import re

from common.errors import UserError

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _check_sha256(value, key):
    if value is not None and not _SHA256.match(str(value)):
        raise UserError(f"config key '{key}' must be a sha256 (64 lowercase hex digits) or null; got {value!r:.70}")


def _check_path_like(value, key):
    if value is not None and not str(value).strip():
        raise UserError(f"config key '{key}' is empty; give a path (or null for none)")


def check_finetune_settings(cfg):
    model, train, data = cfg.model, cfg.train, cfg.data
    for key in ("features_source_sha256", "features_settings_sha256"):
        _check_sha256(getattr(data, key), f"data.{key}")
        if getattr(data, key) is not None and data.dataset != "features":
            raise UserError(f"data.{key} pins cached features but data.dataset={data.dataset}: set "
                            f"data.dataset=features, or data.{key}=null")
    _check_path_like(model.pretrained, "model.pretrained")
    _check_path_like(train.teacher, "train.teacher")
    _check_path_like(train.teacher_weights, "train.teacher_weights")
    _check_sha256(model.pretrained_sha256, "model.pretrained_sha256")
    _check_sha256(train.teacher_sha256, "train.teacher_sha256")
    if model.pretrained_sha256 is not None and model.pretrained is None:
        raise UserError("model.pretrained_sha256 is set but model.pretrained is not: set model.pretrained=PATH, "
                        "or model.pretrained_sha256=null")
    if model.freeze == "backbone" and model.pretrained is None:
        raise UserError("model.freeze=backbone trains only the classifier, on top of pretrained features: set "
                        "model.pretrained=PATH (a run directory or weights file), or model.freeze=none")
    if train.distill != "none" and train.teacher is None:
        raise UserError(f"train.distill={train.distill} needs a teacher: set train.teacher=PATH (a run directory or "
                        f"weights file) or a timm model name with train.teacher_weights=FILE")
    if train.distill == "none" and (train.teacher, train.teacher_weights, train.teacher_sha256) != (None,) * 3:
        raise UserError("train.teacher/teacher_weights/teacher_sha256 are set but train.distill=none would ignore "
                        "them: set train.distill=soft or hard, or set them to null")
    if train.teacher_weights is not None and train.teacher is None:
        raise UserError("train.teacher_weights is set but train.teacher is not: name the teacher's timm model "
                        "with train.teacher=NAME")
